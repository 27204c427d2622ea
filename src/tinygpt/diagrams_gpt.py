"""Diagrams of chapters 6 and 7: the block and the whole GPT, with shapes from a forward pass.

``block_pre_post`` draws a pre-norm and a post-norm ``Block`` side by side, the residual stream
as a highway that the attention and MLP branches leave and rejoin; ``gpt_stack`` the whole
``GPT(config)`` as a stack with the tensor shape between every two parts; ``parameter_share``
how its parameters divide among the parts (``parameter_counts``, checked against the model).
Every shape and count is read from a module built from the ``GPTConfig`` given. Each returns a
``tinygpt.drawing.Diagram``.

It does not draw training or scaling out: see ``tinygpt.diagrams_training``.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from tinygpt.block import Block
from tinygpt.checks import check_instance, check_int
from tinygpt.config import GPTConfig
from tinygpt.diagrams import hooked_shapes, shape_of
from tinygpt.drawing import Canvas, Diagram
from tinygpt.model import GPT, parameter_counts


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
    for x0, position in ((0.1, "pre"), (4.8, "post")):
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
