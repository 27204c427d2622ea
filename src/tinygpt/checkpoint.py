"""Checkpoints: saving a training run to a folder and loading it back, safely.

A checkpoint is a folder holding

* ``model.safetensors``: the weights, each distinct tensor once (a tied ``lm_head.weight`` is
  ``wte``'s weight: it is stored once and re-tied when the model is rebuilt);
* ``optimizer.safetensors``: AdamW's tensors (``state.<param index>.<name>``);
* ``checkpoint.json``: the format name and version, the model and training configs, the step,
  the tokenizer (a ``CharTokenizer``'s characters, or the name of ``tokenizer.json`` written by
  ``BPETokenizer.save``), the RNG states, the optimizer's non-tensor state and hyper-parameters,
  the history, and the SHA-256 of every other file.

Saving is atomic: everything is written and ``fsync``-ed in a temporary sibling folder, which
then takes the old folder's place by renaming; a writer killed at any moment leaves the previous
checkpoint loadable (``load_checkpoint`` also finds it in the one instant when it has been moved
aside and the new one not yet moved in), and the next save removes what a killed one left.
Loading reads safetensors and JSON only -- never pickle, so a checkpoint cannot run code. Every
problem raises ``CheckpointError`` naming the file.

It does not decide when to save (``tinygpt.train``) and does not keep several checkpoints.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from torch import Tensor, nn

from tinygpt.config import GPTConfig
from tinygpt.model import GPT
from tinygpt.tokenizer import BPETokenizer, CharTokenizer
from tinygpt.train import TrainConfig

FORMAT, VERSION = "tinygpt-checkpoint", 1
MODEL_FILE, OPTIMIZER_FILE = "model.safetensors", "optimizer.safetensors"
META_FILE, TOKENIZER_FILE = "checkpoint.json", "tokenizer.json"


class CheckpointError(ValueError):
    """A checkpoint folder is missing, incomplete, corrupt or does not match its configs."""


@dataclass
class Checkpoint:
    """What ``load_checkpoint`` returns; ``model`` is on the CPU in eval mode."""

    path: Path
    model: GPT
    model_config: GPTConfig
    train_config: TrainConfig | None
    step: int
    tokenizer: CharTokenizer | BPETokenizer | None
    optimizer_state: dict[str, Any] | None  # in ``optimizer.state_dict()``'s layout
    rng_states: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)


def unique_tensors(model: nn.Module) -> tuple[dict[str, Tensor], dict[str, str]]:
    """The model's state dict with each shared tensor once, and ``{alias: stored name}``."""
    tensors: dict[str, Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple[int, tuple[int, ...]], str] = {}
    for name, t in model.state_dict().items():
        key = (t.data_ptr(), tuple(t.shape))
        if key in seen:
            aliases[name] = seen[key]
        else:
            seen[key] = name
            tensors[name] = t.detach().cpu().contiguous()
    return tensors, aliases


def _write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # folders cannot be opened on some systems (Windows)
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _siblings(out_dir: Path, kind: str) -> list[Path]:
    """Leftovers of an interrupted save: ``.<name>.tmp-*`` or ``.<name>.old-*`` folders."""
    return sorted(out_dir.parent.glob(f".{out_dir.name}.{kind}-*"))


def _moved_aside(out_dir: Path) -> Path | None:
    """The previous checkpoint, if a save was killed after moving it aside (else None)."""
    found = [p / "ckpt" for p in _siblings(out_dir, "old") if (p / "ckpt" / META_FILE).exists()]
    return found[-1] if found else None


def _tokenizer_json(tokenizer: object, folder: Path) -> dict[str, Any] | None:
    if tokenizer is None:
        return None
    if isinstance(tokenizer, CharTokenizer):
        return {"type": "char", "chars": tokenizer.chars}
    if isinstance(tokenizer, BPETokenizer):
        tokenizer.save(folder / TOKENIZER_FILE)
        for name in (TOKENIZER_FILE, Path(TOKENIZER_FILE).with_suffix(".vocab").name):
            with open(folder / name, "rb") as f:
                os.fsync(f.fileno())
        return {"type": "bpe", "file": TOKENIZER_FILE}
    raise TypeError(f"tokenizer must be a CharTokenizer, a BPETokenizer or None, got "
                    f"{type(tokenizer).__name__}")


def _rng_json(rng_states: dict[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, state in (rng_states or {}).items():
        if isinstance(state, Tensor):  # a torch generator's state: a uint8 tensor
            out[name] = {"bytes": bytes(state.cpu().numpy().tobytes()).hex()}
        elif name == "python":  # random.getstate(): (version, 625 ints, gauss_next)
            out[name] = {"python": [state[0], list(state[1]), state[2]]}
        else:
            raise TypeError(f"rng state {name!r} must be a torch uint8 tensor or "
                            f"random.getstate(), got {type(state).__name__}")
    return out


def save_checkpoint(out_dir: str | Path, model: GPT, optimizer: torch.optim.Optimizer | None,
                    model_config: GPTConfig, train_config: TrainConfig | None, step: int,
                    tokenizer: CharTokenizer | BPETokenizer | None = None,
                    rng_states: dict[str, Any] | None = None,
                    history: list[dict[str, Any]] | None = None) -> Path:
    """Write a checkpoint folder at ``out_dir`` atomically, replacing any previous one.

    ``rng_states``: name -> a torch generator state (``torch.get_rng_state()``,
    ``generator.get_state()``) or, under ``"python"``, ``random.getstate()``. Returns the path.
    """
    out_dir = Path(out_dir)
    if not isinstance(model_config, GPTConfig):
        raise TypeError(f"model_config must be a GPTConfig, got {type(model_config).__name__}")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    previous = _moved_aside(out_dir)
    if not out_dir.exists() and previous is not None:  # a save was killed mid-swap: restore
        os.replace(previous, out_dir)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        tensors, aliases = unique_tensors(model)
        files = {MODEL_FILE: st_save(tensors, metadata={"format": FORMAT})}
        opt_json = None
        if optimizer is not None:
            state = optimizer.state_dict()
            opt_tensors, scalars = {}, {}
            for idx, entries in state["state"].items():
                for key, value in entries.items():
                    if isinstance(value, Tensor):
                        opt_tensors[f"state.{idx}.{key}"] = value.detach().cpu().contiguous()
                    else:
                        scalars[f"{idx}.{key}"] = value
            files[OPTIMIZER_FILE] = st_save(opt_tensors, metadata={"format": FORMAT})
            opt_json = {"param_groups": state["param_groups"], "scalars": scalars}
        for name, data in files.items():
            _write(tmp / name, data)
        meta = {
            "format": FORMAT, "version": VERSION, "step": int(step),
            "model_config": dataclasses.asdict(model_config),
            "train_config": None if train_config is None else dataclasses.asdict(train_config),
            "tokenizer": _tokenizer_json(tokenizer, tmp), "tied": aliases,
            "rng_states": _rng_json(rng_states), "optimizer": opt_json,
            "history": list(history or []),
            "sha256": {name: hashlib.sha256(data).hexdigest() for name, data in files.items()},
        }
        _write(tmp / META_FILE, json.dumps(meta, indent=1).encode("utf-8"))
        _fsync_dir(tmp)
    except BaseException:  # an error leaves nothing; a killed writer's folder goes next save
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if out_dir.exists():  # move the previous checkpoint aside, then the new one in
        aside = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
        os.replace(out_dir, aside / "ckpt")
    os.replace(tmp, out_dir)
    _fsync_dir(out_dir.parent)
    for leftover in _siblings(out_dir, "old") + _siblings(out_dir, "tmp"):
        shutil.rmtree(leftover, ignore_errors=True)
    return out_dir


# --- loading -------------------------------------------------------------------------------------

def _read_tensors(path: Path, expected_sha: str | None) -> dict[str, Tensor]:
    try:
        data = path.read_bytes()
    except OSError as err:
        raise CheckpointError(f"{path}: cannot read it ({err.strerror or err})") from None
    if expected_sha is not None and hashlib.sha256(data).hexdigest() != expected_sha:
        raise CheckpointError(f"{path}: its SHA-256 differs from the one in {META_FILE}: the "
                              f"file is truncated or corrupt ({len(data)} bytes)")
    try:
        return st_load(data)
    except (SafetensorError, ValueError, RuntimeError, TypeError) as err:
        raise CheckpointError(f"{path}: not a readable safetensors file ({err})") from None


def _rng_states(raw: dict[str, Any], where: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in raw.items():
        if "bytes" in value:
            out[name] = torch.frombuffer(bytearray.fromhex(value["bytes"]), dtype=torch.uint8)
        elif "python" in value:
            version, ints, gauss = value["python"]
            out[name] = (version, tuple(ints), gauss)
        else:
            raise CheckpointError(f"{where}: rng state {name!r} has no 'bytes' or 'python' entry")
    return out


def _tokenizer(raw: dict[str, Any] | None, folder: Path) -> CharTokenizer | BPETokenizer | None:
    if raw is None:
        return None
    if raw.get("type") == "char":
        return CharTokenizer(raw["chars"])
    if raw.get("type") == "bpe":
        return BPETokenizer.load(folder / raw["file"])
    raise CheckpointError(f"{folder / META_FILE}: unknown tokenizer type {raw.get('type')!r}")


def _build_model(config: GPTConfig, tensors: dict[str, Tensor], aliases: dict[str, str],
                 where: Path) -> GPT:
    model = GPT(config)
    expected, expected_aliases = unique_tensors(model)
    missing = sorted(set(expected) - set(tensors))
    extra = sorted(set(tensors) - set(expected))
    if missing or extra or expected_aliases != aliases:
        raise CheckpointError(f"{where}: its tensors do not match the model config {config}: "
                              f"missing {missing[:5]}, unexpected {extra[:5]}")
    params = model.state_dict()
    with torch.no_grad():
        for name, t in tensors.items():
            if t.shape != params[name].shape:
                raise CheckpointError(f"{where}: tensor {name} has shape {tuple(t.shape)}, but "
                                      f"the model config needs {tuple(params[name].shape)}")
            params[name].copy_(t)
    return model.eval()


def _optimizer_state(raw: dict[str, Any] | None, tensors: dict[str, Tensor],
                     where: Path) -> dict[str, Any] | None:
    if raw is None:
        return None
    state: dict[int, dict[str, Any]] = {}
    for key, t in tensors.items():
        _, idx, name = key.split(".", 2)
        state.setdefault(int(idx), {})[name] = t
    for key, value in raw["scalars"].items():
        idx, name = key.split(".", 1)
        state.setdefault(int(idx), {})[name] = value
    groups = [{**g, "betas": tuple(g["betas"])} if "betas" in g else dict(g)
              for g in raw["param_groups"]]
    return {"state": state, "param_groups": groups}


def restore_optimizer(optimizer: torch.optim.Optimizer, state: dict[str, Any] | None,
                      where: object = "the checkpoint") -> None:
    """Load a checkpoint's optimizer state after checking it fits ``optimizer``'s parameters."""
    if state is None:
        raise CheckpointError(f"{where}: the checkpoint holds no optimizer state to resume")
    ours = [p for g in optimizer.param_groups for p in g["params"]]
    theirs = [i for g in state["param_groups"] for i in g["params"]]
    if len(ours) != len(theirs) or len(optimizer.param_groups) != len(state["param_groups"]):
        raise CheckpointError(f"{where}: the optimizer state has {len(theirs)} parameters in "
                              f"{len(state['param_groups'])} groups, the optimizer "
                              f"{len(ours)} in {len(optimizer.param_groups)}")
    for p, i in zip(ours, theirs, strict=True):
        for name, t in state["state"].get(i, {}).items():
            if isinstance(t, Tensor) and t.dim() > 0 and t.shape != p.shape:
                raise CheckpointError(f"{where}: optimizer tensor state.{i}.{name} has shape "
                                      f"{tuple(t.shape)}, its parameter {tuple(p.shape)}")
    optimizer.load_state_dict(state)


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Read a checkpoint folder written by ``save_checkpoint`` (safetensors and JSON only).

    Raises ``CheckpointError`` naming the file and the problem: a missing folder or file,
    corrupt JSON, a wrong format or version, a truncated or altered tensor file, tensors that do
    not fit the config.
    """
    folder = Path(path)
    if not folder.is_dir():
        previous = _moved_aside(folder)
        if previous is None:
            raise CheckpointError(f"{folder}: no such checkpoint folder")
        folder = previous  # a save was killed after moving the previous checkpoint aside
    meta_path = folder / META_FILE
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{meta_path}: missing; is {folder} a checkpoint?") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{meta_path}: not valid JSON ({err})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"{meta_path}: not a {FORMAT} file")
    if meta.get("version") != VERSION:
        raise CheckpointError(f"{meta_path}: format version {meta.get('version')!r} is not "
                              f"supported (this tinygpt reads version {VERSION})")
    try:
        model_config = GPTConfig(**meta["model_config"])
        train_raw = meta["train_config"]
        train_config = None if train_raw is None else TrainConfig(**train_raw)
        sha = meta["sha256"]
        tensors = _read_tensors(folder / MODEL_FILE, sha.get(MODEL_FILE))
        model = _build_model(model_config, tensors, meta["tied"], folder / MODEL_FILE)
        opt_tensors = {}
        if meta["optimizer"] is not None:
            opt_tensors = _read_tensors(folder / OPTIMIZER_FILE, sha.get(OPTIMIZER_FILE))
        return Checkpoint(
            path=folder, model=model, model_config=model_config, train_config=train_config,
            step=int(meta["step"]), tokenizer=_tokenizer(meta["tokenizer"], folder),
            optimizer_state=_optimizer_state(meta["optimizer"], opt_tensors, meta_path),
            rng_states=_rng_states(meta["rng_states"], meta_path), history=meta["history"])
    except CheckpointError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise CheckpointError(f"{meta_path}: invalid content ({type(err).__name__}: {err})") \
            from None
