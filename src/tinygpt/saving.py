"""Saving while training: into which folder, by which rank, and never a diverged model.

It handles ``TrainingDivergedError``; ``claimed(out, model)``, held for a whole run: the folder
writable, locked against a second trainer, with room on its disk for two checkpoints; and
``RunSaver``, which saves the run after a step -- rank 0 writes, every rank takes part, since the
checkpoint holds each rank's RNG state -- after checking that the weights, AdamW's moments and the
step's last batch's loss are finite, and which says which checkpoint a divergence keeps.

It does not decide when a run stops (``tinygpt.train``) or how a checkpoint is written
(``tinygpt.checkpoint``, ``tinygpt.ckptio``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from tinygpt import checkpoint, ckptio
from tinygpt.ckptcheck import non_finite
from tinygpt.config import GPTConfig, TrainConfig
from tinygpt.distributed import DistContext, broadcast_flag
from tinygpt.model import GPT
from tinygpt.resume import rng_states
from tinygpt.runtime import autocast


class TrainingDivergedError(FloatingPointError):
    """The loss or the gradient became infinite or NaN; the weights were not updated with it."""


@contextmanager
def claimed(out: Path, model: GPT) -> Iterator[None]:
    """Before the first step: ``out`` writable, locked against a second trainer, with room on
    its disk for this model's checkpoints; held until the run ends."""
    ckptio.check_writable(out)
    with ckptio.locked(out):
        ckptio.check_room(out, checkpoint.checkpoint_bytes(model),
                          have_checkpoint=(out / ckptio.MANIFEST).exists())
        yield


class RunSaver:
    """Saves a run into ``out_dir`` (nothing without one) after the steps it is due."""

    def __init__(self, out_dir: str | Path | None, ctx: DistContext, model: GPT,
                 optimizer: torch.optim.Optimizer, model_config: GPTConfig, cfg: TrainConfig,
                 tokenizer: Any, batches: torch.Generator, last_saved: int | None) -> None:
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
