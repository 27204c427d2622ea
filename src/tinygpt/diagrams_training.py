"""Diagrams of chapters 8 and 10: the training loop, the learning-rate schedule, data parallelism.

``training_loop`` draws one optimizer step as a cycle (batch -> forward -> loss -> backward ->
step) with the shapes of a real batch and forward pass; ``lr_schedule`` plots ``lr_at`` -- the
schedule ``train`` uses -- over a ``TrainConfig``'s steps; ``data_parallel`` two (or more)
processes each holding a replica, computing gradients on their share of the batch, grouped into
the buckets ``DistributedDataParallel`` would make and averaged by an all-reduce. Each returns a
``tinygpt.drawing.Diagram``.

It starts no process group and trains nothing: shapes come from one forward pass, the schedule
from ``lr_at``, the buckets from torch's own bucketing function on the model's parameters.
"""

from __future__ import annotations

import math

import torch

from tinygpt.checks import check_instance, check_int
from tinygpt.config import GPTConfig, TrainConfig
from tinygpt.diagrams import shape_of
from tinygpt.drawing import FILLS, INK, LINE, Canvas, Diagram
from tinygpt.model import GPT
from tinygpt.train import get_batch, lr_at

DDP_BUCKET_CAP_MB = 25  # DistributedDataParallel's default bucket_cap_mb


def training_loop(config: GPTConfig, train: TrainConfig) -> Diagram:
    """One optimizer step as a cycle, with the shapes of a batch of ``train.batch_size``
    windows of ``config.block_size`` tokens through ``GPT(config)``."""
    check_instance(config, GPTConfig, "config")
    check_instance(train, TrainConfig, "train")
    torch.manual_seed(0)
    model = GPT(config)
    data = torch.randint(0, config.vocab_size, (config.block_size * 2 + 1,))
    x, y = get_batch(data, train.batch_size, config.block_size)  # (B, T) each
    logits, loss = model(x, y)  # (B, T, V), ()
    n = sum(p.numel() for p in model.parameters())
    steps = [
        ("batch", f"x, y {shape_of(x.shape, 'B T')}\ny = x shifted by one", "grey"),
        ("forward", f"logits = model(x)\n{shape_of(logits.shape, 'B T V')}", "blue"),
        ("loss", f"cross-entropy(logits, y)\none number: shape {tuple(loss.shape)}", "rose"),
        ("backward", f"loss.backward()\n{n:,} gradients, one per parameter", "violet"),
        ("step", "AdamW: p -= lr · update\nlr = lr_at(step); zero the grads", "amber"),
    ]
    c = Canvas(9.0, 6.0)
    cx, cy, rx, ry = 4.5, 3.05, 3.1, 2.15
    where = []
    for i, (name, label, fill) in enumerate(steps):
        angle = math.pi / 2 + 2 * math.pi * i / len(steps)
        where.append((cx + rx * math.cos(angle + math.pi), cy - ry * math.sin(angle)))
        c.box(*where[i], 2.75, 0.85, f"{name}\n{label}", fill=fill, size=10, gid=f"loop:{name}")
    for i in range(len(steps)):
        (x0, y0), (x1, y1) = where[i], where[(i + 1) % len(steps)]
        dx, dy = x1 - x0, y1 - y0
        d = math.hypot(dx, dy)
        sx = min(1.45 / max(abs(dx) / d, 1e-9), 0.5 / max(abs(dy) / d, 1e-9))
        c.arrow((x0 + dx / d * sx, y0 + dy / d * sx), (x1 - dx / d * sx, y1 - dy / d * sx),
                rad=-0.2)
    c.text(cx, cy, f"repeat for\nmax_iters = {train.max_iters:,}\nsteps", size=11)
    alt = (f"The training loop as a cycle: a batch x, y of shape {tuple(x.shape)}, the forward "
           f"pass to logits {tuple(logits.shape)}, the cross-entropy loss (one number), "
           f"backward ({n:,} gradients), and AdamW's step; repeated {train.max_iters:,} times.")
    return c.finish(alt)


def lr_schedule(train: TrainConfig) -> Diagram:
    """``lr_at(step, train)`` for every step of the run, with the warm-up and the end of the
    cosine decay marked (on a light panel, so that the axes read in both themes)."""
    check_instance(train, TrainConfig, "train")
    steps = list(range(train.max_iters))
    lrs = [lr_at(s, train) for s in steps]
    end = train.max_iters if train.lr_decay_iters is None else train.lr_decay_iters
    c = Canvas(7.6, 3.6)
    c.box(3.8, 1.8, 7.5, 3.5, fill="white", round_=0.1)
    ax = c.fig.add_axes((0.13, 0.17, 0.82, 0.68), zorder=3)
    ax.patch.set_alpha(0)
    ax.plot(steps, lrs, color="#1d4ed8", linewidth=2, gid="lr")
    ax.axvline(train.warmup_iters, color=LINE, linestyle="--", linewidth=1)
    ax.set_xlabel("optimizer step", color=INK)
    ax.set_ylabel("learning rate", color=INK)
    ax.set_title(f"lr_at: warm-up to {train.learning_rate:g} over {train.warmup_iters:,} steps, "
                 f"cosine to {train.min_lr:g} at step {end:,}", color=INK, fontsize=11)
    ax.tick_params(colors=INK, labelsize=10)
    ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    ax.yaxis.get_offset_text().set_color(INK)
    for spine in ax.spines.values():
        spine.set_color(LINE)
    ax.set_facecolor(FILLS["white"])
    alt = (f"The learning rate over {train.max_iters:,} steps: a linear warm-up to "
           f"{train.learning_rate:g} over {train.warmup_iters:,} steps, then a cosine decay to "
           f"{train.min_lr:g} at step {end:,}.")
    return c.finish(alt)


def gradient_buckets(model: torch.nn.Module, cap_mb: float = DDP_BUCKET_CAP_MB) -> list[int]:
    """Bytes of each gradient bucket, in the order ``DistributedDataParallel`` all-reduces them:
    torch's own bucketing of the parameters in reverse order (a small first bucket, then
    ``cap_mb``)."""
    import torch.distributed as dist

    params = [p for p in model.parameters() if p.requires_grad][::-1]
    limits = [dist._DEFAULT_FIRST_BUCKET_BYTES, int(cap_mb * 1024 * 1024)]
    buckets, _ = dist._compute_bucket_assignment_by_size(params, limits)
    return [sum(params[i].numel() * params[i].element_size() for i in b) for b in buckets]


def data_parallel(config: GPTConfig, train: TrainConfig, world_size: int = 2) -> Diagram:
    """``world_size`` processes training ``GPT(config)`` on ``train.batch_size`` windows each:
    replicas, their gradients in DDP's buckets, the all-reduce that averages them, one step."""
    check_instance(config, GPTConfig, "config")
    check_instance(train, TrainConfig, "train")
    check_int(world_size, "world_size", 2, 4)
    model = GPT(config)
    n = sum(p.numel() for p in model.parameters())
    buckets = gradient_buckets(model)
    col = 4.1
    c = Canvas(0.3 + col * world_size, 6.6)
    for r in range(world_size):
        x = 0.15 + col * (r + 0.5)
        c.text(x, 0.3, f"process (rank) {r}", weight="bold", size=12)
        c.box(x, 0.95, 3.6, 0.6, f"its own {train.batch_size} windows\n"
              f"x {shape_of((train.batch_size, config.block_size), 'B T')}", fill="grey",
              size=10, gid=f"shard:{r}")
        c.box(x, 1.95, 3.6, 0.6, f"replica: the same {n:,} weights\nforward, backward",
              fill="blue", size=10, gid=f"replica:{r}")
        c.arrow((x, 1.25), (x, 1.65))
        w = 3.4 / len(buckets)
        for b, size in enumerate(buckets):
            bx = x - 1.7 + w * (b + 0.5)
            c.box(bx, 3.05, w - 0.1, 0.6, f"bucket {b}\n{size / 1024:,.0f} KiB", fill="violet",
                  size=9, gid=f"bucket:{r}:{b}")
            c.arrow((x, 2.25), (bx, 2.75))
            c.arrow((bx, 3.35), (bx, 3.85))
        c.box(x, 5.25, 3.6, 0.6, "AdamW step: every replica\nstays identical", fill="amber",
              size=10, gid=f"step:{r}")
        c.arrow((x, 4.45), (x, 4.95))
    mid = 0.15 + col * world_size / 2
    c.box(mid, 4.15, col * world_size - 0.5, 0.6, "all-reduce each bucket as soon as it is "
          f"ready: the mean of the {world_size} processes' gradients", fill="green", size=10,
          gid="allreduce")
    c.text(mid, 6.15, f"effective batch: {world_size} × {train.batch_size} = "
           f"{world_size * train.batch_size} windows per step", size=11)
    alt = (f"Data parallelism on {world_size} processes: each holds a replica of the "
           f"{n:,}-parameter model, runs forward and backward on its own {train.batch_size} "
           f"windows, and its gradients, in {len(buckets)} bucket(s) of "
           f"{[round(b / 1024) for b in buckets]} KiB, are averaged across processes by an "
           f"all-reduce before the identical AdamW step.")
    return c.finish(alt)
