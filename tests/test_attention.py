"""Tests for tinygpt.attention and tinygpt.config.

The references are independent of the module: a token-by-token loop written here in float64
(each query against the keys of positions <= t only, softmax by hand), and PyTorch's own
``nn.MultiheadAttention`` with the weights copied in.
"""

from __future__ import annotations

import dataclasses
import math
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from tinygpt.attention import CausalSelfAttention, KVCache, causal_mask
from tinygpt.config import GPTConfig

FAST = settings(max_examples=25, deadline=None)


def make_layer(n_embd=16, n_head=4, block_size=12, bias=True, seed=0, fused=True, dropout=0.0):
    torch.manual_seed(seed)
    config = GPTConfig(vocab_size=10, block_size=block_size, n_layer=1, n_head=n_head,
                       n_embd=n_embd, bias=bias, dropout=dropout)
    layer = CausalSelfAttention(config, fused=fused)
    with torch.no_grad():  # non-zero biases, so a bias that is ignored would show
        for p in layer.parameters():
            p.normal_(0.0, 0.3)
    return layer.eval()


def loop_reference(layer: CausalSelfAttention, x: torch.Tensor) -> torch.Tensor:
    """Causal multi-head attention one query at a time, in float64, from the layer's weights."""
    C, H = layer.config.n_embd, layer.config.n_head
    d = C // H
    W = layer.c_attn.weight.detach().double()  # (3C, C)
    b = layer.c_attn.bias.detach().double() if layer.c_attn.bias is not None else torch.zeros(3 * C)
    Wo = layer.c_proj.weight.detach().double()
    bo = layer.c_proj.bias.detach().double() if layer.c_proj.bias is not None else torch.zeros(C)
    x = x.double()
    B, T, _ = x.shape
    out = torch.zeros(B, T, C, dtype=torch.float64)
    for bi in range(B):
        qkv = x[bi] @ W.T + b  # (T, 3C)
        q, k, v = qkv[:, :C], qkv[:, C:2 * C], qkv[:, 2 * C:]
        for t in range(T):
            heads = []
            for h in range(H):
                cols = slice(h * d, (h + 1) * d)
                scores = [float(q[t, cols] @ k[s, cols]) / math.sqrt(d) for s in range(t + 1)]
                top = max(scores)
                e = [math.exp(z - top) for z in scores]
                weights = [w / sum(e) for w in e]
                heads.append(sum(w * v[s, cols] for s, w in enumerate(weights)))
            out[bi, t] = torch.cat(heads) @ Wo.T + bo
    return out


shapes = st.tuples(
    st.integers(1, 3),  # B
    st.integers(1, 8),  # T
    st.sampled_from([(8, 1), (8, 2), (12, 3), (16, 4)]),  # (C, H)
    st.booleans(),  # bias
    st.integers(0, 10_000),  # seed
)


@FAST
@given(shapes)
def test_explicit_fused_and_loop_agree(case):
    B, T, (C, H), bias, seed = case
    layer = make_layer(C, H, block_size=8, bias=bias, seed=seed)
    x = torch.randn(B, T, C, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        layer.fused = True
        fused = layer(x)
        layer.fused = False
        explicit = layer(x)
        _, weights = layer(x, return_weights=True)
    reference = loop_reference(layer, x).float()
    torch.testing.assert_close(explicit, reference, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(fused, reference, atol=1e-5, rtol=1e-4)
    assert weights.shape == (B, H, T, T)


@pytest.mark.parametrize("bias", [True, False])
def test_matches_torch_multihead_attention(bias):
    layer = make_layer(16, 4, bias=bias, seed=3)
    mha = nn.MultiheadAttention(16, 4, bias=bias, batch_first=True)
    with torch.no_grad():
        mha.in_proj_weight.copy_(layer.c_attn.weight)  # same [q | k | v] row layout
        mha.out_proj.weight.copy_(layer.c_proj.weight)
        if bias:
            mha.in_proj_bias.copy_(layer.c_attn.bias)
            mha.out_proj.bias.copy_(layer.c_proj.bias)
    x = torch.randn(2, 9, 16)
    blocked = ~torch.ones(9, 9, dtype=torch.bool).tril()  # torch's convention: True = blocked
    with torch.no_grad():
        expected, _ = mha(x, x, x, attn_mask=blocked, need_weights=False)
        for fused in (True, False):
            layer.fused = fused
            torch.testing.assert_close(layer(x), expected, atol=1e-5, rtol=1e-4)


@FAST
@given(st.integers(0, 9), st.integers(0, 1000), st.booleans())
def test_future_tokens_never_change_the_past(t, seed, fused):
    layer = make_layer(12, 3, block_size=10, seed=seed, fused=fused)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 10, 12, generator=g)
    changed = x.clone()
    changed[:, t + 1:] = torch.randn(2, 10 - t - 1, 12, generator=g) * 5  # rewrite the future
    with torch.no_grad():
        a, b = layer(x), layer(changed)
    torch.testing.assert_close(a[:, : t + 1], b[:, : t + 1], atol=1e-6, rtol=0)
    if t < 9:  # and the change is visible at later positions, so the test can fail
        assert not torch.allclose(a[:, t + 1:], b[:, t + 1:])


def test_weights_are_distributions_and_masked_entries_zero():
    layer = make_layer(16, 4, seed=1)
    future = ~torch.ones(11, 11, dtype=torch.bool).tril()
    for scale in (1.0, 30.0):  # moderate scores, then scores large enough to saturate
        with torch.no_grad():
            _, w = layer(torch.randn(3, 11, 16) * scale, return_weights=True)
        torch.testing.assert_close(w.sum(-1), torch.ones(3, 4, 11))
        # A masked score is -inf, and exp(-inf) is 0 in exact arithmetic; a vectorised exp may
        # clamp its input and return the smallest normal float (1.2e-38) instead. Either is no
        # leak from the future; a nan (an all-masked row) or a real weight fails.
        assert w[..., future].abs().max() < 1e-30
        if scale == 1.0:
            assert (w[..., ~future] > 0).all()


def test_causal_mask_against_tril_and_shifted_rows():
    assert torch.equal(causal_mask(5, 5), torch.tril(torch.ones(5, 5)).bool())
    full = torch.tril(torch.ones(7, 7)).bool()
    assert torch.equal(causal_mask(3, 7), full[4:])  # last 3 queries of 7 positions
    with pytest.raises(ValueError, match="t_query"):
        causal_mask(4, 3)


@FAST
@given(st.lists(st.integers(1, 4), min_size=1, max_size=6), st.booleans(), st.integers(0, 999))
def test_cache_in_chunks_equals_full_sequence(chunks, fused, seed):
    T = sum(chunks)
    layer = make_layer(16, 4, block_size=24, seed=seed, fused=fused)
    x = torch.randn(2, T, 16, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        full = layer(x)
        cache = KVCache.for_config(layer.config, batch_size=2)
        pieces, start = [], 0
        for n in chunks:
            pieces.append(layer(x[:, start:start + n], cache=cache))
            start += n
    assert cache.length == T
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=1e-5, rtol=1e-4)


def test_cache_one_token_at_a_time_and_weights_with_cache():
    layer = make_layer(16, 2, block_size=8, seed=5)
    x = torch.randn(1, 8, 16)
    with torch.no_grad():
        _, full_w = layer(x, return_weights=True)
        cache = KVCache.for_config(layer.config, batch_size=1)
        rows = []
        for t in range(8):
            _, w = layer(x[:, t:t + 1], cache=cache, return_weights=True)
            assert w.shape == (1, 2, 1, t + 1)  # one query against all t+1 keys so far
            rows.append(torch.nn.functional.pad(w, (0, 7 - t)))
    torch.testing.assert_close(torch.cat(rows, dim=2), full_w, atol=1e-6, rtol=1e-5)
    cache.reset()
    assert cache.length == 0


def test_fused_and_explicit_gradients_agree():
    grads = []
    for fused in (True, False):
        layer = make_layer(16, 4, seed=7, fused=fused).train()
        x = torch.randn(2, 6, 16, generator=torch.Generator().manual_seed(1), requires_grad=True)
        (layer(x) ** 2).sum().backward()
        grads.append((layer.c_attn.weight.grad, x.grad))
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_dropout_only_in_training():
    layer = make_layer(16, 4, seed=2, dropout=0.5)
    plain = make_layer(16, 4, seed=2, dropout=0.0)
    x = torch.randn(2, 6, 16)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), plain(x))  # eval: dropout is off
        layer.train()
        for fused in (True, False):
            layer.fused = fused
            assert not torch.allclose(layer(x), plain(x))


def test_bad_inputs_raise_clear_errors():
    layer = make_layer(16, 4, block_size=6)
    with pytest.raises(ValueError, match=r"width C=15 .* n_embd=16"):
        layer(torch.randn(1, 3, 15))
    with pytest.raises(ValueError, match=r"\(B, T, C\).*x\[None\]"):
        layer(torch.randn(3, 16))
    with pytest.raises(ValueError, match=r"shape \(B, T, C\)"):
        layer(torch.randn(1, 1, 3, 16))
    with pytest.raises(ValueError, match="block_size=6"):
        layer(torch.randn(1, 7, 16))
    with pytest.raises(TypeError, match="floating-point"):
        layer(torch.ones(1, 3, 16, dtype=torch.long))
    with pytest.raises(TypeError, match=re.escape("torch.Tensor")):
        layer([[0.0] * 16])
    with pytest.raises(ValueError, match="T=0"):
        layer(torch.randn(1, 0, 16))
    with pytest.raises(TypeError, match="GPTConfig"):
        CausalSelfAttention({"n_embd": 16})
    cache = KVCache.for_config(layer.config, batch_size=1)
    with torch.no_grad():
        layer(torch.randn(1, 4, 16), cache=cache)
        with pytest.raises(ValueError, match=r"4 cached \+ 3 new = 7 .* block_size=6"):
            layer(torch.randn(1, 3, 16), cache=cache)
        with pytest.raises(ValueError, match="batch, heads and head size"):
            layer(torch.randn(2, 1, 16), cache=cache)
    with pytest.raises(ValueError, match="max_len"):
        KVCache(1, 4, 0, 4)


def test_config_defaults_and_validation():
    c = GPTConfig()
    assert c.head_size * c.n_head == c.n_embd
    assert dataclasses.replace(c, n_layer=2).n_layer == 2
    with pytest.raises(ValueError, match=r"n_embd=10 must be divisible by n_head=4"):
        GPTConfig(n_embd=10, n_head=4)
    with pytest.raises(ValueError, match=r"n_embd=10 must be divisible by n_head=4"):
        dataclasses.replace(c, n_embd=10, n_head=4)
    for field, bad in [("vocab_size", 0), ("block_size", -1), ("n_layer", 2.0),
                       ("n_head", True), ("n_embd", "64")]:
        error = ValueError if type(bad) is int else TypeError  # a wrong type is a TypeError
        with pytest.raises(error, match=f"GPTConfig.{field} must be a positive integer"):
            GPTConfig(**{field: bad})
    for bad in (-0.1, 1.0, float("nan")):
        with pytest.raises(ValueError, match=r"dropout must be in \[0, 1\)"):
            GPTConfig(dropout=bad)
    for bad in ("0.1", None, True):
        with pytest.raises(TypeError, match=r"dropout must be a number"):
            GPTConfig(dropout=bad)
    assert GPTConfig(dropout=0).dropout == 0
    with pytest.raises(TypeError, match="bias must be True or False"):
        GPTConfig(bias=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.n_embd = 64


def test_one_query_after_a_cache_needs_no_mask_and_matches_explicit_and_full():
    # the fused path skips the mask for a single new query: it must equal the explicit path
    # (which masks) and the last row of the full sequence
    fused = make_layer(16, 4, block_size=12, seed=9, fused=True)
    explicit = make_layer(16, 4, block_size=12, seed=9, fused=False)
    x = torch.randn(3, 12, 16, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = explicit(x)
        for t0 in (1, 5, 11):
            caches = [KVCache.for_config(fused.config, batch_size=3) for _ in range(2)]
            fused(x[:, :t0], cache=caches[0])
            explicit(x[:, :t0], cache=caches[1])
            y_fused = fused(x[:, t0:t0 + 1], cache=caches[0])  # (B, 1, C)
            y_explicit = explicit(x[:, t0:t0 + 1], cache=caches[1])
            torch.testing.assert_close(y_fused, y_explicit, atol=1e-6, rtol=1e-5)
            torch.testing.assert_close(y_fused, full[:, t0:t0 + 1], atol=1e-6, rtol=1e-5)
