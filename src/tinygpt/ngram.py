"""n-gram models: the next token predicted from counts of the previous ``n - 1`` tokens.

Chapter 2 uses it for contexts longer than one token; the under-the-hood notebook on BPE, n-grams
and autograd shows how it counts.

What this module handles: :class:`NGramModel`, an add-k smoothed counting model for any ``n``
whose n-grams, read as numbers in base ``V``, fit in int64 -- fitting on a sequence of ids, its
cross-entropy on another, the fraction of positions whose context was never seen, the
next-token distribution after a context, and sampling. ``n = 2`` is the bigram model of
:mod:`tinygpt.bigram`, ``n = 1`` the unigram model.

What it does not handle: backoff or interpolation between orders, and anything shared between
contexts: a count belongs to one exact context and says nothing about any other, which is the
limit this model exists to show.
"""

from __future__ import annotations

import numpy as np
import torch

from tinygpt.bigram import checked_id_array, draw_from_cdf
from tinygpt.checks import check_float, check_int


class NGramModel:
    """A counting model of the next token given the previous ``n - 1`` (add-k smoothed).

    ``P(x | c) = (count(c, x) + k) / (count(c) + k V)``. A context is stored as one integer,
    its ids read as digits in base ``V``, so counting is a sort (``np.unique``) and looking up is a
    binary search; only n-grams that occur are stored. ``n = 1`` is the unigram model,
    ``n = 2`` the bigram model of :func:`tinygpt.bigram.bigram_probs`. ``smoothing`` (k) can be
    changed after fitting: it is used only when probabilities are computed.
    """

    def __init__(self, n: int, vocab_size: int, smoothing: float = 1.0) -> None:
        self.n, self.vocab_size = check_int(n, "n"), check_int(vocab_size, "vocab_size")
        if self.vocab_size ** self.n >= 2**63:
            raise ValueError(f"n={n} with vocab_size={vocab_size}: codes of V**n = "
                             f"{self.vocab_size ** self.n} do not fit in int64")
        self.smoothing = smoothing
        self._fitted = False

    @property
    def smoothing(self) -> float:
        """The add-k constant ``k >= 0``."""
        return self._smoothing

    @smoothing.setter
    def smoothing(self, k: float) -> None:
        self._smoothing = check_float(k, "smoothing", 0)

    def _codes(self, a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Context codes ``(N - n + 1,)`` and the token after each ``(N - n + 1,)``."""
        m = len(a) - self.n + 1
        context = np.zeros(m, dtype=np.int64)
        for j in range(self.n - 1):  # Horner's rule: digits in base V, oldest first
            context = context * self.vocab_size + a[j : j + m]
        return context, a[self.n - 1 :]

    def fit(self, ids) -> NGramModel:
        """Count every n-gram of ``ids`` (replacing earlier counts); return ``self``."""
        context, target = self._codes(checked_id_array(ids, self.vocab_size, min_len=self.n))
        ngram = context * self.vocab_size + target  # (N - n + 1,) context and next as one code
        self._ngrams, self._ngram_counts = np.unique(ngram, return_counts=True)
        self._contexts, self._context_counts = np.unique(context, return_counts=True)
        self._fitted = True
        return self

    @property
    def num_ngrams(self) -> int:
        """How many distinct n-grams the training data held: the model's non-zero counts."""
        self._check_fitted()
        return len(self._ngrams)

    @property
    def num_contexts(self) -> int:
        """How many distinct contexts of ``n - 1`` tokens the training data held."""
        self._check_fitted()
        return len(self._contexts)

    def _check_fitted(self) -> None:
        if not self._fitted:
            raise RuntimeError("call fit(ids) before using the model")

    @staticmethod
    def _lookup(keys: np.ndarray, counts: np.ndarray, query: np.ndarray) -> np.ndarray:
        i = np.searchsorted(keys, query).clip(max=len(keys) - 1)
        return np.where(keys[i] == query, counts[i], 0)

    def _scored(self, ids) -> tuple[np.ndarray, np.ndarray]:
        self._check_fitted()
        context, target = self._codes(checked_id_array(ids, self.vocab_size, min_len=self.n))
        pair = self._lookup(self._ngrams, self._ngram_counts, context * self.vocab_size + target)
        seen = self._lookup(self._contexts, self._context_counts, context)
        return pair, seen

    def token_log_probs(self, ids) -> torch.Tensor:
        """``ln P(ids[t] | ids[t-n+1:t])`` for every ``t`` from ``n - 1`` on, as a float64
        tensor of ``len(ids) - n + 1`` values; ``-inf`` where the probability is 0 (possible
        only with ``smoothing=0``)."""
        pair, seen = self._scored(ids)
        k, V = self.smoothing, self.vocab_size
        denominator = seen + k * V
        with np.errstate(divide="ignore", invalid="ignore"):
            p = np.where(denominator > 0, (pair + k) / denominator, 0.0)
            return torch.from_numpy(np.log(p))

    def loss(self, ids) -> float:
        """Mean ``-ln P(next | previous n-1)`` over ``ids[n-1:]`` (nats per token); ``inf`` if
        some token gets probability 0 (possible only with ``smoothing=0``)."""
        return float(-self.token_log_probs(ids).mean())

    def training_loss(self) -> float:
        """``loss(ids)`` for the ``ids`` given to :meth:`fit`, computed from the stored counts:
        each distinct n-gram once, weighted by its count, instead of every position."""
        self._check_fitted()
        k, V = self.smoothing, self.vocab_size
        seen = self._lookup(self._contexts, self._context_counts, self._ngrams // V)  # (M,)
        count = self._ngram_counts
        return float(-(count * np.log((count + k) / (seen + k * V))).sum() / count.sum())

    def unseen_fraction(self, ids) -> float:
        """The fraction of positions of ``ids[n-1:]`` whose context never occurred in training."""
        _, seen = self._scored(ids)
        return float((seen == 0).mean())

    def probs(self, context) -> torch.Tensor:
        """The float64 ``(V,)`` distribution of the next token after the last ``n - 1`` ids of
        ``context`` (all zeros for an unseen context when ``smoothing=0``)."""
        self._check_fitted()
        V = self.vocab_size
        a = checked_id_array(context, V, min_len=self.n - 1)
        code = 0
        for token in a[len(a) - (self.n - 1) :]:  # the last n-1 ids (none for n = 1)
            code = code * V + int(token)
        lo, hi = np.searchsorted(self._ngrams, [code * V, (code + 1) * V])  # this context's run
        counts = np.zeros(V)
        counts[self._ngrams[lo:hi] % V] = self._ngram_counts[lo:hi]  # (V,)
        smoothed = counts + self.smoothing
        total = smoothed.sum()
        return torch.from_numpy(smoothed / total if total > 0 else smoothed)

    def sample(self, prompt, num_tokens: int, generator: torch.Generator) -> list[int]:
        """``num_tokens`` ids drawn one at a time after ``prompt`` (at least ``n - 1`` ids)."""
        check_int(num_tokens, "num_tokens", low=0)
        history = [int(i) for i in checked_id_array(prompt, self.vocab_size, min_len=self.n - 1)]
        u = torch.rand(num_tokens, generator=generator, dtype=torch.float64)  # (num_tokens,)
        for step in range(num_tokens):
            cdf = self.probs(history[len(history) - (self.n - 1) :]).cumsum(0)  # (V,)
            if cdf[-1] <= 0:
                raise ValueError("the context was never seen and smoothing=0: nothing to sample")
            history.append(draw_from_cdf(cdf, float(u[step])))
        return history[len(history) - num_tokens :]

    def sample_chains(self, prompts, num_tokens: int, rng: np.random.Generator) -> np.ndarray:
        """``num_tokens`` ids after each row of ``prompts`` ``(B, >= n - 1)``, the ``B`` chains
        drawn side by side (one array step per position, not one Python step per token): an
        int64 ``(B, num_tokens)`` array. Each id is drawn from the same add-k distribution as
        :meth:`probs` gives, as a mixture: with weight ``count(c) / (count(c) + kV)`` one of the
        n-grams seen after the context ``c`` (in proportion to its count), else a uniform id.
        The draws come from the NumPy generator ``rng``, so a seeded one gives the same ids."""
        self._check_fitted()
        check_int(num_tokens, "num_tokens", low=0)
        if not isinstance(rng, np.random.Generator):
            raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
        rows = np.asarray(prompts)
        if rows.ndim != 2 or rows.shape[0] == 0:
            raise ValueError(f"prompts must be a (B, n - 1) array of ids, B >= 1, got shape "
                             f"{rows.shape}")
        V, k, width = self.vocab_size, self.smoothing, self.n - 1
        checked_id_array(rows.ravel(), V, min_len=0)
        if rows.shape[1] < width:
            raise ValueError(f"each prompt needs at least n - 1 = {width} ids, got "
                             f"{rows.shape[1]}")
        context = np.zeros(len(rows), dtype=np.int64)  # (B,) the last n - 1 ids as one code
        for j in range(rows.shape[1] - width, rows.shape[1]):
            context = context * V + rows[:, j].astype(np.int64)
        # One slot per counted occurrence, runs of the same context together: slot s holds the
        # index of its n-gram, so a context's draw is a uniform slot of its run (no search).
        slots = np.repeat(np.arange(len(self._ngrams)), self._ngram_counts)  # (N,)
        run_start = np.concatenate([[0], np.cumsum(self._context_counts)])[:-1]  # (C,)
        target = self._ngrams % V  # (M,) the id each n-gram ends with
        successor = self._context_index(self._ngrams % V**width)  # (M,) its last n - 1 ids
        c = self._context_index(context)  # (B,) each chain's context, -1 if never seen
        out = np.empty((len(rows), num_tokens), dtype=np.int64)
        for step in range(num_tokens):
            seen = np.where(c >= 0, self._context_counts[c], 0)  # (B,) count(c)
            total = seen + k * V
            if (total <= 0).any():
                raise ValueError("a context was never seen and smoothing=0: nothing to sample")
            u = rng.random(len(rows)) * total  # (B,) a point on [0, count(c) + kV)
            from_counts = u < seen
            slot = run_start[c] + np.where(from_counts, np.floor(u), 0).astype(np.int64)
            j = slots[slot]  # (B,) the n-gram drawn (meaningful where from_counts)
            drawn, next_c = target[j], successor[j]
            if not from_counts.all():  # the rest of [0, count(c) + kV): k for each of the V ids
                rest = ~from_counts
                drawn[rest] = np.minimum((u[rest] - seen[rest]) / k, V - 1).astype(np.int64)
                next_c[rest] = self._context_index((context[rest] * V + drawn[rest]) % V**width)
            out[:, step], c = drawn, next_c
            context = (context * V + drawn) % V**width
        return out

    def _context_index(self, codes: np.ndarray) -> np.ndarray:
        """The index of each context code in the stored contexts, ``-1`` where never seen."""
        i = np.searchsorted(self._contexts, codes).clip(max=len(self._contexts) - 1)
        return np.where(self._contexts[i] == codes, i, -1)

    def __repr__(self) -> str:
        fitted = f", {self.num_ngrams} n-grams" if self._fitted else ", not fitted"
        return (f"NGramModel(n={self.n}, vocab_size={self.vocab_size}, "
                f"smoothing={self.smoothing}{fitted})")
