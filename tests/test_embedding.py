"""Tests of tinygpt.embedding: token lookup, positional tables, shapes and errors.

References: a one-hot vector times the table (the definition of a lookup), the sinusoid formula
evaluated with numpy in plain loops, and torch's own modules.
"""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from tinygpt.checks import check_token_ids
from tinygpt.embedding import Embeddings, sinusoidal_positions

FAST = settings(max_examples=40, deadline=None)


@FAST
@given(
    V=st.integers(1, 50),
    C=st.integers(1, 16),
    B=st.integers(1, 3),
    T=st.integers(1, 8),
    seed=st.integers(0, 99),
)
def test_lookup_is_one_hot_times_table(V, C, B, T, seed):
    g = torch.Generator().manual_seed(seed)
    emb = Embeddings(V, C, block_size=8)
    idx = torch.randint(0, V, (B, T), generator=g)
    one_hot = F.one_hot(idx, V).float()  # (B, T, V)
    assert torch.equal(emb.wte(idx), one_hot @ emb.wte.weight)


def test_gradient_touches_only_used_rows():
    torch.manual_seed(0)
    emb = Embeddings(20, 6, block_size=5)
    idx = torch.tensor([[3, 7, 3, 11, 0], [7, 7, 19, 3, 3]])
    (emb(idx) ** 2).sum().backward()
    nonzero_rows = set(emb.wte.weight.grad.abs().sum(1).nonzero().flatten().tolist())
    assert nonzero_rows == set(idx.flatten().tolist())
    # a row used several times gets the sum of the gradients of each use
    x = emb.wte.weight[idx] + emb.wpe.weight[:5]
    expected = torch.zeros(20, 6).index_add_(0, idx.flatten(), (2 * x).reshape(-1, 6).detach())
    assert torch.allclose(emb.wte.weight.grad, expected)


def sinusoids_loop(T, C, base=10000.0):
    pe = np.zeros((T, C))
    for t in range(T):
        for i in range(C // 2):
            angle = t / base ** (2 * i / C)
            pe[t, 2 * i] = math.sin(angle)
            pe[t, 2 * i + 1] = math.cos(angle)
    return pe


@pytest.mark.parametrize("T,C", [(1, 2), (7, 4), (50, 16), (128, 64)])
def test_sinusoids_match_the_formula(T, C):
    pe = sinusoidal_positions(T, C)
    assert pe.shape == (T, C) and pe.dtype == torch.float32
    np.testing.assert_allclose(pe.numpy(), sinusoids_loop(T, C), atol=1e-6)


@FAST
@given(half=st.integers(1, 32), t=st.integers(0, 200), s=st.integers(0, 200), k=st.integers(0, 100))
def test_sinusoid_dot_product_depends_only_on_offset(half, t, s, k):
    C = 2 * half
    pe = sinusoidal_positions(301, C).double()
    assert pe.abs().max() <= 1.0
    # PE[t] . PE[t+k] = sum_i cos(k w_i), whatever t is
    assert torch.allclose(pe[t] @ pe[t + k], pe[s] @ pe[s + k], atol=1e-4)
    w = 10000.0 ** (-torch.arange(0, C, 2, dtype=torch.float64) / C)
    assert math.isclose(float(pe[t] @ pe[t + k]), float(torch.cos(k * w).sum()), abs_tol=1e-4)


@pytest.mark.parametrize("args", [(4, 3), (0, 4), (4, 0), (4, -2)])
def test_sinusoid_bad_sizes(args):
    with pytest.raises(ValueError, match=r"T|C"):
        sinusoidal_positions(*args)
    with pytest.raises(TypeError, match="T must be a positive integer"):
        sinusoidal_positions(2.0, 4)


@pytest.mark.parametrize("positional", ["learned", "sinusoidal"])
def test_forward_shapes_and_values(positional):
    torch.manual_seed(0)
    V, C, T_max = 13, 8, 10
    emb = Embeddings(V, C, T_max, positional=positional)
    idx = torch.randint(0, V, (3, 6))
    out = emb(idx)
    assert out.shape == (3, 6, C)
    table = emb.wpe.weight if positional == "learned" else sinusoidal_positions(T_max, C)
    for b in range(3):
        for t in range(6):
            assert torch.allclose(out[b, t], emb.wte.weight[idx[b, t]] + table[t])
    assert emb(idx.int()).shape == (3, 6, C)  # int32 ids are accepted too
    assert emb(torch.zeros(2, 0, dtype=torch.long)).shape == (2, 0, C)


def test_parameter_count_and_state_dict():
    V, C, T_max = 50, 12, 9
    learned = Embeddings(V, C, T_max)
    sinus = Embeddings(V, C, T_max, positional="sinusoidal")
    assert sum(p.numel() for p in learned.parameters()) == V * C + T_max * C
    assert sum(p.numel() for p in sinus.parameters()) == V * C  # positions are not trained
    assert set(learned.state_dict()) == {"wte.weight", "wpe.weight"}
    assert set(sinus.state_dict()) == {"wte.weight"}


def test_from_config_reads_the_gpt_sizes():
    config = SimpleNamespace(vocab_size=11, n_embd=6, block_size=7, n_layer=2)
    emb = Embeddings.from_config(config, positional="sinusoidal")
    assert (emb.vocab_size, emb.n_embd, emb.block_size) == (11, 6, 7)
    assert emb.positional == "sinusoidal" and emb.pe.shape == (7, 6)


def test_sinusoidal_positions_are_not_trained():
    emb = Embeddings(5, 4, 6, positional="sinusoidal")
    emb(torch.tensor([[1, 2, 3]])).sum().backward()
    assert emb.wpe is None and not emb.pe.requires_grad
    assert torch.equal(emb.positions(3), sinusoidal_positions(6, 4)[:3])


@pytest.mark.parametrize(
    "idx,match",
    [
        (torch.tensor([[1, 2, 10]]), r"token id 10 at position \(b=0, t=2\).*\[0, 9\].*V=10"),
        (torch.tensor([[1, -1], [0, 0]]), r"token id -1 at position \(b=0, t=1\).*V=10"),
        (torch.tensor([[3, 4], [5, 99]]), r"token id 99 at position \(b=1, t=1\)"),
        (torch.zeros(1, 5, dtype=torch.long), r"T=5 exceeds the context length T_max=4"),
        (torch.tensor([1, 2, 3]), r"shape \(B, T\), got shape \(3,\).*idx\[None\]"),
        (torch.zeros(1, 2, 3, dtype=torch.long), r"shape \(B, T\), got shape \(1, 2, 3\)"),
    ],
)
def test_clear_value_errors(idx, match):
    emb = Embeddings(10, 4, block_size=4)
    with pytest.raises(ValueError, match=match):
        emb(idx)


@pytest.mark.parametrize("idx", [torch.zeros(1, 2), torch.zeros(1, 2, dtype=torch.bool), [[1, 2]]])
def test_type_errors(idx):
    with pytest.raises(TypeError, match="token ids must be"):
        Embeddings(10, 4, block_size=4)(idx)


def test_check_token_ids_without_block_size_and_bad_config():
    check_token_ids(torch.zeros(1, 1000, dtype=torch.long), vocab_size=1)  # no length limit
    with pytest.raises(ValueError, match="positional must be"):
        Embeddings(10, 4, 4, positional="rotary")
    with pytest.raises(ValueError, match="vocab_size"):
        Embeddings(0, 4, 4)
    with pytest.raises(ValueError, match=r"T must be an integer in \[0, 4\]"):
        Embeddings(10, 4, 4).positions(5)
