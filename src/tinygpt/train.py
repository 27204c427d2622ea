"""Training a GPT: batches, the learning-rate schedule, AdamW, evaluation and the loop itself.

It handles:

* ``TrainConfig``: every training setting (batch size, steps, learning rates, AdamW's
  hyper-parameters, clipping, accumulation, evaluation and saving intervals, seed, device) in one
  validated, frozen dataclass; the model's sizes stay in ``GPTConfig``;
* ``get_batch``: ``B`` random windows of ``T + 1`` tokens of a token stream, as inputs ``x`` and
  next-token targets ``y`` (``y`` is ``x`` shifted left by one), drawn with a seeded generator;
* ``lr_at``: linear warm-up, then a cosine decay to ``min_lr``;
* ``configure_optimizer``: ``torch.optim.AdamW`` (fused) with weight decay on matrices only;
* ``keep_freed_memory``: on Linux, let ``malloc`` reuse freed activations (no page faults);
* ``estimate_loss``: the mean loss over ``eval_iters`` batches, without gradients;
* ``autocast``: the context the forward pass runs in for ``TrainConfig.dtype`` (bf16 or none);
* ``train``: the loop, which returns its history (one record per step) and, given ``out_dir``,
  saves checkpoints that it can resume from bit for bit; optionally under bf16 autocast, and on
  several processes under ``torchrun`` (data parallel, with ``tinygpt.distributed``).

It does not define the model (``tinygpt.model``), read corpora or tokenize
(``tinygpt.data``, ``tinygpt.tokenizer``), write files (``tinygpt.checkpoint``) or sample.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from tinygpt.checks import check_int
from tinygpt.config import GPTConfig, TrainConfig
from tinygpt.distributed import (
    DistContext,
    all_reduce_mean,
    broadcast_flag,
    distributed,
    gather_rng_states,
    own_share,
    rng_key,
    saved_world_size,
    wrap_model,
)
from tinygpt.model import GPT
from tinygpt.runtime import autocast, keep_freed_memory, resolve_device

Record = dict[str, Any]  # one history entry: {"step", "loss", "lr", "tokens_per_s", ...}


class TrainingDivergedError(FloatingPointError):
    """The loss or the gradient became infinite or NaN; the weights were not updated with it."""


def get_batch(data: Tensor, batch_size: int, block_size: int,
              generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """``batch_size`` random windows of ``data``: inputs ``x`` and targets ``y``, both ``(B, T)``.

    ``data`` is a 1-D integer tensor of token ids ``(N,)``. Each window starts at a uniformly
    drawn offset ``i`` in ``[0, N - T - 1]`` (with ``generator``); ``x = data[i : i+T]`` and
    ``y = data[i+1 : i+T+1]``, so ``y[b, t]`` is the token that follows ``x[b, t]``.
    """
    if not isinstance(data, Tensor) or data.dim() != 1 or data.is_floating_point():
        what = f"a {data.dim()}-D {data.dtype} tensor" if isinstance(data, Tensor) else type(
            data).__name__
        raise TypeError(f"data must be a 1-D integer tensor of token ids, got {what}")
    check_int(batch_size, "batch_size")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
    N = data.numel()
    if N < block_size + 1:
        raise ValueError(f"data holds {N} tokens, but a window of block_size={block_size} needs "
                         f"at least block_size + 1 = {block_size + 1}; use more text or a "
                         "smaller block_size")
    ix = torch.randint(N - block_size, (batch_size,), generator=generator)  # (B,)
    windows = data.unfold(0, block_size + 1, 1)[ix]  # (B, T+1): copies of the chosen windows
    return windows[:, :-1].long(), windows[:, 1:].long()  # (B, T), (B, T)


def lr_at(step: int, config: TrainConfig) -> float:
    """The learning rate of optimizer step ``step`` (counting from 0).

    Warm-up: ``learning_rate * (step + 1) / warmup_iters`` for ``step < warmup_iters``; then a
    cosine from ``learning_rate`` down to ``min_lr`` at ``lr_decay_iters`` (default
    ``max_iters``); ``min_lr`` from there on.
    """
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be an integer >= 0, got {step!r}")
    lr, warmup = config.learning_rate, config.warmup_iters
    if step < warmup:
        return lr * (step + 1) / warmup
    end = config.max_iters if config.lr_decay_iters is None else config.lr_decay_iters
    if step >= end:
        return config.min_lr
    ratio = (step - warmup) / (end - warmup)  # in [0, 1)
    return config.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - config.min_lr)


SCHEDULE_FIELDS = ("max_iters", "learning_rate", "min_lr", "warmup_iters", "lr_decay_iters")


def _check_same_schedule(history: list[Record], saved: TrainConfig | None, cfg: TrainConfig,
                         step: int, out_dir: object) -> None:
    """Refuse to resume under a learning-rate schedule the checkpoint's steps did not follow.

    A resumed run is the uninterrupted run of ``cfg`` only if ``lr_at(s, cfg)`` is the rate each
    step ``s`` already taken was trained with (the ``lr`` of the saved history). Raising
    ``max_iters`` of a finished run would instead stretch its cosine: the rate would jump back
    up at the resume point.
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


def configure_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.AdamW:
    """AdamW with two groups: matrices (``dim >= 2``: weights, embeddings) get ``weight_decay``,
    vectors (biases, norm gains) get none. Shared (tied) parameters appear once.

    On CPU and CUDA it is torch's fused AdamW (one kernel updates every tensor; the same update,
    equal to the per-tensor loop up to float rounding); on other devices the per-tensor loop."""
    params = [p for p in model.parameters() if p.requires_grad]  # a tied matrix is yielded once
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": config.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    fused = all(p.device.type in ("cpu", "cuda") for p in params)
    return torch.optim.AdamW(groups, lr=config.learning_rate, betas=(config.beta1, config.beta2),
                             fused=fused)


def estimate_loss(model: GPT, splits: Mapping[str, Tensor], config: TrainConfig,
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


def _as_tokens(data: object, name: str, config: GPTConfig) -> Tensor:
    """``data`` as a 1-D int64 CPU tensor of ids in ``[0, V)``, long enough for one window."""
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
    model_config: GPTConfig, train_config: TrainConfig, train_data: object, val_data: object, *,
    out_dir: str | Path | None = None, tokenizer: object = None, resume: bool = False,
    model: GPT | None = None, progress: bool = True,
    callback: Callable[[Record, GPT], bool | None] | None = None,
) -> list[Record]:
    """Train a GPT and return its history: one record per optimizer step.

    Each record holds ``step`` (updates done), ``loss`` (the step's training loss), ``lr`` and
    ``tokens_per_s``; every ``eval_interval`` steps and after the last, also ``train_loss`` and
    ``val_loss`` (``estimate_loss``). A fresh run first records ``{"step": 0, "train_loss",
    "val_loss"}``, the loss of the initialised model.

    Without ``model``, the global torch and ``random`` RNGs are seeded with ``seed`` and a new
    ``GPT(model_config)`` is built; ``model`` trains that model in place instead. ``out_dir``:
    save checkpoints there (``tinygpt.checkpoint``), every ``save_every`` steps and after the last;
    ``callback(record, model)`` is called after each step (and its save); returning True stops
    training (saving that step). ``resume=True`` continues the checkpoint in ``out_dir`` --
    model, optimizer, RNG states and history -- up to ``train_config.max_iters``, giving the same
    numbers as an uninterrupted run. It refuses (``ValueError``) a ``train_config`` whose
    learning-rate schedule differs on the steps already taken (e.g. a larger ``max_iters`` for a
    run whose cosine had started): that would stretch the schedule, not continue the run. A NaN
    or infinite loss or gradient raises ``TrainingDivergedError`` before any weight is changed;
    the last saved checkpoint is kept. Weights that hold an inf or a NaN, or give the step's last
    batch a non-finite loss, are never saved: the save raises ``TrainingDivergedError`` instead,
    keeping the last good checkpoint. Before the first step, ``out_dir`` is checked writable,
    with room for two checkpoints, and locked against a second trainer (``tinygpt.ckptio``)
    until the run ends.

    On the CPU, ``keep_freed_memory()`` is called first (a process-wide ``malloc`` setting).
    ``train_config.dtype="bfloat16"`` runs the forward pass under bf16 autocast. Started by
    ``torchrun`` with ``N > 1`` processes, every process calls ``train`` and they train one
    model data-parallel (``tinygpt.distributed``): the model is wrapped in
    ``DistributedDataParallel``; each rank takes its share of the same seeded global batch, so a
    step sees ``N * batch_size * grad_accum_steps`` sequences -- exactly those a single process
    with ``N`` times the ``grad_accum_steps`` would see; losses and evaluations are averaged over
    the ranks, so every rank returns the same history; only rank 0 shows progress, calls
    ``callback`` (its answer stops all ranks) and writes checkpoints, which hold the plain
    model's weights and each rank's RNG state. Resuming with the same ``N`` continues as the
    uninterrupted run would; with another ``N`` it continues from the same weights, optimizer and
    batch stream, but with the new global batch (a warning says so), so it matches no
    uninterrupted run.
    """
    if not isinstance(model_config, GPTConfig):
        raise TypeError(f"model_config must be a GPTConfig, got {type(model_config).__name__}")
    if not isinstance(train_config, TrainConfig):
        raise TypeError(f"train_config must be a TrainConfig, got {type(train_config).__name__}")
    if resume and out_dir is None:
        raise ValueError("resume=True needs the out_dir holding the checkpoint to continue")
    if model is not None and model.config != model_config:
        raise ValueError(f"model has config {model.config}, not model_config {model_config}")
    train_data = _as_tokens(train_data, "train_data", model_config)
    val_data = _as_tokens(val_data, "val_data", model_config)
    device = resolve_device(train_config.device)
    autocast(device, train_config.dtype)  # an unsupported dtype fails here, before any work
    if device.type == "cpu":
        keep_freed_memory()  # no page faults for the activations each step reallocates
    with distributed(device) as ctx:
        return _run(ctx, model_config, train_config, train_data, val_data, out_dir, tokenizer,
                    resume, model, progress, callback)


def _run(ctx: DistContext, model_config: GPTConfig, cfg: TrainConfig, train_data: Tensor,
         val_data: Tensor, out_dir: str | Path | None, tokenizer: object, resume: bool,
         model: GPT | None, progress: bool,
         callback: Callable[[Record, GPT], bool | None] | None) -> list[Record]:
    """``train``'s loop on one process; with several ranks, all run it in lock step."""
    from tqdm.auto import tqdm

    from tinygpt.checkpoint import load_checkpoint, restore_optimizer, save_checkpoint

    device, T, world = ctx.device, model_config.block_size, ctx.world_size
    show = progress and ctx.is_main
    batch_gen = torch.Generator()

    if resume:
        ckpt = load_checkpoint(out_dir)
        if ckpt.model_config != model_config:
            raise ValueError(f"the checkpoint in {out_dir} has model config {ckpt.model_config}, "
                             f"not {model_config}")
        _check_same_schedule(ckpt.history, ckpt.train_config, cfg, ckpt.step, out_dir)
        if model is None:
            model = ckpt.model
        else:
            model.load_state_dict(ckpt.model.state_dict())
        model.to(device).train()
        optimizer = configure_optimizer(model, cfg)
        restore_optimizer(optimizer, ckpt.optimizer_state, out_dir)
        rng = ckpt.rng_states
        saved_world = saved_world_size(rng)
        if saved_world != world and show:
            tqdm.write(f"warning: {out_dir} was written by {saved_world} process(es), this run "
                       f"has {world}: the global batch changes, so the continuation matches no "
                       "uninterrupted run")
        torch.set_rng_state(rng.get(rng_key("torch", ctx.rank), rng["torch"]))
        random.setstate(rng["python"])
        batch_gen.set_state(rng["batch"])
        if device.type == "cuda" and "cuda" in rng:
            torch.cuda.set_rng_state(rng.get(rng_key("cuda", ctx.rank), rng["cuda"]), device)
        step, history = ckpt.step, list(ckpt.history)
        tokenizer = ckpt.tokenizer if tokenizer is None else tokenizer
    else:
        if model is None:
            torch.manual_seed(cfg.seed)
            random.seed(cfg.seed)
            model = GPT(model_config)
        if ctx.is_distributed:  # same weights everywhere, but each rank its own dropout masks
            torch.manual_seed(cfg.seed + 1 + ctx.rank)
        model.to(device).train()
        batch_gen.manual_seed(cfg.seed)
        optimizer = configure_optimizer(model, cfg)
        step, history = 0, []
    net = wrap_model(model, ctx)  # DDP shares model's parameters; the checkpoint saves model's
    amp = cfg.dtype

    splits = {"train_loss": train_data, "val_loss": val_data}
    shard = len(range(ctx.rank, cfg.eval_iters, world))  # evaluation batches this rank does

    def evaluate() -> dict[str, float]:  # the same held-out batches at every evaluation
        with autocast(device, amp):
            losses = estimate_loss(model, splits, cfg, torch.Generator().manual_seed(cfg.seed + 1),
                                   rank=ctx.rank, world_size=world)
        return all_reduce_mean(losses, ctx, weight=shard)

    def save() -> None:
        rng = {"python": random.getstate(), "batch": batch_gen.get_state(),
               **gather_rng_states(ctx)}  # a collective: every rank calls save()
        bad = _unsaveable(model, optimizer, x, y, amp) if ctx.is_main else None
        if broadcast_flag(bad is not None, ctx):  # never save a diverged model: keep the last
            kept = (f"the checkpoint of step {last_saved} in {out_dir} is kept"
                    if last_saved is not None else "no checkpoint was saved")
            raise TrainingDivergedError(
                f"the weights after step {step} {bad or 'are not finite on rank 0'}: training "
                f"diverged; they were not saved and {kept}. Try a lower learning_rate, more "
                "warmup_iters or grad_clip > 0")
        if ctx.is_main:
            save_checkpoint(out_dir, model, optimizer, model_config, cfg, step, tokenizer, rng,
                            history)

    def log(record: Record) -> None:
        if show:
            tqdm.write(f"step {record['step']}: train loss {record['train_loss']:.4f}, val loss "
                       f"{record['val_loss']:.4f}" + (f", lr {record['lr']:.3g}, "
                       f"{record['tokens_per_s']:.0f} tokens/s" if "lr" in record else ""))

    if show:
        seqs = cfg.sequences_per_step * world
        tqdm.write(f"effective batch: {cfg.batch_size} sequences x {cfg.grad_accum_steps} "
                   f"accumulation steps x {world} process(es) = {seqs} sequences x {T} tokens "
                   f"= {seqs * T} tokens per step ({cfg.dtype}, {device})")
    if step == 0 and not history:
        history.append({"step": 0, **evaluate()})
        log(history[0])
    last_saved = step if resume else None
    guard = ExitStack()  # rank 0 holds the folder's lock for the whole run
    if out_dir is not None and ctx.is_main:
        guard.enter_context(_claimed(Path(out_dir), model))
    bar = tqdm(total=cfg.max_iters, initial=step, disable=not show, unit="step")
    try:
        while step < cfg.max_iters:
            lr = lr_at(step, cfg)
            for group in optimizer.param_groups:
                group["lr"] = lr
            t0 = time.perf_counter()
            total = 0.0
            for micro in range(cfg.grad_accum_steps):
                x, y = own_share(lambda: get_batch(train_data, cfg.batch_size, T, batch_gen), ctx)
                last = micro == cfg.grad_accum_steps - 1  # DDP all-reduces after this backward
                with nullcontext() if last or world == 1 else net.no_sync():
                    with autocast(device, amp):
                        _, loss = net(x.to(device), y.to(device))  # (B, T) in, a scalar out
                    if world == 1 and not torch.isfinite(loss):
                        _diverged(f"the loss is {loss.item()}", step, lr, out_dir, last_saved)
                    (loss / cfg.grad_accum_steps).backward()
                total += loss.item()
            mean_loss = all_reduce_mean({"loss": total / cfg.grad_accum_steps}, ctx)["loss"]
            if not math.isfinite(mean_loss):  # ranks agree on the mean, so all of them stop
                _diverged(f"the loss is {mean_loss}", step, lr, out_dir, last_saved)
            # the global gradient norm, clipped to grad_clip (inf: measured only, scaled by 1)
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip or math.inf)
            if not torch.isfinite(norm):
                _diverged(f"the gradient norm is {norm.item()}", step, lr, out_dir, last_saved)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            seconds = time.perf_counter() - t0
            record: Record = {"step": step, "loss": mean_loss, "lr": lr,
                              "tokens_per_s": cfg.sequences_per_step * world * T / max(seconds, 1e-9)}
            if step % cfg.eval_interval == 0 or step == cfg.max_iters:
                record.update(evaluate())
                log(record)
            history.append(record)
            if out_dir is not None and (step == cfg.max_iters
                                        or (cfg.save_every and step % cfg.save_every == 0)):
                save()
                last_saved = step
            stop = ctx.is_main and callback is not None and callback(record, model) is True
            stop = broadcast_flag(stop, ctx)
            if stop and out_dir is not None and last_saved != step:
                save()
            bar.update(1)
            if step % cfg.log_interval == 0 or step == cfg.max_iters:
                bar.set_postfix(loss=f"{record['loss']:.4f}",
                                tok_s=f"{record['tokens_per_s']:.0f}")
            if stop:
                break
    finally:
        bar.close()
        guard.close()
    model.eval()
    return history


@contextmanager
def _claimed(out: Path, model: GPT) -> Iterator[None]:
    """Before the first step: ``out`` writable, locked against a second trainer, with room on
    its disk for this model's checkpoints; held until the run ends."""
    from tinygpt import ckptio
    from tinygpt.checkpoint import checkpoint_bytes

    ckptio.check_writable(out)
    with ckptio.locked(out):
        ckptio.check_room(out, checkpoint_bytes(model),
                          have_checkpoint=(out / ckptio.MANIFEST).exists())
        yield


def _unsaveable(model: GPT, optimizer: torch.optim.Optimizer, x: Tensor, y: Tensor,
                amp: str) -> str | None:
    """Why the model must not be saved (its weights or AdamW's state hold an inf or a NaN, or
    the last batch's loss under these weights is not finite), else None. RNGs are not used."""
    from tinygpt.ckptcheck import non_finite

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


def _diverged(what: str, step: int, lr: float, out_dir: object, last_saved: int | None) -> None:
    kept = (f"the checkpoint of step {last_saved} in {out_dir} is kept" if last_saved is not None
            else "no checkpoint was saved")
    raise TrainingDivergedError(
        f"{what} at step {step + 1} (lr {lr:.3g}): training diverged and stopped before updating "
        f"the weights; {kept}. Try a lower learning_rate, more warmup_iters or grad_clip > 0")
