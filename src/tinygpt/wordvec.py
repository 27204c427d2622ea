"""Word vectors from co-occurrence counts, and searching them by cosine similarity.

Chapter 4's word vectors.

It handles the classic count-based recipe, small enough to run in seconds on a CPU:

1. ``words_of(text)``: lower-cased words, without the corpus's ``SPEAKER:`` lines;
2. ``build_vocab``: the most frequent words;
3. ``cooccurrence``: how often word ``c`` appears within ``window`` words of word ``w``;
4. ``ppmi``: positive pointwise mutual information, which turns raw counts into association
   strength (with the context-distribution smoothing ``alpha``);
5. ``truncated_svd``: a seeded low-rank factorisation; the rows of ``U * S**power`` are the
   word vectors.

``train_word_vectors`` runs all five; ``WordVectors.most_similar`` ranks words by
``cosine_similarity``; ``pca`` projects vectors to 2-D for plots.

It does not train neural word vectors (skip-gram, CBOW), handle subwords or out-of-vocabulary
words, or solve analogies. Signs of SVD and PCA components are fixed (the largest entry of each
left singular vector is positive), so results do not depend on the signs LAPACK happens to return.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import Tensor

_SPEAKER_LINE = re.compile(r"^[^a-z\n]+:$", re.MULTILINE)  # "KING HENRY:" on a line of its own
_WORD = re.compile(r"[a-z]+(?:'[a-z]+)*")  # letters, with inner apostrophes: "o'er", "'tis" -> tis


@dataclass(frozen=True)
class WordVecConfig:
    """How to build word vectors: vocabulary, context window, PPMI smoothing and SVD."""

    vocab_size: int = 5000  # keep this many of the most frequent words
    window: int = 2  # contexts are the words 1..window positions to the left and right
    dim: int = 100  # length of each word vector
    alpha: float = 0.75  # context-distribution smoothing of PPMI (1.0 = plain PPMI)
    power: float = 0.5  # vectors are U * S**power (0: ignore the singular values, 1: full weight)
    seed: int = 0  # seeds the random projections of the truncated SVD
    niter: int = 20  # subspace iterations of the randomised SVD (more = more accurate)
    oversample: int = 100  # extra random directions, dropped at the end (more = more accurate)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "window", "dim"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.dim > self.vocab_size:
            raise ValueError(f"dim={self.dim} cannot exceed vocab_size={self.vocab_size}")
        if not 0 < self.alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {self.alpha!r}")


def words_of(text: str, drop_speakers: bool = True) -> list[str]:
    """The words of ``text``, lower-cased, in order; speaker lines (``HAMLET:``) removed."""
    if drop_speakers:
        text = _SPEAKER_LINE.sub("", text)
    return _WORD.findall(text.lower())


def build_vocab(words: list[str], size: int) -> list[str]:
    """The ``size`` most frequent words, most frequent first (ties in alphabetical order)."""
    counts = Counter(words)
    return [w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:size]]


def cooccurrence(ids: Tensor, vocab_size: int, window: int) -> Tensor:
    """Counts ``(V, V)``: entry ``[w, c]`` = how often ``c`` occurs 1..``window`` words from ``w``.

    ``ids`` is a 1-D integer tensor of word ids; ``-1`` marks a word outside the vocabulary,
    which keeps its place (distances are counted in the text) but is never counted. The result is
    symmetric: a pair at distance ``k`` counts once as (left, right) and once as (right, left).
    """
    if ids.ndim != 1 or ids.dtype not in (torch.int64, torch.int32):
        raise ValueError(
            f"ids must be a 1-D integer tensor, got {ids.dtype} of shape {tuple(ids.shape)}"
        )
    if ids.numel() and (int(ids.min()) < -1 or int(ids.max()) >= vocab_size):
        raise ValueError(
            f"ids must be in [-1, {vocab_size - 1}], got [{int(ids.min())}, {int(ids.max())}]"
        )
    ids = ids.long()
    counts = torch.zeros(vocab_size * vocab_size)  # (V*V,) flat, float32
    for k in range(1, window + 1):
        left, right = ids[:-k], ids[k:]  # every pair at distance k
        keep = (left >= 0) & (right >= 0)
        flat = left[keep] * vocab_size + right[keep]
        counts.index_add_(0, flat, torch.ones(flat.numel()))
    counts = counts.view(vocab_size, vocab_size)  # (V, V)
    return counts + counts.T  # (V, V)


def ppmi(counts: Tensor, alpha: float = 0.75) -> Tensor:
    """Positive PMI of a ``(V, V)`` count matrix: ``max(0, log P(w, c) / (P(w) P_alpha(c)))``.

    ``P(w, c) = counts[w, c] / N`` with ``N`` the total count, ``P(w)`` the row sums over ``N``,
    and ``P_alpha(c) = n_c**alpha / sum(n_c'**alpha)`` with ``n_c`` the column sums. ``alpha < 1``
    raises the probability of rare contexts, which tempers PMI's bias towards them. Entries with a
    zero count are 0.
    """
    if counts.ndim != 2 or (counts < 0).any():
        raise ValueError("counts must be a 2-D tensor of non-negative counts")
    counts = counts.float()
    total = counts.sum()
    n_c = counts.sum(0) ** alpha  # (V,)
    log_p_w = torch.log(counts.sum(1) / total)  # (V,)
    log_p_c = torch.log(n_c / n_c.sum())  # (V,)
    out = torch.log(counts / total)  # (V, V), -inf where the count is 0
    out.sub_(log_p_w[:, None]).sub_(log_p_c[None, :]).clamp_(min=0.0)
    out[counts == 0] = 0.0  # also clears the nan of an all-zero row or column
    return out  # (V, V)


def _fix_signs(U: Tensor, Vh: Tensor) -> tuple[Tensor, Tensor]:
    """Flip each component so the largest-magnitude entry of its column of ``U`` is positive."""
    rows = U.abs().argmax(dim=0)  # (k,)
    signs = torch.sign(U[rows, torch.arange(U.shape[1])])  # (k,)
    signs[signs == 0] = 1
    return U * signs, Vh * signs[:, None]


def truncated_svd(
    M: Tensor, k: int, seed: int = 0, niter: int = 20, oversample: int = 100
) -> tuple[Tensor, Tensor, Tensor]:
    """The top ``k`` singular triplets of ``M`` (n, m): ``U (n, k)``, ``S (k,)``, ``Vh (k, m)``.

    Uses ``torch.svd_lowrank`` (a randomised method) with its random draws seeded by ``seed`` and
    the global random state left untouched; ``oversample`` extra directions and ``niter`` power
    iterations make the top ``k`` accurate. Signs are fixed as described in the module docstring.
    """
    q = min(k + oversample, *M.shape)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        U, S, V = torch.svd_lowrank(M, q=q, niter=niter)
    U, Vh = _fix_signs(U[:, :k], V[:, :k].T)
    return U, S[:k], Vh


class PCAResult(NamedTuple):
    coords: Tensor  # (n, k): the points in the new axes
    components: Tensor  # (k, D): the axes, unit vectors
    explained: Tensor  # (k,): fraction of the total variance along each axis


def pca(X: Tensor, k: int = 2) -> PCAResult:
    """Principal component analysis of the rows of ``X`` (n, D), by an exact SVD of the centred
    data: the top ``k`` coordinates, axes, and fractions of variance explained."""
    if X.ndim != 2 or not 1 <= k <= min(X.shape):
        raise ValueError(f"need a 2-D X and 1 <= k <= min(n, D); got shape {tuple(X.shape)}, k={k}")
    Xc = X - X.mean(dim=0)  # (n, D)
    U, S, Vh = torch.linalg.svd(Xc, full_matrices=False)
    U, Vh = _fix_signs(U, Vh)
    var = S**2
    return PCAResult(Xc @ Vh[:k].T, Vh[:k], var[:k] / var.sum())


def cosine_similarity(A: Tensor, B: Tensor, eps: float = 1e-8) -> Tensor:
    """All cosine similarities between the rows of ``A`` (n, D) and of ``B`` (m, D): ``(n, m)``."""
    if A.ndim != 2 or B.ndim != 2 or A.shape[1] != B.shape[1]:
        raise ValueError(
            f"need (n, D) and (m, D) tensors, got {tuple(A.shape)} and {tuple(B.shape)}"
        )
    A = A / A.norm(dim=1, keepdim=True).clamp(min=eps)  # (n, D), unit rows
    B = B / B.norm(dim=1, keepdim=True).clamp(min=eps)  # (m, D), unit rows
    return A @ B.T  # (n, m)


def nearest_neighbours(
    vectors: Tensor, query: Tensor, k: int, exclude: tuple[int, ...] = ()
) -> tuple[Tensor, Tensor]:
    """The ``k`` rows of ``vectors`` (N, D) most cosine-similar to ``query`` (D,).

    Returns ``(indices, similarities)``, best first; rows in ``exclude`` are skipped, and equal
    similarities are ranked by the lower row index (a stable sort), so the answer is deterministic.
    """
    sims = cosine_similarity(query[None, :], vectors)[0]  # (N,)
    if exclude:
        sims[list(exclude)] = float("-inf")
    order = torch.sort(sims, descending=True, stable=True).indices[:k]
    return order, sims[order]


@dataclass
class WordVectors:
    """Words and their vectors: ``vectors[i]`` (shape ``(D,)``) belongs to ``words[i]``."""

    words: list[str]
    vectors: Tensor  # (N, D)
    index: dict[str, int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.vectors.ndim != 2 or self.vectors.shape[0] != len(self.words):
            raise ValueError(
                f"{len(self.words)} words need vectors of shape (N, D) with N = {len(self.words)}, "
                f"got {tuple(self.vectors.shape)}"
            )
        self.index = {w: i for i, w in enumerate(self.words)}

    def __contains__(self, word: str) -> bool:
        return word in self.index

    def vector(self, word: str) -> Tensor:
        """The vector of ``word``, shape ``(D,)``; ``ValueError`` for an unknown word."""
        if word not in self.index:
            raise ValueError(
                f"{word!r} is not among the {len(self.words)} words of this vocabulary"
            )
        return self.vectors[self.index[word]]

    def most_similar(self, word: str, k: int = 5) -> list[tuple[str, float]]:
        """The ``k`` other words closest to ``word`` by cosine similarity, best first."""
        order, sims = nearest_neighbours(self.vectors, self.vector(word), k, (self.index[word],))
        return [(self.words[i], float(s)) for i, s in zip(order.tolist(), sims)]


def train_word_vectors(text: str, config: WordVecConfig = WordVecConfig()) -> WordVectors:
    """Word vectors for the ``config.vocab_size`` most frequent words of ``text``: PPMI + SVD."""
    words = words_of(text)
    vocab = build_vocab(words, config.vocab_size)
    if len(vocab) < config.dim:
        raise ValueError(f"the text has {len(vocab)} distinct words, fewer than dim={config.dim}")
    lookup = {w: i for i, w in enumerate(vocab)}
    ids = torch.tensor([lookup.get(w, -1) for w in words], dtype=torch.long)  # (n_words,)
    counts = cooccurrence(ids, len(vocab), config.window)  # (V, V)
    U, S, _ = truncated_svd(
        ppmi(counts, config.alpha), config.dim, config.seed, config.niter, config.oversample
    )
    return WordVectors(vocab, U * S**config.power)  # (V, dim)
