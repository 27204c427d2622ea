"""Diagrams of chapters 6, 7, 8 and 10: the block, the whole GPT, training and data parallelism.

``block_pre_post``: a pre-norm and a post-norm ``Block`` side by side, the residual stream a
highway that the attention and MLP branches leave and rejoin. ``gpt_stack``: ``GPT(config)`` as a
stack with the tensor shape between every two parts. ``parameter_share``: how the parameters
divide among the parts. ``training_loop``: one optimizer step as a cycle. ``lr_schedule``: ``lr_at``
over a run. ``data_parallel_step``: processes with replicas, DDP's gradient buckets, the all-reduce.
Every shape and count is read from a module built from the config given (one forward pass, with
hooks), the schedule from ``lr_at``, the buckets from torch's own bucketing function. Each returns
a ``tinygpt.figures.drawing.Diagram``. It trains nothing and starts no process group.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from tinygpt.block import Block
from tinygpt.checks import check_instance, check_int
from tinygpt.config import GPTConfig, NormPosition, TrainConfig
from tinygpt.figures.drawing import FILLS, INK, LINE, Canvas, Diagram
from tinygpt.figures.embedding_diagrams import hooked_shapes, shape_of
from tinygpt.model import GPT, parameter_counts
from tinygpt.train import get_batch, lr_at


def _panel(c: Canvas, x0: float, config: GPTConfig, shapes: dict[str, tuple], names: dict) -> None:
    """One block drawn from ``x0``: the stream (a band) at ``x0 + 0.8``, branches to its right."""
    sx, bx, pre = x0 + 0.8, x0 + 2.75, config.norm_position == "pre"
    c.text(x0 + 2.0, 0.3, f"{config.norm_position}-norm" + (" (GPT-2)" if pre else " (GPT-1)"),
           weight="bold")
    c.box(sx, 3.6, 0.42, 5.4, fill="green", round_=0.1, gid=f"stream:{config.norm_position}")
    c.text(sx + 0.1, 0.7, f"x {shape_of(shapes['in'], 'B T C')}", size=10)
    c.text(sx + 0.3, 6.0, "residual stream", size=9, ha="left")
    c.text(sx, 6.75, f"out {shape_of(shapes['out'], 'B T C')}", size=10)

    def branch(y_off: float, boxes: list[tuple[str, str, str]], y_add: float) -> None:
        c.polyline([(sx + 0.21, y_off), (bx, y_off), (bx, y_off + 0.25)])
        y = y_off + 0.55
        for n, (label, fill, gid) in enumerate(boxes):
            c.box(bx, y, 2.3, 0.55, label, fill=fill, size=10, gid=gid)
            y_next = y + 0.85
            if n < len(boxes) - 1:
                c.arrow((bx, y + 0.28), (bx, y_next - 0.28))
            y = y_next
        c.polyline([(bx, y - 0.57), (bx, y_add), (sx + 0.21, y_add)])
        c.box(sx, y_add, 0.36, 0.36, "+", fill="white", size=13, round_=0.18)

    norm, mlp = names["norm"], f"mlp: c_fc {shape_of(shapes['c_fc'], 'B T 4C')}"
    if pre:
        branch(1.1, [(f"ln_1 {norm}", "violet", "ln_1"),
                     (f"attn {shape_of(shapes['attn'], 'B T C')}", "amber", "attn")], 3.0)
        branch(3.5, [(f"ln_2 {norm}", "violet", "ln_2"),
                     (f"{mlp}\n{names['act']}, c_proj → C", "blue", "mlp")], 5.4)
    else:
        branch(1.1, [(f"attn {shape_of(shapes['attn'], 'B T C')}", "amber", "attn")], 2.15)
        c.box(sx, 2.75, 1.3, 0.45, f"ln_1 {norm}", fill="violet", size=10, gid="ln_1")
        branch(3.45, [(f"{mlp}\n{names['act']}, c_proj → C", "blue", "mlp")], 4.5)
        c.box(sx, 5.1, 1.3, 0.45, f"ln_2 {norm}", fill="violet", size=10, gid="ln_2")
    c.arrow((sx, 6.3), (sx, 6.55))


def block_pre_post(config: GPTConfig, T: int = 8) -> Diagram:
    """A pre-norm and a post-norm ``Block`` of ``config`` side by side, with the shapes a
    ``(1, T, C)`` input takes through each (the residual stream keeps ``(B, T, C)``)."""
    check_instance(config, GPTConfig, "config")
    check_int(T, "T", 1, config.block_size)
    c = Canvas(9.4, 7.05)
    x = torch.randn(1, T, config.n_embd)  # (B, T, C)
    alt = []
    panels: tuple[tuple[float, NormPosition], ...] = ((0.1, "pre"), (4.8, "post"))
    for x0, position in panels:
        block = Block(replace(config, norm_position=position)).eval()
        s = hooked_shapes(block, ["attn", "mlp.c_fc", "ln_1"], x)
        s = {"in": s["ln_1.in"] if position == "pre" else tuple(x.shape), "attn": s["attn"],
             "c_fc": s["mlp.c_fc"], "out": tuple(block(x).detach().shape)}
        names = {"norm": type(block.ln_1).__name__, "act": config.activation}
        _panel(c, x0, replace(config, norm_position=position), s, names)
        alt.append(f"{position}-norm: " + (
            "x + attn(ln_1(x)), then x + mlp(ln_2(x))" if position == "pre"
            else "ln_1(x + attn(x)), then ln_2(x + mlp(x))"))
    return c.finish(f"Two transformer blocks side by side, the residual stream {tuple(x.shape)} "
                    f"drawn as a vertical highway: {'; '.join(alt)}; the MLP widens to "
                    f"{s['c_fc']} and projects back.")


def _stack_parts(model: GPT) -> list[tuple[str, str]]:
    """(module name, label) of the parts drawn, first to last, eliding middle blocks."""
    L = model.config.n_layer
    shown = list(range(L)) if L <= 4 else [0, 1, L - 1]
    parts = [("transformer.drop", "embed: wte[idx] + wpe[t]")]
    parts += [(f"transformer.h.{i}", f"block h.{i}: attention + MLP") for i in shown]
    if model.config.norm_position == "pre":
        parts.append(("transformer.ln_f", f"ln_f ({type(model.transformer.ln_f).__name__})"))
    parts.append(("lm_head", "lm_head" + (" (tied to wte)" if model.config.tie_weights else "")))
    return parts


def gpt_stack(config: GPTConfig, T: int | None = None, batch: int = 1) -> Diagram:
    """``GPT(config)`` from token ids to logits, with the shape between every two parts, read
    from a forward pass on a ``(batch, T)`` input (``T`` defaults to the context length)."""
    check_instance(config, GPTConfig, "config")
    T = config.block_size if T is None else check_int(T, "T", 1, config.block_size)
    model = GPT(config).eval()
    parts = _stack_parts(model)
    idx = torch.zeros(batch, T, dtype=torch.long)
    shapes = hooked_shapes(model, [name for name, _ in parts], idx)
    c = Canvas(6.6, 1.3 + 1.05 * len(parts) + (0.5 if config.n_layer > 4 else 0))
    c.box(2.6, 0.4, 3.0, 0.45, f"ids {shape_of(idx.shape, 'B T')}", fill="grey", gid="ids")
    y, prev = 0.63, None
    for name, label in parts:
        if prev == "transformer.h.1" and config.n_layer > 4:
            c.text(2.6, y + 0.28, f"⋮  blocks h.2 … h.{config.n_layer - 2}", size=11)
            y += 0.5
        top = y + 0.45
        fill = ("blue" if "embed" in label else "amber" if name.startswith("transformer.h")
                else "violet" if "ln_f" in name else "rose")
        c.box(2.6, top + 0.3, 3.6, 0.6, label, fill=fill, size=11, gid=f"part:{name}")
        c.arrow((2.6, y), (2.6, top))
        letters = "B T V" if name == "lm_head" else "B T C"
        c.text(4.55, top + 0.3, shape_of(shapes[name], letters), ha="left", size=10,
               gid=f"shape:{name}")
        y, prev = top + 0.6, name
    c.text(2.6, y + 0.3, "logits: a score for each of V next tokens, at every position",
           size=10)
    shown = "; ".join(f"{label} → {shapes[name]}" for name, label in parts)
    return c.finish(f"The GPT as a stack, from ids {tuple(idx.shape)} to logits: {shown}. "
                    f"It has {config.n_layer} blocks in all.")


def parameter_share(config: GPTConfig) -> Diagram:
    """Each part's parameters as a bar: ``parameter_counts(config)``, checked against the number
    of distinct parameters of ``GPT(config)`` (a tied matrix counted once)."""
    check_instance(config, GPTConfig, "config")
    counts = {k: v for k, v in parameter_counts(config).items() if v}
    model = GPT(config)
    total = sum(p.numel() for p in model.parameters())  # parameters() yields a tied one once
    if sum(counts.values()) != total:
        raise AssertionError(f"parameter_counts {sum(counts.values())} != model {total}")
    what = {"wte": "token table", "wpe": "position table", "attn": f"attention × {config.n_layer}",
            "mlp": f"MLP × {config.n_layer}", "norms": "block norms", "ln_f": "final norm",
            "lm_head": "output layer"}
    c = Canvas(7.4, 0.95 + 0.5 * len(counts))
    c.text(3.7, 0.3, f"{total:,} parameters (C = {config.n_embd}, L = {config.n_layer}, "
           f"V = {config.vocab_size}, T_max = {config.block_size})", size=11, weight="bold")
    biggest = max(counts.values())
    for i, (name, n) in enumerate(counts.items()):
        y = 0.85 + 0.5 * i
        c.text(2.2, y, f"{name} ({what[name]})", ha="right", size=10, sticker=True)
        w = max(3.6 * n / biggest, 0.03)
        c.box(2.35 + w / 2, y, w, 0.34, fill="blue", round_=0.02, gid=f"bar:{name}")
        c.text(2.45 + w, y, f"{n:,}  ({100 * n / total:.1f}%)", ha="left", size=10)
    shares = ", ".join(f"{k} {100 * v / total:.1f}%" for k, v in counts.items())
    return c.finish(f"Where the {total:,} parameters of the GPT are: {shares}.")


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


def gradient_buckets(model: GPT, cap_mb: float = DDP_BUCKET_CAP_MB) -> list[int]:
    """Bytes of each gradient bucket of ``DistributedDataParallel(model)`` from its second step
    on: the parameters in the order one ``backward`` completes their gradients, cut by torch's
    own bucketing function with DDP's limits (1 MiB for the first bucket, then ``cap_mb``)."""
    import torch.distributed as dist

    check_instance(model, GPT, "model")
    ready: list[torch.Tensor] = []  # parameters, in the order their gradients are ready
    handles = [p.register_post_accumulate_grad_hook(ready.append) for p in model.parameters()]
    x = torch.zeros(1, min(8, model.config.block_size), dtype=torch.long)  # (1, T)
    try:
        model(x, x)[1].backward()
    finally:
        for h in handles:
            h.remove()
        model.zero_grad(set_to_none=True)
    cap = int(cap_mb * 2**20)
    limits = [min(dist._DEFAULT_FIRST_BUCKET_BYTES, cap), cap]
    buckets, _ = dist._compute_bucket_assignment_by_size(ready, limits)
    return [sum(ready[i].nbytes for i in b) for b in buckets]


def data_parallel_step(config: GPTConfig, train: TrainConfig, world_size: int = 2) -> Diagram:
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
    c.box(mid, 4.15, col * world_size - 0.5, 0.6, "all-reduce each bucket as soon as its "
          f"gradients are ready: the mean over the {world_size} processes", fill="green",
          size=10, gid="allreduce")
    c.text(mid, 6.15, f"effective batch: {world_size} × {train.batch_size} = "
           f"{world_size * train.batch_size} windows per step; the buckets are DDP's from its "
           "second step on", size=10)
    alt = (f"Data parallelism on {world_size} processes: each holds a replica of the "
           f"{n:,}-parameter model, runs forward and backward on its own {train.batch_size} "
           f"windows, and its gradients, in {len(buckets)} bucket(s) of "
           f"{[round(b / 1024) for b in buckets]} KiB, are averaged across processes by an "
           f"all-reduce before the identical AdamW step.")
    return c.finish(alt)
