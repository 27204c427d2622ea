"""Tests for tinygpt.ngram: n-gram counting models against loops, the bigram model and by hand."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
import torch
from conftest import corpora
from conftest import random_ids as _random_ids
from hypothesis import given, settings
from hypothesis import strategies as st

from tinygpt.bigram import bigram_counts, bigram_loss, bigram_probs, sample_bigram
from tinygpt.ngram import NGramModel


@settings(max_examples=40, deadline=None)
@given(corpora(min_len=3), st.floats(0.05, 2.0))
def test_ngram_with_n_2_is_the_bigram_model(corpus, k) -> None:
    ids, V = corpus
    half = len(ids) // 2 + 1
    train, val = ids[:half], ids[half - 2 :]
    probs = bigram_probs(bigram_counts(train, V), smoothing=k)
    model = NGramModel(2, V, smoothing=k).fit(train)
    assert model.loss(val) == pytest.approx(bigram_loss(probs, val), rel=1e-12)
    for token in range(V):
        torch.testing.assert_close(model.probs([token]), probs[token])
    g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    assert model.sample([ids[0]], 30, g1) == sample_bigram(probs, ids[0], 30, g2)


@settings(max_examples=40, deadline=None)
@given(corpora(min_len=1), st.floats(0.0, 2.0))
def test_ngram_with_n_1_is_the_unigram_model(corpus, k) -> None:
    ids, V = corpus
    counts = np.bincount(ids, minlength=V)
    p = (counts + k) / (len(ids) + k * V)
    model = NGramModel(1, V, smoothing=k).fit(ids)
    assert model.loss(ids) == pytest.approx(float(-np.log(p[ids]).mean()), rel=1e-12)
    assert model.unseen_fraction(ids) == 0.0


def test_trigram_probabilities_by_hand() -> None:
    # "abcabd" over a=0, b=1, c=2, d=3: the context "ab" is followed once by c, once by d
    ids = [0, 1, 2, 0, 1, 3]
    raw = NGramModel(3, 4, smoothing=0.0).fit(ids)
    assert (raw.num_contexts, raw.num_ngrams) == (3, 4)  # ab, bc, ca / abc, bca, cab, abd
    torch.testing.assert_close(raw.probs([0, 1]), torch.tensor([0, 0, 0.5, 0.5]).double())
    torch.testing.assert_close(raw.probs([3, 1, 2]), torch.tensor([1.0, 0, 0, 0]).double())
    assert raw.probs([3, 3]).sum() == 0  # never seen, not smoothed
    add_one = NGramModel(3, 4, smoothing=1.0).fit(ids)
    torch.testing.assert_close(add_one.probs([0, 1]), torch.tensor([1, 1, 2, 2]).double() / 6)
    torch.testing.assert_close(add_one.probs([3, 3]), torch.full((4,), 0.25).double())
    # loss of "cabd": P(b|ca) = 2/5, P(d|ab) = 2/6
    assert add_one.loss([2, 0, 1, 3]) == pytest.approx(-(math.log(2 / 5) + math.log(2 / 6)) / 2)
    assert raw.loss([2, 0, 1, 3]) == pytest.approx(-(math.log(1) + math.log(0.5)) / 2)
    assert raw.loss([3, 3, 0]) == math.inf
    assert add_one.unseen_fraction([0, 1, 2, 3, 3, 0]) == 0.5  # ab, bc seen; cd, dd not


def test_ngram_codes_match_a_counter_of_tuples() -> None:
    ids, V = _random_ids(3_000, 5, seed=6), 5
    for n in (1, 3, 5):
        model = NGramModel(n, V, smoothing=0.5).fit(ids)
        grams = Counter(tuple(ids[i : i + n]) for i in range(len(ids) - n + 1))
        contexts = Counter(tuple(ids[i : i + n - 1]) for i in range(len(ids) - n + 1))
        assert (model.num_ngrams, model.num_contexts) == (len(grams), len(contexts))
        context = ids[-(n - 1) :] if n > 1 else []
        expected = [(grams[(*context, x)] + 0.5) / (contexts[tuple(context)] + 0.5 * V)
                    for x in range(V)]
        torch.testing.assert_close(model.probs(context), torch.tensor(expected).double())


@settings(max_examples=40, deadline=None)
@given(corpora(min_len=6), st.integers(1, 5), st.sampled_from([0.0, 0.01, 1.0]))
def test_training_loss_is_the_loss_on_the_fitted_ids(corpus, n, k) -> None:
    ids, V = corpus
    model = NGramModel(n, V, smoothing=k).fit(ids)
    assert model.training_loss() == pytest.approx(model.loss(ids), rel=1e-12)


def test_smoothing_can_change_after_fitting_but_stays_valid() -> None:
    ids = _random_ids(500, 6, seed=9)
    model = NGramModel(3, 6, smoothing=1.0).fit(ids)
    model.smoothing = 0.1
    assert model.loss(ids) == NGramModel(3, 6, smoothing=0.1).fit(ids).loss(ids)
    with pytest.raises(ValueError, match=r"smoothing must be in \[0"):
        model.smoothing = -0.5
    assert model.smoothing == 0.1


def test_ngram_train_loss_falls_with_n() -> None:
    ids = _random_ids(2_000, 4, seed=8)
    losses = [NGramModel(n, 4, smoothing=0.01).fit(ids).loss(ids[10:]) for n in (1, 3, 6, 9)]
    assert losses == sorted(losses, reverse=True)


def test_ngram_bad_input() -> None:
    with pytest.raises(ValueError, match="n must be"):
        NGramModel(0, 5)
    with pytest.raises(ValueError, match="int64"):
        NGramModel(12, 65)
    with pytest.raises(RuntimeError, match="fit"):
        NGramModel(2, 5).loss([0, 1, 2])
    model = NGramModel(3, 5).fit([0, 1, 2, 3])
    with pytest.raises(ValueError, match="at least 3"):
        model.loss([0, 1])
    with pytest.raises(ValueError, match="at least 2"):
        model.sample([0], 5, torch.Generator())
    with pytest.raises(ValueError, match="unknown token id 5"):
        model.fit([0, 1, 5])
    with pytest.raises(ValueError, match="nothing to sample"):
        NGramModel(2, 3, smoothing=0).fit([0, 1]).sample([2], 1, torch.Generator())


@pytest.mark.parametrize("k", [0.0, 0.5])
def test_sample_chains_draws_from_the_model_probabilities(k) -> None:
    """Many chains side by side: the first id after a context, and the second after the first,
    have the frequencies ``probs`` gives (within 5 standard errors of the counts)."""
    model = NGramModel(3, 5, smoothing=k).fit([0, 1, 2, 3, 0, 1, 2, 0, 1, 4, 4, 0, 1, 2, 2, 0])
    chains = 200_000
    prompts = np.tile([[3, 0, 1]], (chains, 1))  # the last n - 1 = 2 ids count: (0, 1)
    out = model.sample_chains(prompts, 2, np.random.default_rng(0))
    assert out.shape == (chains, 2) and out.dtype == np.int64

    def assert_frequencies(ids, p) -> None:
        observed = np.bincount(ids, minlength=5) / len(ids)
        error = np.sqrt(p * (1 - p) / len(ids))
        assert np.all(np.abs(observed - p) <= 5 * error + 1e-12), (observed, p)

    assert_frequencies(out[:, 0], model.probs([0, 1]).numpy())
    for first in range(5):  # the second id, among the chains whose first id was `first`
        rows = out[:, 0] == first
        if rows.sum() > 1000:
            assert_frequencies(out[rows, 1], model.probs([1, first]).numpy())


def test_sample_chains_after_an_unseen_context_is_uniform_then_follows_the_counts() -> None:
    model = NGramModel(2, 4, smoothing=1.0).fit([0, 1, 0, 1, 0, 2])  # 3 is never a context
    out = model.sample_chains(np.full((100_000, 1), 3), 1, np.random.default_rng(1))
    observed = np.bincount(out[:, 0], minlength=4) / len(out)
    np.testing.assert_allclose(observed, model.probs([3]).numpy(), atol=0.01)
    assert np.allclose(model.probs([3]).numpy(), 0.25)


def test_sample_chains_is_deterministic_and_n_1_is_the_unigram_model() -> None:
    circle = [0, 1, 2, 3, 4, 5, 0, 1, 2, 0, 1, 2, 3, 0, 0, 1, 2]  # it ends as it starts
    model = NGramModel(4, 6, smoothing=0.0).fit(circle)
    prompts = [[0, 1, 2], [1, 2, 3], [2, 3, 0]]
    first = model.sample_chains(prompts, 50, np.random.default_rng(7))
    assert np.array_equal(first, model.sample_chains(prompts, 50, np.random.default_rng(7)))
    assert not np.array_equal(first, model.sample_chains(prompts, 50, np.random.default_rng(8)))
    # every 4-gram of a chain (prompt included) was seen in training: smoothing 0
    seen = {tuple(g) for g in np.lib.stride_tricks.sliding_window_view(circle, 4)}
    for row, prompt in zip(first, prompts, strict=True):
        chain = [*prompt, *row]
        assert all(tuple(chain[i : i + 4]) in seen for i in range(len(chain) - 3))
    unigram = NGramModel(1, 3, smoothing=0.0).fit([0, 0, 0, 2])
    out = unigram.sample_chains(np.zeros((50_000, 0), dtype=np.int64), 2, np.random.default_rng(0))
    np.testing.assert_allclose(np.bincount(out.ravel(), minlength=3) / out.size, [0.75, 0, 0.25],
                               atol=0.01)


def test_sample_chains_bad_input() -> None:
    model = NGramModel(3, 5, smoothing=0.0).fit([0, 1, 2, 3])
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="nothing to sample"):
        model.sample_chains([[2, 3]], 1, rng)  # (2, 3) is the last context: nothing after it
    with pytest.raises(ValueError, match="at least n - 1 = 2"):
        model.sample_chains([[0]], 1, rng)
    with pytest.raises(ValueError, match=r"\(B, n - 1\)"):
        model.sample_chains([0, 1], 1, rng)
    with pytest.raises(ValueError, match="unknown token id 7"):
        model.sample_chains([[0, 7]], 1, rng)
    with pytest.raises(TypeError, match=r"numpy\.random\.Generator"):
        model.sample_chains([[0, 1]], 1, torch.Generator())
    with pytest.raises(RuntimeError, match="fit"):
        NGramModel(2, 5).sample_chains([[0]], 1, rng)
    assert model.sample_chains([[0, 1]], 0, rng).shape == (1, 0)
