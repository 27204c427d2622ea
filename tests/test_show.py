"""Tests for tinygpt.book.show: the displayed code is the real source, located, and renders."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest
from IPython.core.formatters import DisplayFormatter

from tinygpt import data, shakespeare
from tinygpt.book import show
from tinygpt.files.reading import sha256_of


def _with_a_fence() -> str:
    """Returns Markdown containing a code fence: ```python ... ```."""
    return "```python\nprint('hi')\n```"


def test_function_source_is_the_real_one() -> None:
    shown = show.source(data.get_path)
    lines, start = inspect.getsourcelines(data.get_path)
    assert shown.code == inspect.getsource(data.get_path) == "".join(lines)
    assert (shown.path, shown.first_line, shown.last_line) == (
        "tinygpt/data.py",
        start,
        start + len(lines) - 1,
    )
    file_lines = Path(data.__file__).read_text(encoding="utf-8").splitlines(keepends=True)
    assert "".join(file_lines[shown.first_line - 1 : shown.last_line]) == shown.code


def test_header_names_the_file_and_lines() -> None:
    shown = show.source(data.load_text)
    header = f"tinygpt/data.py, lines {shown.first_line}\u2013{shown.last_line}"
    assert repr(shown).startswith(f"# load_text in {header}\n")
    markdown = shown._repr_markdown_()
    assert markdown.startswith(f"`load_text` in `tinygpt/data.py`, lines {shown.first_line}")
    assert f"```python\n{shown.code}```\n" in markdown


def test_notebook_gets_markdown_and_text_but_no_html() -> None:
    bundle, _ = DisplayFormatter().format(show.source(sha256_of))
    assert set(bundle) == {"text/markdown", "text/plain"}
    assert "def sha256_of" in bundle["text/markdown"] and "def sha256_of" in bundle["text/plain"]
    json.dumps(bundle)  # storable in a notebook


def test_modules_classes_methods_and_wrapped_functions() -> None:
    module = show.source(data)
    assert module.code == Path(data.__file__).read_text(encoding="utf-8")
    assert module.first_line == 1
    assert show.source(data.Dataset).code == inspect.getsource(data.Dataset)
    method = show.source(show.SourceCode._repr_markdown_)
    assert method.code.lstrip().startswith("def _repr_markdown_")
    assert method.title == "SourceCode._repr_markdown_"
    cached = show.source(shakespeare.shakespeare)  # behind functools.cache
    assert "def shakespeare() -> str:" in cached.code


def test_part_of_an_object() -> None:
    whole = inspect.getsource(data.get_path).splitlines(keepends=True)
    part = show.source(data.get_path, lines=(2, 4))
    assert part.code == "".join(line[4:] if line.strip() else line for line in whole[1:4])
    assert part.code.startswith('"""The local path')  # de-indented
    assert part.first_line == show.source(data.get_path).first_line + 1
    assert part.last_line == part.first_line + 2
    with pytest.raises(ValueError, match="outside"):
        show.source(data.get_path, lines=(5, len(whole) + 1))


def test_members_of_a_class() -> None:
    shown = show.source(show.SourceCode, members=["where", "__repr__"])
    assert shown.code.startswith("class SourceCode:\n")
    assert inspect.getsource(show.SourceCode.__repr__) in shown.code
    assert inspect.getsource(show.SourceCode.where.fget) in shown.code
    assert "_repr_markdown_" not in shown.code
    with pytest.raises(ValueError, match="no member"):
        show.source(show.SourceCode, members=["nothing"])
    with pytest.raises(TypeError):
        show.source(data.get_path, members=["x"])


def test_code_containing_a_fence_keeps_its_block_closed() -> None:
    markdown = show.source(_with_a_fence)._repr_markdown_()
    assert "\n````python\n" in markdown and markdown.endswith("\n````\n")


@pytest.mark.parametrize("obj", [len, int, dict.get, 42])
def test_objects_without_source_are_a_type_error(obj: object) -> None:
    with pytest.raises(TypeError, match="no Python source"):
        show.source(obj)


def test_table_renders_markdown_and_aligned_text():
    t = show.table([[1, "a|b"], [22, "c"]], ["n", "s"])
    md = t._repr_markdown_().splitlines()
    assert md[0] == "| n | s |"
    assert md[2] == "| 1 | a\\|b |"  # a pipe inside a cell must not open a new column
    assert repr(t).splitlines() == ["n   s", "1   a|b", "22  c"]


def test_table_rejects_ragged_rows():
    with pytest.raises(ValueError, match="row 1 has 1 values for 2 headers"):
        show.table([[1, 2], [3]], ["a", "b"])


def test_tokens_shows_every_piece_with_visible_whitespace():
    t = show.tokens(["Hello", " wor<ld", "\n"])
    page = t._repr_html_()
    assert page.count("<span") == 3
    assert "&nbsp;wor&lt;ld" in page and "\u21b5" in page  # escaped, spaces and newline visible
    assert repr(t) == "Hello| wor<ld|\u21b5"
    with pytest.raises(TypeError):
        show.tokens("Hello")
