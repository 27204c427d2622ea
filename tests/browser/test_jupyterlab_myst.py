"""Every chapter opened in JupyterLab renders its MyST.

JupyterLab's own Markdown renderer prints MyST roles and directives as literal text ("self-
{term}`attention`", a ```` ```{exercise} ```` block, a solution in plain view). With
jupyterlab-myst (the ``book`` extra, ``make lab``) they render. For each chapter this test opens
the notebook as a reader does (no kernel is needed: nothing is run) and checks, on the rendered
Markdown cells only (not the hidden editors):

* no raw role or directive syntax is left: no ``{term}`…``, ``{cite:p}`…``, no ``:::{…}``
  or ```` ```{…} ```` fence, no ``<!--glue`` marker;
* each exercise is a rendered exercise, each solution a collapsed dropdown, one per exercise
  (a solution whose code runs spans cells: its header shows and its code cells are collapsed);
* the glued numbers show as numbers (the value written in the prose, not "name:.3f");
* the set-up cell's code is collapsed;

and saves one screenshot per chapter in ``_build/screenshots/``.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from browser_support import REPO, SCREENSHOTS
from lab_support import lab_server

CHAPTERS = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "chapters").glob("[0-9]*.ipynb"))
RAW = re.compile(r"\{[a-z]+(?::[a-z]+)?\}`|^\s*(?::::|```)\s*\{|<!--glue", re.MULTILINE)
GLUED = re.compile(r"<!--glue:[^>]*-->(.*?)<!--/glue-->")
# JupyterLab's Markdown typesets quotes (book's -> book’s): compare the text a reader sees
# with the glued source through the plain quotes.
PLAIN_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"'})

# For each Markdown cell in the open notebook: its rendered text (the MyST widget only), the
# open state of every <details> it renders with its summary, and whether it has exercise boxes.
RENDERED = """() => {
  const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
  return Array.from(panel.querySelectorAll('.jp-MarkdownCell')).map(cell => {
    const myst = cell.querySelector('.lm-Widget.myst');
    return {
      rendered: !!myst,
      text: myst ? myst.innerText : '',
      details: myst ? Array.from(myst.querySelectorAll('details')).map(d => ({
        summary: (d.querySelector('summary') || {}).innerText || '', open: d.open})) : [],
    };
  });
}"""
OPEN_DETAILS = """() => {
  const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
  panel.querySelectorAll('.jp-MarkdownCell details').forEach(d => { d.open = true; });
}"""
SETUP_COLLAPSED = """() => {
  const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
  const first = panel.querySelector('.jp-CodeCell');
  return first.querySelector('.jp-InputPlaceholder') !== null
    && first.querySelector('.jp-InputArea-editor') === null
      || !!first.querySelector('.jp-Cell-inputWrapper .jp-InputPlaceholder');
}"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    with lab_server(tmp_path_factory.mktemp("lab"), CHAPTERS) as server:
        yield server


def markdown_cells(path: str) -> list[str]:
    notebook = json.loads((REPO / path).read_text(encoding="utf-8"))
    return ["".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == "markdown"]


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda c: Path(c).stem)
def test_chapter_renders_its_myst_in_jupyterlab(lab, browser, chapter):
    sources = markdown_cells(chapter)
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    context.set_default_timeout(60_000)
    page = context.new_page()
    try:
        # ?reset: a fresh workspace, with this chapter the only open document
        page.goto(f"{lab.url}/lab/tree/{chapter}?reset&token={lab.token}")
        page.locator(".jp-NotebookPanel .jp-Notebook .jp-Cell").first.wait_for()
        deadline = time.monotonic() + 60
        while True:
            cells = page.evaluate(RENDERED)
            if len(cells) == len(sources) and all(c["rendered"] for c in cells):
                break
            assert time.monotonic() < deadline, (
                f"{sum(c['rendered'] for c in cells)} of {len(sources)} Markdown cells rendered")
            page.wait_for_timeout(500)
        page.wait_for_timeout(1000)  # math and late widgets
        cells = page.evaluate(RENDERED)

        raw = [f"cell {i}: ...{m.group(0)}..." for i, c in enumerate(cells)
               for m in RAW.finditer(c["text"])]  # fmt: skip
        assert not raw, "raw MyST syntax in the rendered page:\n  " + "\n  ".join(raw)

        exercises = sum(len(re.findall(r"^:::\{exercise\}", s, re.MULTILINE)) for s in sources)
        solutions = [d for c in cells for d in c["details"] if d["summary"].startswith("Solution")]
        # A solution that runs code spans cells (solution-start ... solution-end): JupyterLab
        # shows its header, and its code cells are collapsed (tests/test_notebook_format.py).
        gated = sum(c["text"].count("Start of Solution") for c in cells)
        assert len(solutions) + gated == exercises > 0, (len(solutions), gated, exercises)
        assert not [d for d in solutions if d["open"]], "a solution starts open"
        text = "\n".join(c["text"] for c in cells)
        assert text.count("Exercise") >= 2 * exercises  # each box's title, each solution's link

        # a glued number inside a solution shows once the reader opens it
        page.evaluate(OPEN_DETAILS)
        opened = page.evaluate(RENDERED)
        for source, cell in zip(sources, opened):
            for value in GLUED.findall(source):
                shown = cell["text"].translate(PLAIN_QUOTES)
                assert value.translate(PLAIN_QUOTES) in shown, f"glued value {value!r} not shown"

        assert page.evaluate(SETUP_COLLAPSED), "the set-up cell's code is not collapsed"
    finally:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=SCREENSHOTS / f"jupyterlab-myst-{Path(chapter).stem}.png")
        context.close()
