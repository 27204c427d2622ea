"""A library of wrong implementations of the sixteen exercises of chapters 1-8, written as a
reader would write them (independently of the checker's own models), each with its verdict
(it fails) and the hint it must get: a named mistake (one of the exercise's ``Mistake`` hints,
which the checker may give only when that mistake reproduces the reader's results on every
case), or a "what differs" message that names no mistake.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter

import pytest
import torch

from tinygpt.exercises import EXERCISES, result

INF = float("-inf")

# -- chapter 1 ---------------------------------------------------------------------------------


def merge_in_place(ids, pair, new_id):  # edits the caller's list
    i = 0
    while i < len(ids) - 1:
        if ids[i] == pair[0] and ids[i + 1] == pair[1]:
            ids[i:i + 2] = [new_id]
        i += 1
    return ids


def merge_by_text(ids, pair, new_id):
    joined = " ".join(str(t) for t in ids)
    return [int(t) for t in joined.replace(f"{pair[0]} {pair[1]}", str(new_id)).split()]


def merge_overlapping(ids, pair, new_id):
    return [new_id if tuple(ids[i:i + 2]) == tuple(pair) else t for i, t in enumerate(ids)]


def merge_first(ids, pair, new_id):
    for i in range(len(ids) - 1):
        if (ids[i], ids[i + 1]) == tuple(pair):
            return ids[:i] + [new_id] + ids[i + 2:]
    return list(ids)


def merge_drops_tail(ids, pair, new_id):
    out, i = [], 0
    while i + 1 < len(ids):
        if ids[i] == pair[0] and ids[i + 1] == pair[1]:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def pairs_set(ids):
    return dict.fromkeys(itertools.pairwise(ids), 1)


def pairs_stride(ids):
    return dict(Counter(zip(ids[::2], ids[1::2])))


def pairs_skip_one(ids):  # (ids[i], ids[i + 2]): not adjacent
    return dict(Counter(zip(ids, ids[2:])))


def pairs_short(ids):
    return dict(Counter(itertools.pairwise(ids[:-1])))


# -- chapter 2 ---------------------------------------------------------------------------------


def counts_index_add_once(ids, vocab_size):
    c = torch.zeros(vocab_size, vocab_size, dtype=torch.long)
    a, b = torch.tensor(ids[:-1]), torch.tensor(ids[1:])
    c[a, b] += 1  # a repeated (a, b) is written once
    return c


def counts_transposed(ids, vocab_size):
    c = torch.zeros(vocab_size, vocab_size, dtype=torch.long)
    for x, y in itertools.pairwise(ids):
        c[y, x] += 1
    return c


def counts_float(ids, vocab_size):
    c = torch.zeros(vocab_size, vocab_size)
    for x, y in itertools.pairwise(ids):
        c[x, y] += 1
    return c


def counts_loop_short(ids, vocab_size):
    c = torch.zeros(vocab_size, vocab_size, dtype=torch.long)
    for i in range(len(ids) - 2):
        c[ids[i], ids[i + 1]] += 1
    return c


def counts_vocab_plus_one(ids, vocab_size):
    c = torch.zeros(vocab_size + 1, vocab_size + 1, dtype=torch.long)
    for x, y in itertools.pairwise(ids):
        c[x, y] += 1
    return c


def probs_raw_total(counts, smoothing):
    return (counts + smoothing).double() / counts.sum(dim=1, keepdim=True)


def probs_columns(counts, smoothing):
    smoothed = counts.double() + smoothing
    totals = smoothed.sum(dim=0, keepdim=True)
    return torch.where(totals > 0, smoothed / totals.clamp(min=1e-300), 0.0)


def probs_zero_over_zero(counts, smoothing):
    smoothed = counts.double() + smoothing
    return smoothed / smoothed.sum(dim=1, keepdim=True)


def probs_float(counts, smoothing):
    smoothed = counts.float() + smoothing
    totals = smoothed.sum(dim=1, keepdim=True)
    return torch.where(totals > 0, smoothed / totals.clamp(min=1e-30), 0.0)


def probs_smoothing_by_v(counts, smoothing):  # smoothing added once per row, not per entry
    V = counts.shape[0]
    smoothed = counts.double() + smoothing / V
    totals = smoothed.sum(dim=1, keepdim=True)
    return torch.where(totals > 0, smoothed / totals.clamp(min=1e-300), 0.0)


# -- chapter 3 ---------------------------------------------------------------------------------


def picked(logp, targets):
    return logp[torch.arange(len(targets)), targets]


def ce_softmax_log(logits, targets):
    return -picked(torch.softmax(logits, dim=1).log(), targets).mean()


def ce_exp_direct(logits, targets):
    p = logits.exp() / logits.exp().sum(dim=1, keepdim=True)
    return -picked(torch.log(p), targets).mean()


def ce_total(logits, targets):
    return -picked(torch.log_softmax(logits, dim=1), targets).sum()


def ce_positive(logits, targets):
    return picked(torch.log_softmax(logits, dim=1), targets).mean()


def ce_every_row(logits, targets):
    return -picked(torch.log_softmax(logits, dim=1), targets)


def ce_columns(logits, targets):
    return -torch.log_softmax(logits, dim=1)[:, targets].mean()


def lb_dw_transposed(dout, x, W):
    return dout @ W.T, dout.T @ x, dout.sum(0)


def lb_db_mean(dout, x, W):
    return dout @ W.T, x.T @ dout, dout.mean(0)


def lb_db_unreduced(dout, x, W):
    return dout @ W.T, x.T @ dout, dout


def lb_dx_no_transpose(dout, x, W):
    return dout @ W, x.T @ dout, dout.sum(0)


# -- chapter 4 ---------------------------------------------------------------------------------


def embed_no_positions(idx, wte, wpe):
    return wte[idx]


def embed_position_by_token(idx, wte, wpe):
    return wte[idx] + wpe[idx.clamp(max=wpe.shape[0] - 1)]


def embed_shifted(idx, wte, wpe):
    T = idx.shape[1]
    return wte[idx] + wpe[1:T + 1]


def embed_batch_positions(idx, wte, wpe):  # positions counted along the batch
    B = idx.shape[0]
    return wte[idx] + wpe[:B][:, None, :]


def sinusoid(T, C, swap=False, halves=False, exponent=2.0, dtype=torch.float32):
    t = torch.arange(T, dtype=torch.float64)[:, None]
    freq = 10000.0 ** (-exponent * torch.arange(C // 2, dtype=torch.float64) / C)
    a, b = (t * freq).sin(), (t * freq).cos()
    if swap:
        a, b = b, a
    out = torch.cat([a, b], 1) if halves else torch.stack([a, b], 2).reshape(T, C)
    return out.to(dtype)


# -- chapters 5 and 6 --------------------------------------------------------------------------


def softmax_in_place(x, dim=-1):  # x -= max changes the caller's tensor
    x -= x.max(dim=dim, keepdim=True).values
    x.exp_()
    return x / x.sum(dim=dim, keepdim=True)


def softmax_unstable(x, dim=-1):
    return x.exp() / x.exp().sum(dim=dim, keepdim=True)


def softmax_ignores_dim(x, dim=-1):
    return torch.softmax(x, dim=-1)


def softmax_no_exp(x, dim=-1):
    return x / x.sum(dim=dim, keepdim=True)


def softmax_plus_one(x, dim=-1):  # "softmax one": exp / (1 + sum exp)
    e = (x - x.max(dim=dim, keepdim=True).values).exp()
    return e / e.sum(dim=dim, keepdim=True).add(1e-3)


def attention(q, k, v, scale="d", mask=0, fill=INF, dim=-1):
    T, d = q.shape[-2], q.shape[-1]
    s = q @ k.transpose(-2, -1)
    s = s / {"d": math.sqrt(d), "T": math.sqrt(T), "none": 1.0, "d1": d}[scale]
    if mask is not None:
        s = s.masked_fill(torch.tril(torch.ones(T, T), diagonal=mask) == 0, fill)
    return torch.softmax(s, dim=dim) @ v


def layer_norm_one_pass(x, weight, bias, eps=1e-5):
    mu = x.mean(-1, keepdim=True)
    var = (x ** 2).mean(-1, keepdim=True) - mu ** 2
    return (x - mu) / torch.sqrt(var + eps) * weight + bias


def layer_norm_rms(x, weight, bias, eps=1e-5):
    mu = x.mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * weight + bias


def layer_norm_unbiased(x, weight, bias, eps=1e-5):
    mu = x.mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(x.var(-1, keepdim=True) + eps) * weight + bias


def layer_norm_std_plus_eps(x, weight, bias, eps=1e-5):
    mu = x.mean(-1, keepdim=True)
    return (x - mu) / (x.std(-1, keepdim=True, unbiased=False) + eps) * weight + bias


def layer_norm_bare(x, weight, bias, eps=1e-5):
    mu = x.mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(((x - mu) ** 2).mean(-1, keepdim=True) + eps)


def gelu_tanh(x):
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def gelu_erf_of_x(x):
    return 0.5 * x * (1 + torch.erf(x))


def gelu_phi_only(x):
    return 0.5 * (1 + torch.erf(x / math.sqrt(2)))


def gelu_relu(x):
    return x.clamp(min=0)


# -- chapter 7 ---------------------------------------------------------------------------------


def params(V, T, L, C, head=False, biases=True, wpe=True, final=True, mlp=4):
    block = (3 * C * C + C * C + 2 * mlp * C * C + (3 * C + C + mlp * C + C if biases else 0)
             + 4 * C)
    return V * C * (2 if head else 1) + (T * C if wpe else 0) + L * block + (2 * C if final else 0)


def residual_sqrt_n(n_layer):
    return 0.02 / n_layer ** 0.5


def residual_no_sqrt(n_layer):
    return 0.02 / (2 * n_layer)


def residual_growing(n_layer):
    return 0.02 * math.sqrt(2 * n_layer)


def residual_precedence(n_layer):  # 0.02 / sqrt(2) * n_layer
    return 0.02 / math.sqrt(2) * n_layer


# -- chapter 8 ---------------------------------------------------------------------------------


def adamw(param, grad, m, v, t, lr, beta1, beta2, eps, weight_decay, *, decay_lr=True,
          hats=False, correct=True, l2=False, t_zero=False):
    if l2:
        grad = grad + weight_decay * param
    else:
        param = param - (lr if decay_lr else 1.0) * weight_decay * param
    m = beta1 * m + (1 - beta1) * grad
    v = beta2 * v + (1 - beta2) * grad * grad
    n = t - 1 if t_zero else t
    m_hat = m / (1 - beta1 ** n) if correct else m
    v_hat = v / (1 - beta2 ** n) if correct else v
    param = param - lr * m_hat / (v_hat.sqrt() + eps)
    return (param, m_hat, v_hat) if hats else (param, m, v)


def adamw_knob(**knob):
    return lambda *args: adamw(*args, **knob)


def lr(step, learning_rate, min_lr, warmup_iters, max_iters, *, boundary=False, zero_floor=False,
       from_start=False, clamp=True):
    if step < warmup_iters or (boundary and step == warmup_iters):
        return learning_rate * (step + 1) / warmup_iters
    if clamp and step >= max_iters:
        return min_lr
    low = 0.0 if zero_floor else min_lr
    r = step / max_iters if from_start else (step - warmup_iters) / (max_iters - warmup_iters)
    return low + 0.5 * (1 + math.cos(math.pi * r)) * (learning_rate - low)


def lr_knob(**knob):
    return lambda *args: lr(*args, **knob)


def lr_step_over_warmup(step, learning_rate, min_lr, warmup_iters, max_iters):
    if step <= warmup_iters:  # step / warmup: 0 at step 0, divides by zero without warm-up
        return learning_rate * step / warmup_iters
    return lr(step, learning_rate, min_lr, warmup_iters, max_iters)


NAMED, DIFFERS = True, False
LIBRARY = [  # (exercise, name, function, named?, a phrase the hint must hold)
    ("bpe_merge", "edits-callers-list", merge_in_place, DIFFERS, "leave ids as given"),
    ("bpe_merge", "str-replace-on-joined-ids", merge_by_text, NAMED, "ids' text"),
    ("bpe_merge", "overlapping", merge_overlapping, NAMED, "skip both of its tokens"),
    ("bpe_merge", "first-only", merge_first, NAMED, "only the first occurrence"),
    ("bpe_merge", "drops-tail", merge_drops_tail, NAMED, "the last token is lost"),
    ("pair_counts", "set", pairs_set, NAMED, "each occurrence counts"),
    ("pair_counts", "stride-2", pairs_stride, NAMED, "not every other one"),
    ("pair_counts", "skips-one", pairs_skip_one, DIFFERS, "wrong on"),
    ("pair_counts", "last-pair-missing", pairs_short, NAMED, "the last pair is missing"),
    ("bigram_counts", "index-tensors-add-once", counts_index_add_once, NAMED, "repeated pair"),
    ("bigram_counts", "transposed", counts_transposed, NAMED, "yours is transposed"),
    ("bigram_counts", "float", counts_float, NAMED, "whole numbers"),
    ("bigram_counts", "loop-short", counts_loop_short, NAMED, "the last pair is missing"),
    ("bigram_counts", "vocab-plus-one", counts_vocab_plus_one, DIFFERS, "expected (3, 3)"),
    ("bigram_probs", "raw-row-total", probs_raw_total, NAMED, "raw total"),
    ("bigram_probs", "by-column", probs_columns, NAMED, "not the column's"),
    ("bigram_probs", "zero-over-zero", probs_zero_over_zero, NAMED, "0 / 0 = nan"),
    ("bigram_probs", "float32", probs_float, NAMED, "float64 here"),
    ("bigram_probs", "smoothing-per-row", probs_smoothing_by_v, DIFFERS,
     "the largest difference, 0.075, is at [0, 0]"),
    ("cross_entropy", "log-of-softmax", ce_softmax_log, NAMED, "underflows to 0"),
    ("cross_entropy", "exp-overflows", ce_exp_direct, NAMED, "exp of a large logit overflows"),
    ("cross_entropy", "summed", ce_total, NAMED, "take the mean over N"),
    ("cross_entropy", "no-minus", ce_positive, NAMED, "minus sign"),
    ("cross_entropy", "per-row", ce_every_row, NAMED, "one loss per row"),
    ("cross_entropy", "column-pick", ce_columns, NAMED, "not logp[:, targets]"),
    ("linear_backward", "dw-transposed", lb_dw_transposed, NAMED, "not dout.T @ x"),
    ("linear_backward", "db-mean", lb_db_mean, NAMED, "not its mean"),
    ("linear_backward", "db-unreduced", lb_db_unreduced, DIFFERS, "db: shape"),
    ("linear_backward", "dx-no-transpose", lb_dx_no_transpose, NAMED, "dx = dout @ W.T"),
    ("embed", "no-positions", embed_no_positions, NAMED, "add the position embeddings"),
    ("embed", "position-by-token", embed_position_by_token, NAMED, "not by the token id"),
    ("embed", "from-one", embed_shifted, NAMED, "not wpe[1:T + 1]"),
    ("embed", "batch-positions", embed_batch_positions, DIFFERS, "wrong on"),
    ("sinusoidal_positions", "swapped", lambda T, C: sinusoid(T, C, swap=True), NAMED,
     "you swapped them"),
    ("sinusoidal_positions", "halves", lambda T, C: sinusoid(T, C, halves=True), NAMED,
     "not two halves"),
    ("sinusoidal_positions", "exponent", lambda T, C: sinusoid(T, C, exponent=1.0), NAMED,
     "2i is the column"),
    ("sinusoidal_positions", "float64", lambda T, C: sinusoid(T, C, dtype=torch.float64),
     DIFFERS, "dtype torch.float64, expected torch.float32"),
    ("softmax", "in-place", softmax_in_place, DIFFERS, "leave x as given"),
    ("softmax", "no-max", softmax_unstable, NAMED, "subtract the max"),
    ("softmax", "ignores-dim", softmax_ignores_dim, NAMED, "wrong dimension"),
    ("softmax", "no-exp", softmax_no_exp, NAMED, "exponentiates first"),
    ("softmax", "plus-epsilon-in-sum", softmax_plus_one, DIFFERS, "sum to"),
    ("causal_attention", "sqrt-T", lambda q, k, v: attention(q, k, v, scale="T"), NAMED,
     "not by 1/sqrt(T)"),
    ("causal_attention", "unscaled", lambda q, k, v: attention(q, k, v, scale="none"), NAMED,
     "not scaled"),
    ("causal_attention", "by-d", lambda q, k, v: attention(q, k, v, scale="d1"), NAMED,
     "not 1/d"),
    ("causal_attention", "no-mask", lambda q, k, v: attention(q, k, v, mask=None), NAMED,
     "no causal mask"),
    ("causal_attention", "zero-fill", lambda q, k, v: attention(q, k, v, fill=0.0), NAMED,
     "a score of 0 still gets weight"),
    ("causal_attention", "mask-off-by-one", lambda q, k, v: attention(q, k, v, mask=-1), NAMED,
     "must see itself"),
    ("causal_attention", "queries-axis", lambda q, k, v: attention(q, k, v, dim=-2), NAMED,
     "wrong axis"),
    ("layer_norm", "one-pass-variance", layer_norm_one_pass, NAMED, "one-pass variance"),
    ("layer_norm", "rms", layer_norm_rms, NAMED, "not by the RMS of x"),
    ("layer_norm", "unbiased", layer_norm_unbiased, NAMED, "biased one"),
    ("layer_norm", "std-plus-eps", layer_norm_std_plus_eps, NAMED, "inside the square root"),
    ("layer_norm", "no-affine", layer_norm_bare, NAMED, "scale by weight"),
    ("gelu", "tanh", gelu_tanh, NAMED, "tanh approximation"),
    ("gelu", "erf-of-x", gelu_erf_of_x, NAMED, "erf's argument"),
    ("gelu", "phi-only", gelu_phi_only, DIFFERS, "wrong on"),
    ("gelu", "relu", gelu_relu, NAMED, "that is ReLU"),
    ("parameter_count", "head-counted", lambda V, T, L, C: params(V, T, L, C, head=True), NAMED,
     "count it once"),
    ("parameter_count", "no-biases", lambda V, T, L, C: params(V, T, L, C, biases=False),
     NAMED, "have biases"),
    ("parameter_count", "no-wpe", lambda V, T, L, C: params(V, T, L, C, wpe=False), NAMED,
     "position table"),
    ("parameter_count", "no-ln-f", lambda V, T, L, C: params(V, T, L, C, final=False), NAMED,
     "ln_f"),
    ("parameter_count", "mlp-2C", lambda V, T, L, C: params(V, T, L, C, mlp=2), DIFFERS,
     "times the expected"),
    ("residual_std", "sqrt-n", residual_sqrt_n, NAMED, "two branches"),
    ("residual_std", "no-sqrt", residual_no_sqrt, NAMED, "the square root"),
    ("residual_std", "growing", residual_growing, NAMED, "deeper models start"),
    ("residual_std", "precedence", residual_precedence, DIFFERS, "times the expected"),
    ("adamw_step", "decay-without-lr", adamw_knob(decay_lr=False), NAMED, "not (1 - "
     "weight_decay)"),
    ("adamw_step", "returns-m-hat-v-hat", adamw_knob(hats=True), NAMED, "m_hat and v_hat"),
    ("adamw_step", "no-bias-correction", adamw_knob(correct=False), NAMED, "bias correction"),
    ("adamw_step", "l2", adamw_knob(l2=True), NAMED, "decoupled"),
    ("adamw_step", "t-minus-one", adamw_knob(t_zero=True), NAMED, "counted from 1"),
    ("lr_at", "le-at-warmup-boundary", lr_knob(boundary=True), NAMED, "not <="),
    ("lr_at", "floor-zero", lr_knob(zero_floor=True), NAMED, "ends at min_lr, not 0"),
    ("lr_at", "progress-from-start", lr_knob(from_start=True), NAMED, "starts after the warm-up"),
    ("lr_at", "no-clamp", lr_knob(clamp=False), NAMED, "stays at min_lr"),
    ("lr_at", "le-and-step-over-warmup", lr_step_over_warmup, DIFFERS, "wrong on"),
]


@pytest.mark.parametrize("exercise_id, fn, named, phrase",
                         [(e, f, n, p) for e, _, f, n, p in LIBRARY],
                         ids=[f"{e}-{name}" for e, name, *_ in LIBRARY])
def test_a_wrong_implementation_fails_with_the_right_hint(exercise_id, fn, named, phrase):
    outcome = result(exercise_id, fn)
    assert outcome.status == "failed", outcome.report
    assert phrase in outcome.hint, outcome.report
    hints = {m.hint for m in EXERCISES[exercise_id].mistakes}
    assert (outcome.hint in hints) is named, outcome.report
    assert f"hint:     {outcome.hint}" in outcome.report


def test_the_library_covers_the_sixteen_exercises_of_chapters_1_to_8():
    sixteen = [e for e in EXERCISES.values() if e.chapter <= 8]
    assert len(sixteen) == 16
    for exercise in sixteen:
        assert sum(entry[0] == exercise.id for entry in LIBRARY) >= 2, exercise.id
    assert len(LIBRARY) >= 31
    assert sum(not entry[3] for entry in LIBRARY) >= 10  # and what differs, said concretely


@pytest.mark.parametrize("exercise_id", [e.id for e in EXERCISES.values() if e.chapter <= 8])
def test_the_reference_passes_the_new_cases(exercise_id):
    outcome = result(exercise_id, EXERCISES[exercise_id].reference)
    assert outcome.passed, outcome.report


def test_the_one_pass_variance_fails_on_chapter_6s_vector():
    outcome = result("layer_norm", layer_norm_one_pass)
    assert "mean 1e4" in outcome.report and "case 2 of" in outcome.report


def test_the_callers_list_is_checked_unchanged():
    outcome = result("bpe_merge", merge_in_place)
    assert "changed its input ids in place" in outcome.problem
