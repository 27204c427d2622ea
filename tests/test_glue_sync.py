"""The glued numbers in the chapters' prose (book/_ext/book_glue.py).

A chapter writes a computed number into its prose as ``<!--glue:name:fmt-->value<!--/glue-->``:
JupyterLab, Colab and GitHub show ``value``; the book's build turns the span into MyST-NB's
``{glue:text}`name:fmt` `` role. These tests check that every written value is the value glued in
the committed notebook, formatted as MyST-NB formats it, and that the build's rewrite is right.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "book" / "_ext"))
import book_glue  # noqa: E402

# the chapters and the Under the hood pages: every notebook whose prose is glued
CHAPTERS = sorted((ROOT / "chapters").glob("[0-9][0-9]_*.ipynb")) + sorted(
    (ROOT / "chapters" / "under_the_hood").glob("*.ipynb"))


def markdown_sources(path: Path) -> list[str]:
    notebook = json.loads(path.read_text(encoding="utf-8"))
    return [
        "".join(cell["source"]) for cell in notebook["cells"] if cell["cell_type"] == "markdown"
    ]


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_every_glued_number_is_the_value_its_notebook_glued(path):
    notebook = json.loads(path.read_text(encoding="utf-8"))
    values = book_glue.glued_values(notebook)
    stale = []
    for source in markdown_sources(path):
        for match in book_glue.GLUED.finditer(source):
            name, fmt = match.group("name"), match.group("fmt") or ""
            assert name in values, f"{path.name}: nothing is glued under {name!r}"
            expected = book_glue.format_plain_text(values[name], fmt)
            if match.group("value") != expected:
                stale.append(f"{name}: prose {match.group('value')!r}, glued {expected!r}")
    assert not stale, (
        f"{path.name}: run `make format` (book/_ext/book_glue.py) to rewrite them:\n  "
        + "\n  ".join(stale)
    )


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_no_chapter_uses_the_glue_role_directly(path):
    """A bare ``{glue:text}`` role would read "name:fmt" in JupyterLab, Colab and GitHub."""
    raw = [s for s in markdown_sources(path) if "{glue" in s]
    assert not raw, f"{path.name}: write <!--glue:name:fmt-->value<!--/glue--> instead"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_no_line_starts_with_a_glued_span(path):
    """A line that starts with ``<!--`` opens a raw HTML block in CommonMark: JupyterLab and
    GitHub would then show the rest of that line, roles and all, as raw text."""
    starts = [s for s in markdown_sources(path) if re.search(r"^\s*<!--glue", s, re.MULTILINE)]
    assert not starts, f"{path.name}: a line starts with a glued span: move it into the line"


def test_the_build_turns_spans_into_roles():
    source = "loss <!--glue:ch8_val:.3f-->1.595<!--/glue--> and <!--glue:n-->12<!--/glue-->."
    assert book_glue.as_roles(source) == "loss {glue:text}`ch8_val:.3f` and {glue:text}`n`."


def test_sync_rewrites_a_stale_number_and_keeps_the_rest():
    source = "a <!--glue:x:.2f-->9.99<!--/glue--> b <!--glue:y:,d-->0<!--/glue--> c"
    assert book_glue.synced(source, {"x": "1.23456", "y": "1234567"}) == (
        "a <!--glue:x:.2f-->1.23<!--/glue--> b <!--glue:y:,d-->1,234,567<!--/glue--> c"
    )
    with pytest.raises(KeyError, match="nothing is glued"):
        book_glue.synced(source, {"x": "1.0"})


myst_variables = pytest.importorskip("myst_nb.core.variables")
FORMATS = ["", ".3f", ".0f", ".2e", ".1%", ",d", "d", ".4g", "s", ":>6.2f"[1:]]


@given(value=st.floats(allow_nan=False, allow_infinity=False), fmt=st.sampled_from(FORMATS))
def test_format_agrees_with_myst_nb(value, fmt):
    """The value written into the prose is the one MyST-NB's role shows on the web page."""
    text = repr(int(value)) if fmt.endswith("d") and abs(value) < 1e15 else repr(value)
    if fmt.endswith("d") and "e" in text:
        return
    assert book_glue.format_plain_text(text, fmt) == myst_variables.format_plain_text(text, fmt)


def test_format_of_a_glued_string_drops_its_quotes_like_myst_nb():
    for text, fmt in [("'Romeo'", ""), ("'Romeo'", "s"), ("'x y'", ">6s")]:
        assert book_glue.format_plain_text(text, fmt) == myst_variables.format_plain_text(text, fmt)
