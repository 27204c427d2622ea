"""How the chapters' notebooks are written so that they read well on the web, in JupyterLab,
on Colab and on GitHub: code that fits the page, a collapsed set-up cell, and
MyST directives that degrade to readable text where no MyST renderer runs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "chapters").glob("[0-9][0-9]_*.ipynb"))
# The widest code line that fits a code cell on the book's page without a scroll bar
# (book/_static/book.css sizes the font for it; tests/browser/test_book.py measures it).
PAGE_COLUMNS = 88


def cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def source(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_code_lines_fit_the_page(path):
    wide = [
        f"cell {index}: {len(line)} columns: {line.strip()[:60]}"
        for index, cell in enumerate(cells(path))
        if cell["cell_type"] == "code"
        for line in source(cell).splitlines()
        if len(line) > PAGE_COLUMNS
    ]
    assert not wide, f"{path.name}: lines over {PAGE_COLUMNS} columns:\n  " + "\n  ".join(wide)


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_setup_cell_is_collapsed_with_a_visible_note(path):
    setup = cells(path)[1]
    assert setup["cell_type"] == "code" and source(setup).startswith("# Set-up")
    meta = setup["metadata"]
    assert "hide-input" in meta.get("tags", []), "hidden on the web page (a toggle shows it)"
    assert meta.get("jupyter", {}).get("source_hidden") is True, "collapsed in JupyterLab"
    note = meta.get("mystnb", {}).get("code_prompt_show", "")
    assert "installs tinygpt" in note, "the web page's toggle says what the cell does"
    # JupyterLab shows a collapsed cell's first line: it says what the cell does.
    assert "install tinygpt" in source(setup).splitlines()[0]


BACKTICK_DIRECTIVE = re.compile(r"^\s*`{3,}\{[\w-]+\}", re.MULTILINE)
SOLUTION = re.compile(r"^:::\{(solution|solution-start)\}[^\n]*\n((?::[\w-]+:.*\n)*)", re.MULTILINE)


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_directives_use_colon_fences(path):
    """A ```{exercise} fence is a code block on Colab and GitHub (its math raw, its text in
    monospace); a :::{exercise} fence leaves the body as Markdown they render."""
    found = [
        f"cell {index}: {match.group(0).strip()}"
        for index, cell in enumerate(cells(path))
        if cell["cell_type"] == "markdown"
        for match in BACKTICK_DIRECTIVE.finditer(source(cell))
    ]
    assert not found, f"{path.name}: use ::: fences for directives:\n  " + "\n  ".join(found)


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_every_solution_starts_collapsed(path):
    markdown = "\n".join(source(c) for c in cells(path) if c["cell_type"] == "markdown")
    solutions = SOLUTION.findall(markdown)
    exercises = re.findall(r"^:::\{exercise\}", markdown, re.MULTILINE)
    assert len(solutions) == len(exercises), "one solution per exercise"
    open_ = [kind for kind, options in solutions if ":class: dropdown" not in options]
    assert not open_, f"{path.name}: solutions without `:class: dropdown`: {len(open_)}"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_code_of_a_solution_starts_collapsed_in_jupyterlab(path):
    """A solution whose code runs spans cells; JupyterLab cannot fold them into the solution's
    dropdown as the web page does, so each of its code cells starts collapsed, input and output."""
    inside, shown = False, []
    for index, cell in enumerate(cells(path)):
        text = source(cell)
        if cell["cell_type"] == "markdown" and ":::{solution-start}" in text:
            inside = True
        elif cell["cell_type"] == "markdown" and ":::{solution-end}" in text:
            inside = False
        elif inside and cell["cell_type"] == "code":
            lab = cell["metadata"].get("jupyter", {})
            if not (lab.get("source_hidden") and lab.get("outputs_hidden")):
                shown.append(index)
    assert not inside, "a solution-start without its solution-end"
    assert not shown, f"{path.name}: solution code cells not collapsed: {shown}"


markdown_it = pytest.importorskip("markdown_it")


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_plain_markdown_renderers_show_readable_text(path):
    """Where no MyST renderer runs (Colab, GitHub's notebook view), a chapter is read through a
    plain CommonMark renderer. Rendered by one (markdown-it-py, HTML allowed as those sites do):
    no exercise or solution is a code block, and every glued number is in the text, not in a
    comment or a raw HTML block."""
    md = markdown_it.MarkdownIt("commonmark", {"html": True})
    problems = []
    for index, cell in enumerate(cells(path)):
        if cell["cell_type"] != "markdown":
            continue
        text = source(cell)
        html = md.render(text)
        for kind in re.findall(r'<pre><code class="language-\{([\w-]+)\}', html):
            problems.append(f"cell {index}: a {kind} directive rendered as a code block")
        visible = re.sub(r"<!--.*?-->", "", html, flags=re.DOTALL)
        for match in re.finditer(r"<!--glue:[^>]*-->(.*?)<!--/glue-->", text):
            if match.group(1) not in visible:
                problems.append(f"cell {index}: glued value {match.group(1)!r} not shown")
    assert not problems, f"{path.name}:\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_source_excerpts_are_not_chosen_by_line_number(path):
    """``show.source(obj, lines=(25, 38))`` shows other lines as soon as the package's code above
    them changes (a docstring grows), and a page then shows a docstring's middle as code. A
    chapter finds an excerpt's lines by their text."""
    fixed = [
        f"cell {index}: {match.group(0)}"
        for index, cell in enumerate(cells(path))
        if cell["cell_type"] == "code"
        for match in re.finditer(r"lines=\(\s*\d+\s*,\s*\d+\s*\)", source(cell))
    ]
    assert not fixed, f"{path.name}: excerpts by fixed line numbers: {fixed}"
