"""Tests for tinygpt.rope and RoPE inside the GPT: scores depend on relative position only, the two
layouts are one rotation up to a permutation, and the key/value cache and context cropping give
the same logits and tokens as recomputing everything."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tinygpt.config import GPTConfig
from tinygpt.model import GPT
from tinygpt.rope import RoPE, halves_order, rope_angles, rotate_halves, rotate_interleaved
from tinygpt.sample import generate

ROPE = GPTConfig(vocab_size=37, block_size=16, n_layer=2, n_head=2, n_embd=16, positional="rope")


def rotated(x: torch.Tensor, t: int, d: int, base: float = 10000.0) -> torch.Tensor:
    """``x`` ``(d,)`` rotated to position ``t`` in the halves layout, with the angles computed in
    float64 (rope_angles computes them in float32, as Hugging Face does: at t ~ 100 that alone
    moves a score by ~1e-5, which would hide the property tested below)."""
    inv_freq = 1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = (t * inv_freq)[None]  # (1, d/2)
    return rotate_halves(x[None].double(), angles.cos(), angles.sin())[0]


def test_rope_angles_are_the_formula_in_float32():
    d, base = 8, 10000.0
    ref = torch.outer(torch.arange(64, dtype=torch.float64),
                      1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    angles = rope_angles(64, d, base)
    assert angles.dtype == torch.float32 and angles.shape == (64, d // 2)
    torch.testing.assert_close(angles.double(), ref, rtol=1e-6, atol=1e-6)


@settings(max_examples=40, deadline=None)
@given(i=st.integers(0, 60), j=st.integers(0, 60), shift=st.integers(0, 60),
       seed=st.integers(0, 2**16))
def test_a_score_depends_only_on_the_distance_between_query_and_key(i, j, shift, seed):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(2, 8, generator=g, dtype=torch.float64)
    score = rotated(q, i, 8) @ rotated(k, j, 8)
    moved = rotated(q, i + shift, 8) @ rotated(k, j + shift, 8)  # the same distance i - j
    assert math.isclose(score, moved, rel_tol=1e-9, abs_tol=1e-9)


def test_the_score_does_change_with_the_distance():
    q = k = torch.ones(8, dtype=torch.float64)
    scores = [float(rotated(q, i, 8) @ rotated(k, 0, 8)) for i in range(4)]
    assert scores[0] == pytest.approx(8.0)  # no rotation at distance 0: q . k
    assert len({round(s, 6) for s in scores}) == 4


def test_rotation_keeps_lengths_and_position_zero_is_the_identity():
    x = torch.randn(3, 5, 8, dtype=torch.float64)
    angles = rope_angles(5, 8).double()
    y = rotate_halves(x, angles.cos(), angles.sin())
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))
    torch.testing.assert_close(y[:, 0], x[:, 0])


def test_the_two_layouts_are_the_same_rotation_up_to_a_permutation():
    d = 12
    p = halves_order(d)
    assert sorted(p.tolist()) == list(range(d)) and p.tolist()[:3] == [0, 2, 4]
    x = torch.randn(2, 3, 7, d, dtype=torch.float64)
    angles = rope_angles(7, d, base=500.0).double()
    cos, sin = angles.cos(), angles.sin()
    torch.testing.assert_close(rotate_halves(x[..., p], cos, sin),
                               rotate_interleaved(x, cos, sin)[..., p])
    # and not without it: the layouts pair different dimensions
    assert not torch.allclose(rotate_halves(x, cos, sin), rotate_interleaved(x, cos, sin))


def test_interleaved_pairs_rotate_as_complex_numbers():
    """RoFormer's form: pair (x[2i], x[2i+1]) is the complex number x[2i] + i x[2i+1], times
    e^(i t theta_i)."""
    d, T = 8, 6
    x = torch.randn(T, d, dtype=torch.float64)
    angles = rope_angles(T, d).double()  # (T, d/2)
    z = torch.view_as_complex(x.reshape(T, d // 2, 2).contiguous()) * torch.polar(
        torch.ones_like(angles), angles)
    torch.testing.assert_close(rotate_interleaved(x, angles.cos(), angles.sin()),
                               torch.view_as_real(z).reshape(T, d))


def test_rope_module_starts_at_the_given_position():
    rope = RoPE(8, 10, base=100.0)
    x = torch.randn(1, 2, 10, 8)
    whole = rope(x)
    torch.testing.assert_close(rope(x[:, :, 4:7], start=4), whole[:, :, 4:7])
    assert not torch.allclose(rope(x[:, :, 4:7]), whole[:, :, 4:7])
    assert "rope" not in dict(GPT(ROPE).state_dict())  # buffers are recomputed, not saved
    assert not any("cos" in k or "sin" in k for k in GPT(ROPE).state_dict())


def test_the_model_with_rope_has_no_position_table_and_sees_order():
    torch.manual_seed(0)
    model = GPT(ROPE).eval()
    assert model.transformer.embed.wpe is None
    idx = torch.tensor([[1, 2, 3, 4, 5]])
    flipped = idx.flip(1)
    with torch.no_grad():  # the last position sees the same bag of tokens in another order
        assert not torch.allclose(model(idx)[0, -1], model(flipped)[0, -1])


def test_cached_forward_equals_the_full_forward_with_rope():
    torch.manual_seed(1)
    model = GPT(ROPE).eval()
    idx = torch.randint(0, 37, (2, 11))
    with torch.no_grad():
        full = model(idx)
        caches = model.new_caches(2)
        parts = [model(idx[:, :4], caches=caches), model(idx[:, 4:5], caches=caches),
                 model(idx[:, 5:], caches=caches)]
    torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("qk_norm", [False, True])
def test_generation_with_the_cache_equals_generation_without_it_past_the_context(qk_norm):
    """Greedy generation well past block_size: the context is cropped and the cache rebuilt, and
    positions restart at 0 in both paths."""
    torch.manual_seed(2)
    config = GPTConfig(vocab_size=37, block_size=8, n_layer=2, n_head=2, n_embd=16,
                       positional="rope", qk_norm=qk_norm)
    model = GPT(config).eval()
    with torch.no_grad():  # wider weights than at init, so that positions change the tokens
        for p in model.parameters():
            if p.ndim == 2:
                p.normal_(0.0, 0.5)
    idx = torch.randint(0, 37, (3, 5))
    cached = generate(model, idx, 30, temperature=0)
    uncached = generate(model, idx, 30, temperature=0, use_cache=False)
    assert torch.equal(cached, uncached)


def test_rope_config_is_validated():
    with pytest.raises(ValueError, match=r"head size .* must be even"):
        GPTConfig(n_embd=12, n_head=4, positional="rope")
    with pytest.raises(ValueError, match="rope_theta"):
        GPTConfig(rope_theta=1.0)
    with pytest.raises(TypeError, match="rope_theta"):
        GPTConfig(rope_theta="big")
    with pytest.raises(ValueError, match="head_size must be even"):
        rope_angles(4, 7)
