"""Code length of text under standard compressors: gzip, bzip2, xz and PPMd, per character.

Chapter 8 puts them beside the loss ladder, chapter 14 sets PPMd against dynamic evaluation, and
``tinygpt eval --compression`` measures them from the shell.

A compressor is a model of text: the shorter it writes a text, the more probable it found it, and
``8 × bytes`` of output is a code length in bits, the quantity a language model's loss measures in
nats (``bits × ln 2``). To put a compressor on the book's loss ladder it must be scored as the
models are, on the validation text *after* learning from the training text: its **conditional code
length** ``len(C(train + val)) − len(C(train))`` bytes, what the validation text costs once the
compressor has read the training text. Every text is compressed as its UTF-8 bytes; the code length
is divided by the number of *characters* of the validation text (not bytes: the book's loss is per
character; for the plays, which are ASCII, the two counts agree).

``Compressor`` names one compressor and its settings; ``code_length(compressor, text, context)``
measures ``text`` given ``context`` (empty: the text alone, as PPMd learns while it reads).
This module handles only these measurements; the book's split, and caching the results for the
chapters, are ``tinygpt.book.ladder``'s.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import math
from dataclasses import dataclass
from typing import Any

from tinygpt.checks import check_choice, check_instance, check_int, check_text

KINDS = ("gzip", "bzip2", "xz", "ppmd")
PPMD_MEMORY = 256 << 20  # bytes of model PPMd may build (above 64 MiB the book's results agree)
PPMD_VARIANT = "H"  # PPMd var. H (Ppmd7), the one 7-Zip's .7z format uses


@dataclass(frozen=True)
class Compressor:
    """One compressor and its settings: ``kind`` is ``gzip`` (level 9), ``bzip2`` (level 9),
    ``xz`` (preset 6, the default: its 8 MiB dictionary holds the whole of the plays' training
    text) or ``ppmd`` (variant H, contexts of up to ``order`` bytes, ``memory`` bytes of model).
    ``order`` and ``memory`` are PPMd's only, and required for it. Checked when created."""

    kind: str
    order: int | None = None
    memory: int = PPMD_MEMORY

    def __post_init__(self) -> None:
        check_choice(self.kind, "compressor kind", KINDS)
        if self.kind == "ppmd":
            check_int(self.order, "PPMd order", 2, 64)  # pyppmd's range for variant H
            check_int(self.memory, "PPMd memory (bytes)", 1 << 11, (1 << 32) - 36)
        elif self.order is not None:
            raise ValueError(f"order is PPMd's setting; {self.kind} has none, got {self.order!r}")

    @property
    def title(self) -> str:
        """Its name on a page: ``gzip -9``, ``PPMd order 8``."""
        return {"gzip": "gzip -9", "bzip2": "bzip2 -9", "xz": "xz -6"}.get(
            self.kind, f"PPMd order {self.order}")

    def recipe(self) -> dict[str, Any]:
        """Everything that fixes its output, as JSON."""
        out: dict[str, Any] = {"kind": self.kind}
        if self.kind == "ppmd":
            out |= {"order": self.order, "memory": self.memory, "variant": PPMD_VARIANT}
        return out

    def compress(self, raw: bytes) -> bytes:
        """``raw`` compressed (deterministic: gzip's header carries no time)."""
        check_instance(raw, (bytes, bytearray), "raw")
        if self.kind == "gzip":
            return gzip.compress(raw, compresslevel=9, mtime=0)
        if self.kind == "bzip2":
            return bz2.compress(raw, compresslevel=9)
        if self.kind == "xz":
            return lzma.compress(raw, preset=6)
        import pyppmd  # a book dependency: only PPMd needs it

        assert self.order is not None  # checked when created
        return pyppmd.compress(raw, max_order=self.order, mem_size=self.memory,
                               variant=PPMD_VARIANT)


@dataclass(frozen=True)
class CodeLength:
    """What ``text`` cost a compressor: ``bits`` (8 × bytes of output; for a conditional code
    length, the bytes it added to the context's), over ``chars`` characters (``utf8_bytes`` bytes
    of UTF-8)."""

    compressor: Compressor
    bits: int
    chars: int
    utf8_bytes: int
    given_context: bool

    @property
    def bits_per_char(self) -> float:
        return self.bits / self.chars

    @property
    def nats_per_char(self) -> float:
        """Bits per character × ln 2: on the scale of the book's loss."""
        return self.bits_per_char * math.log(2)

    def to_json(self) -> dict[str, Any]:
        return {"compressor": self.compressor.recipe(), "title": self.compressor.title,
                "bits": self.bits, "chars": self.chars, "utf8_bytes": self.utf8_bytes,
                "given_context": self.given_context, "bits_per_char": self.bits_per_char,
                "nats_per_char": self.nats_per_char}


def code_length(compressor: Compressor, text: str, context: str = "") -> CodeLength:
    """The code length of ``text`` under ``compressor``, given ``context``:
    ``8 × (len(C(context + text)) − len(C(context)))`` bits (UTF-8 bytes in; with no context,
    ``8 × len(C(text))``). ``text`` must hold at least one character."""
    check_instance(compressor, Compressor, "compressor")
    check_text(text, "text")
    check_text(context, "context")
    if not text:
        raise ValueError("text must hold at least one character to measure its code length")
    raw, before = text.encode("utf-8"), context.encode("utf-8")
    total = len(compressor.compress(before + raw))
    added = total - len(compressor.compress(before)) if before else total
    return CodeLength(compressor, 8 * added, len(text), len(raw), bool(before))
