"""A training run's state: starting it, fresh or from a checkpoint, and saving it while it trains.

Starting: what a run needs besides its weights to continue bit for bit -- the optimizer's state
(checked against the model's parameters), the step and history, and the RNG states (Python's and
the batch stream's, and each rank's torch and CUDA state, so that a data-parallel run resumes
too). Saving: ``claimed(out, model)``, held for a whole run (the folder writable, locked against a
second trainer, with room for two checkpoints), and ``RunSaver``, which saves after a step -- rank
0 writes, every rank takes part, since the checkpoint holds each rank's RNG state -- after checking
that the weights, the optimizer's moments and the step's loss are finite; a divergence raises
``TrainingDivergedError`` and says which checkpoint is kept.

It imports no training code: ``tinygpt.train`` builds the optimizer and owns the schedule. It
does not lay out the files (``tinygpt.checkpoint``, ``tinygpt.checkpoint.folder``) or decide when
to save.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor

from tinygpt import checkpoint
from tinygpt.checkpoint import load_checkpoint
from tinygpt.checkpoint.folder import MANIFEST, CheckpointError, check_room, check_writable, locked
from tinygpt.checkpoint.verify import non_finite
from tinygpt.config import GPTConfig, TrainConfig
from tinygpt.distributed import DistContext, broadcast_flag
from tinygpt.model import GPT
from tinygpt.runtime import autocast
from tinygpt.tokenizer import BPETokenizer, CharTokenizer, SavedTokenizer, tokenizer_fingerprint


class Process(Protocol):
    """This process's place in the run (``tinygpt.distributed.DistContext`` is one)."""

    @property
    def rank(self) -> int: ...
    @property
    def world_size(self) -> int: ...
    @property
    def device(self) -> torch.device: ...


@dataclass
class Run:
    """A run ready for its next step."""

    model: GPT
    step: int  # optimizer steps done
    history: list[dict[str, Any]]
    tokenizer: SavedTokenizer | None
    optimizer_state: dict[str, Any] | None = None  # a resumed run's saved optimizer state
    saved_train_config: TrainConfig | None = None  # the configuration it was saved with


def start_run(model_config: GPTConfig, cfg: TrainConfig, proc: Process,
              batches: torch.Generator, *, out_dir: str | Path | None, resume: bool,
              model: GPT | None, tokenizer: SavedTokenizer | None,
              warn: Callable[[str], object]) -> Run:
    """A fresh run of ``cfg``, seeded (on ``model`` if given, else a new ``GPT``), or with
    ``resume`` the checkpoint in ``out_dir`` continued: weights, optimizer, step, history and
    every RNG state restored. ``batches``, the batch stream's generator, is seeded or restored.
    The caller builds the optimizer and loads ``Run.optimizer_state`` into it
    (``restore_optimizer``). A ``tokenizer`` of more tokens than ``model_config.vocab_size`` is
    refused here, before any step, not by the run's first save (``ValueError`` naming both)."""
    if tokenizer is not None and not isinstance(tokenizer, (CharTokenizer, BPETokenizer)):
        raise TypeError(f"tokenizer must be a CharTokenizer, a BPETokenizer or None, got "
                        f"{type(tokenizer).__name__}")
    misfit = None if tokenizer is None else checkpoint.tokenizer_misfit(tokenizer, model_config)
    if misfit is not None:
        raise ValueError(f"the tokenizer given {misfit}; give the one the data was encoded with "
                         "and a model_config whose vocab_size is its vocab_size")
    if not resume:
        if model is None:
            torch.manual_seed(cfg.seed)
            random.seed(cfg.seed)
            model = GPT(model_config)
        if proc.world_size > 1:  # the same weights everywhere, but each rank its own dropout
            torch.manual_seed(cfg.seed + 1 + proc.rank)
        model.to(proc.device).train()
        batches.manual_seed(cfg.seed)
        return Run(model, 0, [], tokenizer)
    if out_dir is None:
        raise ValueError("resume=True needs the out_dir holding the checkpoint to continue")
    ckpt = load_checkpoint(out_dir)
    if ckpt.model_config != model_config:
        raise ValueError(f"the checkpoint in {out_dir} has model config {ckpt.model_config}, "
                         f"not {model_config}")
    if tokenizer is not None and ckpt.tokenizer is not None and (
            tokenizer_fingerprint(tokenizer) != tokenizer_fingerprint(ckpt.tokenizer)):
        raise ValueError(f"the checkpoint in {out_dir} was trained with another tokenizer than "
                         f"the one given ({tokenizer!r}): resume with its own (or none)")
    if model is None:
        model = ckpt.model
    else:
        model.load_state_dict(ckpt.model.state_dict())
    model.to(proc.device).train()
    missing = [name for name in ("torch", "python", "batch") if name not in ckpt.rng_states]
    if missing:
        raise CheckpointError(f"{out_dir}: the checkpoint holds no RNG state {missing[0]!r}, "
                              "which resuming restores (it was saved without its run's RNG "
                              "states): train on from its weights as a new run instead")
    saved_world = saved_world_size(ckpt.rng_states)
    if saved_world != proc.world_size:
        warn(f"warning: {out_dir} was written by {saved_world} process(es), this run has "
             f"{proc.world_size}: the global batch changes, so the continuation matches no "
             "uninterrupted run")
    restore_rng_states(ckpt.rng_states, proc, batches)
    return Run(model, ckpt.step, list(ckpt.history),
               ckpt.tokenizer if tokenizer is None else tokenizer,
               ckpt.optimizer_state, ckpt.train_config)


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


# --- RNG states ----------------------------------------------------------------------------------

def rng_key(name: str, rank: int) -> str:
    """The checkpoint's name for rank ``rank``'s RNG ``name``: rank 0 keeps the plain name."""
    return name if rank == 0 else f"{name}.rank{rank}"


def saved_world_size(rng_states: Mapping[str, Any]) -> int:
    """How many ranks wrote their torch RNG state into a checkpoint's ``rng_states``."""
    return 1 + sum(key.startswith("torch.rank") for key in rng_states)


def rng_states(proc: Process, batches: torch.Generator) -> dict[str, Any]:
    """Every RNG state a resumed run needs: Python's and the batch stream's (the same on every
    rank) and each rank's torch (and CUDA) state under ``rng_key``; with several ranks every
    rank must call it (it gathers them)."""
    mine = {"torch": torch.get_rng_state()}
    if proc.device.type == "cuda":
        mine["cuda"] = torch.cuda.get_rng_state(proc.device)
    shared = {"python": random.getstate(), "batch": batches.get_state()}
    if proc.world_size == 1:
        return {**shared, **mine}
    import torch.distributed as dist

    everyone: list[Any] = [None] * proc.world_size
    dist.all_gather_object(everyone, mine)
    return {**shared, **{rng_key(name, r): state.cpu() for r, states in enumerate(everyone)
                         for name, state in states.items()}}


def restore_rng_states(rng: Mapping[str, Any], proc: Process, batches: torch.Generator) -> None:
    """Set this rank's RNGs to a checkpoint's (rank 0's where the checkpoint has fewer ranks)."""
    torch.set_rng_state(rng.get(rng_key("torch", proc.rank), rng["torch"]))
    random.setstate(rng["python"])
    batches.set_state(rng["batch"])
    if proc.device.type == "cuda" and "cuda" in rng:
        torch.cuda.set_rng_state(rng.get(rng_key("cuda", proc.rank), rng["cuda"]), proc.device)



class TrainingDivergedError(FloatingPointError):
    """The loss or the gradient became infinite or NaN; the weights were not updated with it."""


@contextmanager
def claimed(out: Path, model: GPT) -> Iterator[None]:
    """Before the first step: ``out`` writable, locked against a second trainer, with room on
    its disk for this model's checkpoints; held until the run ends."""
    check_writable(out)
    with locked(out):
        check_room(out, checkpoint.checkpoint_bytes(model),
                          have_checkpoint=(out / MANIFEST).exists())
        yield


class RunSaver:
    """Saves a run into ``out_dir`` (nothing without one) after the steps it is due."""

    def __init__(self, out_dir: str | Path | None, ctx: DistContext, model: GPT,
                 optimizer: torch.optim.Optimizer, model_config: GPTConfig, cfg: TrainConfig,
                 tokenizer: SavedTokenizer | None, batches: torch.Generator,
                 last_saved: int | None) -> None:
        self.out_dir, self.ctx, self.model, self.optimizer = out_dir, ctx, model, optimizer
        self.model_config, self.cfg, self.tokenizer = model_config, cfg, tokenizer
        self.batches = batches  # the batch stream's generator, whose state is saved
        self.last_saved = last_saved  # the step of the checkpoint in out_dir, if any

    def due(self, step: int) -> bool:
        """Whether to save after ``step``: every ``save_every`` steps, and after the last."""
        every = self.cfg.save_every
        return self.out_dir is not None and (step == self.cfg.max_iters
                                             or bool(every and step % every == 0))

    def save(self, step: int, history: list[dict[str, Any]], x: Tensor, y: Tensor) -> None:
        """Save the run after ``step``; ``x``, ``y`` is its last batch, whose loss must be finite.
        Every rank calls it; a diverged model raises ``TrainingDivergedError`` on all of them."""
        if self.out_dir is None:
            return
        rng = rng_states(self.ctx, self.batches)  # a collective: every rank takes part
        bad = unsaveable(self.model, self.optimizer, x, y, self.cfg.dtype) if self.ctx.is_main \
            else None
        if broadcast_flag(bad is not None, self.ctx):  # never save a diverged model
            raise TrainingDivergedError(
                f"the weights after step {step} {bad or 'are not finite on rank 0'}: training "
                f"diverged; they were not saved and {self.kept()}. Try a lower learning_rate, "
                "more warmup_iters or grad_clip > 0")
        if self.ctx.is_main:
            checkpoint.save_checkpoint(self.out_dir, self.model, self.optimizer,
                                       self.model_config, self.cfg, step, self.tokenizer, rng,
                                       history)
        self.last_saved = step

    def kept(self) -> str:
        """Which checkpoint a run that stops now leaves, in words."""
        return (f"the checkpoint of step {self.last_saved} in {self.out_dir} is kept"
                if self.last_saved is not None else "no checkpoint was saved")


def unsaveable(model: GPT, optimizer: torch.optim.Optimizer, x: Tensor, y: Tensor,
               amp: str) -> str | None:
    """Why the model must not be saved (its weights or AdamW's state hold an inf or a NaN, or
    the last batch's loss under these weights is not finite), else None. RNGs are not used."""
    if non_finite(dict(model.named_parameters())):
        return "hold an inf or a NaN"
    for state in optimizer.state.values():
        if non_finite({k: t for k, t in state.items() if isinstance(t, Tensor)}):
            return "have AdamW moments holding an inf or a NaN"
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()  # no dropout: no random numbers drawn
    with torch.no_grad(), autocast(device, amp):
        _, loss = model(x.to(device), y.to(device))
    model.train(was_training)
    return None if torch.isfinite(loss) else f"give the last batch a loss of {loss.item()}"
