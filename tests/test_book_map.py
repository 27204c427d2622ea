"""The landing page's chapter map (book/figures/chapter_map.svg) shows what the code does.

The figure is drawn by book/_ext/chapter_map.py from the package's imports (at every book build,
and committed): one row per chapter with the top-level modules it builds, a band with one box per
subpackage, and an arrow for every import. These tests read what was drawn from the committed
SVG (its elements carry ids ``module:NAME``, ``package:NAME``, ``modules:NAME`` and
``edge:IMPORTER:IMPORTED``) and compare it with the imports found here, by an independent
reading of ``src/tinygpt/**/*.py``. They also check that the drawing follows a change in the
code, on a copy of the package with planted imports, and that it takes seconds.
"""

from __future__ import annotations

import ast
import importlib.util
import json
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


def modules_of(package: Path) -> dict[str, Path]:
    """``tinygpt.cli.options`` -> its file, for every module under ``package``, subpackages
    included; a package's ``__init__.py`` is the package itself (``tinygpt.cli``)."""
    found = {}
    for path in package.rglob("*.py"):
        dotted = ".".join(path.relative_to(package.parent).with_suffix("").parts)
        found[dotted.removesuffix(".__init__")] = path
    return found


def dotted_imports(package: Path) -> set[tuple[str, str]]:
    """(importer, imported) between the package's modules, as dotted names, from every import
    statement of every file (also those inside functions)."""
    modules = modules_of(package)
    edges = set()
    for importer, path in modules.items():
        home = importer if path.name == "__init__.py" else importer.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                parts = home.split(".")
                base = parts[: len(parts) - node.level + 1] if node.level else []
                module = ".".join([*base, *([node.module] if node.module else [])])
                # `from tinygpt.cli import options` imports a module; `import load_checkpoint`
                # from `tinygpt.checkpoint` imports the package's __init__.
                targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in modules else module
                           for a in node.names]
            else:
                continue
            edges |= {(importer, t) for t in targets if t in modules and t != importer}
    return edges


def drawn_as(module: str) -> str | None:
    """The box a dotted module is drawn in: its own (top level), its subpackage's, or none."""
    parts = module.split(".")
    return None if len(parts) == 1 or parts[1] in PLUMBING else parts[1]


def imports_in(package: Path) -> set[tuple[str, str]]:
    """(importer, imported) as the map draws them: top-level modules and subpackages."""
    edges = {(drawn_as(a), drawn_as(b)) for a, b in dotted_imports(package)}
    return {(a, b) for a, b in edges if a and b and a != b}


def drawn(svg: Path) -> dict:
    """The ids of what the SVG draws: edges, modules (planned ones apart), subpackages, the
    modules listed in each subpackage's box, and chapter labels."""
    ids: dict = {"edge": set(), "module": set(), "planned": set(), "package": set(),
                 "modules": {}, "chapter": {}}
    for element in ET.parse(svg).iter():
        kind, _, rest = (element.get("id") or "").partition(":")
        if kind == "edge":
            ids["edge"].add(tuple(rest.split(":")))
        elif kind == "module":
            name, _, planned = rest.partition(":")
            ids["planned" if planned else "module"].add(name)
        elif kind == "package":
            ids["package"].add(rest)
        elif kind == "modules":
            ids["modules"][rest] = set("".join(element.itertext()).split())
        elif kind == "chapter":
            ids["chapter"][int(rest)] = "".join(element.itertext())
    return ids


def subpackages(package: Path) -> set[str]:
    return {p.parent.name for p in package.glob("*/__init__.py")}


def test_the_reading_of_imports_counts_subpackages_and_relative_imports(tmp_path):
    package = tmp_path / "tinygpt"
    (package / "cli").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "data.py").write_text("import tinygpt\n")
    (package / "train.py").write_text("def f():\n    from tinygpt.cli import options\n")
    (package / "cli" / "__init__.py").write_text("from tinygpt.data import load\n")
    (package / "cli" / "options.py").write_text("from . import run\nfrom .. import data\n")
    (package / "cli" / "run.py").write_text("from tinygpt.cli import main\n")
    assert dotted_imports(package) == {
        ("tinygpt.train", "tinygpt.cli.options"), ("tinygpt.cli", "tinygpt.data"),
        ("tinygpt.cli.options", "tinygpt.cli.run"), ("tinygpt.cli.options", "tinygpt.data"),
        ("tinygpt.cli.run", "tinygpt.cli"), ("tinygpt.data", "tinygpt"),
    }
    assert imports_in(package) == {("train", "cli"), ("cli", "data")}


def test_the_drawn_arrows_are_the_imports_in_src():
    edges = drawn(FIGURE)["edge"]
    found = imports_in(SRC)
    assert len(found) >= 40  # the package's modules do import one another
    assert any(a in subpackages(SRC) for a, _ in found)  # and the subpackages import them
    assert edges == found, (
        f"drawn but not imported: {sorted(edges - found)}; imported but not drawn: "
        f"{sorted(found - edges)} -- redraw with `python book/_ext/chapter_map.py`"
    )


def test_every_module_and_subpackage_is_drawn_and_planned_ones_are_muted():
    generator = load_generator()
    ids = drawn(FIGURE)
    existing = {p.stem for p in SRC.glob("*.py")} - PLUMBING
    listed = {m for *_, mods in generator.CHAPTERS for m in mods}
    assert ids["module"] == existing
    assert ids["planned"] == listed - existing
    assert ids["package"] == subpackages(SRC)
    for name in subpackages(SRC):
        inside = {p.stem for p in (SRC / name).glob("*.py")} - PLUMBING
        assert ids["modules"][name] == inside, f"{name}/'s box lists the wrong modules"


def test_chapters_without_a_notebook_are_marked_in_preparation():
    generator = load_generator()
    labels = drawn(FIGURE)["chapter"]
    assert sorted(labels) == list(range(1, len(generator.CHAPTERS) + 1))
    for number, stem, title, _ in generator.CHAPTERS:
        written = (ROOT / "chapters" / f"{stem}.ipynb").is_file()
        assert title in labels[number]
        assert ("in preparation" not in labels[number]) == written, (number, labels[number])


def code_imports(notebook: Path) -> set[str]:
    """The package's top-level modules and subpackages that a notebook's code cells import
    (``import tinygpt.X``, ``from tinygpt.X import ...``, ``from tinygpt import X``); prose and
    outputs are not read. Lines of IPython syntax (``%``, ``!``) are left out."""
    found = set()
    for cell in json.loads(notebook.read_text(encoding="utf-8"))["cells"]:
        if cell["cell_type"] != "code":
            continue
        lines = "".join(cell["source"]).splitlines()
        code = "\n".join(line for line in lines if not line.lstrip().startswith(("%", "!")))
        for node in ast.walk(ast.parse(code)):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module]
                if node.module == "tinygpt":
                    names = [f"tinygpt.{alias.name}" for alias in node.names]
            else:
                continue
            found |= {drawn_as(name) for name in names if name.startswith("tinygpt.")}
    return found - {None}


def reached(start: set[str], package: Path) -> set[str]:
    """``start`` and every top-level module or subpackage it imports, directly or through
    others, by the package's own imports."""
    edges = imports_in(package)
    seen, todo = set(start), list(start)
    while todo:
        node = todo.pop()
        for a, b in edges:
            if a == node and b not in seen:
                seen.add(b)
                todo.append(b)
    return seen


def test_the_reading_of_a_notebooks_imports_skips_prose_and_magics(tmp_path):
    notebook = tmp_path / "n.ipynb"
    cells = [
        {"cell_type": "markdown", "source": ["`tinygpt.stream` and from tinygpt import rope\n"]},
        {"cell_type": "code", "source": ["%matplotlib inline\n", "import tinygpt.bpe\n",
                                         "from tinygpt.cli.sample import main\n"]},
        {"cell_type": "code", "source": ["def f():\n", "    from tinygpt import data, model\n"]},
    ]
    notebook.write_text(json.dumps({"cells": cells}))
    assert code_imports(notebook) == {"bpe", "cli", "data", "model"}
    package = tmp_path / "tinygpt"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from tinygpt import b\n")
    (package / "b.py").write_text("def f():\n    from tinygpt import c\n")
    (package / "c.py").write_text("")
    (package / "d.py").write_text("import tinygpt.a\n")
    assert reached({"a"}, package) == {"a", "b", "c"}


def test_a_chapter_row_holds_modules_its_code_runs():
    """A module is on the row of a chapter whose code cells import it, or import a module that
    imports it (directly or through others): the table follows the code, and the prose is never
    read, so no sentence has to name a module to keep its row."""
    generator = load_generator()
    astray = []
    for number, stem, _, mods in generator.CHAPTERS:
        notebook = ROOT / "chapters" / f"{stem}.ipynb"
        if not notebook.is_file():
            continue
        runs = reached(code_imports(notebook), SRC)
        astray += [f"{m} (chapter {number})" for m in mods if m not in runs]
    assert not astray, f"modules on a chapter's row that its code never runs: {astray}"


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
    shutil.copytree(SRC, tmp_path / "src" / "tinygpt",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "chapters").mkdir()
    return tmp_path


def test_planted_imports_are_drawn_in_seconds(copy):
    generator = load_generator()
    package = copy / "src" / "tinygpt"
    assert {("bigram", "wordvec"), ("cli", "figures")}.isdisjoint(imports_in(package))
    bigram = package / "bigram.py"
    bigram.write_text(bigram.read_text() + "\n\ndef _late():\n    from tinygpt import wordvec\n")
    sample = package / "cli" / "sample.py"
    sample.write_text(sample.read_text() + "\n\ndef _late():\n    from ..figures import drawing\n")
    chart = generator.chapter_map(copy)
    assert {("bigram", "wordvec"), ("cli", "figures")} <= set(chart.edges)
    assert set(chart.edges) == imports_in(package)
    assert generator.write(copy)
    edges = drawn(copy / generator.FIGURE)["edge"]
    assert {("bigram", "wordvec"), ("cli", "figures")} <= edges
    assert not generator.write(copy)  # current now: not drawn again


def test_a_module_no_chapter_builds_is_an_error(copy):
    generator = load_generator()
    (copy / "src" / "tinygpt" / "orphan.py").write_text('"""Not on the map."""\n')
    with pytest.raises(ValueError, match="orphan"):
        generator.chapter_map(copy)


def test_a_subpackage_outside_the_band_is_an_error(copy):
    generator = load_generator()
    (copy / "src" / "tinygpt" / "extras").mkdir()
    (copy / "src" / "tinygpt" / "extras" / "__init__.py").write_text('"""Not on the map."""\n')
    with pytest.raises(ValueError, match="extras"):
        generator.chapter_map(copy)


def test_the_intro_shows_the_map_with_a_caption():
    intro = (ROOT / "book" / "intro.md").read_text(encoding="utf-8")
    match = re.search(r"```\{figure\} (\S+)\n(.*?)```", intro, re.DOTALL)
    assert match, "book/intro.md has no {figure}"
    assert (ROOT / "book" / match.group(1)).resolve() == FIGURE.resolve()
    caption = [line for line in match.group(2).splitlines() if line and not line.startswith(":")]
    assert caption, "the chapter map has no caption"
