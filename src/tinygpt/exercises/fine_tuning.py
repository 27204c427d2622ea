"""The exercises of chapter 14: a LoRA layer's output, the Wilson interval of an accuracy, and
dynamic evaluation's score-then-learn loop. Graded against the package's own functions
(``tinygpt.lora``, ``tinygpt.multiple_choice``, ``tinygpt.book.dynamic_eval``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tinygpt.book.dynamic_eval import read_and_learn
from tinygpt.exercises.grading import Case, Exercise, Mistake
from tinygpt.exercises.inputs import DTYPES, Draw
from tinygpt.lora import LoRALinear
from tinygpt.multiple_choice import wilson_interval

LORA_ARGS = ("x", "weight", "bias", "A", "B", "alpha")
Z = 1.959963984540054  # 95%


def lora_cases() -> list[Case]:
    draw = Draw(1401)
    cases = []
    for i in range(24):
        n_in, n_out = draw.integer(1, 8), draw.integer(1, 8)
        rank = draw.integer(1, min(n_in, n_out))
        dtype = draw.choice(DTYPES)
        shape = (*draw.batch_shape(), n_in)
        bias = draw.normal(n_out, dtype=dtype) if i % 3 else None
        B = torch.zeros(n_out, rank, dtype=dtype) if i == 0 else draw.normal(n_out, rank,
                                                                             dtype=dtype)
        alpha = draw.choice([1.0, 2.0, 8.0, 16.0])
        note = (f"x {shape}, W ({n_out}, {n_in}), rank {rank}, alpha {alpha:g}"
                + (", no bias" if bias is None else "") + (", B = 0" if i == 0 else ""))
        cases.append(Case((draw.normal(*shape, dtype=dtype), draw.normal(n_out, n_in, dtype=dtype),
                           bias, draw.normal(rank, n_in, dtype=dtype), B, alpha), note=note))
    return cases


def lora_reference(x: Tensor, weight: Tensor, bias: Tensor | None, A: Tensor, B: Tensor,
                   alpha: float) -> Tensor:
    """The package's ``LoRALinear`` with these weights."""
    base = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, dtype=weight.dtype)
    with torch.no_grad():
        base.weight.copy_(weight)
        if bias is not None:
            base.bias.copy_(bias)
        layer = LoRALinear(base, A.shape[0], alpha)
        layer.A.copy_(A)
        layer.B.copy_(B)
        return layer(x)


def wilson_cases() -> list[Case]:
    cases = [Case((0, 10, Z), note="no right answer"), Case((10, 10, Z), note="all right"),
             Case((5, 10, Z), note="half"), Case((1, 1, Z), note="one question"),
             Case((348, 500, Z), note="the book model's word cut"),
             Case((50, 100, 1.0), note="z = 1")]
    draw = Draw(1402)
    for _ in range(20):
        n = draw.integer(1, 2000)
        cases.append(Case((draw.integer(0, n), n, Z), note="random"))
    return cases


def wilson_with(successes: int, n: int, z: float, centre_shift: bool = True,
                width_term: bool = True) -> tuple[float, float]:
    """The Wilson interval, or the normal approximation's parts of it, knob by knob."""
    p = successes / n
    shrink = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / shrink if centre_shift else p
    spread = p * (1 - p) / n + (z * z / (4 * n * n) if width_term else 0.0)
    half = z * math.sqrt(spread) / (shrink if width_term else 1.0)
    return max(0.0, centre - half), min(1.0, centre + half)


def dynamic_cases() -> list[Case]:
    """A table of next-character logits (an ``nn.Embedding(V, V)``: a bigram model) and a few
    chunks of (inputs, targets) to read, at several learning rates."""
    draw = Draw(1403)
    cases = []
    for i in range(16):
        V, n_chunks = draw.integer(2, 7), draw.integer(1, 5) if i else 3
        model = nn.Embedding(V, V)
        with torch.no_grad():
            model.weight.copy_(draw.normal(V, V))
        chunks = []
        for _ in range(n_chunks):
            B, T = draw.integer(1, 2), draw.integer(1, 6)
            text = torch.tensor(draw.ids(B * (T + 1), V)).view(B, T + 1)  # (B, T + 1)
            chunks.append((text[:, :-1], text[:, 1:]))
        lr = draw.choice([0.1, 0.5, 1.0, 3.0]) if i else 1.0
        cases.append(Case((model, chunks, lr), note=f"V = {V}, {n_chunks} chunks, lr {lr:g}"))
    return cases


def dynamic_reference(model: nn.Module, chunks: list[tuple[Tensor, Tensor]], lr: float) -> Tensor:
    """``read_and_learn`` with SGD at ``lr``: each chunk's mean loss as scored."""
    scored = read_and_learn(model, chunks, torch.optim.SGD(model.parameters(), lr=lr))
    return torch.tensor([total / y.numel() for total, (_, y) in zip(scored, chunks)])


def dynamic_with(score_first: bool = True, learn: bool = True, zero_grad: bool = True,
                 mean: bool = True):
    """The loop with one thing wrong: the step before the score, no step, gradients that add up
    across chunks, or a step on the summed loss."""
    def loop(model: nn.Module, chunks: list[tuple[Tensor, Tensor]], lr: float) -> Tensor:
        optimizer, losses = torch.optim.SGD(model.parameters(), lr=lr), []
        for x, y in chunks:
            if score_first:
                losses.append(F.cross_entropy(model(x).flatten(0, 1), y.flatten()).item())
            if learn:
                if zero_grad:
                    optimizer.zero_grad()
                F.cross_entropy(model(x).flatten(0, 1), y.flatten(),
                                reduction="mean" if mean else "sum").backward()
                optimizer.step()
            if not score_first:
                losses.append(F.cross_entropy(model(x).flatten(0, 1), y.flatten()).item())
        return torch.tensor(losses)
    return loop


EXERCISES = [
    Exercise(
        "lora_forward", 14, "lora_forward",
        "lora_forward(x: Tensor (..., in), weight: Tensor (out, in), bias: Tensor (out,) or "
        "None, A: Tensor (r, in), B: Tensor (out, r), alpha: float) -> Tensor (..., out)",
        "x W^T + b plus the low-rank change (alpha / r) x A^T B^T",
        lora_reference, lora_cases, names=LORA_ARGS, mistakes=(
            Mistake("scale the change by alpha / r (r = A.shape[0]), not by alpha",
                    lambda x, w, b, A, B, alpha: F.linear(x, w + alpha * B @ A, b)),
            Mistake("the change is scaled: (alpha / r) x A^T B^T, with r = A.shape[0]",
                    lambda x, w, b, A, B, alpha: F.linear(x, w + B @ A, b)),
            Mistake("keep the frozen layer's output, x W^T + b, and add the change to it",
                    lambda x, w, b, A, B, alpha: alpha / A.shape[0] * x @ A.T @ B.T),
        )),
    Exercise(
        "wilson_interval", 14, "wilson_interval",
        "wilson_interval(successes: int, n: int, z: float) -> (low, high)",
        "the 95% (z = 1.96) Wilson score interval of a share successes / n",
        lambda s, n, z: wilson_interval(s, n, z), wilson_cases, names=("successes", "n", "z"),
        parts=("low", "high"), mistakes=(
            Mistake("that is the normal approximation p +- z sqrt(p (1 - p) / n); Wilson's "
                    "centre is (p + z^2 / 2n) / (1 + z^2 / n), its half-width "
                    "z sqrt(p (1 - p) / n + z^2 / 4n^2) / (1 + z^2 / n)",
                    lambda s, n, z: wilson_with(s, n, z, centre_shift=False, width_term=False)),
            Mistake("the centre moves towards 1/2: (p + z^2 / 2n) / (1 + z^2 / n), not p",
                    lambda s, n, z: wilson_with(s, n, z, centre_shift=False)),
            Mistake("the half-width has two terms under the root, p (1 - p) / n + z^2 / 4n^2, "
                    "and is divided by 1 + z^2 / n",
                    lambda s, n, z: wilson_with(s, n, z, width_term=False)),
        )),
    Exercise(
        "dynamic_evaluation", 14, "dynamic_losses",
        "dynamic_losses(model: nn.Module mapping (B, T) ids to (B, T, V) logits, chunks: list "
        "of (x, y) id tensors (B, T), lr: float) -> Tensor (len(chunks),)",
        "for each chunk in order, its mean cross-entropy (nats per token), then one SGD step "
        "(lr) on that loss: the loss of each chunk as read before learning from it",
        dynamic_reference, dynamic_cases, names=("model", "chunks", "lr"),
        may_change=("model",),  # learning from each chunk is the task
        mistakes=(
            Mistake("trained before scoring: score each chunk first, then take the step on it; "
                    "a model that has trained on a chunk has read its answers",
                    dynamic_with(score_first=False)),
            Mistake("the model never learns: after scoring a chunk, take an SGD step on its loss "
                    "(backward, then optimizer.step())", dynamic_with(learn=False)),
            Mistake("the gradients add up across chunks: zero them (optimizer.zero_grad()) before "
                    "each backward", dynamic_with(zero_grad=False)),
            Mistake("take the step on the chunk's mean loss (cross_entropy's default), not on its "
                    "sum", dynamic_with(mean=False)),
        )),
]
