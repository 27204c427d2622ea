"""Tests of tinygpt.wordvec: counting, PPMI, SVD, PCA, cosine similarity and search.

References: Python loops over hand-made inputs, math.log, numpy's SVD, torch.pca_lowrank,
torch.linalg.svd and torch.nn.functional.cosine_similarity.
"""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from tinygpt.wordvec import (
    WordVecConfig,
    WordVectors,
    build_vocab,
    cooccurrence,
    cosine_similarity,
    nearest_neighbours,
    pca,
    ppmi,
    train_word_vectors,
    truncated_svd,
    words_of,
)

FAST = settings(max_examples=40, deadline=None)


def test_words_of_drops_speakers_and_keeps_apostrophes():
    text = "KING HENRY:\nO'er the hills, 'tis Night!\n\nFIRST LORD:\nThe king's men: gone."
    assert words_of(text) == [
        "o'er",
        "the",
        "hills",
        "tis",
        "night",
        "the",
        "king's",
        "men",
        "gone",
    ]
    assert words_of(text, drop_speakers=False)[:3] == ["king", "henry", "o'er"]


def test_build_vocab_orders_by_count_then_alphabet():
    words = ["b", "a", "c", "b", "a", "d", "b"]
    assert build_vocab(words, 3) == ["b", "a", "c"]  # b: 3, a: 2, then c and d tie at 1 -> c
    assert build_vocab(words, 10) == ["b", "a", "c", "d"]


def cooccurrence_loop(ids, V, window):
    counts = [[0.0] * V for _ in range(V)]
    for i, w in enumerate(ids):
        for j in range(max(0, i - window), min(len(ids), i + window + 1)):
            if j != i and w >= 0 and ids[j] >= 0:
                counts[w][ids[j]] += 1
    return torch.tensor(counts)


@FAST
@given(ids=st.lists(st.integers(-1, 5), max_size=40), window=st.integers(1, 4))
def test_cooccurrence_matches_loop(ids, window):
    got = cooccurrence(torch.tensor(ids, dtype=torch.long), 6, window)
    assert torch.equal(got, cooccurrence_loop(ids, 6, window))


def test_cooccurrence_rejects_bad_ids():
    with pytest.raises(ValueError, match=r"\[-1, 2\]"):
        cooccurrence(torch.tensor([0, 3]), 3, 1)
    with pytest.raises(ValueError, match="1-D integer"):
        cooccurrence(torch.tensor([0.0, 1.0]), 3, 1)


@pytest.mark.parametrize("alpha", [1.0, 0.75])
def test_ppmi_by_hand(alpha):
    counts = [[0, 4, 1], [4, 2, 0], [1, 0, 6]]
    total = sum(map(sum, counts))
    rows = [sum(r) for r in counts]
    cols = [sum(counts[i][j] for i in range(3)) for j in range(3)]
    smoothed = sum(c**alpha for c in cols)
    expected = torch.zeros(3, 3)
    for w in range(3):
        for c in range(3):
            if counts[w][c]:
                pmi = math.log(
                    (counts[w][c] / total) / ((rows[w] / total) * (cols[c] ** alpha / smoothed))
                )
                expected[w, c] = max(pmi, 0.0)
    got = ppmi(torch.tensor(counts, dtype=torch.float32), alpha)
    assert torch.allclose(got, expected, atol=1e-6)
    assert (got > 0).sum() < (
        torch.tensor(counts) > 0
    ).sum()  # some associations are negative, cut to 0


def test_ppmi_handles_empty_rows():
    counts = torch.tensor([[0.0, 0.0], [0.0, 3.0]])
    assert torch.equal(ppmi(counts), torch.zeros(2, 2))  # log(1) = 0; empty row -> 0, never nan
    with pytest.raises(ValueError, match="non-negative"):
        ppmi(torch.tensor([[1.0, -1.0]]))


@FAST
@given(n=st.integers(1, 6), m=st.integers(1, 6), D=st.integers(1, 8), seed=st.integers(0, 999))
def test_cosine_similarity_matches_torch(n, m, D, seed):
    g = torch.Generator().manual_seed(seed)
    A, B = torch.randn(n, D, generator=g), torch.randn(m, D, generator=g)
    expected = F.cosine_similarity(A[:, None, :], B[None, :, :], dim=-1)
    assert torch.allclose(cosine_similarity(A, B), expected, atol=1e-6)
    assert torch.allclose(cosine_similarity(3.0 * A, B), expected, atol=1e-6)  # scale-free


def test_nearest_neighbours_on_a_hand_made_example():
    vectors = torch.tensor([[1.0, 0.0], [10.0, 1.0], [0.0, 1.0], [-1.0, 0.0], [2.0, 0.0]])
    order, sims = nearest_neighbours(vectors, torch.tensor([1.0, 0.0]), k=3, exclude=(0,))
    assert order.tolist() == [4, 1, 2]  # same direction, then nearly, then orthogonal
    assert torch.allclose(sims, torch.tensor([1.0, 10 / math.sqrt(101), 0.0]))
    order, _ = nearest_neighbours(vectors, torch.tensor([1.0, 0.0]), k=2)
    assert order.tolist() == [0, 4]  # a tie is ranked by the lower index


def test_pca_matches_numpy_and_torch_up_to_sign():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(30, 5, generator=g) @ torch.diag(torch.tensor([5.0, 3.0, 1.0, 0.5, 0.1])) + 2.0
    coords, components, explained = pca(X, 3)
    Xc = X.numpy() - X.numpy().mean(0)
    _, S, Vt = np.linalg.svd(Xc, full_matrices=False)
    for i in range(3):
        sign = np.sign(components[i].numpy() @ Vt[i])
        np.testing.assert_allclose(components[i].numpy(), sign * Vt[i], atol=1e-5)
        np.testing.assert_allclose(coords[:, i].numpy(), sign * (Xc @ Vt[i]), atol=1e-4)
    np.testing.assert_allclose(explained.numpy(), (S**2 / (S**2).sum())[:3], atol=1e-6)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)  # pca_lowrank draws random directions; q = D makes it exact
        _, _, V = torch.pca_lowrank(X, q=5, center=True, niter=4)
    assert torch.allclose((components @ V[:, :3]).abs(), torch.eye(3), atol=1e-4)
    with pytest.raises(ValueError, match="k"):
        pca(X, 6)


def test_truncated_svd_matches_exact_svd_and_is_seeded():
    g = torch.Generator().manual_seed(1)
    M = (
        torch.randn(60, 6, generator=g)
        @ torch.diag(torch.tensor([9.0, 7.0, 5.0, 3.0, 2.0, 1.0]))
        @ torch.randn(6, 40, generator=g)
    )
    state = torch.random.get_rng_state()
    U, S, Vh = truncated_svd(M, 4, seed=3)
    assert torch.equal(torch.random.get_rng_state(), state)  # global RNG untouched
    U2, _, _ = truncated_svd(M, 4, seed=3)
    assert torch.equal(U, U2)
    Ue, Se, Vhe = torch.linalg.svd(M, full_matrices=False)
    assert torch.allclose(S, Se[:4], rtol=1e-4)
    signs = torch.sign((U * Ue[:, :4]).sum(0))
    assert torch.allclose(U, Ue[:, :4] * signs, atol=1e-4)
    assert torch.allclose(Vh, Vhe[:4] * signs[:, None], atol=1e-4)
    assert (U.abs().argmax(0) == U.argmax(0)).all()  # sign convention: largest entry positive


def test_word_vectors_lookup_and_errors():
    wv = WordVectors(["a", "b", "c"], torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0]]))
    assert "b" in wv and "z" not in wv
    assert [w for w, _ in wv.most_similar("a", 2)] == ["b", "c"]
    with pytest.raises(ValueError, match="'z' is not among the 3 words"):
        wv.most_similar("z")
    with pytest.raises(ValueError, match="need vectors of shape"):
        WordVectors(["a"], torch.zeros(2, 2))


def test_train_word_vectors_finds_words_used_alike():
    lines = []
    for animal in ("cat", "dog"):
        for food in ("fish", "meat", "milk"):
            lines.append(f"the {animal} eats {food} slowly")
    for vehicle in ("car", "truck"):
        for road in ("road", "street", "lane"):
            lines.append(f"a {vehicle} drives down the {road} fast")
    text = "\n".join(lines * 5)
    wv = train_word_vectors(text, WordVecConfig(vocab_size=50, window=2, dim=4, oversample=10))
    assert wv.most_similar("cat", 1)[0][0] == "dog"
    assert wv.most_similar("car", 1)[0][0] == "truck"
    assert wv.vectors.shape == (len(wv.words), 4)


@pytest.mark.parametrize(
    "kwargs", [{"dim": 0}, {"window": 1.5}, {"alpha": 0.0}, {"vocab_size": 3, "dim": 4}]
)
def test_config_validation(kwargs):
    with pytest.raises(ValueError):
        WordVecConfig(**kwargs)
