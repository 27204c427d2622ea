"""Tests for tinygpt.bigram: counts, smoothing, losses, sampling, BigramNet and n-gram models."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import corpora
from conftest import random_ids as _random_ids
from hypothesis import given, settings
from hypothesis import strategies as st

from tinygpt.bigram import (
    BigramNet,
    BigramNetConfig,
    bigram_counts,
    bigram_loss,
    bigram_probs,
    perplexity,
    sample_bigram,
    train_bigram_net,
)

# --- Counting -------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(corpora(min_len=2))
def test_counts_equal_a_python_loop(corpus) -> None:
    ids, V = corpus
    expected = [[0] * V for _ in range(V)]
    for a, b in itertools.pairwise(ids):
        expected[a][b] += 1
    counts = bigram_counts(ids, V)
    assert counts.dtype == torch.int64 and counts.shape == (V, V)
    assert counts.tolist() == expected
    # the same from a tensor and from a numpy array
    assert torch.equal(bigram_counts(torch.tensor(ids), V), counts)
    assert torch.equal(bigram_counts(np.array(ids, dtype=np.int32), V), counts)


@settings(max_examples=60, deadline=None)
@given(corpora(min_len=2), st.floats(0.01, 5.0))
def test_smoothed_rows_are_positive_distributions(corpus, k) -> None:
    ids, V = corpus
    probs = bigram_probs(bigram_counts(ids, V), smoothing=k)
    assert (probs > 0).all()
    torch.testing.assert_close(probs.sum(dim=1), torch.ones(V, dtype=torch.float64))


def test_unsmoothed_probabilities_are_relative_frequencies() -> None:
    counts = torch.tensor([[0, 3, 1], [2, 2, 0], [0, 0, 0]])
    probs = bigram_probs(counts, smoothing=0.0)
    expected = torch.tensor([[0, 0.75, 0.25], [0.5, 0.5, 0], [0, 0, 0]], dtype=torch.float64)
    torch.testing.assert_close(probs, expected)  # a row never seen has nothing to say
    # add-one by hand: row 0 is (0+1, 3+1, 1+1) / (4 + 3)
    torch.testing.assert_close(bigram_probs(counts)[0], torch.tensor([1, 4, 2]) / 7.0,
                               check_dtype=False)


def test_zero_count_means_infinite_loss_unless_smoothed() -> None:
    train, val = [0, 1, 0, 1, 0], [1, 1]  # the pair (1, 1) never occurs in training
    counts = bigram_counts(train, 2)
    assert bigram_loss(bigram_probs(counts, smoothing=0.0), val) == math.inf
    assert math.isfinite(bigram_loss(bigram_probs(counts, smoothing=1.0), val))


@settings(max_examples=40, deadline=None)
@given(corpora(min_len=2), st.floats(0.1, 3.0))
def test_loss_matches_torch_cross_entropy(corpus, k) -> None:
    ids, V = corpus
    probs = bigram_probs(bigram_counts(ids, V), smoothing=k)
    a = torch.tensor(ids)
    reference = F.cross_entropy(probs.log()[a[:-1]], a[1:])  # log-probabilities as logits
    assert bigram_loss(probs, ids) == pytest.approx(float(reference), rel=1e-12, abs=1e-12)
    assert perplexity(bigram_loss(probs, ids)) == pytest.approx(math.exp(float(reference)))


def test_uniform_model_has_loss_ln_v_and_perplexity_v() -> None:
    V = 7
    uniform = torch.full((V, V), 1 / V, dtype=torch.float64)
    loss = bigram_loss(uniform, _random_ids(100, V, seed=0))
    assert loss == pytest.approx(math.log(V))
    assert perplexity(loss) == pytest.approx(V)


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: bigram_counts([0, 1, 5], 3), ValueError, "unknown token id 5"),
        (lambda: bigram_counts([0, -1], 3), ValueError, "unknown token id -1"),
        (lambda: bigram_counts([0], 3), ValueError, "at least 2"),
        (lambda: bigram_counts([[0, 1]], 3), ValueError, "1-D"),
        (lambda: bigram_counts([0.5, 1.0], 3), TypeError, "integers"),
        (lambda: bigram_counts("abc", 3), TypeError, "tokenizer"),
        (lambda: bigram_counts([0, 1], 0), ValueError, "vocab_size"),
        (lambda: bigram_probs(torch.zeros(2, 3)), ValueError, r"square \(V, V\)"),
        (lambda: bigram_probs(-torch.ones(2, 2)), ValueError, "non-negative"),
        (lambda: bigram_probs(torch.ones(2, 2), smoothing=-1), ValueError,
         r"smoothing must be in \[0"),
        (lambda: bigram_probs(torch.ones(2, 2), smoothing="1"), TypeError, "number"),
        (lambda: bigram_loss(torch.ones(2, 2) / 2, [0, 2]), ValueError, "valid ids are 0..1"),
    ],
)
def test_bad_input_gets_a_clear_error(call, error, message) -> None:
    with pytest.raises(error, match=message):
        call()


# --- Sampling ---------------------------------------------------------------------------------


def test_sampling_is_reproducible_and_valid() -> None:
    V = 6
    counts = bigram_counts(_random_ids(500, V, seed=1), V)
    counts[:, 4] = 0  # token 4 can never be produced by the unsmoothed model
    probs = bigram_probs(counts, smoothing=0.0)
    def draw(seed: int) -> list[int]:
        return sample_bigram(probs, 0, 400, torch.Generator().manual_seed(seed))

    first = draw(123)
    assert first == draw(123)
    assert first != draw(124)
    assert len(first) == 400 and set(first) <= set(range(V)) - {4}


def test_sampling_follows_the_probabilities() -> None:
    probs = torch.tensor([[0.1, 0.9], [0.7, 0.3]], dtype=torch.float64)
    out = sample_bigram(probs, 0, 20_000, torch.Generator().manual_seed(0))
    pairs = Counter(zip([0] + out[:-1], out))
    assert pairs[(0, 1)] / (pairs[(0, 0)] + pairs[(0, 1)]) == pytest.approx(0.9, abs=0.015)
    assert pairs[(1, 0)] / (pairs[(1, 0)] + pairs[(1, 1)]) == pytest.approx(0.7, abs=0.015)


def test_sampling_rejects_a_dead_end() -> None:
    probs = bigram_probs(torch.tensor([[0, 1], [0, 0]]), smoothing=0.0)
    with pytest.raises(ValueError, match="no continuation"):
        sample_bigram(probs, 0, 5, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="num_tokens"):
        sample_bigram(probs, 0, -1, torch.Generator())


# --- BigramNet ------------------------------------------------------------------------------


def test_count_loss_equals_the_loss_over_every_position() -> None:
    V = 9
    ids = torch.tensor(_random_ids(2_000, V, seed=2))
    net = BigramNet(V)
    with torch.no_grad():
        net.wte.weight.normal_(generator=torch.Generator().manual_seed(0))
    logits, loss = net(ids[:-1].view(1, -1), ids[1:].view(1, -1))
    assert logits.shape == (1, len(ids) - 1, V)
    torch.testing.assert_close(net.count_loss(bigram_counts(ids, V)), loss)
    assert net(ids.view(4, -1))[1] is None


def test_trained_net_reaches_the_counting_loss() -> None:
    V = 10
    train, val = _random_ids(3_000, V, seed=3), _random_ids(500, V, seed=4)
    counts, val_counts = bigram_counts(train, V), bigram_counts(val, V)
    config = BigramNetConfig(steps=300, lr=0.5)
    _, history = train_bigram_net(counts, config, val_counts=val_counts)
    assert len(history["train"]) == len(history["val"]) == 301
    assert history["train"][0] == pytest.approx(math.log(V))  # starts uniform
    best = bigram_loss(bigram_probs(counts, smoothing=0.0), train)  # the optimum
    assert best <= history["train"][-1] < best + 1e-3
    # with k pseudo-counts in the objective it converges to the add-k probabilities
    smoothed, _ = train_bigram_net(counts, BigramNetConfig(steps=300, lr=0.5, smoothing=2.0))
    torch.testing.assert_close(smoothed.probs().double(), bigram_probs(counts, 2.0), atol=2e-4,
                               rtol=0)


def test_plain_gradient_descent_decreases_the_loss() -> None:
    counts = torch.tensor([[50, 5, 1], [2, 30, 9], [20, 0, 3]])
    _, history = train_bigram_net(counts, BigramNetConfig(steps=50, lr=1.0, optimizer="sgd"))
    assert all(b <= a + 1e-7 for a, b in zip(history["train"], history["train"][1:]))
    assert history["train"][-1] < history["train"][0] - 0.01


def test_bigram_net_bad_input() -> None:
    net = BigramNet(4)
    with pytest.raises(ValueError, match=r"\(B, T\) int64"):
        net(torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="unknown token id 4"):
        net(torch.tensor([[0, 4]]))
    with pytest.raises(ValueError, match="differ"):
        net(torch.zeros(2, 3, dtype=torch.long), torch.zeros(3, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="vocab_size 4"):
        net.count_loss(torch.ones(5, 5))
    with pytest.raises(ValueError, match="optimizer"):
        train_bigram_net(torch.ones(4, 4), BigramNetConfig(optimizer="sgdd"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="steps"):
        train_bigram_net(torch.ones(4, 4), BigramNetConfig(steps=-1))
