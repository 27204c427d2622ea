"""Training a GPT: batches, the learning-rate schedule, AdamW, evaluation and the loop itself.

Chapter 8 builds it; the loop itself (``train``) is read in the under-the-hood notebook on the
training loop, and chapter 10 runs it on several processes.

It handles ``get_batch`` (random windows of a token stream: inputs and next-token targets),
``lr_at`` (linear warm-up, then a cosine decay to ``min_lr``), ``configure_optimizer`` (fused AdamW,
weight decay on matrices only), ``estimate_loss`` and ``train``, the loop. It does not define the
model (``tinygpt.model``), tokenize (``tinygpt.tokenizer``), save or resume a run
(``tinygpt.checkpoint.run_state``), choose the device or bf16
(``tinygpt.runtime``) or start processes (``torchrun``, with ``tinygpt.distributed``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from tinygpt.checkpoint.run_state import (
    RunSaver,
    TrainingDivergedError,
    claimed,
    restore_optimizer,
    start_run,
)
from tinygpt.checks import check_instance, check_int
from tinygpt.config import GPTConfig, TrainConfig
from tinygpt.distributed import (
    DistContext,
    all_reduce_mean,
    broadcast_flag,
    data_parallel,
    distributed,
    no_sync,
    own_share,
)
from tinygpt.model import GPT
from tinygpt.muon import configure_muon
from tinygpt.runtime import autocast, keep_freed_memory, resolve_device
from tinygpt.shards import TokenShards
from tinygpt.tokenizer import SavedTokenizer

if TYPE_CHECKING:
    import numpy as np

# What ``train`` learns from: token ids (a 1-D tensor, a list, a numpy array), or the shards of a
# prepared corpus (chapter 13), which are read from disk a batch at a time.
TokenData: TypeAlias = "Tensor | TokenShards | Sequence[int] | np.ndarray"
Record = dict[str, Any]  # one history entry: {"step", "loss", "lr", "tokens_per_s", ...}


def get_batch(data: Tensor | TokenShards, batch_size: int, block_size: int,
              generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """``batch_size`` random windows of ``data``: inputs ``x`` and targets ``y``, both ``(B, T)``.

    ``data`` is a 1-D integer tensor of token ids ``(N,)``. Each window starts at a uniformly
    drawn offset ``i`` in ``[0, N - T - 1]`` (with ``generator``); ``x = data[i : i+T]`` and
    ``y = data[i+1 : i+T+1]``, so ``y[b, t]`` is the token that follows ``x[b, t]``.
    """
    if isinstance(data, TokenShards):  # memory-mapped shards: the same draws, per shard
        return data.get_batch(batch_size, block_size, generator)
    _check_batch_args(data, batch_size, block_size)
    N = data.numel()
    ix = torch.randint(N - block_size, (batch_size,), generator=generator)  # (B,)
    windows = data.unfold(0, block_size + 1, 1)[ix]  # (B, T+1): copies of the chosen windows
    return windows[:, :-1].long(), windows[:, 1:].long()  # (B, T), (B, T)


def _check_batch_args(data: object, batch_size: object, block_size: object) -> None:
    """``get_batch``'s checks: a 1-D integer tensor long enough for one window, positive sizes."""
    if not isinstance(data, Tensor) or data.dim() != 1 or data.is_floating_point():
        what = f"a {data.dim()}-D {data.dtype} tensor" if isinstance(data, Tensor) else type(
            data).__name__
        raise TypeError(f"data must be a 1-D integer tensor of token ids, got {what}")
    check_int(batch_size, "batch_size")
    T = check_int(block_size, "block_size")
    if data.numel() < T + 1:
        raise ValueError(f"data holds {data.numel()} tokens, but a window of block_size={T} needs "
                         f"at least block_size + 1 = {T + 1}; use more text or a smaller "
                         "block_size")


def lr_at(step: int, config: TrainConfig) -> float:
    """The learning rate of optimizer step ``step`` (counting from 0).

    Warm-up: ``learning_rate * (step + 1) / warmup_iters`` for ``step < warmup_iters``; then,
    to ``lr_decay_iters`` (default ``max_iters``), a cosine from ``learning_rate`` down to
    ``min_lr`` (``schedule="cosine"``) or, with ``schedule="wsd"``, ``learning_rate`` until the
    last ``cooldown_fraction`` of those steps and a straight line down to ``min_lr`` over them;
    ``min_lr`` from there on.
    """
    check_int(step, "step", low=0)
    lr, warmup = config.learning_rate, config.warmup_iters
    if step < warmup:
        return lr * (step + 1) / warmup
    end = config.max_iters if config.lr_decay_iters is None else config.lr_decay_iters
    if step >= end:
        return config.min_lr
    ratio = (step - warmup) / (end - warmup)  # in [0, 1)
    if config.schedule == "wsd":
        left = (1.0 - ratio) / config.cooldown_fraction  # 1 where the cool-down starts, 0 at end
        return config.min_lr + min(1.0, left) * (lr - config.min_lr)
    return config.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - config.min_lr)


SCHEDULE_FIELDS = ("max_iters", "learning_rate", "min_lr", "warmup_iters", "lr_decay_iters",
                   "schedule", "cooldown_fraction")


def check_same_schedule(history: list[dict[str, Any]], saved: TrainConfig | None,
                        cfg: TrainConfig, step: int, out_dir: object) -> None:
    """Refuse to resume under a learning-rate schedule the saved steps did not follow.

    A resumed run continues the saved one only if ``lr_at(s, cfg)`` is the rate each step ``s``
    already taken was trained with; a larger ``max_iters`` would stretch a started cosine instead.
    """
    if (saved is not None and cfg.optimizer == "muon" and step > 0
            and saved.adamw_lr_scale != cfg.adamw_lr_scale):
        raise ValueError(
            f"cannot resume {out_dir} with adamw_lr_scale={cfg.adamw_lr_scale} (the "
            f"checkpoint's: {saved.adamw_lr_scale}): its AdamW part (embeddings, norms) took "
            f"its {step} steps at {saved.adamw_lr_scale} times the schedule's rate. Resume with "
            "the checkpoint's adamw_lr_scale, or train on from its weights as a new run")
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


def configure_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    """AdamW with two groups: matrices (``dim >= 2``) get ``weight_decay``, vectors none. In a GPT
    the decayed ones are ``wte`` (``lm_head``'s too: one tied tensor, listed once), ``wpe`` and
    every ``c_attn``, ``c_fc`` and ``c_proj`` weight; not the biases, nor the gains of ``ln_1``,
    ``ln_2``, ``ln_f`` and QK-norm, which decay would pull to 0 and their layers' output with them.

    On CPU and CUDA it is torch's fused AdamW (one kernel updates every tensor; the same update,
    equal to the per-tensor loop up to float rounding); on other devices the per-tensor loop.
    ``optimizer="muon"``: Muon for the blocks' matrices, AdamW for the rest (``configure_muon``)."""
    if config.optimizer == "muon":
        return configure_muon(model, config.learning_rate, config.weight_decay,
                              (config.beta1, config.beta2),
                              adamw_lr_scale=config.adamw_lr_scale)
    params = [p for p in model.parameters() if p.requires_grad]  # a tied matrix is yielded once
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": config.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    fused = all(p.device.type in ("cpu", "cuda") for p in params)
    return torch.optim.AdamW(groups, lr=config.learning_rate, betas=(config.beta1, config.beta2),
                             fused=fused)


def estimate_loss(model: GPT, splits: Mapping[str, Tensor | TokenShards], config: TrainConfig,
                  generator: torch.Generator | None = None, *, rank: int = 0,
                  world_size: int = 1) -> dict[str, float]:
    """The mean loss of each split over ``config.eval_iters`` batches of ``config.batch_size``.

    Runs in eval mode (no dropout) under ``torch.no_grad()`` and restores the model's mode.
    With ``world_size > 1`` all batches are drawn but only those numbered ``rank``,
    ``rank + world_size``, ... are evaluated (their mean; NaN if there are none), so that ranks
    share the work and a weighted mean over ranks is the one-process figure.
    """
    T = model.config.block_size
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    out = {}
    with torch.no_grad():
        for name, data in splits.items():
            losses = []
            for i in range(config.eval_iters):
                x, y = get_batch(data, config.batch_size, T, generator)  # (B, T)
                if i % world_size == rank:
                    _, loss = model(x.to(device), y.to(device))
                    losses.append(loss.item())
            out[name] = sum(losses) / len(losses) if losses else math.nan
    model.train(was_training)
    return out


def _as_tokens(data: TokenData, name: str, config: GPTConfig) -> Tensor | TokenShards:
    """``data`` as 1-D int64 CPU ids in ``[0, V)``, one window long (``TokenShards``: checked)."""
    if isinstance(data, TokenShards):
        return data.check(name, config.block_size, config.vocab_size)
    try:
        t = data if isinstance(data, Tensor) else torch.as_tensor(data)
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"{name} must be a 1-D sequence of token ids, got "
                        f"{type(data).__name__}") from None
    if t.dim() != 1 or t.is_floating_point() or t.dtype == torch.bool:
        raise TypeError(f"{name} must be a 1-D integer sequence of token ids, got shape "
                        f"{tuple(t.shape)} and dtype {t.dtype}")
    T, V = config.block_size, config.vocab_size
    if t.numel() < T + 1:
        raise ValueError(f"{name} holds {t.numel()} tokens, but training windows of "
                         f"block_size={T} need at least {T + 1}; use more text or a smaller "
                         "block_size")
    lo, hi = int(t.min()), int(t.max())
    if lo < 0 or hi >= V:
        raise ValueError(f"{name} holds token id {lo if lo < 0 else hi}, outside the model's "
                         f"vocabulary [0, {V}); is vocab_size right for this tokenizer?")
    return t.to(device="cpu", dtype=torch.long)


def train(
    model_config: GPTConfig, train_config: TrainConfig, train_data: TokenData,
    val_data: TokenData, *, out_dir: str | Path | None = None,
    tokenizer: SavedTokenizer | None = None, resume: bool = False,
    model: GPT | None = None, progress: bool = True,
    callback: Callable[[Record, GPT], bool | None] | None = None,
) -> list[Record]:
    """Train a GPT; return its history, one record per step (``step``, ``loss``, ``lr``,
    ``tokens_per_s``, and ``train_loss``/``val_loss`` when evaluated; step 0 first). ``out_dir``:
    save checkpoints there; ``resume=True`` continues the one there bit for bit. ``model``: train
    it in place. ``callback(record, model)``, called after each step before the step is saved (what
    it adds to the record is saved too), returning True stops the run. A non-finite loss or
    gradient raises
    ``TrainingDivergedError`` (nothing diverged is saved). Under ``torchrun`` every process calls
    it (data parallel)."""
    cfg = train_config
    train_data, val_data, device = _checked(model_config, cfg, train_data, val_data, out_dir,
                                            resume, model)
    with distributed(device) as ctx, ExitStack() as cleanup:
        device, world = ctx.device, ctx.world_size  # under torchrun on GPUs: cuda:LOCAL_RANK
        T, A = model_config.block_size, cfg.grad_accum_steps
        show = progress and ctx.is_main  # only rank 0 prints
        say = _printer(show)
        batches = torch.Generator()  # the seeded stream of training windows, the same on all ranks
        run = start_run(model_config, cfg, ctx, batches, out_dir=out_dir, resume=resume,
                        model=model, tokenizer=tokenizer, warn=say)
        model, step, history = run.model, run.step, run.history
        optimizer = configure_optimizer(model, cfg)
        if resume:
            check_same_schedule(history, run.saved_train_config, cfg, step, out_dir)
            restore_optimizer(optimizer, run.optimizer_state, out_dir)
        net = cleanup.enter_context(data_parallel(model, ctx))  # DDP shares model's parameters
        saver = RunSaver(out_dir, ctx, model, optimizer, model_config, cfg, run.tokenizer,
                         batches, last_saved=step if resume else None)
        say(f"effective batch: {cfg.batch_size} sequences x {A} accumulation steps x {world} "
            f"process(es) = {cfg.sequences_per_step * world} sequences x {T} tokens = "
            f"{cfg.sequences_per_step * world * T} tokens per step ({cfg.dtype}, {device})")
        if not history:  # a fresh run: first the loss of the initialised model
            history.append({"step": 0, **_evaluate(model, train_data, val_data, cfg, ctx)})
            _log(history[0], say)
        if out_dir is not None and ctx.is_main:  # rank 0 holds the folder's lock until the end
            cleanup.enter_context(claimed(Path(out_dir), model))
        bar = cleanup.enter_context(_progress_bar(cfg.max_iters, step, show))
        while step < cfg.max_iters:
            lr = lr_at(step, cfg)
            for group in optimizer.param_groups:  # a group may train at a multiple of the rate
                group["lr"] = lr * group.get("lr_scale", 1.0)
            t0 = time.perf_counter()
            loss_sum = 0.0
            for micro_step in range(A):  # gradient accumulation: A micro-batches, one update
                x, y = own_share(lambda: get_batch(train_data, cfg.batch_size, T, batches), ctx)
                sync = micro_step == A - 1 or world == 1  # DDP all-reduces after this backward
                with nullcontext() if sync else no_sync(net):
                    with autocast(device, cfg.dtype):
                        _, loss = net(x.to(device), y.to(device))  # (B, T) in, a scalar out
                    # One process stops at the first non-finite micro-batch, before its backward
                    # (no extra wait: loss.item() below syncs anyway). With several, a rank that
                    # raised here alone would leave the others waiting in DDP's all-reduce, so
                    # all ranks test the mean loss below instead, equal on every rank.
                    if world == 1 and not torch.isfinite(loss):
                        raise _diverged(f"the loss is {loss.item()}", step, lr, saver)
                    (loss / A).backward()
                loss_sum += loss.item()
            mean_loss = all_reduce_mean({"loss": loss_sum / A}, ctx)["loss"]  # equal on all ranks
            if not math.isfinite(mean_loss):
                raise _diverged(f"the loss is {mean_loss}", step, lr, saver)
            # the global gradient norm, clipped to grad_clip (inf: measured only, scaled by 1)
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip or math.inf)
            if not torch.isfinite(norm):
                raise _diverged(f"the gradient norm is {norm.item()}", step, lr, saver)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            seconds = time.perf_counter() - t0
            tokens = cfg.sequences_per_step * world * T  # in this step, over all ranks
            record: Record = {"step": step, "loss": mean_loss, "lr": lr,
                              "tokens_per_s": tokens / max(seconds, 1e-9)}
            if step % cfg.eval_interval == 0 or step == cfg.max_iters:
                record.update(_evaluate(model, train_data, val_data, cfg, ctx))
                _log(record, say)
            history.append(record)
            # the callback sees the record before it is saved, so what it adds is saved with it
            stop = ctx.is_main and callback is not None and callback(record, model) is True
            stop = broadcast_flag(stop, ctx)  # rank 0's callback stops every rank
            if saver.due(step) or (stop and saver.last_saved != step):
                saver.save(step, history, x, y)
            if stop:
                break
            bar.update(1)
            if step % cfg.log_interval == 0 or step == cfg.max_iters:
                bar.set_postfix(loss=f"{mean_loss:.4f}", tok_s=f"{record['tokens_per_s']:.0f}")
    model.eval()
    return history


def _checked(model_config: GPTConfig, cfg: TrainConfig, train_data: TokenData,
             val_data: TokenData, out_dir: str | Path | None, resume: bool, model: GPT | None
             ) -> tuple[Tensor | TokenShards, Tensor | TokenShards, torch.device]:
    """``train``'s checks, before any work: the data as tokens, and the device to train on."""
    check_instance(model_config, GPTConfig, "model_config")
    check_instance(cfg, TrainConfig, "train_config")
    if resume and out_dir is None:
        raise ValueError("resume=True needs the out_dir holding the checkpoint to continue")
    if model is not None and model.config != model_config:
        raise ValueError(f"model has config {model.config}, not model_config {model_config}")
    train_tokens = _as_tokens(train_data, "train_data", model_config)
    val_tokens = _as_tokens(val_data, "val_data", model_config)
    device = resolve_device(cfg.device)
    autocast(device, cfg.dtype)  # an unsupported dtype fails here
    if device.type == "cpu":
        keep_freed_memory()  # no page faults for the activations each step reallocates
    return train_tokens, val_tokens, device


def _evaluate(model: GPT, train_data: Tensor | TokenShards, val_data: Tensor | TokenShards,
              cfg: TrainConfig,
              ctx: DistContext) -> dict[str, float]:
    """``train_loss`` and ``val_loss`` (``estimate_loss``) on the same batches every time, the
    batches shared out over the ranks."""
    splits = {"train_loss": train_data, "val_loss": val_data}
    with autocast(ctx.device, cfg.dtype):
        losses = estimate_loss(model, splits, cfg, torch.Generator().manual_seed(cfg.seed + 1),
                               rank=ctx.rank, world_size=ctx.world_size)
    mine = len(range(ctx.rank, cfg.eval_iters, ctx.world_size))  # batches this rank evaluated
    return all_reduce_mean(losses, ctx, weight=mine)


def _printer(show: bool) -> Callable[[str], None]:  # a line above the progress bar, or none
    return tqdm.write if show else lambda text: None


def _log(record: Record, say: Callable[[str], None]) -> None:
    say(f"step {record['step']}: train loss {record['train_loss']:.4f}, val loss "
        f"{record['val_loss']:.4f}" + (f", lr {record['lr']:.3g}, "
        f"{record['tokens_per_s']:.0f} tokens/s" if "lr" in record else ""))


def _progress_bar(total: int, done: int, show: bool) -> Any:
    return tqdm(total=total, initial=done, disable=not show, unit="step")


def _diverged(what: str, step: int, lr: float, saver: RunSaver) -> TrainingDivergedError:
    """The error that stops a run before ``what`` (non-finite) would update the weights."""
    return TrainingDivergedError(
        f"{what} at step {step + 1} (lr {lr:.3g}): training diverged and stopped before updating "
        f"the weights; {saver.kept()}. Try a lower learning_rate, more warmup_iters or "
        "grad_clip > 0")
