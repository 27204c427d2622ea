"""Checking a checkpoint's files before anything is allocated: the manifest (format, version,
checksum), each file's size and SHA-256 against it, the layout a model config implies (built on
the meta device), safetensors headers against that layout and the file's length, finiteness of
tensors, and RNG states. Used by ``tinygpt.checkpoint``; every problem raises ``CheckpointError``
naming the file.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from torch import Tensor

from tinygpt.checkpoint.folder import (
    FORMAT,
    MANIFEST,
    MAX_JSON,
    MODEL_FILE,
    OPTIMIZER_FILE,
    VERSION,
    CheckpointError,
    MissingCheckpointFile,
    open_regular,
    read_regular,
)
from tinygpt.config import GPTConfig
from tinygpt.data import parse_manifest
from tinygpt.model import GPT

Layout = dict[str, tuple[str, tuple[int, ...]]]  # stored tensor name -> (dtype, shape)
DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16",
          torch.float64: "F64", torch.int64: "I64"}
SIZES = {"F32": 4, "BF16": 2, "F16": 2, "F64": 8, "I64": 8}


def read_checkpoint_manifest(folder: Path) -> tuple[bytes, dict[str, Any]]:
    """The manifest of ``folder``: its bytes and, checked (format, version, checksum:
    ``tinygpt.data.parse_manifest``), its content without the checksum."""
    path = folder / MANIFEST
    try:
        raw = read_regular(path, max_size=MAX_JSON)
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
    fds = {name: open_regular(version / name) for name in files}
    try:
        found = layout(config)  # sizes follow from it, before any read
        weights = sum(SIZES.get(dtype, 8) * numel(shape) for dtype, shape in found[0].values())
        limits = {MODEL_FILE: weights + 2**20, OPTIMIZER_FILE: 3 * weights + 2**20}
        blobs = {}
        for name, entry in files.items():
            path, size = version / name, int(entry["size"])
            if size > limits.get(name, MAX_JSON):
                raise CheckpointError(f"{path}: {size} bytes, more than a checkpoint of this "
                                      f"model config can hold ({limits.get(name, MAX_JSON)})")
            blobs[name] = read_regular(path, size=size, fd=fds.pop(name))
            if hashlib.sha256(blobs[name]).hexdigest() != entry["sha256"]:
                raise CheckpointError(f"{path}: its SHA-256 differs from the one in {MANIFEST}: "
                                      f"the file is truncated or corrupt ({size} bytes)")
    finally:
        for fd in fds.values():  # those not read: an error came first
            os.close(fd)
    return blobs, found


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
    found: Layout = {name: (DTYPES.get(t.dtype, str(t.dtype)), tuple(t.shape))
                     for name, t in tensors.items()}
    return found, aliases


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
    try:
        header = json.loads(data[8:8 + n])
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
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise CheckpointError(f"{bad} ({type(err).__name__}: {err})") from None
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


def check_model_file(data: bytes, path: Path, config: GPTConfig, aliases: Any,
                      layout: tuple[Layout, dict[str, str]]) -> None:
    expected, expected_aliases = layout
    found = header(data, path)
    missing = sorted(set(expected) - set(found))
    extra = sorted(set(found) - set(expected))
    if missing or extra or expected_aliases != aliases:
        raise CheckpointError(f"{path}: its tensors do not match the model config {config}: "
                              f"missing {missing[:5]}, unexpected {extra[:5]}")
    for name, (dtype, shape) in found.items():
        if (dtype, shape) != expected[name]:
            raise CheckpointError(f"{path}: tensor {name} has shape {shape} ({dtype}), but "
                                  f"the model config needs {expected[name][1]}")


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
