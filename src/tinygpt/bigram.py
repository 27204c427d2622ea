"""The bigram model: next-token probabilities from counts of adjacent pairs, and as a network.

What this module handles:

* the bigram model by counting: :func:`bigram_counts` builds the ``(V, V)`` matrix of how often
  token ``j`` follows token ``i``, :func:`bigram_probs` turns it into add-k smoothed next-token
  probabilities, :func:`bigram_loss` measures a sequence's cross-entropy under them (nats per
  token), :func:`perplexity` exponentiates it, and :func:`sample_bigram` walks the Markov chain;
* :class:`BigramNet`, the same model as a neural network (one ``(V, V)`` table of logits), and
  :func:`train_bigram_net`, which fits it by gradient descent on the count matrix, full batch.

What it does not handle: turning text into ids (:mod:`tinygpt.tokenizer`), splitting data
(:func:`tinygpt.data.split_train_val`), contexts longer than one token (:mod:`tinygpt.ngram`),
and smoothing other than add-k.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


def _check_int(name: str, value: int, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _check_smoothing(smoothing: float) -> float:
    if isinstance(smoothing, bool) or not isinstance(smoothing, numbers.Real):
        raise TypeError(f"smoothing must be a number, not {type(smoothing).__name__}")
    if not (math.isfinite(smoothing) and smoothing >= 0):
        raise ValueError(f"smoothing must be a finite number >= 0, got {smoothing}")
    return float(smoothing)


def _as_ids(ids, vocab_size: int, min_len: int) -> np.ndarray:
    """``ids`` (list, tuple, numpy array or torch tensor) as a 1-D int64 array, checked."""
    if isinstance(ids, torch.Tensor):
        ids = ids.detach().cpu().numpy()
    if isinstance(ids, str):
        raise TypeError("ids must be token ids, not a str: encode the text with a tokenizer first")
    array = np.asarray(ids)
    if array.ndim != 1:
        raise ValueError(f"ids must be a 1-D sequence of token ids, got shape {array.shape}")
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise TypeError(f"ids must be integers, got dtype {array.dtype}")
    if len(array) < min_len:
        raise ValueError(f"need at least {min_len} ids, got {len(array)}")
    array = array.astype(np.int64)
    if array.size and (array.min() < 0 or array.max() >= vocab_size):
        bad = array[(array < 0) | (array >= vocab_size)][0]
        raise ValueError(f"unknown token id {bad}: valid ids are 0..{vocab_size - 1}")
    return array


def _check_table(table: torch.Tensor, name: str) -> int:
    if not isinstance(table, torch.Tensor) or table.ndim != 2 or table.shape[0] != table.shape[1]:
        shape = tuple(table.shape) if isinstance(table, torch.Tensor) else type(table).__name__
        raise ValueError(f"{name} must be a square (V, V) tensor, got {shape}")
    return table.shape[0]


# --- The bigram model by counting ------------------------------------------------------------


def bigram_counts(ids, vocab_size: int) -> torch.Tensor:
    """The ``(V, V)`` int64 matrix whose entry ``[i, j]`` counts token ``j`` right after ``i``."""
    V = _check_int("vocab_size", vocab_size, 1)
    a = torch.from_numpy(_as_ids(ids, V, min_len=2))
    pair_code = a[:-1] * V + a[1:]  # (N-1,) each bigram (i, j) as the single integer i*V + j
    return torch.bincount(pair_code, minlength=V * V).reshape(V, V)  # (V, V)


def bigram_probs(counts: torch.Tensor, smoothing: float = 1.0) -> torch.Tensor:
    """Next-token probabilities ``(counts + k) / row total``, as a float64 ``(V, V)`` tensor.

    Row ``i`` is the distribution of the token after ``i``. With ``smoothing=k > 0`` every entry
    is positive and every row sums to 1. With ``k = 0`` (the raw maximum-likelihood estimate) a
    pair never counted gets probability 0, and a row whose token was never followed by anything
    is all zeros: the model has nothing to say there.
    """
    _check_table(counts, "counts")
    k = _check_smoothing(smoothing)
    if counts.is_floating_point() and not torch.isfinite(counts).all() or (counts < 0).any():
        raise ValueError("counts must be finite and non-negative")
    smoothed = counts.double() + k  # (V, V)
    totals = smoothed.sum(dim=1, keepdim=True)  # (V, 1)
    return torch.where(totals > 0, smoothed / totals.clamp(min=1e-300), 0.0)


def bigram_loss(probs: torch.Tensor, ids) -> float:
    """Cross-entropy of ``ids`` under bigram ``probs``: mean of ``-ln probs[prev, next]`` (nats).

    It is ``inf`` if some bigram of ``ids`` has probability 0.
    """
    V = _check_table(probs, "probs")
    a = torch.from_numpy(_as_ids(ids, V, min_len=2))
    p = probs.double()[a[:-1], a[1:]]  # (N-1,) probability of each actual next token
    return float(-p.log().mean())


def perplexity(loss: float) -> float:
    """``exp(loss)`` for a loss in nats: the number of equally likely choices it is worth."""
    return math.exp(loss)


def _draw(cdf: torch.Tensor, u: float) -> int:
    """The index where ``u * total`` falls in a cumulative distribution (inverse-CDF sampling)."""
    return int(torch.searchsorted(cdf, u * cdf[-1], right=True).clamp(max=len(cdf) - 1))


def sample_bigram(probs: torch.Tensor, start: int, num_tokens: int,
                  generator: torch.Generator) -> list[int]:
    """Walk the Markov chain: ``num_tokens`` ids, each drawn from the row of the one before.

    ``start`` is the id the walk starts from (not included in the result). Draws use
    ``torch.rand(..., generator=generator)``, so a seeded generator gives the same ids anywhere.
    """
    V = _check_table(probs, "probs")
    start = int(_as_ids([start], V, min_len=1)[0])
    num_tokens = _check_int("num_tokens", num_tokens, 0)
    cdf = probs.double().cumsum(dim=1)  # (V, V) row i: cumulative distribution after token i
    u = torch.rand(num_tokens, generator=generator, dtype=torch.float64)  # (num_tokens,)
    out, current = [], start
    for step in range(num_tokens):
        if cdf[current, -1] <= 0:
            raise ValueError(f"token {current} has no continuation (an all-zero row): smooth it")
        current = _draw(cdf[current], float(u[step]))
        out.append(current)
    return out


# --- The bigram model as a network -------------------------------------------------------------


class BigramNet(nn.Module):
    """A one-layer network: the logits for the token after ``i`` are row ``i`` of a table.

    ``wte`` is an embedding of width ``V`` whose rows are read directly as logits. It starts at
    zero, the uniform model, whose loss is ``ln V``.
    """

    def __init__(self, vocab_size: int) -> None:
        super().__init__()
        self.vocab_size = _check_int("vocab_size", vocab_size, 1)
        self.wte = nn.Embedding(self.vocab_size, self.vocab_size)  # (V, V) logits table
        nn.init.zeros_(self.wte.weight)

    def forward(self, idx: torch.Tensor,
                targets: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits ``(B, T, V)`` for ids ``idx`` ``(B, T)``; and the mean cross-entropy against
        ``targets`` ``(B, T)`` if given, else ``None``."""
        for name, t in (("idx", idx), ("targets", targets)):
            if t is None:
                continue
            if not isinstance(t, torch.Tensor) or t.ndim != 2 or t.dtype != torch.long:
                shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(f"{name} must be a (B, T) int64 tensor, got {shape}")
            _as_ids(t.reshape(-1), self.vocab_size, min_len=0)
        if targets is not None and targets.shape != idx.shape:
            raise ValueError(f"targets {tuple(targets.shape)} and idx {tuple(idx.shape)} differ")
        logits = self.wte(idx)  # (B, T, V)
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.reshape(-1, self.vocab_size), targets.reshape(-1))

    def count_loss(self, counts: torch.Tensor) -> torch.Tensor:
        """The mean cross-entropy over every bigram counted in ``counts`` ``(V, V)``, in O(V^2).

        Each occurrence of the pair ``(i, j)`` contributes the same ``-log softmax(row i)[j]``,
        so the sum over all N bigrams is ``sum(counts * -log_softmax(table))``.
        """
        if _check_table(counts, "counts") != self.vocab_size:
            raise ValueError(f"counts is {tuple(counts.shape)} for a net of vocab_size "
                             f"{self.vocab_size}")
        log_probs = F.log_softmax(self.wte.weight, dim=-1)  # (V, V)
        return -(counts.to(log_probs.dtype) * log_probs).sum() / counts.sum()

    def probs(self) -> torch.Tensor:
        """The ``(V, V)`` next-token probabilities the table stands for."""
        return F.softmax(self.wte.weight.detach(), dim=-1)


@dataclass(frozen=True)
class BigramNetConfig:
    """How :func:`train_bigram_net` trains: full-batch steps of Adam or plain gradient descent.

    ``smoothing`` adds ``k`` pseudo-counts to every pair in the objective (not in the reported
    losses); the net then converges to the add-k probabilities of :func:`bigram_probs`.
    """

    steps: int = 300
    lr: float = 1.0
    optimizer: Literal["adam", "sgd"] = "adam"
    smoothing: float = 0.0


def train_bigram_net(
    counts: torch.Tensor,
    config: BigramNetConfig = BigramNetConfig(),
    val_counts: torch.Tensor | None = None,
) -> tuple[BigramNet, dict[str, list[float]]]:
    """Fit a :class:`BigramNet` to the bigrams counted in ``counts``; return it and its history.

    Each step computes the loss over all bigrams from the ``(V, V)`` counts, so it costs O(V^2)
    whatever the corpus length. ``history["train"]`` (and ``history["val"]`` when ``val_counts``
    is given) holds ``steps + 1`` losses in nats: before each step, and after the last.
    """
    V = _check_table(counts, "counts")
    if val_counts is not None and _check_table(val_counts, "val_counts") != V:
        raise ValueError(f"val_counts is {tuple(val_counts.shape)}, counts {tuple(counts.shape)}")
    if config.optimizer not in ("adam", "sgd"):
        raise ValueError(f"optimizer must be 'adam' or 'sgd', got {config.optimizer!r}")
    _check_int("steps", config.steps, 0)
    if not (isinstance(config.lr, numbers.Real) and config.lr > 0):
        raise ValueError(f"lr must be a positive number, got {config.lr!r}")
    objective_counts = counts.float() + _check_smoothing(config.smoothing)  # (V, V)
    net = BigramNet(V)
    make = torch.optim.Adam if config.optimizer == "adam" else torch.optim.SGD
    optimizer = make(net.parameters(), lr=config.lr)
    history: dict[str, list[float]] = {"train": [], **({} if val_counts is None else {"val": []})}
    for step in range(config.steps + 1):
        with torch.no_grad():
            history["train"].append(float(net.count_loss(counts)))
            if val_counts is not None:
                history["val"].append(float(net.count_loss(val_counts)))
        if step == config.steps:
            break
        loss = net.count_loss(objective_counts)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return net, history
