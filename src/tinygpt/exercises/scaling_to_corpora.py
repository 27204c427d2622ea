"""The exercises of chapters 10 to 13: a rank's share of a batch and the mean over ranks; softmax
and RMSNorm on plain lists; RoPE and RMSNorm on tensors; window starts over token shards and
where a window index falls. Graded against the package's own functions (or torch's).
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Literal, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from tinygpt import scalar_gpt
from tinygpt.autograd import Value
from tinygpt.distributed import DistContext, own_share
from tinygpt.exercises.grading import Case, Exercise, Mistake
from tinygpt.exercises.inputs import DTYPES, Draw
from tinygpt.rope import rotate_halves, rotate_interleaved
from tinygpt.shards import TokenShards

# -- chapter 10 --------------------------------------------------------------------------------


def rank_share_cases() -> list[Case]:
    draw = Draw(1001)
    cases = []
    for world_size in (1, 2, 3, 4):
        for rank in range(world_size):
            b = draw.integer(1, 3)
            batch = torch.arange(world_size * b * 3).reshape(world_size * b, 3)
            cases.append(Case((batch, rank, world_size),
                              note=f"rank {rank} of {world_size}, {b} rows each"))
    return cases


def rank_share_reference(batch: Tensor, rank: int, world_size: int) -> Tensor:
    """The share ``own_share`` gives a rank when the global batch is drawn in order."""
    shares = iter(batch.chunk(world_size))
    return own_share(lambda: next(shares), DistContext(rank=rank, world_size=world_size))


def mean_over_ranks_cases() -> list[Case]:
    cases = [Case(([2.0, 4.0], [1.0, 1.0]), note="equal weights"),
             Case(([2.0, 4.0], [3.0, 1.0]), note="rank 0 evaluated 3 batches, rank 1 one"),
             Case(([5.0], [2.0]), note="one rank"),
             Case(([1.5, float("nan"), 2.5], [2.0, 0.0, 2.0]),
                  note="a rank that evaluated nothing (weight 0, mean nan)")]
    draw = Draw(1002)
    for _ in range(15):
        n = draw.integer(1, 5)
        cases.append(Case(([draw.random.uniform(0, 5) for _ in range(n)],
                           [float(draw.integer(1, 4)) for _ in range(n)]), note="random"))
    return cases


def mean_over_ranks_reference(means: list[float], weights: list[float]) -> float:
    """``all_reduce_mean``'s rule: sum(mean * weight) / sum(weight); weight 0 adds nothing."""
    total = sum(m * w if w else 0.0 for m, w in zip(means, weights))
    return total / sum(weights)


# -- chapter 11 --------------------------------------------------------------------------------


def list_cases(seed: int) -> list[Case]:
    cases = [Case(([1.0, 2.0, 3.0],), note="small"),
             Case(([1000.0, 999.0, 0.0],), note="large values"),
             Case(([2.0, 2.0, 2.0],), note="ties"), Case(([0.5],), note="length 1")]
    draw = Draw(seed)
    cases += [Case(([draw.random.gauss(0, 3) for _ in range(draw.integer(1, 8))],), note="random")
              for _ in range(20)]
    return cases


def softmax_list_reference(logits: list[float]) -> list[float]:
    return [p.data for p in scalar_gpt.softmax([Value(x) for x in logits])]


def rmsnorm_list_reference(x: list[float], eps: float = 1e-5) -> list[float]:
    return [y.data for y in scalar_gpt.rmsnorm([Value(v) for v in x], eps)]


def rmsnorm_list_with(x: list[float], eps: float = 1e-5, center: bool = False,
                      eps_outside: bool = False, mean: bool = True) -> list[float]:
    """RMSNorm on a list with one knob turned."""
    if center:
        x = [v - sum(x) / len(x) for v in x]
    square = sum(v * v for v in x) / (len(x) if mean else 1)
    scale = 1 / (math.sqrt(square) + eps) if eps_outside else 1 / math.sqrt(square + eps)
    return [v * scale for v in x]


# -- chapter 12 --------------------------------------------------------------------------------


def rope_cases() -> list[Case]:
    draw = Draw(1201)
    cases = [Case((torch.ones(1, 4),), note="T = 1: position 0 is not rotated"),
             Case((torch.arange(8.0).reshape(2, 4),), note="T = 2, d = 4")]
    for _ in range(20):
        shape = (*draw.batch_shape(), draw.integer(2, 10), draw.choice([2, 4, 8, 16]))
        dtype = draw.choice(DTYPES)
        kwargs = {"base": 100.0} if draw.integer(0, 3) == 0 else {}
        cases.append(Case((draw.normal(*shape, dtype=dtype),), kwargs,
                          note=f"shape {shape}, {dtype}"))
    return cases


def rope_with(x: Tensor, base: float = 10000.0, interleaved: bool = False, start: int = 0,
              sign: float = 1.0, exponent: float = 2.0) -> Tensor:
    """RoPE in the halves layout (Llama's, the package's ``RoPE``), or with one knob turned;
    the angles in float64 (the package's ``RoPE`` computes them in float32, as Hugging Face)."""
    T, d = x.shape[-2], x.shape[-1]
    inv_freq = base ** (-exponent * torch.arange(d // 2, dtype=torch.float64) / d)
    angles = torch.outer(torch.arange(start, start + T, dtype=torch.float64), inv_freq)
    cos, sin = angles.cos().to(x.dtype), (sign * angles.sin()).to(x.dtype)
    return (rotate_interleaved if interleaved else rotate_halves)(x, cos, sin)


def rms_norm_reference(x: Tensor, weight: Tensor, eps: float = 1e-5) -> Tensor:
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def rms_norm_cases() -> list[Case]:
    draw = Draw(1202)
    cases = []
    for i in range(20):
        shape, dtype = (*draw.batch_shape(), draw.integer(1, 8)), draw.choice(DTYPES)
        scale = 1e-3 if i % 5 == 0 else draw.choice([1.0, 10.0])
        kwargs = {"eps": 1e-2} if i % 7 == 3 else {}
        cases.append(Case((draw.normal(*shape, dtype=dtype, scale=scale) + draw.choice([0, 2]),
                           draw.normal(shape[-1], dtype=dtype) + 1), kwargs,
                          note=f"shape {shape}, values about {scale:g}, {dtype}"))
    return cases


def rms_norm_with(x: Tensor, weight: Tensor, eps: float = 1e-5, center: bool = False,
                  eps_outside: bool = False, mean: bool = True, scaled: bool = True) -> Tensor:
    """RMSNorm with one knob turned."""
    if center:
        x = x - x.mean(dim=-1, keepdim=True)
    square = (x * x).mean(dim=-1, keepdim=True) if mean else (x * x).sum(dim=-1, keepdim=True)
    y = x / (square.sqrt() + eps) if eps_outside else x / (square + eps).sqrt()
    return y * weight if scaled else y


# -- chapter 13 --------------------------------------------------------------------------------


def window_starts_cases() -> list[Case]:
    cases = [Case(([10, 20, 5], 4)), Case(([3, 4, 5], 4), note="shards shorter than a window"),
             Case(([100], 8), note="one shard"), Case(([], 4), note="no shard")]
    draw = Draw(1301)
    cases += [Case(([draw.integer(0, 30) for _ in range(draw.integer(1, 5))], draw.integer(1, 10)),
                   note="random") for _ in range(15)]
    return cases


def window_starts_reference(shard_lengths: list[int], block_size: int) -> list[int]:
    """``TokenShards.starts`` (which reads only the lengths of its shards) on such lengths."""
    shards = cast(TokenShards, SimpleNamespace(arrays=[range(n) for n in shard_lengths]))
    return [int(n) for n in TokenShards.starts(shards, block_size)]


def locate_cases() -> list[Case]:
    counts = [3, 0, 4, 2]
    cases = [Case((i, counts), note="shard 1 is empty") for i in range(sum(counts))]
    draw = Draw(1302)
    for _ in range(15):
        counts = [draw.integer(0, 5) for _ in range(draw.integer(1, 5))]
        counts[-1] += 1  # at least one window in all
        cases.append(Case((draw.integer(0, sum(counts) - 1), counts), note="random"))
    return cases


def locate_reference(index: int, counts: list[int]) -> tuple[int, int]:
    """Where ``TokenShards.get_batch`` reads window ``index`` (of all shards' windows)."""
    ends = np.cumsum(counts)  # (K,) windows in shards 0..k
    which = int(np.searchsorted(ends, index, side="right"))  # its shard
    return which, int(index - (ends[which] - counts[which]))


def locate_with(index: int, counts: list[int], side: Literal["left", "right"] = "right",
                subtract: bool = True,
                first: int = 0) -> tuple[int, int]:
    """``locate_reference`` with one knob turned."""
    ends = np.cumsum(counts)
    which = min(int(np.searchsorted(ends, index, side=side)), len(counts) - 1)
    return which + first, int(index - (ends[which] - counts[which])) if subtract else index


EXERCISES = [
    Exercise(
        "rank_share", 10, "rank_share",
        "rank_share(batch: Tensor (B, T), rank: int, world_size: int) -> Tensor (B / "
        "world_size, T)",
        "the rows of the global batch that rank draws: its block, in rank order",
        rank_share_reference, rank_share_cases, names=("batch", "rank", "world_size"),
        mistakes=(
            Mistake("each rank takes a block of consecutive rows (rank * b to (rank + 1) * b, "
                    "b = B / world_size), not every world_size-th row",
                    lambda x, r, w: x[r::w]),
            Mistake("each rank gets only its share, B / world_size rows",
                    lambda x, r, w: x),
            Mistake("ranks count from 0: rank 0 takes the first block",
                    lambda x, r, w: x.chunk(w)[(r + 1) % w]),
        )),
    Exercise(
        "mean_over_ranks", 10, "mean_over_ranks",
        "mean_over_ranks(means: list[float], weights: list[float]) -> float",
        "the mean over all ranks' batches, from each rank's mean loss and batch count",
        mean_over_ranks_reference, mean_over_ranks_cases, names=("means", "weights"),
        mistakes=(
            Mistake("weight each rank's mean by its weight (the batches it evaluated)",
                    lambda ms, ws: sum(ms) / len(ms)),
            Mistake("divide by the sum of the weights, not the number of ranks",
                    lambda ms, ws: sum(m * w for m, w in zip(ms, ws)) / len(ms)),
            Mistake("a rank with weight 0 adds nothing (its mean may be nan: it evaluated no "
                    "batch); skip it", lambda ms, ws: sum(m * w for m, w in zip(ms, ws))
                    / sum(ws)),
        )),
    Exercise(
        "softmax_list", 11, "softmax_list",
        "softmax_list(logits: list[float]) -> list[float]",
        "softmax on a plain Python list, with math.exp, safe for large values",
        softmax_list_reference, lambda: list_cases(1101), names=("logits",), mistakes=(
            Mistake("divide by the sum of the exponentials, not by their max",
                    lambda xs: [math.exp(x - max(xs)) for x in xs]),
            Mistake("softmax exponentiates first: exp(x - max) / sum(exp(x - max))",
                    lambda xs: [x / sum(xs) for x in xs]),
        )),
    Exercise(
        "rmsnorm_list", 11, "rmsnorm_list",
        "rmsnorm_list(x: list[float], eps: float = 1e-5) -> list[float]",
        "x / sqrt(mean(x^2) + eps) on a plain Python list",
        rmsnorm_list_reference, lambda: list_cases(1102), names=("x",), mistakes=(
            Mistake("RMSNorm does not subtract the mean (that is LayerNorm's first step)",
                    lambda x, eps=1e-5: rmsnorm_list_with(x, eps, center=True)),
            Mistake("eps goes inside the square root: sqrt(mean(x^2) + eps)",
                    lambda x, eps=1e-5: rmsnorm_list_with(x, eps, eps_outside=True)),
            Mistake("the mean of the squares, not their sum: divide by len(x)",
                    lambda x, eps=1e-5: rmsnorm_list_with(x, eps, mean=False)),
        )),
    Exercise(
        "rope", 12, "rope",
        "rope(x: Tensor (..., T, d), base: float = 10000.0) -> Tensor (..., T, d)",
        "rotate each pair (x[m], x[m + d/2]) at position t by t * base^(-2m/d)",
        rope_with, rope_cases, names=("x",),
        # the package's RoPE, as Hugging Face's, computes its angles in float32
        tolerance={torch.float32: (1e-5, 1e-5), torch.float64: (1e-6, 1e-6)}, mistakes=(
            Mistake("the pairs are the two halves, (x[m], x[m + d/2]) as in Llama's code, not "
                    "neighbours (x[2i], x[2i + 1])",
                    lambda x, base=1e4: rope_with(x, base, interleaved=True)),
            Mistake("positions start at 0: the first row is not rotated",
                    lambda x, base=1e4: rope_with(x, base, start=1)),
            Mistake("the rotation goes the other way: (x1 cos - x2 sin, x2 cos + x1 sin)",
                    lambda x, base=1e4: rope_with(x, base, sign=-1.0)),
            Mistake("the frequency of pair m is base^(-2m/d)",
                    lambda x, base=1e4: rope_with(x, base, exponent=1.0)),
        )),
    Exercise(
        "rms_norm", 12, "rms_norm",
        "rms_norm(x: Tensor (..., C), weight: Tensor (C,), eps: float = 1e-5) -> Tensor",
        "x / sqrt(mean(x^2) + eps) * weight over the last dimension",
        rms_norm_reference, rms_norm_cases, names=("x", "weight"), mistakes=(
            Mistake("RMSNorm does not subtract the mean (that is LayerNorm)",
                    lambda x, w, eps=1e-5: rms_norm_with(x, w, eps, center=True)),
            Mistake("eps goes inside the square root: sqrt(mean(x^2) + eps)",
                    lambda x, w, eps=1e-5: rms_norm_with(x, w, eps, eps_outside=True)),
            Mistake("the mean of the squares over the last dimension, not their sum",
                    lambda x, w, eps=1e-5: rms_norm_with(x, w, eps, mean=False)),
            Mistake("scale the result by weight",
                    lambda x, w, eps=1e-5: rms_norm_with(x, w, eps, scaled=False)),
        )),
    Exercise(
        "window_starts", 13, "window_starts",
        "window_starts(shard_lengths: list[int], block_size: int) -> list[int]",
        "how many windows of block_size + 1 tokens start in each shard",
        window_starts_reference, window_starts_cases, names=("shard_lengths", "block_size"),
        mistakes=(
            Mistake("a window is block_size + 1 tokens (inputs and the shifted targets): a "
                    "shard of n tokens has n - block_size starts",
                    lambda ns, T: [max(0, n - T + 1) for n in ns]),
            Mistake("a window is block_size + 1 tokens, so n - block_size starts, not "
                    "n - block_size - 1", lambda ns, T: [max(0, n - T - 1) for n in ns]),
            Mistake("a shard shorter than a window has 0 starts, not a negative number",
                    lambda ns, T: [n - T for n in ns]),
        )),
    Exercise(
        "locate_window", 13, "locate_window",
        "locate_window(index: int, counts: list[int]) -> tuple[int, int]",
        "the shard and the offset in it of window index, counting the windows of all shards",
        locate_reference, locate_cases, names=("index", "counts"), mistakes=(
            Mistake("an index equal to the windows of shards 0..k together is the first "
                    "window of the next non-empty shard (searchsorted side='right')",
                    lambda i, c: locate_with(i, c, side="left")),
            Mistake("the offset counts from the shard's start: subtract the windows of the "
                    "shards before it", lambda i, c: locate_with(i, c, subtract=False)),
            Mistake("shards count from 0", lambda i, c: locate_with(i, c, first=1)),
        )),
]
