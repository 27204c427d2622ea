"""Show, inside the book, the source code that actually runs.

Its main job: ``source(obj)`` takes a function, class, method or module (of tinygpt, or any
Python object whose source file can be found) and returns a displayable object with that code,
headed by where it lives (``tinygpt/data.py, lines 120-141``), so the reader sees the very code
the chapter then calls, never a copy that could drift from it.

Two small companions display what chapters compute: ``table(rows, headers)`` (a Markdown table
that also prints as aligned text, so checked outputs compare the numbers) and ``tokens(pieces)``
(text pieces on alternating coloured backgrounds, to make token boundaries visible).

It does not run, edit or diff code, and it cannot show objects without Python source (builtins,
C extensions), for which it raises ``TypeError``.

Why Markdown: the object gives ``text/markdown`` (a header line and a fenced ``python`` block) and
``text/plain``, and deliberately no ``text/html``. JupyterLab renders the fenced block with its own
syntax highlighting. The book's builder (myst-nb) would pick ``text/html`` first when present, but
given ``text/markdown`` it emits an ordinary Sphinx code block, highlighted with the book theme's
own colours (light and dark). ``IPython.display.Code`` was not used: its HTML opens with a
``<style>`` block of page-wide rules (``pre { ... }`` and the classic notebook's ``.output_html``
classes) that leaks into the rest of the book's page.
"""

from __future__ import annotations

import html
import inspect
import re
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType


@dataclass(frozen=True)
class SourceCode:
    """Source text with its location; displays as Markdown in notebooks, as text elsewhere."""

    code: str
    path: str
    first_line: int
    last_line: int
    title: str = ""
    language: str = "python"

    @property
    def where(self) -> str:
        """The file and line range, e.g. ``tinygpt/data.py, lines 120-141``."""
        return f"{self.path}, lines {self.first_line}\u2013{self.last_line}"

    def _repr_markdown_(self) -> str:
        longest = max((len(run) for run in re.findall(r"`+", self.code)), default=0)
        fence = "`" * max(3, longest + 1)
        path, lines = self.where.split(", ", 1)
        title = f"`{self.title}` in " if self.title else ""
        return (
            f"{title}`{path}`, {lines}\n\n{fence}{self.language}\n{self.code.rstrip()}\n{fence}\n"
        )

    def __repr__(self) -> str:
        title = f"{self.title} in " if self.title else ""
        return f"# {title}{self.where}\n{self.code.rstrip()}"

    def __str__(self) -> str:
        return self.code


def _display_path(filename: str, obj: object) -> str:
    """``filename`` relative to the folder holding the object's top-level package."""
    path = Path(filename).resolve()
    module = obj if isinstance(obj, ModuleType) else inspect.getmodule(obj)
    top = sys.modules.get(module.__name__.partition(".")[0]) if module else None
    top_file = getattr(top, "__file__", None)
    if top_file:
        root = Path(top_file).resolve().parent
        if Path(top_file).name == "__init__.py":  # a package: show "tinygpt/data.py"
            root = root.parent
        if path.is_relative_to(root):
            return path.relative_to(root).as_posix()
    return path.name


def _lines_of(obj: object) -> tuple[list[str], int, str]:
    """The source lines of ``obj``, the file line number of the first one, and the file name."""
    if isinstance(obj, property) and obj.fget is not None:
        obj = obj.fget
    obj = inspect.unwrap(obj) if callable(obj) else obj  # through functools.cache, wraps...
    try:
        # any object: inspect raises TypeError for one without Python source, caught below
        lines, start = inspect.getsourcelines(obj)  # type: ignore[arg-type]
        filename = inspect.getsourcefile(obj)  # type: ignore[arg-type]  # (the same)
    except (TypeError, OSError) as error:
        raise TypeError(f"cannot show {obj!r}: it has no Python source ({error})") from error
    if filename is None:
        raise TypeError(f"cannot show {obj!r}: its source file is unknown")
    return lines, max(start, 1), filename


def _name(obj: object) -> str:
    return getattr(obj, "__qualname__", None) or getattr(obj, "__name__", "") or ""


def source(
    obj: object,
    *,
    lines: tuple[int, int] | None = None,
    members: list[str] | tuple[str, ...] | None = None,
) -> SourceCode:
    """The source of a function, class, method or module, ready to display in a notebook.

    ``lines=(first, last)`` keeps only those lines, counted from 1 within the object's own source
    (not the file), both included, so they do not move when code above the object changes; the
    part is de-indented. A whole object is shown exactly as ``inspect.getsource`` gives it.
    ``members=["encode", "decode"]`` shows only those members of a class, after its first line.
    Raises ``TypeError`` for objects without Python source, ``ValueError`` for bad arguments.
    """
    if lines is not None and members is not None:
        raise ValueError("give lines= or members=, not both")
    if members is not None:
        return _members_of(obj, members)
    code_lines, start, filename = _lines_of(obj)
    path = _display_path(filename, obj)
    if lines is None:
        first, last = 1, len(code_lines)
    else:
        first, last = lines
        if not 1 <= first <= last <= len(code_lines):
            raise ValueError(
                f"lines={lines!r} is outside {_name(obj)}'s {len(code_lines)} lines of source"
            )
    chosen = code_lines[first - 1 : last]
    code = "".join(chosen)
    if lines is not None:
        code = textwrap.dedent(code)
    return SourceCode(code, path, start + first - 1, start + last - 1, _name(obj))


def _members_of(cls: object, members: list[str] | tuple[str, ...]) -> SourceCode:
    """A class's first line followed by the source of the named members, in the order given."""
    if not inspect.isclass(cls):
        raise TypeError(f"members= needs a class, got {cls!r}")
    class_lines, start, filename = _lines_of(cls)
    header_index = next(
        i for i, line in enumerate(class_lines) if line.lstrip().startswith("class ")
    )
    parts = [class_lines[header_index].rstrip("\n")]
    last = start + header_index
    for member in members:
        if member not in vars(cls):
            raise ValueError(f"{_name(cls)} has no member {member!r} of its own")
        attribute = vars(cls)[member]
        target = attribute.fget if isinstance(attribute, property) else attribute
        target = getattr(target, "__func__", target)  # staticmethod / classmethod
        member_lines, member_start, _ = _lines_of(target)
        parts += ["    ...", "".join(member_lines).rstrip("\n")]
        last = max(last, member_start + len(member_lines) - 1)
    title = f"{_name(cls)}: {', '.join(members)}"
    path = _display_path(filename, cls)
    return SourceCode("\n".join(parts) + "\n", path, start + header_index, last, title)


@dataclass(frozen=True)
class Table:
    """Rows of values under headers; Markdown in notebooks, aligned plain text elsewhere."""

    rows: tuple[tuple[str, ...], ...]
    headers: tuple[str, ...]

    def _repr_markdown_(self) -> str:
        def line(cells: tuple[str, ...]) -> str:
            return "| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |"

        rule = "|" + "|".join("---" for _ in self.headers) + "|"
        return "\n".join([line(self.headers), rule, *(line(row) for row in self.rows)]) + "\n"

    def __repr__(self) -> str:
        rows = (self.headers, *self.rows)
        widths = [max(len(r[i]) for r in rows) for i in range(len(self.headers))]
        return "\n".join(
            "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()
            for row in (self.headers, *self.rows)
        )


def table(rows: list | tuple, headers: list[str] | tuple[str, ...]) -> Table:
    """A table of ``rows`` (sequences of values, shown with ``str``) under ``headers``."""
    headers = tuple(str(h) for h in headers)
    cells = tuple(tuple(str(value) for value in row) for row in rows)
    for i, row in enumerate(cells):
        if len(row) != len(headers):
            raise ValueError(f"row {i} has {len(row)} values for {len(headers)} headers: {row!r}")
    return Table(cells, headers)


# Light backgrounds with dark text stay readable on the book's light and dark themes.
_TOKEN_COLOURS = ("#fde2a8", "#c9e7f5", "#d5f0c4", "#f7cfe0", "#e0d7f7")


@dataclass(frozen=True)
class Tokens:
    """Pieces of text shown side by side on alternating colours, so boundaries are visible."""

    pieces: tuple[str, ...]

    def _repr_html_(self) -> str:
        spans = []
        for i, piece in enumerate(self.pieces):
            shown = html.escape(piece).replace(" ", "&nbsp;")
            shown = shown.replace("\n", "\u21b5").replace("\t", "\u21e5")
            colour = _TOKEN_COLOURS[i % len(_TOKEN_COLOURS)]
            spans.append(
                f'<span style="background:{colour};color:#111;padding:1px 0;'
                f'font-family:monospace;white-space:pre">{shown}</span>'
            )
        return f'<div style="line-height:1.9">{"".join(spans)}</div>'

    def __repr__(self) -> str:
        return "|".join(self.pieces).replace("\n", "\u21b5")


def tokens(pieces: list[str] | tuple[str, ...]) -> Tokens:
    """Display text pieces (e.g. decoded tokens) with their boundaries made visible."""
    if isinstance(pieces, str) or not all(isinstance(p, str) for p in pieces):
        raise TypeError("tokens() takes a list of strings, e.g. decoded tokens")
    return Tokens(tuple(pieces))
