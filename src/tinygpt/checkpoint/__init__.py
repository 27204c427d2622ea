"""Checkpoints: saving a training run to a folder and loading it back, safely.

A checkpoint folder holds (``tinygpt.checkpoint.folder`` says which entries are tinygpt's and how
they are written; anything else in the folder is the user's and is never touched)

* ``checkpoint.json``: the manifest, written last and swapped in by one atomic rename: the format
  and version, the model and training configs, the step, the tokenizer (a ``CharTokenizer``'s
  characters, or ``tokenizer.json``), the RNG states, the optimizer's non-tensor state and
  hyper-parameters, the history, the name of the version folder with the SHA-256 and size of
  each of its files, and a SHA-256 of the manifest itself;
* ``step-NNNNNN-xxxxxxxx/``: this save's files: ``model.safetensors`` (the weights, each distinct
  tensor once: a tied ``lm_head.weight`` is ``wte``'s and is re-tied when the model is rebuilt),
  ``optimizer.safetensors`` (AdamW's tensors, ``state.<param index>.<name>``) and, for a BPE
  tokenizer, ``tokenizer.json`` and ``tokenizer.vocab``;
* ``.tinygpt.lock``: held by the process that trains into the folder.

Saving is atomic, for a writer killed at any moment and for readers: the new version folder is
written and ``fsync``-ed, then the manifest is replaced, then the previous version is removed. A
save needs room for one more checkpoint beside the current one. Non-finite weights are never
saved. Loading reads the manifest first, checks every file against it (regular files only, sizes
before reading, safetensors headers against the config before allocating) and reads again if a
save switched versions meanwhile. It reads safetensors and JSON only -- never pickle. Every
problem raises ``CheckpointError`` naming the file.

It does not decide when to save (``tinygpt.train``, ``tinygpt.checkpoint.run_state``), restore a
run's optimizer and RNGs (``tinygpt.checkpoint.run_state``) or keep several checkpoints.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tinygpt.checkpoint.folder import (
    CHECKPOINT_ENTRIES,
    FORMAT,
    MANIFEST,
    MODEL_FILE,
    OPTIMIZER_FILE,
    VERSION,
    VERSION_FILES,
    CheckpointError,
    is_tinygpt_manifest,
    locked,
    new_version,
    read_checkpoint_file,
    remove_stale,
    remove_version,
    swap_manifest,
)
from tinygpt.config import GPTConfig, TrainConfig
from tinygpt.files.manifest import manifest_checksum, tokenizer_entry, tokenizer_from_entry
from tinygpt.files.reading import MAX_JSON
from tinygpt.files.writing import fsync_dir, write_synced
from tinygpt.tokenizer import BPETokenizer, CharTokenizer, SavedTokenizer

if TYPE_CHECKING:  # torch and the model are imported by the functions that use them, so that
    # the folder helpers (tinygpt.checkpoint.folder: the lock, safe reads) import without torch
    import torch
    from torch import Tensor, nn

    from tinygpt.model import GPT

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
    from tinygpt.checkpoint import verify

    tensors, aliases = verify.distinct_tensors(model)
    return {name: t.detach().cpu().contiguous() for name, t in tensors.items()}, aliases


def checkpoint_bytes(model: nn.Module, optimizer: bool = True) -> int:
    """About how many bytes a checkpoint of ``model`` takes: the weights, and AdamW's two
    moments per weight (``optimizer``), plus headers, JSON and tokenizer (1 MiB)."""
    from tinygpt.checkpoint import verify

    tensors, _ = verify.distinct_tensors(model)  # counted where they are: nothing is copied
    weights = sum(t.numel() * t.element_size() for t in tensors.values())
    return weights * (3 if optimizer else 1) + 2**20


def _rng_json(rng_states: dict[str, Any] | None) -> dict[str, Any]:
    from torch import Tensor

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
    """Write a checkpoint into the folder ``out_dir`` atomically, replacing tinygpt's previous one
    there (and nothing else); returns the path. Weights or optimizer state holding an inf or a
    NaN are refused (``CheckpointError``), keeping the previous checkpoint, and so is a model whose
    tensors are not the ones ``model_config`` builds (a LoRA model never merged, another config),
    naming the mismatch: a checkpoint no loader accepts is never made.

    ``rng_states``: name -> a torch generator state (``torch.get_rng_state()``,
    ``generator.get_state()``) or, under ``"python"``, ``random.getstate()``.

    ``tokenizer`` must fit the model: a tokenizer of more tokens than ``model_config.vocab_size``
    is refused (``CheckpointError`` naming both numbers), since its last ids would have no row in
    the embedding. Fewer is allowed (an embedding padded to a round size).
    """
    from safetensors.torch import save as st_save
    from torch import Tensor

    from tinygpt.checkpoint import verify

    out = Path(out_dir)
    if not isinstance(model_config, GPTConfig):
        raise TypeError(f"model_config must be a GPTConfig, got {type(model_config).__name__}")
    if tokenizer is not None and not isinstance(tokenizer, (CharTokenizer, BPETokenizer)):
        raise TypeError(f"tokenizer must be a CharTokenizer, a BPETokenizer or None, got "
                        f"{type(tokenizer).__name__}")
    misfit = None if tokenizer is None else tokenizer_misfit(tokenizer, model_config)
    if misfit is not None:
        raise CheckpointError(f"{out}: not saved: the tokenizer given {misfit}; give the model's "
                              "own")
    tensors, aliases = unique_tensors(model)
    verify.check_dimensions(model_config, out, "not saved; the checkpoint already there is kept")
    misfit = verify.layout_misfit(verify.tensor_layout(tensors), aliases,
                                  verify.layout(model_config))
    if misfit is not None:  # say, a LoRA model never merged: no loader could build it
        raise CheckpointError(f"{out}: not saved: the model does not fit model_config ({misfit});"
                              " the checkpoint already there is kept (merge LoRA adapters "
                              "first: tinygpt.lora.merge_lora)")
    opt_tensors: dict[str, Tensor] = {}
    opt_json = None
    if optimizer is not None:
        state = optimizer.state_dict()
        scalars = {}
        for idx, entries in state["state"].items():
            for key, value in entries.items():
                if isinstance(value, Tensor):
                    opt_tensors[f"state.{idx}.{key}"] = value.detach().cpu().contiguous()
                else:
                    scalars[f"{idx}.{key}"] = value
        opt_json = {"param_groups": state["param_groups"], "scalars": scalars}
    bad = verify.non_finite(tensors) or verify.non_finite(opt_tensors)
    if bad is not None:
        raise CheckpointError(f"{out}: not saved: {bad} holds an inf or a NaN (the run "
                              "diverged); the checkpoint already there is kept")
    if out.exists() and not out.is_dir():
        raise CheckpointError(f"{out}: is a file, not a checkpoint folder; it is left alone")
    out.mkdir(parents=True, exist_ok=True)
    if (out / MANIFEST).exists() and not is_tinygpt_manifest(out / MANIFEST):
        raise CheckpointError(f"{out / MANIFEST} was not written by tinygpt, which never "
                              "replaces it: move it away or choose another folder")
    with locked(out):
        version = new_version(out, int(step))
        try:
            blobs = {MODEL_FILE: st_save(tensors, metadata={"format": FORMAT})}
            if optimizer is not None:
                blobs[OPTIMIZER_FILE] = st_save(opt_tensors, metadata={"format": FORMAT})
            for name, data in blobs.items():
                write_synced(version / name, data)
            tok_json = None if tokenizer is None else tokenizer_entry(tokenizer, version)
            for name in VERSION_FILES:
                if name not in blobs and (version / name).exists():  # the tokenizer's files
                    blobs[name] = (version / name).read_bytes()
            fsync_dir(version)
            meta = {
                "format": FORMAT, "version": VERSION, "step": int(step),
                "model_config": dataclasses.asdict(model_config),
                "train_config": None if train_config is None else dataclasses.asdict(train_config),
                "tokenizer": tok_json, "tied": aliases, "rng_states": _rng_json(rng_states),
                "optimizer": opt_json, "history": list(history or []), "folder": version.name,
                "files": {name: {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
                          for name, data in blobs.items()},
            }
            meta["checksum"] = manifest_checksum(meta)
            swap_manifest(out, json.dumps(meta, indent=1).encode("utf-8"))
        except BaseException as err:  # an error leaves the previous checkpoint, no new files
            current = _current(out)
            if current.get("folder") != version.name:
                remove_version(version)
            if isinstance(err, OSError):  # a full disk, a folder made read-only meanwhile...
                kept = (f"the checkpoint of step {current['step']} there is kept" if "step" in
                        current else "no checkpoint is there")
                raise CheckpointError(f"{out}: could not save step {step} ({err.strerror or err}"
                                      f"{': ' + str(err.filename) if err.filename else ''}); "
                                      f"{kept}") from None
            raise
        remove_stale(out, current=version.name)  # the previous version, killed saves' files
    return out


def tokenizer_misfit(tokenizer: SavedTokenizer, model_config: GPTConfig) -> str | None:
    """What makes ``tokenizer`` unfit for a model of ``model_config`` (more tokens than the
    embedding has rows, ``vocab_size``: encoding text would give ids the model cannot look up),
    both numbers named; or None. Fewer tokens fit: an embedding may be padded to a round size."""
    if tokenizer.vocab_size <= model_config.vocab_size:
        return None
    return (f"has {tokenizer.vocab_size} tokens but the model's vocab_size is "
            f"{model_config.vocab_size}: ids from {model_config.vocab_size} on have no embedding "
            "row, so it is not the model's tokenizer")


def _current(out: Path) -> dict[str, Any]:
    """The manifest now in ``out`` (unchecked), or ``{}``."""
    try:
        meta = json.loads(read_checkpoint_file(out / MANIFEST, max_size=MAX_JSON))
    except (CheckpointError, ValueError, RecursionError):
        return {}
    return meta if isinstance(meta, dict) else {}


# --- loading -------------------------------------------------------------------------------------

def _tokenizer(raw: object, meta_path: Path, version: Path,
               blobs: dict[str, bytes]) -> SavedTokenizer | None:
    """The checkpoint's tokenizer (``None`` if it was saved without one), its file read and
    checked with the version's other files (``blobs``)."""

    def listed(name: str) -> bytes:
        if name not in blobs:
            raise CheckpointError(f"{meta_path}: its tokenizer file {name} is not among the "
                                  "files it lists: altered")
        return blobs[name]

    if raw is None:
        return None
    return tokenizer_from_entry(raw, meta_path, version, listed, error=CheckpointError)


def _build_model(config: GPTConfig, tensors: dict[str, Tensor]) -> GPT:
    import torch

    from tinygpt.model import GPT

    model = GPT(config)
    params = model.state_dict()
    with torch.no_grad():
        for name, t in tensors.items():
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
              for g in map(_checked_group, raw["param_groups"], [where] * len(raw["param_groups"]))]
    return {"state": state, "param_groups": groups}


def _checked_group(group: Any, where: Path) -> dict[str, Any]:
    """An optimizer's parameter group from ``where``, once its settings are numbers torch takes:
    else torch fails later, printing its kernels' signatures, or trains with betas of 2."""
    import math

    def number(value: Any) -> bool:
        return type(value) in (int, float) and math.isfinite(value)

    if not isinstance(group, dict):
        raise CheckpointError(f"{where}: an optimizer parameter group is not an object")
    betas = group.get("betas", (0.0, 0.0))
    if (not isinstance(betas, (list, tuple)) or len(betas) != 2
            or not all(number(b) and 0 <= b < 1 for b in betas)):
        raise CheckpointError(f"{where}: the optimizer's betas must be two numbers in [0, 1), "
                              f"got {betas!r}: altered; resume from another checkpoint or "
                              "train anew")
    for key in ("lr", "eps", "weight_decay", "adam_eps", "momentum"):
        if key in group and not (number(group[key]) and group[key] >= 0):
            raise CheckpointError(f"{where}: the optimizer's {key} must be a finite number >= 0, "
                                  f"got {group[key]!r}: altered; resume from another checkpoint "
                                  "or train anew")
    return group


def _load(folder: Path, meta: dict[str, Any]) -> Checkpoint:
    from tinygpt.checkpoint import verify

    meta_path = folder / MANIFEST
    try:
        model_config = GPTConfig(**meta["model_config"])
        train_raw = meta["train_config"]
        train_config = None if train_raw is None else TrainConfig(**train_raw)
        files = meta["files"]
        version = folder / meta["folder"]
        if not CHECKPOINT_ENTRIES.is_numbered(meta["folder"]):
            raise CheckpointError(f"{meta_path}: names {meta['folder']!r}, not a version folder")
        for name in files:
            if name not in VERSION_FILES:
                raise CheckpointError(f"{meta_path}: names an unknown file {name!r}")
        blobs, layout = verify.read_files(version, files, model_config)
        if MODEL_FILE not in blobs:
            raise CheckpointError(f"{meta_path}: names no {MODEL_FILE}")
        verify.check_model_file(blobs[MODEL_FILE], version / MODEL_FILE, model_config,
                                   meta["tied"], layout)
        opt_tensors = {}
        if meta["optimizer"] is not None:
            if OPTIMIZER_FILE not in blobs:
                raise CheckpointError(f"{meta_path}: names no {OPTIMIZER_FILE}")
            verify.check_optimizer_file(blobs[OPTIMIZER_FILE], version / OPTIMIZER_FILE,
                                           layout[0])
            opt_tensors = verify.tensors(blobs[OPTIMIZER_FILE], version / OPTIMIZER_FILE)
        model = _build_model(model_config,
                             verify.tensors(blobs[MODEL_FILE], version / MODEL_FILE))
        tokenizer = _tokenizer(meta["tokenizer"], meta_path, version, blobs)
        misfit = None if tokenizer is None else tokenizer_misfit(tokenizer, model_config)
        if misfit is not None:  # say, a tokenizer file from another run, listed by an editor
            raise CheckpointError(f"{meta_path}: its tokenizer {misfit}: altered; load another "
                                  "checkpoint or train anew")
        if not isinstance(meta["history"], list):
            raise TypeError("history is not a list")
        return Checkpoint(
            path=folder, model=model, model_config=model_config, train_config=train_config,
            step=int(meta["step"]), tokenizer=tokenizer,
            optimizer_state=_optimizer_state(meta["optimizer"], opt_tensors, meta_path),
            rng_states=verify.checked_rng_states(meta["rng_states"], meta_path),
            history=meta["history"])
    except CheckpointError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as err:
        raise CheckpointError(f"{meta_path}: invalid content ({type(err).__name__}: {err})") \
            from None


def load_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """Read a checkpoint folder written by ``save_checkpoint`` (safetensors and JSON only).

    Raises ``CheckpointError`` naming the file and the problem: a missing folder or file,
    corrupt or edited JSON, a wrong format or version, a truncated or altered file, a file that is
    not a regular file, tensors that do not fit the config, weights holding infs or NaNs, a
    tokenizer of more tokens than the model's ``vocab_size`` (both numbers named). A save
    that replaces the checkpoint while it is read makes it read the new one.
    """
    from tinygpt.checkpoint import verify

    folder = Path(path)
    if not folder.is_dir():
        what = "not a folder" if folder.exists() else "no such checkpoint folder"
        raise CheckpointError(f"{folder}: {what}")
    for attempt in range(20):
        raw, meta = verify.read_checkpoint_manifest(folder)
        try:
            return _load(folder, meta)
        except CheckpointError:
            try:
                again = read_checkpoint_file(folder / MANIFEST, max_size=MAX_JSON)
            except CheckpointError:
                again = raw
            if again == raw or attempt == 19:  # not a save that switched versions: a real error
                raise
    raise AssertionError("unreachable")
