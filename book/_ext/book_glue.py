"""Glued numbers that read right everywhere: on the web, in JupyterLab, on Colab and GitHub.

A number a cell computed is written into the chapter's prose as the number itself, between two
HTML comments that name where it comes from::

    the validation loss reaches <!--glue:ch8_val_loss:.3f-->1.595<!--/glue--> nats

* In JupyterLab, Colab and GitHub's notebook view the comments are invisible and the sentence
  reads "the validation loss reaches 1.595 nats". (MyST-NB's ``{glue:text}`` role, which these
  renderers do not know, would show "ch8_val_loss:.3f" there instead of the number.)
* When the book is built, this extension turns each such span back into the role
  ``{glue:text}`ch8_val_loss:.3f` `` before MyST-NB reads the chapter, so the web page shows the
  value glued by the run that built it, even on a machine whose last digits differ.
* The number written between the comments is the value glued in the committed notebook,
  formatted by the same rule as MyST-NB's role. ``python book/_ext/book_glue.py chapters/*.ipynb``
  rewrites every such number from the notebook's own outputs (run it after executing a chapter);
  ``tests/test_glue_sync.py`` fails while a number differs from its glued value.
"""

from __future__ import annotations

import json
import re
import sys
from ast import literal_eval
from pathlib import Path

# <!--glue:NAME:FORMAT-->VALUE<!--/glue-->; FORMAT is a format specification (possibly empty).
GLUED = re.compile(r"<!--glue:(?P<name>[\w.-]+)(?::(?P<fmt>[^>]*?))?-->(?P<value>.*?)<!--/glue-->")
MIME_PREFIX = "application/papermill.record/"


def format_plain_text(text: str, fmt: str) -> str:
    """A glued ``text/plain`` value formatted as MyST-NB's ``{glue:text}`` role formats it."""
    try:
        value = literal_eval(text)
    except (SyntaxError, ValueError):
        value = text
    if not fmt:
        return str(value)
    kind = fmt[-1]
    if kind == "s":
        value = str(value)
    elif kind in "bcdoxX":
        value = int(value)
    elif kind in "eEfFgGn%":
        value = float(value)
    return format(value, fmt)


def glued_values(notebook: dict) -> dict[str, str]:
    """The ``text/plain`` value of every name glued by the notebook's code cells."""
    values = {}
    for cell in notebook["cells"]:
        for output in cell.get("outputs", []) if cell["cell_type"] == "code" else []:
            scrapbook = output.get("metadata", {}).get("scrapbook")
            if scrapbook:
                prefix = scrapbook.get("mime_prefix", MIME_PREFIX)
                text = output.get("data", {}).get(prefix + "text/plain")
                if text is not None:
                    values[scrapbook["name"]] = "".join(text) if isinstance(text, list) else text
    return values


def synced(source: str, values: dict[str, str]) -> str:
    """``source`` with every glued span's number rewritten from ``values``."""

    def fill(match: re.Match) -> str:
        name, fmt = match.group("name"), match.group("fmt") or ""
        if name not in values:
            raise KeyError(f"nothing is glued under the name {name!r}")
        return f"<!--glue:{name}{':' + fmt if fmt else ''}-->" \
            f"{format_plain_text(values[name], fmt)}<!--/glue-->"

    return GLUED.sub(fill, source)


def as_roles(source: str) -> str:
    """``source`` with every glued span replaced by MyST-NB's ``{glue:text}`` role."""
    def role(match: re.Match) -> str:
        fmt = match.group("fmt")
        return f"{{glue:text}}`{match.group('name')}{':' + fmt if fmt else ''}`"

    return GLUED.sub(role, source)


def _cell_source(cell: dict) -> str:
    source = cell["source"]
    return "".join(source) if isinstance(source, list) else source


def sync_notebook(path: Path) -> bool:
    """Rewrite the glued numbers of the notebook at ``path``; whether anything changed."""
    import nbformat

    notebook = nbformat.read(path, as_version=4)
    values = glued_values(notebook)
    changed = False
    for cell in notebook.cells:
        if cell.cell_type == "markdown":
            after = synced(cell.source, values)
            if after != cell.source:
                cell.source = after
                changed = True
    if changed:
        nbformat.write(notebook, path)
    return changed


def _source_read(app, docname: str, source: list[str]) -> None:
    """Before MyST-NB reads a notebook, turn its glued spans into ``{glue:text}`` roles."""
    if not str(app.env.doc2path(docname)).endswith(".ipynb") or "<!--glue:" not in source[0]:
        return
    notebook = json.loads(source[0])
    for cell in notebook["cells"]:
        if cell["cell_type"] == "markdown":
            cell["source"] = as_roles(_cell_source(cell))
    source[0] = json.dumps(notebook)


def setup(app) -> dict:
    app.connect("source-read", _source_read)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


if __name__ == "__main__":
    for name in sys.argv[1:]:
        if sync_notebook(Path(name)):
            print(f"{name}: glued numbers rewritten from its outputs")
