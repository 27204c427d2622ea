"""Tests for tinygpt.block: norms and activations against torch, the MLP, and the block's wiring."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from tinygpt.attention import KVCache
from tinygpt.block import (
    ACTIVATION_FUNCTIONS,
    GATED,
    MLP,
    ActivationLayer,
    Block,
    LayerNorm,
    RMSNorm,
    gelu,
    gelu_tanh,
    make_norm,
    relu,
)
from tinygpt.config import ACTIVATIONS, GPTConfig

shapes = st.tuples(st.integers(1, 3), st.integers(1, 5), st.integers(1, 24))  # (B, T, C)
epsilons = st.sampled_from([1e-8, 1e-6, 1e-5, 1e-3, 0.1])


def config(**overrides) -> GPTConfig:
    base = {"vocab_size": 11, "block_size": 16, "n_layer": 2, "n_head": 4, "n_embd": 16}
    return GPTConfig(**{**base, **overrides})


def randomise_(module: torch.nn.Module, seed: int, std: float = 0.3) -> torch.nn.Module:
    """Give every parameter (norm scales and shifts included) random values."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * std + (1.0 if p.ndim == 1 else 0.0))
    return module


# --- norms ------------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(shape=shapes, eps=epsilons, bias=st.booleans(), scale=st.sampled_from([1e-3, 1.0, 1e3]),
       seed=st.integers(0, 2**16))
def test_layernorm_matches_torch(shape, eps, bias, scale, seed):
    gen = torch.Generator().manual_seed(seed)
    C = shape[-1]
    ours, ref = LayerNorm(C, eps=eps, bias=bias), torch.nn.LayerNorm(C, eps=eps, bias=bias)
    randomise_(ours, seed)
    ref.load_state_dict(ours.state_dict())
    x = (torch.randn(shape, generator=gen) + 3.0) * scale  # an offset and a scale to remove
    torch.testing.assert_close(ours(x), ref(x), atol=1e-5, rtol=1e-4)


@settings(max_examples=40, deadline=None)
@given(shape=shapes, eps=epsilons, scale=st.sampled_from([1e-3, 1.0, 1e3]),
       seed=st.integers(0, 2**16))
def test_rmsnorm_matches_torch(shape, eps, scale, seed):
    gen = torch.Generator().manual_seed(seed)
    C = shape[-1]
    ours, ref = RMSNorm(C, eps=eps), torch.nn.RMSNorm(C, eps=eps)
    randomise_(ours, seed)
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(shape, generator=gen) * scale
    torch.testing.assert_close(ours(x), ref(x), atol=1e-5, rtol=1e-4)


def test_norm_gradients_match_torch():
    torch.manual_seed(0)
    x = torch.randn(2, 5, 12, dtype=torch.float64, requires_grad=True)
    for ours, ref in [(LayerNorm(12), torch.nn.LayerNorm(12)),
                      (RMSNorm(12), torch.nn.RMSNorm(12, eps=1e-5))]:
        ours, ref = randomise_(ours.double(), 1), ref.double()
        ref.load_state_dict(ours.state_dict())
        g_ours = torch.autograd.grad(ours(x).pow(3).sum(), [x, *ours.parameters()])
        g_ref = torch.autograd.grad(ref(x).pow(3).sum(), [x, *ref.parameters()])
        for a, b in zip(g_ours, g_ref):
            torch.testing.assert_close(a, b)


def test_what_the_norms_remove():
    torch.manual_seed(0)
    x = torch.randn(4, 7, 32) * 5 + 2
    y = LayerNorm(32, eps=1e-12)(x)
    torch.testing.assert_close(y.mean(-1), torch.zeros(4, 7), atol=1e-5, rtol=0)
    torch.testing.assert_close(y.var(-1, unbiased=False), torch.ones(4, 7), atol=1e-4, rtol=0)
    z = RMSNorm(32, eps=1e-12)(x)
    torch.testing.assert_close(z.pow(2).mean(-1), torch.ones(4, 7), atol=1e-4, rtol=0)
    # RMSNorm keeps the direction: z is a positive multiple of x, so the mean keeps its sign
    torch.testing.assert_close(z / z.norm(dim=-1, keepdim=True), x / x.norm(dim=-1, keepdim=True))
    assert LayerNorm(8)(torch.zeros(3, 8)).abs().max() == 0  # eps: no 0/0 for a constant vector


def test_layernorm_is_accurate_with_a_large_offset():
    x = torch.randn(1000, 64, generator=torch.Generator().manual_seed(0)) + 1e4  # float32
    expected = torch.nn.functional.layer_norm(x.double(), (64,)).float()
    # x itself is rounded to float32's spacing at 1e4 (~1e-3); the two-pass formula adds little,
    # torch's kernel (Welford's stable one-pass update) about as little
    torch.testing.assert_close(LayerNorm(64).explicit(x), expected, atol=2e-3, rtol=0)
    torch.testing.assert_close(LayerNorm(64)(x), expected, atol=3e-3, rtol=0)


def test_make_norm_follows_the_config():
    ln = make_norm(config(norm_eps=1e-3))
    assert isinstance(ln, LayerNorm) and ln.bias is not None and ln.eps == 1e-3
    assert make_norm(config(bias=False)).bias is None
    rms = make_norm(config(norm="rmsnorm", norm_eps=1e-6))
    assert isinstance(rms, RMSNorm) and rms.eps == 1e-6 and rms.weight.shape == (16,)


@pytest.mark.parametrize(("bad", "error"), [(0, ValueError), (-3, ValueError),
                                            (2.0, TypeError), (True, TypeError), ("8", TypeError)])
def test_norms_reject_bad_width(bad, error):
    for cls in (LayerNorm, RMSNorm):
        with pytest.raises(error, match="n_embd"):
            cls(bad)


@pytest.mark.parametrize(("bad", "error"), [(0.0, ValueError), (-1e-5, ValueError),
                                            ("1e-5", TypeError), (None, TypeError)])
def test_norms_reject_bad_eps(bad, error):
    for cls in (LayerNorm, RMSNorm):
        with pytest.raises(error, match="eps"):
            cls(8, eps=bad)


def test_norms_reject_wrong_input_width():
    for norm in (LayerNorm(8), RMSNorm(8)):
        with pytest.raises(ValueError, match="last dimension must be 8"):
            norm(torch.zeros(2, 3, 9))
        with pytest.raises(TypeError, match=re.escape("torch.Tensor")):
            norm([0.0] * 8)


# --- activations ------------------------------------------------------------------------------

# |x| <= 20 covers the curved part and both saturated tails (Phi(-20) < 1e-88, so gelu(x) is x or
# 0 to the last float32 bit beyond it). Further out the comparison with torch would only test how
# each kernel rounds erf/tanh next to +-1 -- one ulp there is 6e-8 * |x| in the output, 0.03 at
# 1e6, and vectorised kernels (AVX2, AVX-512, NEON) legitimately differ in that ulp. The far
# tails are checked against their limits instead, in test_activation_extremes.
floats = st.floats(-20.0, 20.0, allow_nan=False, width=32)


@settings(max_examples=30, deadline=None)
@given(values=st.lists(floats, min_size=1, max_size=50))
def test_activations_match_torch(values):
    x = torch.tensor(values + [0.0, -0.0, 1e-7, -3.0, 3.0])
    torch.testing.assert_close(relu(x), F.relu(x))
    torch.testing.assert_close(gelu(x), F.gelu(x, approximate="none"))
    torch.testing.assert_close(gelu_tanh(x), F.gelu(x, approximate="tanh"))


def test_activation_gradients_match_torch():
    x = torch.linspace(-6, 6, 241, dtype=torch.float64, requires_grad=True)  # includes 0.0
    for ours, ref in [(relu, F.relu), (gelu, F.gelu),
                      (gelu_tanh, lambda t: F.gelu(t, approximate="tanh"))]:
        (g_ours,) = torch.autograd.grad(ours(x).sum(), x)
        (g_ref,) = torch.autograd.grad(ref(x).sum(), x)
        torch.testing.assert_close(g_ours, g_ref)


def test_activation_extremes():
    """Our activations far out and at +-inf/nan: only properties that hold on every CPU.

    torch's F.gelu is no reference here: its value at inf depends on the vectorised kernel the CPU
    selects (nan on some, inf on others), so nothing below compares with it.
    """
    inf, nan = float("inf"), float("nan")
    x = torch.tensor([-inf, inf, nan])
    y = relu(x)  # comparisons and a select, no arithmetic: exact on any machine
    assert y[:2].tolist() == [0.0, inf] and y[2].isnan()
    for fn in (gelu, gelu_tanh):
        assert fn(x)[2].isnan()  # nan propagates, never becomes a plausible number
    # Large finite inputs (a diverging network's activations): the tails are relu's, to one part
    # in a million of |x| -- a margin that an erf/tanh off by a few ulp next to +-1 still meets.
    big = torch.tensor([-1e30, -1e6, -1e3, -20.0, 20.0, 1e3, 1e6, 1e30])
    for fn in (relu, gelu, gelu_tanh):
        out = fn(big)
        assert torch.isfinite(out).all(), fn.__name__
        assert ((out - relu(big)).abs() <= 1e-6 * big.abs()).all(), (fn.__name__, out)


def test_activation_names():
    assert tuple(ACTIVATION_FUNCTIONS) == ACTIVATIONS  # the config and the block agree
    x = torch.randn(20)
    for name, fn in ACTIVATION_FUNCTIONS.items():
        torch.testing.assert_close(ActivationLayer(name)(x), fn(x))
    with pytest.raises(ValueError, match="gelu_tanh"):
        ActivationLayer("swish")


# --- MLP --------------------------------------------------------------------------------------


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("hidden", [None, 24])
def test_mlp_computes_contract_act_expand(activation, hidden):
    cfg = config(activation=activation, mlp_hidden=hidden)
    mlp = MLP(cfg)
    width = 4 * cfg.n_embd if hidden is None else hidden
    fc = 2 * width if activation in GATED else width  # swiglu: c_fc makes gate and up
    assert mlp.c_fc.weight.shape == (fc, 16) and mlp.c_proj.weight.shape == (16, width)
    x = torch.randn(3, 5, 16)
    ref = F.linear(ACTIVATION_FUNCTIONS[activation](F.linear(x, mlp.c_fc.weight, mlp.c_fc.bias)),
                   mlp.c_proj.weight, mlp.c_proj.bias)
    torch.testing.assert_close(mlp(x), ref)


def test_mlp_works_position_by_position():
    mlp = MLP(config())
    x = torch.randn(2, 6, 16)
    torch.testing.assert_close(mlp(x)[:, 3], mlp(x[:, 3]))


def test_parameter_counts():
    C = 16
    block = Block(config(n_embd=C))
    def count(m: torch.nn.Module) -> int:
        return sum(p.numel() for p in m.parameters())

    assert count(block.mlp) == 8 * C * C + 5 * C
    assert count(block.attn) == 4 * C * C + 4 * C
    assert count(block.ln_1) == 2 * C
    nobias = Block(config(n_embd=C, bias=False, norm="rmsnorm"))
    assert (count(nobias.mlp), count(nobias.attn), count(nobias.ln_2)) == (8 * C * C, 4 * C * C, C)


# --- the block --------------------------------------------------------------------------------


def reference_block(block: Block, x: torch.Tensor, pre: bool) -> torch.Tensor:
    """The block's two formulas, written out with its own submodules."""
    def attn(t: torch.Tensor) -> torch.Tensor:
        return block.attn(t)

    if pre:
        h = x + attn(block.ln_1(x))
        return h + block.mlp(block.ln_2(h))
    h = block.ln_1(x + attn(x))
    return block.ln_2(h + block.mlp(h))


@pytest.mark.parametrize("position", ["pre", "post"])
@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_block_matches_its_formulas(position, norm):
    torch.manual_seed(0)
    block = randomise_(Block(config(norm_position=position, norm=norm)), seed=3)
    x = torch.randn(2, 9, 16) * 2
    y = block(x)
    assert y.shape == x.shape
    torch.testing.assert_close(y, reference_block(block, x, pre=position == "pre"))
    # and not the other arrangement: the switch really changes the computation
    assert not torch.allclose(y, reference_block(block, x, pre=position != "pre"), atol=1e-3)


def test_pre_and_post_norm_differ_only_in_arrangement():
    torch.manual_seed(0)
    pre = Block(config(norm_position="pre"))
    post = Block(config(norm_position="post"))
    post.load_state_dict(pre.state_dict())  # same parameters, same names
    x = torch.randn(1, 5, 16)
    assert not torch.allclose(pre(x), post(x), atol=1e-3)
    # post-norm ends with a norm: every output vector has mean 0 and variance 1 (weights at init)
    torch.testing.assert_close(post(x).mean(-1), torch.zeros(1, 5), atol=1e-5, rtol=0)


@given(position=st.sampled_from(["pre", "post"]), seed=st.integers(0, 1000))
@settings(max_examples=10, deadline=None)
def test_block_with_zero_residual_branches(position, seed):
    torch.manual_seed(seed)
    block = Block(config(norm_position=position))
    with torch.no_grad():
        for proj in (block.attn.c_proj, block.mlp.c_proj):
            proj.weight.zero_()
            proj.bias.zero_()
    x = torch.randn(2, 7, 16, requires_grad=True)
    y = block(x)
    if position == "pre":  # both branches add zero: the identity, gradient included
        torch.testing.assert_close(y, x)
        (g,) = torch.autograd.grad((y * x.detach()).sum(), x)
        torch.testing.assert_close(g, x.detach())
    else:  # what is left is the two norms
        torch.testing.assert_close(y, block.ln_2(block.ln_1(x)))


@pytest.mark.parametrize("position", ["pre", "post"])
def test_block_with_cache_matches_full_sequence(position):
    torch.manual_seed(0)
    cfg = config(norm_position=position)
    block = Block(cfg).eval()
    x = torch.randn(2, 10, 16)
    cache = KVCache.for_config(cfg, batch_size=2)
    with torch.no_grad():
        full = block(x)
        parts = torch.cat([block(x[:, :6], cache=cache), block(x[:, 6:7], cache=cache),
                           block(x[:, 7:], cache=cache)], dim=1)
    torch.testing.assert_close(parts, full, atol=1e-5, rtol=1e-5)


def test_block_is_causal():
    torch.manual_seed(0)
    block = Block(config())
    x = torch.randn(1, 8, 16)
    x2 = x.clone()
    x2[:, 5:] += 1.0  # change the future only
    torch.testing.assert_close(block(x)[:, :5], block(x2)[:, :5])


def test_block_submodule_names():
    names = {n for n, _ in Block(config()).named_parameters()}
    assert {"ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_proj.weight", "ln_2.weight",
            "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight"} <= names


def test_block_rejects_bad_config_and_input():
    with pytest.raises(TypeError, match="GPTConfig"):
        Block({"n_embd": 16})
    with pytest.raises(TypeError, match="GPTConfig"):
        MLP(dataclasses.asdict(config()))
    block = Block(config())
    with pytest.raises(ValueError, match="16"):
        block(torch.zeros(1, 4, 12))


# --- fast paths against the explicit formulas ---------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(shape=shapes, eps=epsilons, bias=st.booleans(), seed=st.integers(0, 999))
def test_fused_norms_equal_their_explicit_formulas_values_and_gradients(shape, eps, bias, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen, dtype=torch.float64) * 3 + 1  # float64: C=1, tiny eps
    for norm in (LayerNorm(shape[-1], eps=eps, bias=bias), RMSNorm(shape[-1], eps=eps)):
        randomise_(norm, seed).double()
        a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
        fast, slow = norm(a), norm.explicit(b)
        torch.testing.assert_close(fast, slow, atol=1e-9, rtol=1e-9)
        g = torch.randn(fast.shape, generator=gen, dtype=torch.float64)
        fast_grads = torch.autograd.grad(fast, [a, *norm.parameters()], g)
        slow_grads = torch.autograd.grad(slow, [b, *norm.parameters()], g)
        for f, s in zip(fast_grads, slow_grads, strict=True):
            torch.testing.assert_close(f, s, atol=1e-6, rtol=1e-6)


def test_explicit_norm_path_checks_its_input_too():
    for norm in (LayerNorm(8), RMSNorm(8)):
        with pytest.raises(ValueError, match="width 8"):
            norm.explicit(torch.zeros(2, 7))


@pytest.mark.parametrize("name", ACTIVATIONS)
def test_activation_kernel_equals_the_written_formula(name):
    n = 302 if name in GATED else 301  # a gated unit splits its input into two halves
    x = torch.linspace(-6, 6, n, dtype=torch.float64).requires_grad_()
    fast, slow = ActivationLayer(name), ActivationLayer(name, explicit=True)
    assert slow.fn is ACTIVATION_FUNCTIONS[name] and fast.fn is not ACTIVATION_FUNCTIONS[name]
    yf, ys = fast(x), slow(x)
    torch.testing.assert_close(yf, ys, atol=1e-12, rtol=1e-12)
    (gf,), (gs,) = torch.autograd.grad(yf.sum(), x), torch.autograd.grad(ys.sum(), x)
    torch.testing.assert_close(gf, gs, atol=1e-10, rtol=1e-10)
    assert "explicit=True" in repr(slow) and "explicit" not in repr(fast)
    with pytest.raises(TypeError, match="explicit"):
        ActivationLayer(name, explicit=1)


def test_block_with_explicit_layers_equals_the_fast_block():
    cfg = config(norm="layernorm", activation="gelu_tanh")
    block = randomise_(Block(cfg), 3, std=0.1)
    x = torch.randn(2, 6, 16, generator=torch.Generator().manual_seed(1))
    fast = block(x)
    block.ln_1.forward, block.ln_2.forward = block.ln_1.explicit, block.ln_2.explicit
    block.mlp.act = ActivationLayer("gelu_tanh", explicit=True)
    torch.testing.assert_close(block(x), fast, atol=1e-5, rtol=1e-5)


def test_a_layer_saved_whole_still_checks_its_input():
    """The input check is the first line of the forward the chapters show; a module saved whole
    with torch.save loads back and still checks."""
    import io

    norm = LayerNorm(8)
    buffer = io.BytesIO()
    torch.save(norm, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    torch.testing.assert_close(loaded(torch.ones(2, 8)), norm(torch.ones(2, 8)))
    with pytest.raises(ValueError, match="last dimension must be 8"):
        loaded(torch.ones(2, 3))
