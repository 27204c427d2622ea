"""The reader's edition: the page teaches, the proof runs underneath.

What checks the book (nbval's cell tags, glued numbers) stays in the notebooks and runs in CI,
but the reader does not see it: no ``# NBVAL_*`` comment in a code cell, no ``glue(`` call
outside a cell the web page removes (and JupyterLab shows collapsed). And the chapters are a
length a reader finishes: at most 5,000 words of prose each, 50,000 together.

``python tests/test_reader_edition.py`` prints each chapter's words.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "chapters").glob("[0-9][0-9]_*.ipynb"))
# every page that runs: the chapters and the back matter's "Under the hood" notebooks
NOTEBOOKS = sorted((ROOT / "chapters").rglob("*.ipynb"))
CHAPTER_WORDS = 5_000
BOOK_WORDS = 50_000

FENCE = re.compile(r"^(`{3,}|:{3,}).*?^\1\s*$", re.MULTILINE | re.DOTALL)
OPTION_LINE = re.compile(r"^:[\w-]+:.*$", re.MULTILINE)
HTML_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
DIRECTIVE_LINE = re.compile(r"^(`{3,}|:{3,}).*$", re.MULTILINE)


def cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def source(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def prose_words(path: Path) -> int:
    """Words of prose in a chapter: its Markdown, less code blocks, directive fences and their
    option lines, and HTML comments (a glued number's comments, not the number, are left out).
    Text inside MyST directives (exercises, notes) is prose and counts."""
    words = 0
    for cell in cells(path):
        if cell["cell_type"] != "markdown":
            continue
        text = HTML_COMMENT.sub(" ", source(cell))
        # code blocks: ``` or ~~~ fences whose info string is not a {directive}
        text = re.sub(r"^(```|~~~)(?!\{)[^\n]*\n.*?^\1\s*$", " ", text, flags=re.M | re.DOTALL)
        text = OPTION_LINE.sub(" ", text)
        text = DIRECTIVE_LINE.sub(" ", text)
        words += len(text.split())
    return words


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_test_marker_comments_on_the_page(path):
    """nbval reads its cell tags (nbval-check-output); a comment would show on the page."""
    marked = [
        index
        for index, cell in enumerate(cells(path))
        if cell["cell_type"] == "code" and re.search(r"#\s*NBVAL", source(cell))
    ]
    assert not marked, f"{path.name}: cells {marked} carry a # NBVAL comment; use a cell tag"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_glue_calls_sit_in_removed_cells(path):
    """A number glued for the prose is computed where the reader sees it, and glued in a cell
    of its own that the web page removes and JupyterLab shows collapsed."""
    visible = []
    for index, cell in enumerate(cells(path)):
        if cell["cell_type"] != "code" or "glue(" not in source(cell):
            continue
        meta = cell.get("metadata", {})
        removed = "remove-cell" in meta.get("tags", [])
        collapsed = meta.get("jupyter", {}).get("source_hidden") is True
        if not (removed and collapsed):
            visible.append(index)
    assert not visible, f"{path.name}: cells {visible} show glue(...) calls to the reader"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_a_chapter_is_at_most_its_word_budget(path):
    words = prose_words(path)
    assert words <= CHAPTER_WORDS, f"{path.name}: {words:,} words, budget {CHAPTER_WORDS:,}"


def test_the_chapters_together_are_at_most_the_book_budget():
    total = sum(prose_words(path) for path in CHAPTERS)
    assert total <= BOOK_WORDS, f"the chapters have {total:,} words of prose, budget {BOOK_WORDS:,}"


def test_prose_words_leaves_out_code_comments_and_options(tmp_path):
    notebook = {
        "cells": [
            {"cell_type": "markdown", "metadata": {}, "source": [
                "Two words <!--glue:x:.2f-->1.00<!--/glue-->\n",
                "```python\nnot counted at all\n```\n",
                "~~~python\nnor this\n~~~\n",
                ":::{note}\n:class: dropdown\nthree more words\n:::\n",
            ]},
            {"cell_type": "code", "metadata": {}, "outputs": [], "source": ["a b c d"]},
        ]
    }  # fmt: skip
    path = tmp_path / "01_x.ipynb"
    path.write_text(json.dumps(notebook))
    assert prose_words(path) == 6  # "Two words 1.00" and "three more words"


if __name__ == "__main__":
    total = 0
    for path in CHAPTERS:
        words = prose_words(path)
        total += words
        flag = "  over" if words > CHAPTER_WORDS else ""
        print(f"{path.stem:24s} {words:6,d}{flag}")
    print(f"{'total':24s} {total:6,d}  (budget {BOOK_WORDS:,})")
    sys.exit(0)
