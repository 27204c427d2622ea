"""Starting a training run: fresh and seeded, or continuing a checkpoint exactly where it stopped.

It handles what a run needs besides its weights to continue bit for bit: the optimizer's state
(checked against the model's parameters), the step and history, the learning-rate schedule the
saved steps followed, and the RNG states -- Python's and the batch stream's, and each rank's
torch (and CUDA) state, so that a data-parallel run resumes too.

It imports no training code: ``tinygpt.train`` passes in what it needs (the optimizer's factory,
the schedule, this process's rank and device). It does not read or write files
(``tinygpt.checkpoint``) or decide when to save.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor

from tinygpt.checkpoint import load_checkpoint
from tinygpt.ckptio import CheckpointError
from tinygpt.config import GPTConfig, TrainConfig
from tinygpt.model import GPT
from tinygpt.tokenizer import tokenizer_fingerprint

SCHEDULE_FIELDS = ("max_iters", "learning_rate", "min_lr", "warmup_iters", "lr_decay_iters")


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
    optimizer: torch.optim.Optimizer
    step: int  # optimizer steps done
    history: list[dict[str, Any]]
    tokenizer: Any


def start_run(model_config: GPTConfig, cfg: TrainConfig, proc: Process,
              batches: torch.Generator, *, out_dir: str | Path | None, resume: bool,
              model: GPT | None, tokenizer: Any,
              configure_optimizer: Callable[[GPT, TrainConfig], torch.optim.Optimizer],
              lr_at: Callable[[int, TrainConfig], float],
              warn: Callable[[str], object]) -> Run:
    """A fresh run of ``cfg``, seeded (on ``model`` if given, else a new ``GPT``), or with
    ``resume`` the checkpoint in ``out_dir`` continued: weights, optimizer, step, history and
    every RNG state restored. ``batches``, the batch stream's generator, is seeded or restored."""
    if not resume:
        if model is None:
            torch.manual_seed(cfg.seed)
            random.seed(cfg.seed)
            model = GPT(model_config)
        if proc.world_size > 1:  # the same weights everywhere, but each rank its own dropout
            torch.manual_seed(cfg.seed + 1 + proc.rank)
        model.to(proc.device).train()
        batches.manual_seed(cfg.seed)
        return Run(model, configure_optimizer(model, cfg), 0, [], tokenizer)
    ckpt = load_checkpoint(out_dir)  # type: ignore[arg-type]
    if ckpt.model_config != model_config:
        raise ValueError(f"the checkpoint in {out_dir} has model config {ckpt.model_config}, "
                         f"not {model_config}")
    check_same_schedule(ckpt.history, ckpt.train_config, cfg, ckpt.step, out_dir, lr_at)
    if tokenizer is not None and ckpt.tokenizer is not None and (
            tokenizer_fingerprint(tokenizer) != tokenizer_fingerprint(ckpt.tokenizer)):
        raise ValueError(f"the checkpoint in {out_dir} was trained with another tokenizer than "
                         f"the one given ({tokenizer!r}): resume with its own (or none)")
    if model is None:
        model = ckpt.model
    else:
        model.load_state_dict(ckpt.model.state_dict())
    model.to(proc.device).train()
    optimizer = configure_optimizer(model, cfg)
    restore_optimizer(optimizer, ckpt.optimizer_state, out_dir)
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
    return Run(model, optimizer, ckpt.step, list(ckpt.history),
               ckpt.tokenizer if tokenizer is None else tokenizer)


def check_same_schedule(history: list[dict[str, Any]], saved: TrainConfig | None,
                        cfg: TrainConfig, step: int, out_dir: object,
                        lr_at: Callable[[int, TrainConfig], float]) -> None:
    """Refuse to resume under a learning-rate schedule the saved steps did not follow.

    A resumed run continues the saved one only if ``lr_at(s, cfg)`` is the rate each step ``s``
    already taken was trained with; a larger ``max_iters`` would stretch a started cosine instead.
    """
    done = [(r["step"] - 1, r["lr"]) for r in history if "lr" in r]  # (step index, its lr)
    bad = next(((s, lr) for s, lr in done
                if not math.isclose(lr, lr_at(s, cfg), rel_tol=1e-9, abs_tol=0.0)), None)
    if bad is None:
        return
    changed = [f"{n}={getattr(cfg, n)} (the checkpoint's: {getattr(saved, n)})" for n in
               SCHEDULE_FIELDS if saved is not None and getattr(saved, n) != getattr(cfg, n)]
    jump = (f"; the rate would go from {done[-1][1]:.1e} at step {done[-1][0] + 1} to "
            f"{lr_at(step, cfg):.1e} at step {step + 1}" if done and step < cfg.max_iters else "")
    raise ValueError(
        f"cannot resume {out_dir} with {', '.join(changed) or 'this schedule'}: its step "
        f"{bad[0] + 1} was trained with lr {bad[1]:.4g}, this schedule gives "
        f"{lr_at(bad[0], cfg):.4g} there, so the run would not continue the one that was "
        f"saved{jump}. Resume with the checkpoint's max_iters, learning_rate, min_lr, "
        "warmup_iters and lr_decay_iters, or train on from its weights as a new run with a "
        "schedule of its own (train(..., model=tinygpt.load(folder)[0]) and another out_dir)")


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
