"""The landing page's chapter map (book/figures/chapter_map.svg) shows what the code does.

The figure is drawn by book/_ext/chapter_map.py from the package's imports (at every book build,
and committed). These tests read what was drawn from the committed SVG (its elements carry ids
``module:NAME`` and ``edge:IMPORTER:IMPORTED``) and compare it with the imports found here, by
an independent reading of ``src/tinygpt/*.py``. They also check that the drawing follows a
change in the code, on a copy of the package with a planted import.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import shutil
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "tinygpt"
FIGURE = ROOT / "book" / "figures" / "chapter_map.svg"
PLUMBING = {"__init__", "__main__"}


def load_generator():
    spec = importlib.util.spec_from_file_location(
        "chapter_map", ROOT / "book" / "_ext" / "chapter_map.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def imports_in(src: Path) -> set[tuple[str, str]]:
    """(importer, imported) for the package's modules, from their import statements."""
    modules = {p.stem for p in src.glob("*.py")}
    edges = set()
    for path in src.glob("*.py"):
        if path.stem in PLUMBING:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [
                    a.name.split(".")[1] for a in node.names if a.name.startswith("tinygpt.")
                ]
            elif isinstance(node, ast.ImportFrom) and node.module == "tinygpt":
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tinygpt."):
                targets = [node.module.split(".")[1]]
            elif isinstance(node, ast.ImportFrom) and node.level:
                targets = (
                    [node.module.split(".")[0]] if node.module else [a.name for a in node.names]
                )
            edges |= {(path.stem, t) for t in targets if t in modules - PLUMBING - {path.stem}}
    return edges


def drawn(svg: Path) -> dict[str, set]:
    """The ids of what the SVG draws: edges, modules (planned ones apart) and chapter labels."""
    ids: dict[str, set] = {"edge": set(), "module": set(), "planned": set(), "chapter": {}}
    for element in ET.parse(svg).iter():
        kind, _, rest = (element.get("id") or "").partition(":")
        if kind == "edge":
            ids["edge"].add(tuple(rest.split(":")))
        elif kind == "module":
            name, _, planned = rest.partition(":")
            ids["planned" if planned else "module"].add(name)
        elif kind == "chapter":
            ids["chapter"][int(rest)] = "".join(element.itertext())
    return ids


def test_the_drawn_arrows_are_the_imports_in_src():
    edges = drawn(FIGURE)["edge"]
    found = imports_in(SRC)
    assert len(found) >= 20  # the package's modules do import one another
    assert edges == found, (
        f"drawn but not imported: {sorted(edges - found)}; imported but not drawn: "
        f"{sorted(found - edges)} -- redraw with `python book/_ext/chapter_map.py`"
    )


def test_every_module_is_drawn_and_planned_ones_are_muted():
    generator = load_generator()
    ids = drawn(FIGURE)
    existing = {p.stem for p in SRC.glob("*.py")} - PLUMBING
    listed = {m for *_, mods in generator.CHAPTERS for m in mods}
    assert ids["module"] == existing
    assert ids["planned"] == listed - existing


def test_chapters_without_a_notebook_are_marked_in_preparation():
    generator = load_generator()
    labels = drawn(FIGURE)["chapter"]
    assert sorted(labels) == list(range(1, len(generator.CHAPTERS) + 1))
    for number, stem, title, _ in generator.CHAPTERS:
        written = (ROOT / "chapters" / f"{stem}.ipynb").is_file()
        assert title in labels[number]
        assert ("in preparation" not in labels[number]) == written, (number, labels[number])


def test_the_committed_figure_is_current():
    generator = load_generator()
    stamp = re.search(r"<!-- chapter_map ([0-9a-f]+) -->", FIGURE.read_text(encoding="utf-8"))
    assert stamp, "the figure has no chapter_map stamp"
    assert stamp.group(1) == generator._key(generator.chapter_map(ROOT)), (
        "book/figures/chapter_map.svg is out of date: run `python book/_ext/chapter_map.py`"
    )


@pytest.fixture
def copy(tmp_path) -> Path:
    """A repository with a copy of the package (notebooks are only looked at, not copied)."""
    shutil.copytree(SRC, tmp_path / "src" / "tinygpt")
    (tmp_path / "chapters").mkdir()
    return tmp_path


def test_a_planted_import_is_drawn(copy, monkeypatch):
    generator = load_generator()
    # Where the boxes go does not matter here; the real placement takes seconds.
    monkeypatch.setattr(
        generator,
        "_layout",
        lambda chart: {
            m: (generator._x(j), -float(i))
            for i, (*_, mods) in enumerate(chart.rows)
            for j, (m, _) in enumerate(mods)
        },
    )
    bigram = copy / "src" / "tinygpt" / "bigram.py"
    bigram.write_text(bigram.read_text() + "\n\ndef _late():\n    from tinygpt import wordvec\n")
    chart = generator.chapter_map(copy)
    assert ("bigram", "wordvec") in chart.edges
    assert set(chart.edges) == imports_in(copy / "src" / "tinygpt")
    assert generator.write(copy)
    assert ("bigram", "wordvec") in drawn(copy / generator.FIGURE)["edge"]
    assert not generator.write(copy)  # current now: not drawn again


def test_a_module_no_chapter_builds_is_an_error(copy):
    generator = load_generator()
    (copy / "src" / "tinygpt" / "orphan.py").write_text('"""Not on the map."""\n')
    with pytest.raises(ValueError, match="orphan"):
        generator.chapter_map(copy)


def test_the_intro_shows_the_map_with_a_caption():
    intro = (ROOT / "book" / "intro.md").read_text(encoding="utf-8")
    match = re.search(r"```\{figure\} (\S+)\n(.*?)```", intro, re.DOTALL)
    assert match, "book/intro.md has no {figure}"
    assert (ROOT / "book" / match.group(1)).resolve() == FIGURE.resolve()
    caption = [line for line in match.group(2).splitlines() if line and not line.startswith(":")]
    assert caption, "the chapter map has no caption"
