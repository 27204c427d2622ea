"""Diagrams of chapters 1 and 4, drawn from the package's own objects, never typed in.

``bpe_tree`` draws which merges of a trained ``BPETokenizer`` built a word; ``text_to_tokens``
draws characters -> UTF-8 bytes -> tokens; ``embedding_sum`` the token and position lookups summed
into the residual stream. ``shape_of`` and ``hooked_shapes`` serve every figure module: a shape
with its letters, and the shapes a real forward pass produces. Every shape shown is read from a
tensor that a real module produced, so a diagram changes with the ``GPTConfig`` it is given.
Each returns a ``tinygpt.figures.drawing.Diagram``.

It does not train anything and draws no plots of data; the later chapters' diagrams are in
``tinygpt.figures.attention_diagrams`` (chapter 5) and ``tinygpt.figures.gpt_diagrams``
(chapters 6, 7, 8 and 10).
"""

from __future__ import annotations

import torch
from torch import nn

from tinygpt.checks import check_instance
from tinygpt.config import GPTConfig
from tinygpt.embedding import Embeddings
from tinygpt.figures.drawing import Canvas, Diagram
from tinygpt.tokenizer import BPETokenizer, render_token


def shape_of(shape: tuple[int, ...] | torch.Size, names: str) -> str:
    """``"(B, T, C) = (1, 8, 32)"``: a shape with its letters, e.g. ``names="B T C"``."""
    letters = names.split()
    if len(letters) != len(shape):
        raise ValueError(f"shape {tuple(shape)} has {len(shape)} dims, names {names!r} do not")
    return f"({', '.join(letters)}) = {tuple(shape)}".replace(",)", ")")


def hooked_shapes(module: nn.Module, names: list[str], *inputs, **kwargs) -> dict[str, tuple]:
    """Run ``module(*inputs)`` and return the output shape of each named submodule, and of its
    input under ``name + ".in"`` (the first positional input)."""
    found: dict[str, tuple] = {}

    def hook(name):
        def record(_, args, out):
            found[name + ".in"] = tuple(args[0].shape) if args else ()
            found[name] = tuple((out[0] if isinstance(out, tuple) else out).shape)
        return record

    subs = dict(module.named_modules())
    handles = [subs[n].register_forward_hook(hook(n)) for n in names]
    try:
        with torch.no_grad():
            module(*inputs, **kwargs)
    finally:
        for h in handles:
            h.remove()
    return found


# --- chapter 1 ---------------------------------------------------------------------------------

def _parts(tokenizer: BPETokenizer, token: int) -> tuple[int, int] | None:
    return tokenizer.merges[token - 256] if 256 <= token < 256 + len(tokenizer.merges) else None


def bpe_tree(tokenizer: BPETokenizer, word: str) -> Diagram:
    """The merges that built ``word``'s tokens: its bytes at the bottom, each merge a node above
    its two parts, labelled with its merge number; the word's tokens at the top."""
    check_instance(tokenizer, BPETokenizer, "tokenizer")
    ids = tokenizer.encode_ordinary(word)
    if not 1 <= len(word) <= 14:
        raise ValueError(f"word must have 1 to 14 characters to fit the figure, got {word!r}")
    leaves: list[int] = []
    nodes: dict[int, tuple] = {}  # node number -> (token, children, height)

    def build(token: int) -> int:
        parts = _parts(tokenizer, token)
        kids = [build(p) for p in parts] if parts else []
        if not kids:
            leaves.append(len(nodes))
        height = 1 + max((nodes[k][2] for k in kids), default=-1)
        nodes[len(nodes)] = (token, kids, height)
        return len(nodes) - 1

    roots = [build(t) for t in ids]
    top = max(nodes[r][2] for r in roots)
    step_x, step_y, w = 0.66, 0.85, 0.6
    xs = {n: 0.45 + i * step_x for i, n in enumerate(leaves)}
    for n in sorted(nodes, key=lambda n: nodes[n][2]):
        if nodes[n][1]:
            xs[n] = sum(xs[k] for k in nodes[n][1]) / len(nodes[n][1])
    bottom = 0.5 + top * step_y
    canvas = Canvas(max(4.6, 0.9 + (len(leaves) - 1) * step_x), bottom + 0.85)
    y_of = {n: 0.5 + (top - nodes[n][2]) * step_y for n in nodes}
    y_of.update(dict.fromkeys(roots, 0.5))  # the word's tokens on the top row
    for n, (token, kids, _) in nodes.items():
        for k in kids:
            canvas.arrow((xs[k], y_of[k] - 0.28), (xs[n], y_of[n] + 0.28))
        label = render_token(tokenizer.token_bytes(token)).replace(" ", "␣")
        number = f"#{token - 256}" if kids else str(token)
        canvas.box(xs[n], y_of[n], w, 0.56, fill="amber" if kids else "grey", gid=f"token:{token}")
        canvas.text(xs[n], y_of[n] - 0.1, label, mono=True, size=13, sticker=False)
        canvas.text(xs[n], y_of[n] + 0.15, number, size=10, sticker=False)
    canvas.text(0.15, bottom + 0.6, "amber: a merge, #n the n-th that training learned; "
                "grey: a byte, with its value", ha="left", size=10)
    steps = ", ".join(f"{render_token(tokenizer.token_bytes(t))!r} = merge {t - 256}"
                      for t in sorted({nodes[n][0] for n in nodes if nodes[n][1]}))
    alt = (f"How BPE built {word!r}: its {len(leaves)} bytes at the bottom, merged pairwise "
           f"upwards into {len(ids)} token(s) at the top; merges used: {steps or 'none'}.")
    return canvas.finish(alt)


def text_to_tokens(tokenizer: BPETokenizer, text: str) -> Diagram:
    """Three rows: the characters of ``text``, their UTF-8 bytes, and the tokens (with ids)
    that ``tokenizer`` encodes them to, each token spanning the bytes it covers."""
    check_instance(tokenizer, BPETokenizer, "tokenizer")
    data = text.encode("utf-8")
    if not 1 <= len(data) <= 16:
        raise ValueError(f"text must be 1 to 16 bytes in UTF-8 to fit the figure, got {text!r}")
    ids = tokenizer.encode_ordinary(text)
    cell, x0 = 0.5, 1.25
    canvas = Canvas(x0 + len(data) * cell + 0.2, 3.0)
    for y, name in ((0.45, "characters"), (1.35, "UTF-8 bytes"), (2.45, "tokens (id)")):
        canvas.text(0.1, y, name, ha="left", size=11)
    at = 0
    for ch in text:
        n = len(ch.encode("utf-8"))
        canvas.box(x0 + (at + n / 2) * cell, 0.45, n * cell - 0.08, 0.45,
                   ch.replace(" ", "␣"), fill="white", mono=True, gid=f"char:{at}")
        at += n
    for i, b in enumerate(data):
        canvas.box(x0 + (i + 0.5) * cell, 1.35, cell - 0.08, 0.45, str(b), fill="grey",
                   mono=True, size=11, gid=f"byte:{i}")
    at = 0
    for token in ids:
        n = len(tokenizer.token_bytes(token))
        x = x0 + (at + n / 2) * cell
        for i in range(at, at + n):
            canvas.arrow((x0 + (i + 0.5) * cell, 1.6), (x, 2.18), width=1.0)
        label = render_token(tokenizer.token_bytes(token)).replace(" ", "␣")
        canvas.box(x, 2.45, n * cell - 0.08, 0.5, f"{label}\n{token}", fill="amber",
                   mono=True, size=10, gid=f"token:{token}")
        at += n
    alt = (f"{text!r}: {len(text)} characters, {len(data)} UTF-8 bytes {list(data)}, "
           f"{len(ids)} tokens with ids {ids}.")
    return canvas.finish(alt)


# --- chapter 4 ---------------------------------------------------------------------------------

def embedding_sum(embeddings: Embeddings | GPTConfig, ids: list[int] | torch.Tensor) -> Diagram:
    """Token ids -> rows of ``wte`` and rows of the position table, summed into the residual
    stream, with the shapes that ``embeddings`` (or ``Embeddings.from_config(config)``) produces
    for ``ids`` (a list of ids, or a ``(B, T)`` tensor)."""
    if isinstance(embeddings, GPTConfig):
        embeddings = Embeddings.from_config(embeddings, embeddings.positional)
    check_instance(embeddings, Embeddings, "embeddings")
    emb = embeddings
    idx = ids if isinstance(ids, torch.Tensor) else torch.tensor([ids])  # (B, T)
    shapes = hooked_shapes(emb, ["wte"], idx)
    T = idx.shape[1]
    pos = tuple(emb.positions(T).shape)
    with torch.no_grad():
        out = tuple(emb(idx).shape)
    table = ("wpe" if emb.wpe is not None else "sinusoids")
    table_shape = (tuple(emb.wpe.weight.shape) if emb.wpe is not None else tuple(emb.pe.shape))
    c = Canvas(8.6, 4.3)
    c.box(1.3, 0.45, 2.2, 0.5, f"ids {shape_of(idx.shape, 'B T')}", fill="grey", size=11)
    c.box(5.6, 0.45, 2.6, 0.5, f"positions 0 .. {T - 1}", fill="grey", size=11)
    c.box(1.3, 1.6, 2.3, 0.7, f"wte {shape_of(emb.wte.weight.shape, 'V C')}\nlook up rows",
          fill="blue", size=11, gid="wte")
    c.box(5.6, 1.6, 2.9, 0.7, f"{table} {shape_of(table_shape, 'T_max C')}\nlook up rows",
          fill="violet", size=11, gid="wpe")
    c.arrow((1.3, 0.7), (1.3, 1.25))
    c.arrow((5.6, 0.7), (5.6, 1.25))
    c.box(3.45, 2.85, 0.5, 0.5, "+", fill="white", size=16)
    c.arrow((1.3, 1.95), (3.2, 2.85), label=shape_of(shapes["wte"], "B T C"), rad=0.25,
            label_at=0.3)
    c.arrow((5.6, 1.95), (3.7, 2.85), label=shape_of(pos, "T C"), rad=-0.25, label_at=0.3)
    c.box(3.45, 3.75, 5.6, 0.55, f"residual stream x {shape_of(out, 'B T C')}", fill="green",
          gid="stream")
    c.arrow((3.45, 3.1), (3.45, 3.47))
    alt = (f"Embedding {T} token ids: rows of wte {tuple(emb.wte.weight.shape)} give "
           f"{shapes['wte']}, rows of {table} give {pos} (broadcast over the batch), and their "
           f"sum is the residual stream {out}.")
    return c.finish(alt)
