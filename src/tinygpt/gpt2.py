"""GPT-2 interoperability: OpenAI's tokenizer files, read into a :class:`BPETokenizer`.

It handles GPT-2's ``vocab.json`` and ``merges.txt`` (found and checked by :mod:`tinygpt.data`),
which spell bytes with printable characters (:func:`bytes_to_unicode`). It does not train or
apply merges (:mod:`tinygpt.bpe`, :mod:`tinygpt.tokenizer`).
"""

from __future__ import annotations

import json
from pathlib import Path

from tinygpt.data import get_path
from tinygpt.tokenizer import BPETokenizer

# --- tokenizer files: vocab.json and merges.txt ---

EOT = "<|endoftext|>"  # GPT-2's one special token, the last id (50256)


def tokenizer_files() -> tuple[Path, Path]:
    """Paths of GPT-2's ``vocab.json`` and ``merges.txt`` (the latter without its header)."""
    return get_path("gpt2/vocab.json"), get_path("gpt2/merges.txt")


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's table from each byte to a printable character, used in its vocabulary files.

    Printable Latin-1 bytes stand for themselves; the 68 others (controls, space, ...)
    get the characters 256, 257, ... in byte order, so a space is ``'Ġ'``.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    others = [b for b in range(256) if b not in table]
    table.update({b: chr(256 + k) for k, b in enumerate(others)})
    return table


def load_tokenizer(vocab_json: str | Path, merges_txt: str | Path) -> BPETokenizer:
    """GPT-2's tokenizer from its ``vocab.json`` and ``merges.txt`` (``#version`` line optional).

    The files' printable characters are turned back into bytes. ValueError if the files are
    unreadable or do not agree (merge ``i`` must make token ``256 + i``).
    """
    files = f"GPT-2 files {vocab_json} and {merges_txt}"
    decoder = {ch: b for b, ch in bytes_to_unicode().items()}
    try:
        vocab = json.loads(Path(vocab_json).read_text(encoding="utf-8"))
        lines = Path(merges_txt).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"cannot read {files}: {err}") from None
    try:
        eot_id = vocab.pop(EOT)
        by_id = sorted((i, t) for t, i in vocab.items())
        if [i for i, _ in by_id] != list(range(len(by_id))):
            raise ValueError("the ids of vocab.json are not 0, 1, 2... without gaps")
        tokens = [bytes(decoder[ch] for ch in t) for _, t in by_id]
        ids = {t: i for i, t in enumerate(tokens)}
        merges = []
        for line in lines:
            if line.strip() and not line.startswith("#version"):
                a, b = (bytes(decoder[ch] for ch in part) for part in line.split(" "))
                merges.append((ids[a], ids[b]))
        return BPETokenizer(tokens + [EOT.encode()], merges, "gpt2", {EOT: eot_id})
    except (AttributeError, KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{files} do not match or are not GPT-2's: "
                         f"{type(err).__name__} {err}") from None
