"""Text a reader typed, mapped to the characters a character-level model knows.

Command-line machinery: ``tinygpt chat`` and ``tinygpt finetune`` fold the text they are
given with it.

A model trained on the plays knows a few dozen characters; a reader types curly quotes, accents,
dashes, digits the plays never print. ``fold`` maps each character the model does not know to
the nearest one it knows, and drops the rest, saying what it did:

- the typographic characters a keyboard or a word processor writes: curly quotes to straight
  ones (a double quote to a single one if it must), dashes to ``-``, an ellipsis to ``...``,
  a no-break space to a space;
- a character whose Unicode compatibility decomposition (NFKD) is made of known characters and
  combining marks: ``é`` -> ``e``, ``ﬁ`` -> ``fi``, ``²`` -> ``2``;
- a character whose other case is known (a model of lower-case text);
- a number with a digit the model does not know: spelled out, digit by digit (``1603`` ->
  ``one six nought three``), since a digit replaced by another would change what it says.

What is left is dropped. Every change is recorded with its position in the reader's text
(``Change``). It handles only characters; it does not tokenize (``tinygpt.tokenizer``) and
knows nothing of the chat template (``tinygpt.chat``), whose special tokens a caller refuses
before folding.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Collection
from dataclasses import dataclass

TYPOGRAPHIC = {"\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'", "\u2032": "'",
               "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u201f": '"', "\u2033": '"',
               "\u00ab": '"', "\u00bb": '"', "\u2010": "-", "\u2011": "-", "\u2012": "-",
               "\u2013": "-", "\u2014": "-", "\u2015": "-", "\u2212": "-", "\u2026": "...",
               "\u00a0": " ", "\u2009": " ", "\u202f": " ", "\t": " "}
DIGIT_WORDS = ("nought", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
_DIGITS = re.compile(r"\d+")


@dataclass(frozen=True)
class Change:
    """``original`` at ``position`` (0-based, in the text given to ``fold``) became ``new``
    (empty: dropped)."""

    position: int
    original: str
    new: str


@dataclass(frozen=True)
class Folded:
    """The folded ``text`` and its ``changes``, in order."""

    text: str
    changes: tuple[Change, ...]

    @property
    def dropped(self) -> tuple[Change, ...]:
        return tuple(c for c in self.changes if not c.new)

    @property
    def mapped(self) -> tuple[Change, ...]:
        return tuple(c for c in self.changes if c.new)


def nearest(char: str, known: Collection[str]) -> str:
    """What ``fold`` writes for one character not in ``known``: the characters it maps to, or
    ``""`` (dropped)."""
    candidates = [TYPOGRAPHIC.get(char, "")]
    decomposed = unicodedata.normalize("NFKD", char)
    candidates.append("".join(c for c in decomposed if not unicodedata.combining(c)))
    candidates += [char.lower(), char.upper()]
    candidates += [c.replace('"', "'") for c in candidates]  # no double quote: a single one
    for candidate in candidates:
        candidate = TYPOGRAPHIC.get(candidate, candidate)
        if candidate and candidate != char and all(c in known for c in candidate):
            return candidate
    if unicodedata.decimal(char, None) is not None:
        return DIGIT_WORDS[unicodedata.decimal(char)]
    return ""


def spelled(number: str, known: Collection[str]) -> str | None:
    """``number`` (a run of digits) spelled digit by digit, if one of its digits is unknown and
    the words are made of known characters; else None (left to ``nearest``)."""
    if all(c in known for c in number):
        return None
    words = " ".join(DIGIT_WORDS[unicodedata.decimal(c)] for c in number)
    return words if all(c in known for c in words) else None


def fold(text: str, known: Collection[str]) -> Folded:
    """``text`` with every character not in ``known`` mapped to its nearest known characters
    or dropped (the module's rules), and the changes made."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    known = frozenset(known)
    out: list[str] = []
    changes: list[Change] = []
    numbers = {m.start(): m.group() for m in _DIGITS.finditer(text)}
    i = 0
    while i < len(text):
        number = numbers.get(i)
        words = None if number is None else spelled(number, known)
        if number is not None and words is not None:
            out.append(words)
            changes.append(Change(i, number, words))
            i += len(number)
            continue
        char = text[i]
        if char in known:
            out.append(char)
        else:
            new = nearest(char, known)
            out.append(new)
            changes.append(Change(i, char, new))
        i += 1
    return Folded("".join(out), tuple(changes))


def describe(folded: Folded, first: int = 1, limit: int = 4) -> str | None:
    """One line saying what ``fold`` changed (positions counted from ``first``), at most
    ``limit`` of each kind shown; None if it changed nothing."""
    parts = []
    for changes, verb in ((folded.mapped, "mapped"), (folded.dropped, "dropped")):
        if not changes:
            continue
        shown = ", ".join(
            f"{c.original!r} at {c.position + first}" + (f" -> {c.new!r}" if c.new else "")
            for c in changes[:limit])
        more = f" and {len(changes) - limit} more" if len(changes) > limit else ""
        parts.append(f"{verb} {len(changes)} ({shown}{more})")
    return "; ".join(parts) or None
