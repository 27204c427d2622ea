"""Checking a checkpoint's files before anything is allocated: the manifest (format, version,
checksum), the model config's dimensions (bounded, and matched against the shapes the weights
file's header gives, before the config builds anything), each file's size and SHA-256 against
it, the layout a model config implies (built on
the meta device), safetensors headers against that layout and the file's length, finiteness of
tensors, and RNG states. Used by ``tinygpt.checkpoint``; every problem raises ``CheckpointError``
naming the file.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from torch import Tensor

from tinygpt.checkpoint.folder import (
    FORMAT,
    MANIFEST,
    MODEL_FILE,
    OPTIMIZER_FILE,
    VERSION,
    CheckpointError,
    MissingCheckpointFile,
    open_version_file,
    read_checkpoint_file,
)
from tinygpt.config import GPTConfig
from tinygpt.files.manifest import parse_manifest
from tinygpt.files.reading import MAX_JSON
from tinygpt.model import GPT

Layout = dict[str, tuple[str, tuple[int, ...]]]  # stored tensor name -> (dtype, shape)
DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16",
          torch.float64: "F64", torch.int64: "I64"}
SIZES = {"F32": 4, "BF16": 2, "F16": 2, "F64": 8, "I64": 8}


def read_checkpoint_manifest(folder: Path) -> tuple[bytes, dict[str, Any]]:
    """The manifest of ``folder``: its bytes and, checked (format, version, checksum:
    ``tinygpt.files.manifest.parse_manifest``), its content without the checksum."""
    path = folder / MANIFEST
    try:
        raw = read_checkpoint_file(path, max_size=MAX_JSON)
    except MissingCheckpointFile:
        raise CheckpointError(f"{path}: missing; is {folder} a checkpoint?") from None
    return raw, parse_manifest(raw, path, FORMAT, VERSION, CheckpointError,
                               "load another checkpoint or train anew")


def read_files(version: Path, files: dict[str, Any],
               config: GPTConfig) -> tuple[dict[str, bytes], tuple[Layout, dict[str, str]]]:
    """The bytes of the version folder's ``files`` (name -> its manifest entry), each checked
    against its size and SHA-256, and the layout of ``config``."""
    # Open every file at once: a save that replaces this version can remove the files, but
    # not what is open; the contents are read after the sizes are known to be sane.
    fds = {name: open_version_file(version / name) for name in files}
    try:
        check_dimensions(config, version.parent / MANIFEST)
        peeked = peek_header(fds[MODEL_FILE], version / MODEL_FILE) if MODEL_FILE in fds \
            else None
        if peeked is not None:  # the header says what the model is: the config must agree
            check_config_fits(config, peeked, version / MODEL_FILE)
        found = layout(config)  # sizes follow from it, before any read
        weights = sum(SIZES.get(dtype, 8) * numel(shape) for dtype, shape in found[0].values())
        limits = {MODEL_FILE: weights + 2**20, OPTIMIZER_FILE: 3 * weights + 2**20}
        blobs = {}
        for name, entry in files.items():
            path, size = version / name, int(entry["size"])
            if size > limits.get(name, MAX_JSON):
                raise CheckpointError(f"{path}: {size} bytes, more than a checkpoint of this "
                                      f"model config can hold ({limits.get(name, MAX_JSON)})")
            blobs[name] = read_checkpoint_file(path, size=size, fd=fds.pop(name))
            if hashlib.sha256(blobs[name]).hexdigest() != entry["sha256"]:
                raise CheckpointError(f"{path}: its SHA-256 differs from the one in {MANIFEST}: "
                                      f"the file is truncated or corrupt ({size} bytes)")
    finally:
        for fd in fds.values():  # those not read: an error came first
            os.close(fd)
    return blobs, found


# The largest model config a checkpoint may hold, dimension by dimension: far beyond any model
# tinygpt trains (GPT-2 XL: 48 blocks of width 1,600, context 1,024, 50,257 tokens), yet small
# enough that the layout built from it, and the position tables that are not stored (RoPE's,
# sinusoidal), fit in memory. An edited config beyond them is refused before it builds anything.
MAX_DIMENSIONS = {"n_layer": 1024, "n_embd": 1 << 16, "n_head": 1 << 12,
                  "block_size": 1 << 20, "vocab_size": 1 << 21, "mlp_hidden": 1 << 18}
MAX_TABLE = 1 << 27  # elements of a position table, block_size x n_embd (512 MiB of float32)
MAX_HEADER = 1 << 24  # bytes of a weights file's header (a million tensors' names and shapes)


def check_dimensions(config: GPTConfig, where: Path,
                     advice: str = "altered; load another checkpoint or train anew") -> None:
    """Refuse a config with a dimension beyond ``MAX_DIMENSIONS``, or a position table of more
    than ``MAX_TABLE`` elements, naming the field (``CheckpointError``: ``where``, the problem,
    then ``advice``)."""
    for name, most in MAX_DIMENSIONS.items():
        value = getattr(config, name)
        if value is not None and value > most:
            raise CheckpointError(f"{where}: model_config.{name} is {value}, more than the "
                                  f"{most} a tinygpt checkpoint may hold: {advice}")
    if config.block_size * config.n_embd > MAX_TABLE:
        raise CheckpointError(f"{where}: model_config.block_size x n_embd is "
                              f"{config.block_size} x {config.n_embd}, a position table of more "
                              f"than {MAX_TABLE} numbers: {advice}")


def peek_header(fd: int, path: Path) -> Layout | None:
    """``{name: (dtype, shape)}`` from the header of the safetensors file open as ``fd``, read
    alone (at most ``MAX_HEADER`` bytes), its data not read; None if it cannot be read so (the
    file's checksum and ``header`` then say what is wrong with it)."""
    size = os.fstat(fd).st_size
    n = int.from_bytes(os.pread(fd, 8, 0), "little") if size >= 8 else -1
    if n < 0 or n > min(size - 8, MAX_HEADER):
        return None
    try:
        return parse_header(os.pread(fd, n, 8), f"{path}: not a readable safetensors file")[0]
    except CheckpointError:
        return None


def parse_header(raw: bytes, bad: str) -> tuple[Layout, list[tuple[int, int]]]:
    """A safetensors header's tensors (name -> dtype and shape) and their byte spans, each
    tensor's size checked against its dtype and shape; ``CheckpointError`` starting ``bad``."""
    try:
        header = json.loads(raw)
        spans, out = [], {}
        for name, info in header.items():
            if name == "__metadata__":
                continue
            shape = tuple(int(s) for s in info["shape"])
            begin, end = (int(o) for o in info["data_offsets"])
            if min(shape, default=0) < 0 or end - begin != numel(shape) * SIZES[info["dtype"]]:
                raise ValueError(f"tensor {name}: {end - begin} bytes for shape {list(shape)}")
            spans.append((begin, end))
            out[name] = (info["dtype"], shape)
    except RecursionError:
        raise CheckpointError(f"{bad} (its header is JSON nested too deeply)") from None
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise CheckpointError(f"{bad} ({type(err).__name__}: {err})") from None
    return out, spans


def check_config_fits(config: GPTConfig, found: Layout, path: Path) -> None:
    """Refuse a config the weights' shapes contradict -- the number of blocks, the token table
    (``vocab_size`` x ``n_embd``), the learned position table (``block_size`` x ``n_embd``) --
    before the config builds anything, naming the field and what the weights hold."""
    shapes = {name: shape for name, (_, shape) in found.items()}
    blocks = {int(m.group(1)) for name in shapes
              if (m := re.match(r"transformer\.h\.(\d{1,9})\.", name))}
    layers = max(blocks) + 1 if blocks else 0
    wte, wpe = shapes.get("transformer.embed.wte.weight"), shapes.get(
        "transformer.embed.wpe.weight")
    problems = []
    if layers != config.n_layer:
        problems.append(f"n_layer is {config.n_layer}, the weights hold {layers} blocks")
    if wte is not None and tuple(wte) != (config.vocab_size, config.n_embd):
        problems.append(f"vocab_size x n_embd is {config.vocab_size} x {config.n_embd}, the "
                        f"token table is {' x '.join(map(str, wte))}")
    if config.positional == "learned" and wpe is not None and tuple(wpe) != (
            config.block_size, config.n_embd):
        problems.append(f"block_size x n_embd is {config.block_size} x {config.n_embd}, the "
                        f"position table is {' x '.join(map(str, wpe))}")
    if problems:
        raise CheckpointError(f"{path}: the model config does not fit these weights: "
                              f"{'; '.join(problems)}: altered; load another checkpoint or "
                              "train anew")


def non_finite(tensors: dict[str, Tensor]) -> str | None:
    """The name of the first floating tensor holding an inf or a NaN, else None."""
    for name, t in tensors.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            return name
    return None


def distinct_tensors(model: torch.nn.Module) -> tuple[dict[str, Tensor], dict[str, str]]:
    """The model's state dict with each shared (tied) tensor once, and ``{alias: stored name}``."""
    tensors: dict[str, Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[int, str] = {}
    for name, t in model.state_dict(keep_vars=True).items():  # a tied tensor: the same object
        if id(t) in seen:
            aliases[name] = seen[id(t)]
        else:
            seen[id(t)] = name
            tensors[name] = t
    return tensors, aliases


def layout(config: GPTConfig) -> tuple[Layout, dict[str, str]]:
    """``{name: (dtype, shape)}`` of a model's stored tensors and its aliases, from the config
    alone (built on the meta device: nothing is allocated, however large the config)."""
    with torch.device("meta"):
        model = GPT(config)
    tensors, aliases = distinct_tensors(model)
    return tensor_layout(tensors), aliases


def numel(shape: tuple[int, ...]) -> int:
    """The number of elements of a tensor of ``shape``."""
    n = 1
    for s in shape:
        n *= s
    return n


def header(data: bytes, path: Path) -> Layout:
    """``{name: (dtype, shape)}`` of a safetensors file, after checking that its header fits
    the file exactly (offsets contiguous, sizes matching dtypes and shapes)."""
    bad = f"{path}: not a readable safetensors file"
    if len(data) < 8 or int.from_bytes(data[:8], "little") > len(data) - 8:
        raise CheckpointError(f"{bad} (header length beyond the file's {len(data)} bytes)")
    n = int.from_bytes(data[:8], "little")
    out, spans = parse_header(data[8:8 + n], bad)
    edge = 0
    for begin, end in sorted(spans):
        if begin != edge:
            raise CheckpointError(f"{bad} (its tensors overlap or leave gaps)")
        edge = end
    if edge != len(data) - 8 - n:
        raise CheckpointError(f"{bad} ({len(data) - 8 - n} bytes of data, its header "
                              f"describes {edge})")
    return out


def tensors(data: bytes, path: Path) -> dict[str, Tensor]:
    try:
        tensors = st_load(data)
    except (SafetensorError, ValueError, RuntimeError, TypeError) as err:
        raise CheckpointError(f"{path}: not a readable safetensors file ({err})") from None
    bad = non_finite(tensors)
    if bad is not None:
        raise CheckpointError(f"{path}: tensor {bad} holds an inf or a NaN: these weights come "
                              "from a diverged run and cannot be used")
    return tensors


def layout_misfit(found: Layout, aliases: Any, layout: tuple[Layout, dict[str, str]]) -> str | None:
    """How tensors ``found`` (name -> dtype and shape, with their ``aliases``) differ from the
    ``layout`` a model config implies, in words; None if they are that layout."""
    expected, expected_aliases = layout
    missing = sorted(set(expected) - set(found))
    extra = sorted(set(found) - set(expected))
    if missing or extra:
        return f"missing {missing[:5]}, unexpected {extra[:5]}"
    if expected_aliases != aliases:
        return f"shared tensors {aliases}, the config's {expected_aliases}"
    for name, (dtype, shape) in found.items():
        if (dtype, shape) != expected[name]:
            return (f"tensor {name} has shape {shape} ({dtype}), but the model config needs "
                    f"{expected[name][1]} ({expected[name][0]})")
    return None


def check_model_file(data: bytes, path: Path, config: GPTConfig, aliases: Any,
                      layout: tuple[Layout, dict[str, str]]) -> None:
    misfit = layout_misfit(header(data, path), aliases, layout)
    if misfit is not None:
        raise CheckpointError(f"{path}: its tensors do not match the model config {config}: "
                              f"{misfit}")


def tensor_layout(tensors: dict[str, Tensor]) -> Layout:
    """``{name: (dtype, shape)}`` of tensors in memory, as a safetensors header says them."""
    return {name: (DTYPES.get(t.dtype, str(t.dtype)), tuple(t.shape))
            for name, t in tensors.items()}


def check_optimizer_file(data: bytes, path: Path,
                          layout: Layout) -> None:
    shapes = {shape for _, shape in layout.values()} | {()}  # indices follow param groups
    for name, (_, shape) in header(data, path).items():
        parts = name.split(".")
        if len(parts) != 3 or parts[0] != "state" or not parts[1].isdigit() or int(
                parts[1]) >= len(layout) or shape not in shapes:
            raise CheckpointError(f"{path}: tensor {name} {shape} fits no parameter of the "
                                  "model config")


def checked_rng_states(raw: dict[str, Any], where: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in raw.items():
        try:
            if "bytes" in value:
                out[name] = torch.frombuffer(bytearray.fromhex(value["bytes"]), dtype=torch.uint8)
                if not name.startswith("cuda"):  # a CPU generator's state: try it on a spare
                    torch.Generator().set_state(out[name])
            elif "python" in value:
                version, ints, gauss = value["python"]
                out[name] = (version, tuple(ints), gauss)
                random.Random().setstate(out[name])
            else:
                raise ValueError("no 'bytes' or 'python' entry")
        except (ValueError, TypeError, RuntimeError, OverflowError) as err:
            raise CheckpointError(f"{where}: rng state {name!r} is damaged ({err})") from None
    return out
