"""Diagrams of chapter 5 (attention), drawn from a real, seeded ``CausalSelfAttention``.

``attention_flow`` follows one query through a one-head layer (Q, K, V -> scores -> softmax ->
weighted sum) with the layer's own numbers; ``causal_mask_grid`` draws ``causal_mask`` as a
matrix holding the same example's weights; ``multi_head`` the split into heads, attention and
concatenation with the shapes a forward pass of ``CausalSelfAttention(config)`` produces; and
``kv_cache_steps`` a ``KVCache`` filling up over four generation steps. Each returns a
``tinygpt.figures.drawing.Diagram``.

It draws what the modules compute; it does not compute attention itself, except the scores
``q k^T / sqrt(d_k)`` of the example, which it checks against the layer's own weights.
"""

from __future__ import annotations

import math

import torch

from tinygpt.attention import CausalSelfAttention, KVCache, causal_mask
from tinygpt.checks import check_instance, check_int
from tinygpt.config import GPTConfig
from tinygpt.figures.drawing import Canvas, Diagram
from tinygpt.figures.embedding_diagrams import hooked_shapes, shape_of


def attention_example(n_embd: int = 4, T: int = 4, seed: int = 0) -> dict[str, torch.Tensor]:
    """A seeded one-head layer on ``T`` random vectors: ``x``, ``q``, ``k``, ``v``, ``scores``
    (-inf where masked), ``weights`` (the layer's own) and ``y = weights @ v``; batch dropped."""
    check_int(T, "T", 1, 8)
    check_int(n_embd, "n_embd", 1, 8)
    torch.manual_seed(seed)
    layer = CausalSelfAttention(GPTConfig(n_embd=n_embd, n_head=1, block_size=T), fused=False)
    x = torch.randn(1, T, n_embd)  # (1, T, C)
    with torch.no_grad():
        q, k, v = layer.c_attn(x).split(n_embd, dim=2)  # 3 x (1, T, C)
        _, weights = layer(x, return_weights=True)  # (1, 1, T, T)
    scores = (q[0] @ k[0].T) / math.sqrt(n_embd)  # (T, T)
    scores = scores.masked_fill(~causal_mask(T, T), float("-inf"))
    weights = weights[0, 0]  # (T, T)
    torch.testing.assert_close(torch.softmax(scores, dim=-1), weights)
    return {"x": x[0], "q": q[0], "k": k[0], "v": v[0], "scores": scores, "weights": weights,
            "y": weights @ v[0]}


def _vec(t: torch.Tensor) -> str:
    return "[" + " ".join(f"{v:+.2f}" for v in t.tolist()) + "]"


def attention_flow(seed: int = 0, T: int = 4, n_embd: int = 4) -> Diagram:
    """The last position's query against every key: scores, softmax weights and the weighted sum
    of the values, with the numbers of ``attention_example(n_embd, T, seed)``."""
    ex = attention_example(n_embd, T, seed)
    t = T - 1
    c = Canvas(8.75, 1.9 + 0.72 * T)
    cols = {"k": 1.35, "v": 3.95, "s": 5.95, "a": 7.1, "bar": 8.2}  # centres of the columns
    c.box(1.75, 0.4, 3.3, 0.45, f"query q{t} = {_vec(ex['q'][t])}", fill="rose",
          mono=True, size=10, gid="query")
    heads = {"k": "keys k_j = x_j W_K", "v": "values v_j = x_j W_V", "s": "q·k_j / √d_k",
             "a": "softmax", "bar": "weight"}
    for key, title in heads.items():
        c.text(cols[key], 0.98, title, size=10, weight="bold")
    y_of = [1.5 + 0.72 * j for j in range(T)]
    for j, y in enumerate(y_of):
        c.box(cols["k"], y, 2.5, 0.45, f"k{j} {_vec(ex['k'][j])}", fill="blue", mono=True,
              size=10)
        c.box(cols["v"], y, 2.5, 0.45, f"v{j} {_vec(ex['v'][j])}", fill="violet", mono=True,
              size=10)
        c.arrow((cols["k"] + 1.25, y), (cols["s"] - 0.48, y))
        c.box(cols["s"], y, 0.95, 0.45, f"{ex['scores'][t, j]:+.3f}", fill="white", mono=True,
              size=10, gid=f"score:{j}")
        c.arrow((cols["s"] + 0.48, y), (cols["a"] - 0.43, y))
        a = float(ex["weights"][t, j])
        c.box(cols["a"], y, 0.86, 0.45, f"{a:.3f}", fill="amber", mono=True, size=10,
              gid=f"weight:{j}")
        c.box(cols["bar"] - 0.4 + 0.4 * a, y, max(0.8 * a, 0.02), 0.3, fill="amber", round_=0.02)
    c.arrow((3.4, 0.4), (cols["s"], y_of[0] - 0.24), rad=-0.15)
    y_out = y_of[-1] + 0.85
    c.box(cols["v"], y_out, 3.9, 0.45, f"y{t} = Σ weight·v = {_vec(ex['y'][t])}", fill="green",
          mono=True, size=10, gid="output")
    c.arrow((cols["a"], y_of[-1] + 0.24), (cols["v"] + 1.95, y_out), rad=-0.2)
    c.arrow((cols["v"], y_of[-1] + 0.24), (cols["v"], y_out - 0.24))
    alt = (f"One query, position {t}, attending over {T} positions: scores "
           f"{[round(float(s), 3) for s in ex['scores'][t]]}, softmax weights "
           f"{[round(float(a), 3) for a in ex['weights'][t]]}, output {_vec(ex['y'][t])}.")
    return c.finish(alt)


def causal_mask_grid(seed: int = 0, T: int = 4, n_embd: int = 4) -> Diagram:
    """``causal_mask(T, T)`` as a T x T matrix: row = query, column = key; visible cells hold
    the example's attention weights, masked cells are grey."""
    ex = attention_example(n_embd, T, seed)
    mask = causal_mask(T, T)
    cell, x0, y0 = 0.8, 1.45, 1.0
    c = Canvas(x0 + T * cell + 0.5, y0 + T * cell + 0.35)
    c.text(x0 + T * cell / 2, 0.25, "key position j (what is looked at)", size=11)
    c.text(0.55, y0 + T * cell / 2, "query\nposition t", size=11)
    for i in range(T):
        c.text(x0 + (i + 0.5) * cell, 0.7, str(i), size=11)
        c.text(x0 - 0.25, y0 + (i + 0.5) * cell, str(i), size=11)
        for j in range(T):
            visible = bool(mask[i, j])
            c.box(x0 + (j + 0.5) * cell, y0 + (i + 0.5) * cell, cell - 0.06, cell - 0.06,
                  f"{float(ex['weights'][i, j]):.2f}" if visible else "masked",
                  fill="amber" if visible else "grey", size=11 if visible else 9,
                  mono=visible, round_=0.03, gid=f"cell:{i}:{j}:{'on' if visible else 'off'}")
    alt = (f"The causal mask for {T} positions as a matrix: query t sees keys 0 to t (a lower "
           f"triangle of {int(mask.sum())} cells holding the attention weights, each row summing "
           f"to 1); the {T * T - int(mask.sum())} cells above the diagonal are masked.")
    return c.finish(alt)


def multi_head(config: GPTConfig, T: int = 8, batch: int = 1) -> Diagram:
    """Split into heads, attend, concatenate, project: the shapes ``CausalSelfAttention(config)``
    produces on a ``(batch, T, C)`` input (heads read from the weights it returns)."""
    check_instance(config, GPTConfig, "config")
    check_int(T, "T", 1, config.block_size)
    layer = CausalSelfAttention(config, fused=False).eval()
    x = torch.randn(batch, T, config.n_embd)  # (B, T, C)
    cache = KVCache.for_config(config, batch)
    s = hooked_shapes(layer, ["c_attn", "c_proj"], x, cache=cache, return_weights=True)
    with torch.no_grad():
        _, weights = layer(x, return_weights=True)  # (B, H, T, T)
    heads = tuple(cache.k[:, :, :cache.length].shape)  # (B, H, T, d_k)
    H = heads[1]
    shown = list(range(H)) if H <= 5 else [0, 1, None, H - 1]
    c = Canvas(9.0, 6.3)
    mid = 4.5
    c.box(mid, 0.4, 4.0, 0.45, f"x {shape_of(x.shape, 'B T C')}", fill="green")
    c.box(mid, 1.25, 5.2, 0.5, f"c_attn → q | k | v {shape_of(s['c_attn'], 'B T 3C')}",
          fill="blue", gid="c_attn")
    c.arrow((mid, 0.63), (mid, 1.0))
    c.text(mid, 1.9, f"split into H = {H} heads: q, k, v each {shape_of(heads, 'B H T d_k')}",
           size=11)
    gap = 8.4 / len(shown)
    for n, h in enumerate(shown):
        hx = 0.3 + gap * (n + 0.5)
        c.arrow((mid, 1.5), (hx, 2.55), rad=0)
        if h is None:
            c.text(hx, 3.05, "…", size=16)
            continue
        c.box(hx, 3.05, gap - 0.2, 0.95, f"head {h}\nsoftmax(q kᵀ/√d_k) v\n"
              f"weights {tuple(weights.shape[2:])}", fill="amber", size=10, gid=f"head:{h}")
        c.arrow((hx, 3.53), (mid, 4.35))
    c.box(mid, 4.6, 5.2, 0.5, f"concatenate heads {shape_of(s['c_proj.in'], 'B T C')}",
          fill="violet", gid="concat")
    c.box(mid, 5.55, 5.2, 0.5, f"c_proj → {shape_of(s['c_proj'], 'B T C')}", fill="blue",
          gid="c_proj")
    c.arrow((mid, 4.85), (mid, 5.3))
    alt = (f"Multi-head attention with H = {H}: x {tuple(x.shape)} goes through c_attn to "
           f"{s['c_attn']}, is split into q, k, v of {heads} per head, each head attends with "
           f"weights {tuple(weights.shape)}, the heads are concatenated back to {s['c_proj.in']} "
           f"and c_proj gives {s['c_proj']}.")
    return c.finish(alt)


def kv_cache_steps(config: GPTConfig, steps: int = 4) -> Diagram:
    """A ``KVCache`` over ``steps`` generation steps of one ``CausalSelfAttention(config)``: one
    new position a step, its key and value appended, the query attending to all stored ones."""
    check_instance(config, GPTConfig, "config")
    check_int(steps, "steps", 1, min(6, config.block_size))
    torch.manual_seed(0)
    layer = CausalSelfAttention(config).eval()
    cache = KVCache.for_config(config, 1)
    slots = min(config.block_size, steps + 3)
    cell, x0 = 0.55, 1.55
    c = Canvas(x0 + slots * cell + 3.05, 0.6 + steps * 1.05)
    c.text(x0 + slots * cell / 2, 0.25, f"cache slots: the first {slots} of "
           f"T_max = {config.block_size}", size=10)
    shapes = []
    for s in range(steps):
        with torch.no_grad():
            layer(torch.randn(1, 1, config.n_embd), cache=cache)  # one new position
        shapes.append(tuple(cache.k[:, :, :cache.length].shape))  # (B, H, t, d_k)
        y = 0.95 + s * 1.05
        c.text(0.1, y, f"step {s + 1}\nnew position {cache.length - 1}", ha="left", size=10)
        for j in range(slots):
            x = x0 + (j + 0.5) * cell
            held, new = j < cache.length, j == cache.length - 1
            fill = "amber" if new else ("blue" if held else "none")  # none: an empty slot
            for row, name in ((-0.17, "k"), (0.17, "v")):
                c.box(x, y + row, cell - 0.08, 0.3, name if held else "", fill=fill, size=9,
                      dashed=not held, round_=0.03, mono=True)
        c.text(x0 + slots * cell + 0.15, y, f"k, v each {shape_of(shapes[-1], 'B H t d_k')}",
               ha="left", size=10, gid=f"cache:{s + 1}")
    alt = (f"A KV cache of {config.block_size} positions over {steps} generation steps: each "
           f"step appends one key and one value, so the stored keys grow "
           f"{' → '.join(str(sh) for sh in shapes)} (B, H, t, d_k), and the new query attends "
           f"to all of them.")
    return c.finish(alt)
