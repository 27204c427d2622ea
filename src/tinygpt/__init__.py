"""tinygpt: the package built, one concept at a time, by the book *Build a GPT from scratch*.

Most top-level modules hold one concept of a chapter and say which; the subpackages (book, cli,
checkpoint, files, prepare, exercises, figures) and a few shared modules (checks, data,
shakespeare, shards, stream, runtime) are the infrastructure around them. Chapters import from
here instead of copying code.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only for type checkers: importing torch here would slow down every import
    from tinygpt.model import GPT
    from tinygpt.tokenizer import BPETokenizer, CharTokenizer

__version__ = "0.1.0"


def load(path: str | os.PathLike[str]) -> tuple[GPT, CharTokenizer | BPETokenizer | None]:
    """The ``(model, tokenizer)`` of the checkpoint folder ``path`` (model in eval mode, CPU).

    A shortcut for ``tinygpt.checkpoint.load_checkpoint(path)``, imported only when called.
    """
    from tinygpt.checkpoint import load_checkpoint

    checkpoint = load_checkpoint(path)
    return checkpoint.model, checkpoint.tokenizer
