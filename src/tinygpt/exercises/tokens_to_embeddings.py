"""The exercises of chapters 1 to 4: BPE merges and pair counts, bigram counts and
probabilities, cross-entropy and a linear layer's backward pass, embeddings and sinusoidal
positions. Each is graded against the package's own function (or torch's).
"""

from __future__ import annotations

import itertools
import math

import torch
import torch.nn.functional as F
from torch import Tensor

from tinygpt import backprop, bigram, bpe, embedding
from tinygpt.exercises.grading import Case, Exercise, Mistake
from tinygpt.exercises.inputs import DTYPES, Draw

# -- chapter 1 ---------------------------------------------------------------------------------


def merge_cases() -> list[Case]:
    a, b, c, new = 1, 2, 3, 256
    cases = [Case(([a, b, c, a, b], (a, b), new), note="two pairs"),
             Case(([a, a, a], (a, a), new), note="(a, a) in [a, a, a]"),
             Case(([a, a, a, a], (a, a), new), note="(a, a) in [a, a, a, a]"),
             Case(([c, a, b], (a, b), new), note="the pair at the end"),
             Case(([a, b, c], (b, a), new), note="the pair reversed is not the pair"),
             Case(([a], (a, b), new), note="length 1"),
             Case(([], (a, b), new), note="empty"),
             Case(([c, c, a, b, c], (a, b), new), note="the pair in the middle"),
             Case(([11, 2, 1, 23, 1, 2], (1, 2), new), note="ids of two digits: 11, 23"),
             Case(([12, 1, 2, 112], (1, 12), new), note="ids of two and three digits")]
    draw = Draw(101)
    for _ in range(38):
        pair = (draw.integer(0, 2), draw.integer(0, 2))
        cases.append(Case((draw.ids(draw.integer(0, 20), 3), pair, 256 + draw.integer(0, 9)),
                          note="random"))
    return cases


def merge_overlapping(ids: list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    out = []
    for i in range(len(ids)):  # the second token of a merged pair is looked at again
        out.append(new_id if tuple(ids[i:i + 2]) == pair else ids[i])
    return out


def merge_dropping_last(ids: list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    out, i = [], 0
    while i < len(ids) - 1:
        if (ids[i], ids[i + 1]) == pair:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def merge_right_to_left(ids: list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    return bpe.merge(ids[::-1], pair[::-1], new_id)[::-1]


def merge_first_only(ids: list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    for i in range(len(ids) - 1):
        if (ids[i], ids[i + 1]) == pair:
            return [*ids[:i], new_id, *ids[i + 2:]]
    return list(ids)


def merge_text_replace(ids: list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    text = " ".join(map(str, ids)).replace(f"{pair[0]} {pair[1]}", str(new_id))
    return [int(piece) for piece in text.split()]


def merge_either_order(ids: list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    out = bpe.merge(ids, pair, new_id)
    return bpe.merge(out, pair[::-1], new_id)


def pair_counts_cases() -> list[Case]:
    cases = [Case(([1, 1, 1],), note="[a, a, a]"), Case(([1, 2, 1, 2],)),
             Case(([5],), note="length 1"), Case(([],), note="empty"),
             Case(([1, 2, 3, 1],), note="no pair twice")]
    draw = Draw(102)
    cases += [Case((draw.ids(draw.integer(0, 25), 4),), note="random") for _ in range(30)]
    return cases


def pairs_unique(ids: list[int]) -> dict[tuple[int, int], int]:
    return dict.fromkeys(itertools.pairwise(ids), 1)


def pairs_every_other(ids: list[int]) -> dict[tuple[int, int], int]:
    counts: dict[tuple[int, int], int] = {}
    for i in range(0, len(ids) - 1, 2):
        counts[ids[i], ids[i + 1]] = counts.get((ids[i], ids[i + 1]), 0) + 1
    return counts


def pairs_wrapping(ids: list[int]) -> dict[tuple[int, int], int]:
    return bpe.pair_counts(ids + ids[:1]) if len(ids) > 1 else {}


def pairs_missing_last(ids: list[int]) -> dict[tuple[int, int], int]:
    return bpe.pair_counts(ids[:-1])


# -- chapter 2 ---------------------------------------------------------------------------------


def bigram_counts_cases() -> list[Case]:
    cases = [Case(([0, 1, 2, 0, 1], 3)), Case(([2, 2, 2], 3), note="a repeated token"),
             Case(([0, 1], 4), note="one pair"), Case(([1, 0], 2), note="one pair, reversed")]
    draw = Draw(201)
    for _ in range(25):
        V = draw.integer(2, 6)
        cases.append(Case((draw.ids(draw.integer(2, 40), V), V), note="random"))
    return cases


def bigram_probs_cases() -> list[Case]:
    cases = [Case((torch.tensor([[0, 3], [1, 1]]), 0.0), note="no smoothing"),
             Case((torch.tensor([[0, 3], [1, 1]]), 1.0), note="add-one"),
             Case((torch.tensor([[2, 0, 0], [0, 0, 0], [1, 1, 0]]), 0.0),
                  note="a token never followed by anything, no smoothing"),
             Case((torch.tensor([[2, 0, 0], [0, 0, 0], [1, 1, 0]]), 0.5),
                  note="the same, add-0.5")]
    draw = Draw(202)
    for _ in range(20):
        V = draw.integer(1, 6)
        counts = torch.randint(0, 5, (V, V), generator=draw.generator)
        cases.append(Case((counts, draw.choice([0.0, 0.1, 1.0, 2.5])), note="random"))
    return cases


def probs_by_column(counts: Tensor, smoothing: float = 1.0) -> Tensor:
    return bigram.bigram_probs(counts.T, smoothing).T


def probs_unsmoothed(counts: Tensor, smoothing: float = 1.0) -> Tensor:
    return bigram.bigram_probs(counts, 0.0)


def probs_nan_rows(counts: Tensor, smoothing: float = 1.0) -> Tensor:
    smoothed = counts.double() + smoothing
    return smoothed / smoothed.sum(dim=1, keepdim=True)


def probs_raw_total(counts: Tensor, smoothing: float = 1.0) -> Tensor:
    return (counts.double() + smoothing) / counts.sum(dim=1, keepdim=True)


def rows_sum(case: Case, expected: Tensor, got: Tensor) -> str | None:
    """What a row of ``got`` sums to, where a row of ``expected`` sums to 1 and it does not."""
    if got.shape != expected.shape or not got.is_floating_point():
        return None
    totals, wanted = got.double().sum(dim=1), expected.double().sum(dim=1)
    bad = ((totals - wanted).abs() > 1e-6).nonzero()
    if not len(bad):
        return None
    row = int(bad[0])
    return f"row {row} sums to {totals[row].item():.4g}, not {wanted[row].item():.4g}"


def probs_float32(counts: Tensor, smoothing: float = 1.0) -> Tensor:
    return bigram.bigram_probs(counts, smoothing).float()


# -- chapter 3 ---------------------------------------------------------------------------------


def cross_entropy_cases() -> list[Case]:
    cases = []
    for dtype in DTYPES:
        cases += [Case((torch.tensor([[2.0, 1.0, 0.1], [0.5, 2.5, 0.3]], dtype=dtype),
                        torch.tensor([0, 1])), note=f"small, {dtype}"),
                  Case((torch.tensor([[1000.0, 999.0, 0.0]], dtype=dtype), torch.tensor([1])),
                       note=f"large logits, {dtype}"),
                  Case((torch.tensor([[3.0, 3.0, 3.0, 3.0]], dtype=dtype), torch.tensor([2])),
                       note=f"ties, {dtype}"),
                  Case((torch.tensor([[0.7]], dtype=dtype), torch.tensor([0])),
                       note=f"one token, {dtype}"),
                  Case((torch.tensor([[0.0, -120.0 if dtype == torch.float32 else -800.0]],
                                     dtype=dtype), torch.tensor([1])),
                       note=f"a target far less likely than the top token, {dtype}")]
    draw = Draw(301)
    for _ in range(22):
        N, V, dtype = draw.integer(1, 6), draw.integer(2, 9), draw.choice(DTYPES)
        scale = draw.choice([0.1, 1.0, 5.0, 200.0])
        cases.append(Case((draw.normal(N, V, dtype=dtype, scale=scale),
                           torch.randint(0, V, (N,), generator=draw.generator)),
                          note=f"random, {dtype}, logits about {scale:g}"))
    return cases


def cross_entropy_reference(logits: Tensor, targets: Tensor) -> Tensor:
    return backprop.cross_entropy(logits, targets)[0]


def log_probs(logits: Tensor) -> Tensor:
    return logits - logits.exp().sum(dim=1, keepdim=True).log()


def ce_summed(logits: Tensor, targets: Tensor) -> Tensor:
    return F.cross_entropy(logits, targets, reduction="sum")


def ce_per_row(logits: Tensor, targets: Tensor) -> Tensor:
    return F.cross_entropy(logits, targets, reduction="none")


def ce_no_log_sum_exp(logits: Tensor, targets: Tensor) -> Tensor:
    return -log_probs(logits)[torch.arange(len(targets)), targets].mean()


def ce_via_probs(logits: Tensor, targets: Tensor) -> Tensor:
    probs = logits.exp() / logits.exp().sum(dim=1, keepdim=True)
    return -probs[torch.arange(len(targets)), targets].log().mean()


def ce_log_of_softmax(logits: Tensor, targets: Tensor) -> Tensor:
    return -torch.softmax(logits, dim=1)[torch.arange(len(targets)), targets].log().mean()


def ce_log_base(base: float):
    def ce(logits: Tensor, targets: Tensor) -> Tensor:
        return F.cross_entropy(logits, targets) / math.log(base)
    return ce


def ce_log2_of_softmax(logits: Tensor, targets: Tensor) -> Tensor:
    return -torch.softmax(logits, dim=1)[torch.arange(len(targets)), targets].log2().mean()


def ce_no_minus(logits: Tensor, targets: Tensor) -> Tensor:
    return -F.cross_entropy(logits, targets)


def ce_batch_softmax(logits: Tensor, targets: Tensor) -> Tensor:
    return -torch.log_softmax(logits, dim=0)[torch.arange(len(targets)), targets].mean()


def ce_column_pick(logits: Tensor, targets: Tensor) -> Tensor:
    return -torch.log_softmax(logits, dim=1)[:, targets].mean()


def linear_backward_cases() -> list[Case]:
    draw = Draw(302)
    cases = []
    for i in range(20):
        B, n_in, n_out = draw.integer(1, 5), draw.integer(1, 5), draw.integer(1, 5)
        if i < 2:  # two square cases, where a transposed result has the right shape
            B = n_in = n_out = 3
        dtype = draw.choice(DTYPES)
        cases.append(Case((draw.normal(B, n_out, dtype=dtype), draw.normal(B, n_in, dtype=dtype),
                           draw.normal(n_in, n_out, dtype=dtype)),
                          note=f"B={B}, N_in={n_in}, N_out={n_out}, {dtype}"))
    return cases


def dw_transposed(dout: Tensor, x: Tensor, W: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    dx, _, db = backprop.linear_backward(dout, x, W)
    return dx, dout.T @ x, db


def db_mean(dout: Tensor, x: Tensor, W: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    dx, dW, _ = backprop.linear_backward(dout, x, W)
    return dx, dW, dout.mean(dim=0)


def dx_without_transpose(dout: Tensor, x: Tensor, W: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    _, dW, db = backprop.linear_backward(dout, x, W)
    return dout @ W, dW, db


# -- chapter 4 ---------------------------------------------------------------------------------


def embed_cases() -> list[Case]:
    draw = Draw(401)
    cases = []
    for i in range(20):
        B, T, V, C = (draw.integer(1, n) for n in (3, 6, 9, 5))
        V, dtype = V + 1, draw.choice(DTYPES)
        block = T + draw.integer(0, 3)
        if i == 0:
            T, block = 1, 4
        cases.append(Case((torch.randint(0, V, (B, T), generator=draw.generator),
                           draw.normal(V, C, dtype=dtype), draw.normal(block, C, dtype=dtype)),
                          note=f"B={B}, T={T}, block_size={block}, {dtype}"))
    return cases


def embed_reference(idx: Tensor, wte: Tensor, wpe: Tensor) -> Tensor:
    T = idx.shape[1]
    return F.embedding(idx, wte) + F.embedding(torch.arange(T), wpe)  # (B, T, C)


def embed_positions_by_id(idx: Tensor, wte: Tensor, wpe: Tensor) -> Tensor:
    return wte[idx] + wpe[idx.clamp(max=len(wpe) - 1)]


def embed_without_positions(idx: Tensor, wte: Tensor, wpe: Tensor) -> Tensor:
    return wte[idx]


def embed_positions_from_one(idx: Tensor, wte: Tensor, wpe: Tensor) -> Tensor:
    return wte[idx] + wpe[1:idx.shape[1] + 1]


def sinusoid_cases() -> list[Case]:
    return [Case((T, C), note=f"T={T}, C={C}")
            for T, C in [(1, 2), (4, 2), (5, 4), (8, 6), (16, 8), (3, 16), (50, 32)]]


def sinusoid(T: int, C: int, exponent: float = 2.0, start: int = 0, swap: bool = False,
             halves: bool = False) -> Tensor:
    t = torch.arange(start, start + T, dtype=torch.float64)
    freqs = 10000.0 ** (-exponent * torch.arange(C // 2, dtype=torch.float64) / C)
    angles = t[:, None] * freqs[None, :]
    sin, cos = (angles.cos(), angles.sin()) if swap else (angles.sin(), angles.cos())
    if halves:
        return torch.cat([sin, cos], dim=1).float()
    return torch.stack([sin, cos], dim=2).flatten(1).float()


EXERCISES = [
    Exercise(
        "bpe_merge", 1, "merge",
        "merge(ids: list[int], pair: tuple[int, int], new_id: int) -> list[int]",
        "replace each occurrence of pair in ids by new_id, left to right, not overlapping",
        bpe.merge, merge_cases, names=("ids", "pair", "new_id"), mistakes=(
            Mistake("merged pairs overlap: after a merge, skip both of its tokens (i += 2); "
                    "(a, a) in [a, a, a] gives [new_id, a]", merge_overlapping),
            Mistake("the last token is lost: when no pair starts at the last position, "
                    "ids[-1] still belongs to the output", merge_dropping_last),
            Mistake("merges go left to right: in [a, a, a] the first two tokens are merged, "
                    "giving [new_id, a]", merge_right_to_left),
            Mistake("only the first occurrence was merged: replace every one",
                    merge_first_only),
            Mistake("the pair is ordered: (a, b) matches a followed by b, not b followed by a",
                    merge_either_order),
            Mistake("matching on the ids' text: \"1 2\" is also found inside \"11 2\" or "
                    "\"1 23\"; compare the ids themselves, two at a time",
                    merge_text_replace),
        )),
    Exercise(
        "pair_counts", 1, "pair_counts",
        "pair_counts(ids: list[int]) -> dict[tuple[int, int], int]",
        "count every adjacent pair of ids (the pairs overlap)",
        bpe.pair_counts, pair_counts_cases, names=("ids",), mistakes=(
            Mistake("each occurrence counts: (a, a) appears twice in [a, a, a]", pairs_unique),
            Mistake("pairs overlap: count the pair at every position i (ids[i], ids[i + 1]), "
                    "not every other one", pairs_every_other),
            Mistake("the last token has no successor: don't wrap around to the first",
                    pairs_wrapping),
            Mistake("the last pair is missing: positions run to len(ids) - 2 (zip(ids, "
                    "ids[1:]))", pairs_missing_last),
        )),
    Exercise(
        "bigram_counts", 2, "bigram_counts",
        "bigram_counts(ids: list[int], vocab_size: int) -> Tensor (V, V) int64",
        "counts[i, j] = how often token j comes right after token i",
        bigram.bigram_counts, bigram_counts_cases, names=("ids", "vocab_size"), mistakes=(
            Mistake("rows are the previous token: counts[i, j] counts j right after i (yours "
                    "is transposed)", lambda ids, V: bigram.bigram_counts(ids, V).T),
            Mistake("the last pair is missing: pairs run up to (ids[-2], ids[-1])",
                    lambda ids, V: bigram.bigram_counts(ids[:-1], V)
                    if len(ids) > 2 else torch.zeros(V, V, dtype=torch.int64)),
            Mistake("a repeated pair is counted once: counts[a, b] += 1 with index tensors "
                    "writes each (a, b) once; count in a loop, or with counts.index_put_((a, "
                    "b), ones, accumulate=True)", lambda ids, V:
                    (bigram.bigram_counts(ids, V) > 0).long()),
            Mistake("counts are whole numbers: an int64 tensor (torch.zeros(V, V, "
                    "dtype=torch.long)), not float", lambda ids, V:
                    bigram.bigram_counts(ids, V).float()),
        )),
    Exercise(
        "bigram_probs", 2, "bigram_probs",
        "bigram_probs(counts: Tensor (V, V) int64, smoothing: float) -> Tensor (V, V) float64",
        "(counts + smoothing) / the row's total; a row of zeros stays zeros",
        bigram.bigram_probs, bigram_probs_cases, names=("counts", "smoothing"), mistakes=(
            Mistake("each row is a distribution: divide by the row's total (sum(dim=1, "
                    "keepdim=True)), not the column's", probs_by_column),
            Mistake("add the smoothing k to every count before normalising", probs_unsmoothed),
            Mistake("a token never followed by anything (a row of zeros, no smoothing) gives "
                    "0 / 0 = nan: leave its row at zero", probs_nan_rows),
            Mistake("probabilities are float64 here (counts.double())", probs_float32),
            Mistake("divide by the smoothed row total, (counts + smoothing).sum(dim=1): the "
                    "raw total leaves out the smoothing, and rows sum to more than 1",
                    probs_raw_total),
        ), describe=rows_sum),
    Exercise(
        "cross_entropy", 3, "cross_entropy",
        "cross_entropy(logits: Tensor (N, V), targets: Tensor (N,) int64) -> Tensor ()",
        "the mean over the N rows of -ln softmax(logits[n])[targets[n]]",
        cross_entropy_reference, cross_entropy_cases, names=("logits", "targets"),
        tolerance={torch.float32: (1e-4, 1e-4)},  # 1000 + 0.31 - 999 in float32: 1.31323
        mistakes=(
            Mistake("the loss is summed over the rows: take the mean over N", ce_summed),
            Mistake("one loss per row: return their mean, a scalar", ce_per_row),
            Mistake("exp of a large logit overflows: use log-sum-exp, subtracting each row's "
                    "max before exp", ce_no_log_sum_exp),
            Mistake("exp of a large logit overflows: use log-sum-exp, subtracting each row's "
                    "max before exp", ce_via_probs),
            Mistake("a very unlikely target's probability underflows to 0, and log(0) = -inf: "
                    "take log_softmax (logits - logsumexp), not the log of softmax",
                    ce_log_of_softmax),
            Mistake("use the natural log (torch.log), not log2", ce_log_base(2.0)),
            Mistake("use the natural log (torch.log), not log2", ce_log2_of_softmax),
            Mistake("use the natural log (torch.log), not log10", ce_log_base(10.0)),
            Mistake("the loss is -ln p: the minus sign is missing", ce_no_minus),
            Mistake("softmax runs over the vocabulary (dim=1, within a row), not over the "
                    "batch", ce_batch_softmax),
            Mistake("pick one log-probability per row, logp[torch.arange(N), targets], not "
                    "logp[:, targets]", ce_column_pick),
        )),
    Exercise(
        "linear_backward", 3, "linear_backward",
        "linear_backward(dout: Tensor (B, N_out), x: Tensor (B, N_in), W: Tensor (N_in, N_out))"
        " -> (dx, dW, db)",
        "the gradients of out = x @ W + b, given dout = d loss / d out",
        backprop.linear_backward, linear_backward_cases, names=("dout", "x", "W"),
        parts=("dx", "dW", "db"), mistakes=(
            Mistake("dW has W's shape (N_in, N_out): x.T @ dout, not dout.T @ x",
                    dw_transposed),
            Mistake("db sums dout over the batch (the bias is added to every row), not its "
                    "mean", db_mean),
            Mistake("dx = dout @ W.T: W is (N_in, N_out)", dx_without_transpose),
        )),
    Exercise(
        "embed", 4, "embed",
        "embed(idx: Tensor (B, T) int64, wte: Tensor (V, C), wpe: Tensor (block_size, C)) -> "
        "Tensor (B, T, C)",
        "each token's row of wte plus its position's row of wpe (positions 0 .. T-1)",
        embed_reference, embed_cases, names=("idx", "wte", "wpe"), mistakes=(
            Mistake("positions index wpe by the position t = 0 .. T-1 (torch.arange(T)), not "
                    "by the token id", embed_positions_by_id),
            Mistake("add the position embeddings wpe[:T] to the token embeddings",
                    embed_without_positions),
            Mistake("positions start at 0: wpe[:T], not wpe[1:T + 1]",
                    embed_positions_from_one),
        )),
    Exercise(
        "sinusoidal_positions", 4, "sinusoidal_positions",
        "sinusoidal_positions(T: int, C: int) -> Tensor (T, C) float32",
        "column 2i: sin(t / 10000^(2i/C)), column 2i+1: cos of the same",
        embedding.sinusoidal_positions, sinusoid_cases, names=("T", "C"), mistakes=(
            Mistake("column 2i holds sin and column 2i + 1 cos (you swapped them)",
                    lambda T, C: sinusoid(T, C, swap=True)),
            Mistake("sin and cos alternate (columns 0::2 and 1::2), not two halves",
                    lambda T, C: sinusoid(T, C, halves=True)),
            Mistake("the frequency of pair i is 10000^(-2i/C): 2i is the column",
                    lambda T, C: sinusoid(T, C, exponent=1.0)),
            Mistake("positions start at 0", lambda T, C: sinusoid(T, C, start=1)),
        )),
]
