"""Tests for tinygpt.attention.scaled_dot_product_attention: the formula with an arbitrary boolean
mask, checked against torch's F.scaled_dot_product_attention and against the causal layer."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from tinygpt.attention import causal_mask, scaled_dot_product_attention


@settings(max_examples=30, deadline=None)
@given(B=st.integers(1, 3), H=st.integers(1, 3), Tq=st.integers(1, 6), Tk=st.integers(1, 6),
       d=st.integers(1, 8), dv=st.integers(1, 5), seed=st.integers(0, 2**16),
       broadcast=st.booleans())
def test_any_boolean_mask_matches_torch(B, H, Tq, Tk, d, dv, seed, broadcast):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, Tq, d, generator=g, dtype=torch.float64)
    k = torch.randn(B, H, Tk, d, generator=g, dtype=torch.float64)
    v = torch.randn(B, H, Tk, dv, generator=g, dtype=torch.float64)
    shape = (Tq, Tk) if broadcast else (B, 1, Tq, Tk)
    mask = torch.rand(shape, generator=g) < 0.6
    mask[..., 0] = True  # every query sees at least one key (torch's kernel is not compared
    # where none is seen)
    ours = scaled_dot_product_attention(q, k, v, mask)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(ours, ref)


def test_no_mask_and_the_causal_mask_match_torch():
    q, k, v = torch.randn(3, 2, 4, 5, 8, dtype=torch.float64)
    torch.testing.assert_close(scaled_dot_product_attention(q, k, v),
                               F.scaled_dot_product_attention(q, k, v))
    torch.testing.assert_close(scaled_dot_product_attention(q, k, v, causal_mask(5, 5)),
                               F.scaled_dot_product_attention(q, k, v, is_causal=True))


def test_a_hidden_key_has_no_influence_and_a_query_that_sees_nothing_gets_zeros():
    q, k, v = torch.randn(3, 1, 4, 6, dtype=torch.float64)
    mask = torch.ones(4, 4, dtype=torch.bool)
    mask[:, 2] = False
    mask[3] = False
    out = scaled_dot_product_attention(q, k, v, mask)
    v2 = v.clone()
    v2[:, 2] += 100.0  # change what only the hidden key holds
    k2 = k.clone()
    k2[:, 2] -= 50.0
    torch.testing.assert_close(scaled_dot_product_attention(q, k2, v2, mask), out)
    assert torch.equal(out[:, 3], torch.zeros(1, 6, dtype=torch.float64))


def test_bad_arguments_are_clear_errors():
    q = torch.zeros(1, 2, 4)
    with pytest.raises(TypeError, match="mask must be a boolean"):
        scaled_dot_product_attention(q, q, q, torch.ones(2, 2))
    with pytest.raises(ValueError, match="must share d_k"):
        scaled_dot_product_attention(q, torch.zeros(1, 2, 3), q)
    with pytest.raises(TypeError, match="q must be a floating-point"):
        scaled_dot_product_attention(torch.zeros(2, 4, dtype=torch.long), q, q)
