"""A model for the reader's page: a GPT's config, weights and characters in files a browser reads.

``export_model(model, tokenizer, folder, name)`` writes three files into ``folder``:

* ``<name>.json``, the manifest: ``format`` ``"tinygpt-web-model"``, ``version`` 1, the
  ``GPTConfig`` as a dict, ``chars`` (the ``CharTokenizer``'s id -> character list), and each
  tensor's ``name`` (PyTorch's state-dict name), ``shape`` and byte ``offset`` in the weights,
  their total ``bytes`` and SHA-256;
* ``<name>.bin``, every tensor of the state dict in that order, float32 little-endian, row-major
  (a tied ``lm_head.weight`` is left out: the page uses the token table);
* ``<name>.js``, a classic script that registers the manifest and the weights under
  ``window.TINYGPT_MODELS[name]``: what the page loads when opened from disk (``file://``), where
  a browser refuses ``fetch``; a ``<script>`` tag still works there. Its weights are the
  ``.bin``'s bytes packed (``packing`` ``"shuffle4-deflate"``, ``pack_weights``): split into
  four planes (every float's first byte, then every second byte, ...), compressed with zlib's
  deflate and written in base64. The planes of exponent and sign bytes compress well, so the
  file is about 15% smaller than the plain base64 (a third larger than the ``.bin``) would be,
  which keeps the modern model's page from disk under 3 MB; the page unpacks it with the
  browser's own ``DecompressionStream`` (engine.js's ``unpackWeights``).

Each file is written to a temporary name and renamed into place; a file of that name that this
module did not write (another format) is refused, never replaced. The page's engine
(book/_static/tinygpt/engine.js) reads these files; ``book/_ext/book_web_models.py`` calls this
module when the book is built. It does not train or load models, nor export BPE tokenizers.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import os
import secrets
import zlib
from pathlib import Path
from typing import Any

import torch

from tinygpt.checks import check_instance
from tinygpt.model import GPT
from tinygpt.tokenizer import CharTokenizer

FORMAT, VERSION = "tinygpt-web-model", 1
_JS_MARK = "// tinygpt web model"  # the first line of every script this module writes


def weights_of(model: GPT) -> list[tuple[str, torch.Tensor]]:
    """The tensors the page needs, ``(state-dict name, float32 CPU tensor)``, in state-dict
    order; a tied output layer is left out."""
    out = []
    for name, t in model.state_dict().items():
        if name == "lm_head.weight" and model.config.tie_weights:
            continue  # the same tensor as transformer.embed.wte.weight
        out.append((name, t.detach().to("cpu", torch.float32).contiguous()))
    return out


def manifest_and_bytes(model: GPT, tokenizer: CharTokenizer, name: str
                       ) -> tuple[dict[str, Any], bytes]:
    """The manifest (a JSON-ready dict) and the weights' bytes of ``model``."""
    check_instance(model, GPT, "model")
    check_instance(tokenizer, CharTokenizer, "tokenizer")
    if tokenizer.vocab_size != model.config.vocab_size:
        raise ValueError(f"the tokenizer has {tokenizer.vocab_size} characters but the model's "
                         f"vocab_size is {model.config.vocab_size}")
    tensors, chunks, offset = [], [], 0
    for tensor_name, t in weights_of(model):
        data = t.numpy().astype("<f4").tobytes()  # little-endian float32, row-major
        tensors.append({"name": tensor_name, "shape": list(t.shape), "offset": offset})
        chunks.append(data)
        offset += len(data)
    blob = b"".join(chunks)
    manifest = {"format": FORMAT, "version": VERSION, "name": name,
                "config": dataclasses.asdict(model.config), "chars": list(tokenizer.chars),
                "tensors": tensors, "bytes": len(blob),
                "sha256": hashlib.sha256(blob).hexdigest()}
    return manifest, blob


PACKING = "shuffle4-deflate"


def pack_weights(blob: bytes) -> bytes:
    """The bytes of ``blob`` (float32 values, so a multiple of 4 long) in four planes, byte 0
    of every value, then byte 1, 2 and 3, compressed with zlib (RFC 1950, the "deflate" of a
    browser's ``DecompressionStream``). ``unpack_weights`` undoes it."""
    if len(blob) % 4:
        raise ValueError(f"the weights are float32 values: their byte count must be a multiple "
                         f"of 4, got {len(blob)}")
    planes = b"".join(blob[j::4] for j in range(4))
    return zlib.compress(planes, 9)


def unpack_weights(packed: bytes) -> bytes:
    """The bytes ``pack_weights`` packed: inflate, then interleave the four planes again."""
    planes = zlib.decompress(packed)
    n = len(planes) // 4
    out = bytearray(len(planes))
    for j in range(4):
        out[j::4] = planes[j * n:(j + 1) * n]
    return bytes(out)


def _ours(path: Path) -> bool:
    """Whether ``path`` is absent or a file this module wrote."""
    if not path.exists():
        return True
    if not path.is_file():
        return False
    if path.suffix == ".json":
        try:
            return json.loads(path.read_text(encoding="utf-8")).get("format") == FORMAT
        except (OSError, ValueError, AttributeError):
            return False
    if path.suffix == ".js":
        with path.open("rb") as f:
            return f.read(len(_JS_MARK)) == _JS_MARK.encode()
    return _ours(path.with_suffix(".json")) and path.with_suffix(".json").exists()


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{secrets.token_hex(4)}")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def export_model(model: GPT, tokenizer: CharTokenizer, folder: str | Path, name: str
                 ) -> dict[str, int]:
    """Write ``<name>.json``, ``<name>.bin`` and ``<name>.js`` into ``folder`` (created if
    missing); return each file's size in bytes."""
    check_instance(name, str, "name")
    if not name.isidentifier():
        raise ValueError(f"name must be a plain identifier (it names files and a JS key), got "
                         f"{name!r}")
    folder = Path(folder)
    manifest, blob = manifest_and_bytes(model, tokenizer, name)
    paths = {ext: folder / f"{name}.{ext}" for ext in ("bin", "json", "js")}
    # the .bin is judged by its manifest, so check before anything is written
    foreign = [str(p) for p in paths.values() if not _ours(p)]
    if foreign:
        raise FileExistsError(f"{foreign[0]} exists and was not written by tinygpt's web "
                              "export: refusing to replace it")
    folder.mkdir(parents=True, exist_ok=True)
    text = json.dumps(manifest, ensure_ascii=True)
    script = (f"{_JS_MARK} {name!r}: written by tinygpt.book.web_export when the book was "
              "built.\nwindow.TINYGPT_MODELS = window.TINYGPT_MODELS || {};\n"
              f"window.TINYGPT_MODELS[{json.dumps(name)}] = {{manifest: {text}, packing: "
              f"\"{PACKING}\", weights: \"{base64.b64encode(pack_weights(blob)).decode('ascii')}"
              "\"};\n")
    _write_atomic(paths["bin"], blob)
    _write_atomic(paths["json"], text.encode("utf-8"))
    _write_atomic(paths["js"], script.encode("utf-8"))
    return {p.name: p.stat().st_size for p in paths.values()}
