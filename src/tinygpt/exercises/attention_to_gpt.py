"""The exercises of chapters 5 to 7: softmax and causal attention, LayerNorm and GELU, and the
GPT's parameter count and residual initialisation. Graded against torch's functions (which the
package's are checked against) or the package's own.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from tinygpt import block, model
from tinygpt.config import GPTConfig
from tinygpt.exercises.grading import Case, Exercise, Mistake
from tinygpt.exercises.inputs import DTYPES, Draw

# -- chapter 5 ---------------------------------------------------------------------------------


def softmax_cases() -> list[Case]:
    cases = []
    for dtype in DTYPES:
        cases += [
            Case((torch.tensor([[1.0, 2.0, 3.0], [0.5, 0.5, -1.0]], dtype=dtype),),
                 note=f"small, {dtype}"),
            Case((torch.tensor([[1000.0, 999.0, 0.0], [-5.0, 800.0, 800.0]], dtype=dtype),),
                 note=f"large logits, {dtype}"),
            Case((torch.tensor([[2.0, 2.0, 2.0, 2.0]], dtype=dtype),), note=f"ties, {dtype}"),
            Case((torch.tensor([[4.0]], dtype=dtype),), note=f"length 1, {dtype}"),
            Case((torch.tensor([[1.0, 2.0], [3.0, 5.0], [0.0, 1.0]], dtype=dtype),), {"dim": 0},
                 note=f"dim=0, {dtype}"),
            Case((torch.tensor([[0.0, float("-inf"), 1.0]], dtype=dtype),),
                 note=f"a masked (-inf) logit, {dtype}"),
        ]
    draw = Draw(501)
    for _ in range(30):
        shape = (*draw.batch_shape(), draw.integer(1, 7))
        dim = draw.choice(list(range(-len(shape), len(shape))))
        dtype, scale = draw.choice(DTYPES), draw.choice([1.0, 10.0, 300.0])
        cases.append(Case((draw.normal(*shape, dtype=dtype, scale=scale),), {"dim": dim},
                          note=f"random, shape {shape}, dim={dim}, {dtype}"))
    return cases


def softmax_reference(x: Tensor, dim: int = -1) -> Tensor:
    return torch.softmax(x, dim=dim)


def softmax_no_max(x: Tensor, dim: int = -1) -> Tensor:
    e = x.exp()
    return e / e.sum(dim=dim, keepdim=True)


def softmax_last_dim(x: Tensor, dim: int = -1) -> Tensor:
    return torch.softmax(x, dim=-1)


def softmax_whole_tensor(x: Tensor, dim: int = -1) -> Tensor:
    e = (x - x.max()).exp()
    return e / e.sum()


def sums_along_dim(case: Case, expected: Tensor, got: Tensor) -> str | None:
    """What ``got`` sums to along the case's dim, where it should sum to 1 and does not."""
    if got.shape != expected.shape or not got.is_floating_point():
        return None
    dim = case.kwargs.get("dim", -1)
    totals, wanted = got.double().sum(dim=dim), expected.double().sum(dim=dim)
    bad = ((totals - wanted).abs() > 1e-6).nonzero()
    if not len(bad):
        return None
    at = tuple(bad[0].tolist())
    return (f"your values along dim={dim} sum to {totals[at].item():.4g}, not "
            f"{wanted[at].item():.4g}")


def softmax_without_exp(x: Tensor, dim: int = -1) -> Tensor:
    return x / x.sum(dim=dim, keepdim=True)


def attention_cases() -> list[Case]:
    draw = Draw(502)
    cases = []
    for i in range(30):
        lead = draw.batch_shape()
        T, d = draw.integer(1, 6), draw.choice([1, 2, 4, 8, 16])
        if i < 4:
            T, d, lead = (1, 4, ()) if i == 0 else (5, 16, (2,))
        dtype, scale = draw.choice(DTYPES), draw.choice([1.0, 1.0, 4.0])
        q, k, v = (draw.normal(*lead, T, d, dtype=dtype, scale=scale) for _ in range(3))
        cases.append(Case((q, k, v), note=f"shape {(*lead, T, d)}, {dtype}"))
    return cases


def attention_reference(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def attend(q: Tensor, k: Tensor, v: Tensor, scale: float | None = None, diagonal: int = 0,
           fill: float = float("-inf"), future: bool = False, causal: bool = True,
           dim: int = -1) -> Tensor:
    """Attention with one knob turned: the scale, the mask's diagonal or direction, the
    value masked scores get, or the axis of the softmax."""
    d, T = q.shape[-1], q.shape[-2]
    scores = q @ k.transpose(-2, -1) * (1 / math.sqrt(d) if scale is None else scale)
    if causal:
        allowed = torch.ones(T, T, dtype=torch.bool)
        allowed = allowed.triu(-diagonal) if future else allowed.tril(diagonal)
        scores = scores.masked_fill(~allowed, fill)
    return torch.softmax(scores, dim=dim) @ v


# -- chapter 6 ---------------------------------------------------------------------------------


def layer_norm_cases() -> list[Case]:
    cases = []
    draw = Draw(601)
    for i in range(30):
        shape = (*draw.batch_shape(), draw.integer(2, 8))
        if i == 0:
            shape = (1, 1)
        dtype = draw.choice(DTYPES)
        scale = draw.choice([1.0, 1.0, 10.0, 1e-3]) if i > 1 else 1e-3
        offset = draw.choice([0.0, 3.0]) if scale >= 1 else 0.0  # float32 would cancel
        x = draw.normal(*shape, dtype=dtype, scale=scale) + offset
        C = shape[-1]
        weight, bias = draw.normal(C, dtype=dtype) + 1.0, draw.normal(C, dtype=dtype)
        kwargs = {"eps": draw.choice([1e-5, 1e-2])} if i % 4 == 3 else {}
        note = f"shape {shape}, {dtype}" + (", a row of std 1e-3" if scale == 1e-3 else "")
        cases.append(Case((x, weight, bias), kwargs, note=note))
    x = torch.full((2, 4), 7.0, dtype=torch.float64)
    cases.append(Case((x, torch.ones(4, dtype=torch.float64), torch.arange(4.0).double()),
                      note="constant rows (variance 0)"))
    x = torch.randn(64, generator=torch.Generator().manual_seed(0)) + 1e4  # chapter 6's vector
    cases[1] = Case((x, torch.ones(64), torch.zeros(64)), note="chapter 6's float32 vector of "
                    "mean 1e4 and std 1", tolerance={torch.float32: (1e-2, 1e-2)})
    return cases  # (float32 rounds its mean by about 5e-4; a one-pass variance is off by 8)


def layer_norm_reference(x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5) -> Tensor:
    return F.layer_norm(x.double(), (x.shape[-1],), weight.double(), bias.double(),
                        eps).to(x.dtype)  # in float64, then rounded: the exact normalisation


def norm_with(x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5, correction: int = 0,
              eps_outside: bool = False, dim: int = -1, affine: bool = True,
              one_pass: bool = False, rms: bool = False) -> Tensor:
    """LayerNorm with one knob turned."""
    mean = x.mean(dim=dim, keepdim=True)
    var = x.var(dim=dim, keepdim=True, correction=correction)
    if one_pass:  # E[x^2] - mean^2: two large, nearly equal numbers subtracted
        var = x.pow(2).mean(dim=dim, keepdim=True) - mean.pow(2)
    if rms:
        var = x.pow(2).mean(dim=dim, keepdim=True)
    y = (x - mean) / (var.sqrt() + eps if eps_outside else (var + eps).sqrt())
    return y * weight + bias if affine else y


def gelu_cases() -> list[Case]:
    cases = [Case((torch.tensor([-3.0, -1.0, 0.0, 0.5, 1.0, 3.0], dtype=dtype),),
                  note=f"a few values, {dtype}") for dtype in DTYPES]
    cases.append(Case((torch.tensor([-1000.0, 1000.0, -30.0, 30.0]),), note="large values"))
    draw = Draw(602)
    for _ in range(15):
        shape, dtype = (*draw.batch_shape(), draw.integer(1, 8)), draw.choice(DTYPES)
        cases.append(Case((draw.normal(*shape, dtype=dtype, scale=2.0),),
                          note=f"random, {dtype}"))
    return cases


# -- chapter 7 ---------------------------------------------------------------------------------


def parameter_count_cases() -> list[Case]:
    sizes = [(65, 64, 4, 128), (50257, 1024, 12, 768), (10, 8, 1, 4), (256, 256, 2, 32),
             (27, 16, 1, 16), (100, 32, 6, 64)]
    return [Case(s, note="GPT-2's layout") for s in sizes]


def parameter_count_reference(vocab_size: int, block_size: int, n_layer: int, n_embd: int) -> int:
    config = GPTConfig(vocab_size=vocab_size, block_size=block_size, n_layer=n_layer, n_head=1,
                       n_embd=n_embd)  # GPT-2's layout: biases, LayerNorm, tied, learned wpe
    return model.num_parameters(config)


def count_with(V: int, T: int, L: int, C: int, lm_head: bool = False, biases: bool = True,
               wpe: bool = True, ln_f: bool = True, norms_per_block: int = 2) -> int:
    """The parameter count with one part left out or counted twice."""
    per_block = 12 * C * C + (9 * C if biases else 0) + norms_per_block * 2 * C
    return (V * C * (2 if lm_head else 1) + (T * C if wpe else 0) + L * per_block
            + (2 * C if ln_f else 0))


def residual_std_reference(n_layer: int) -> float:
    return model.INIT_STD / math.sqrt(2 * n_layer)


EXERCISES = [
    Exercise(
        "softmax", 5, "softmax", "softmax(x: Tensor, dim: int = -1) -> Tensor",
        "exp(x) / sum(exp(x)) along dim, safe for large x",
        softmax_reference, softmax_cases, names=("x",), mistakes=(
            Mistake("the largest logit overflows (exp(1000) is inf): subtract the max along "
                    "dim before exp; it changes no probability", softmax_no_max),
            Mistake("softmax over the wrong dimension: use the dim argument (max and sum over "
                    "dim, keepdim=True)", softmax_last_dim),
            Mistake("the sum runs over the whole tensor: sum over dim only, keepdim=True",
                    softmax_whole_tensor),
            Mistake("softmax exponentiates first: exp(x - max) / sum(exp(x - max))",
                    softmax_without_exp),
        ), describe=sums_along_dim),
    Exercise(
        "causal_attention", 5, "attention",
        "attention(q: Tensor (..., T, d), k: Tensor (..., T, d), v: Tensor (..., T, d)) -> "
        "Tensor (..., T, d)",
        "one causal head: softmax(q @ k^T / sqrt(d), masked so t sees 0..t) @ v",
        attention_reference, attention_cases, names=("q", "k", "v"), mistakes=(
            Mistake("the scores are not scaled: multiply q @ k^T by 1/sqrt(d), d = "
                    "q.shape[-1]", lambda q, k, v: attend(q, k, v, scale=1.0)),
            Mistake("scale by 1/sqrt(d), not 1/d",
                    lambda q, k, v: attend(q, k, v, scale=1 / q.shape[-1])),
            Mistake("scale by 1/sqrt(d), d the head size q.shape[-1], not by 1/sqrt(T), T the "
                    "sequence length", lambda q, k, v: attend(q, k, v,
                                                             scale=1 / math.sqrt(q.shape[-2]))),
            Mistake("the mask is off by one: position t must see itself (torch.tril keeps "
                    "the diagonal)", lambda q, k, v: attend(q, k, v, diagonal=-1)),
            Mistake("the mask lets position t see the next one: keep keys j <= t (the lower "
                    "triangle, diagonal included)", lambda q, k, v: attend(q, k, v, diagonal=1)),
            Mistake("the mask points the wrong way: position t sees the future (j >= t), not "
                    "the past", lambda q, k, v: attend(q, k, v, future=True)),
            Mistake("no causal mask: position t must not attend to t+1 .. T-1",
                    lambda q, k, v: attend(q, k, v, causal=False)),
            Mistake("masked scores must be -inf (exp gives 0); a score of 0 still gets weight",
                    lambda q, k, v: attend(q, k, v, fill=0.0)),
            Mistake("softmax over the wrong axis: over the keys (dim=-1), so that each "
                    "query's weights sum to 1", lambda q, k, v: attend(q, k, v, dim=-2)),
        )),
    Exercise(
        "layer_norm", 6, "layer_norm",
        "layer_norm(x: Tensor (..., C), weight: Tensor (C,), bias: Tensor (C,), eps: float = "
        "1e-5) -> Tensor (..., C)",
        "(x - mean) / sqrt(var + eps) * weight + bias over the last dimension",
        layer_norm_reference, layer_norm_cases, names=("x", "weight", "bias"), mistakes=(
            Mistake("the variance is the biased one, dividing by C (x.var(dim=-1, "
                    "unbiased=False), or correction=0), as LayerNorm's",
                    lambda x, w, b, eps=1e-5: norm_with(x, w, b, eps, correction=1)),
            Mistake("eps goes inside the square root: sqrt(var + eps), not sqrt(var) + eps",
                    lambda x, w, b, eps=1e-5: norm_with(x, w, b, eps, eps_outside=True)),
            Mistake("normalise over the last dimension (each vector's C features), not over "
                    "the first", lambda x, w, b, eps=1e-5: norm_with(x, w, b, eps, dim=0)),
            Mistake("scale by weight and shift by bias after normalising",
                    lambda x, w, b, eps=1e-5: norm_with(x, w, b, eps, affine=False)),
            Mistake("use the eps argument, not a fixed 1e-5",
                    lambda x, w, b, eps=1e-5: norm_with(x, w, b, 1e-5)),
            Mistake("the one-pass variance E[x^2] - mean^2 cancels in float32 when the mean is "
                    "large (chapter 6's vector of mean 1e4): take the mean first, then the "
                    "mean of (x - mean)^2",
                    lambda x, w, b, eps=1e-5: norm_with(x, w, b, eps, one_pass=True)),
            Mistake("divide by the standard deviation, sqrt(mean((x - mean)^2) + eps), not by "
                    "the RMS of x, sqrt(mean(x^2) + eps): that is RMSNorm's",
                    lambda x, w, b, eps=1e-5: norm_with(x, w, b, eps, rms=True)),
        )),
    Exercise(
        "gelu", 6, "gelu", "gelu(x: Tensor) -> Tensor",
        "the exact GELU, x * Phi(x) with Phi the standard normal CDF",
        block.gelu, gelu_cases, names=("x",), mistakes=(
            Mistake("this is GPT-2's tanh approximation: the exact GELU is 0.5 x (1 + erf(x / "
                    "sqrt 2))", block.gelu_tanh),
            Mistake("x * sigmoid(1.702 x) is an approximation: the exact GELU is 0.5 x (1 + "
                    "erf(x / sqrt 2))", lambda x: x * torch.sigmoid(1.702 * x)),
            Mistake("erf's argument is x / sqrt(2)",
                    lambda x: 0.5 * x * (1 + torch.erf(x))),
            Mistake("that is ReLU: GELU weighs x by the probability Phi(x)", torch.relu),
        )),
    Exercise(
        "parameter_count", 7, "parameter_count",
        "parameter_count(vocab_size: int, block_size: int, n_layer: int, n_embd: int) -> int",
        "the parameters of a GPT-2-style GPT (biases, LayerNorms, 4C MLP, tied output layer)",
        parameter_count_reference, parameter_count_cases,
        names=("vocab_size", "block_size", "n_layer", "n_embd"), mistakes=(
            Mistake("the output layer shares the token embedding's matrix (weight tying): "
                    "count it once", lambda V, T, L, C: count_with(V, T, L, C, lm_head=True)),
            Mistake("the Linear layers have biases: 3C + C in attention, 4C + C in the MLP",
                    lambda V, T, L, C: count_with(V, T, L, C, biases=False)),
            Mistake("count the position table wpe: block_size x n_embd",
                    lambda V, T, L, C: count_with(V, T, L, C, wpe=False)),
            Mistake("count the final LayerNorm ln_f: 2C",
                    lambda V, T, L, C: count_with(V, T, L, C, ln_f=False)),
            Mistake("each block has two LayerNorms (before attention and before the MLP), "
                    "2C each", lambda V, T, L, C: count_with(V, T, L, C, norms_per_block=1)),
        )),
    Exercise(
        "residual_std", 7, "residual_std", "residual_std(n_layer: int) -> float",
        "the standard deviation GPT-2 gives the projections that end a residual branch",
        residual_std_reference, lambda: [Case((n,)) for n in (1, 2, 4, 6, 12, 48)],
        names=("n_layer",), mistakes=(
            Mistake("each block adds two branches to the residual stream (attention and the "
                    "MLP): 0.02 / sqrt(2 * n_layer)", lambda n: 0.02 / math.sqrt(n)),
            Mistake("the square root: 0.02 / sqrt(2 * n_layer), not 0.02 / (2 * n_layer)",
                    lambda n: 0.02 / (2 * n)),
            Mistake("divide 0.02 by sqrt(2 * n_layer): deeper models start with smaller "
                    "branches", lambda n: 0.02 * math.sqrt(2 * n)),
        )),
]
