"""The bigram model: next-token probabilities from counts of adjacent pairs, and as a network.

Chapter 2 builds it; chapters 3, 8 and 11 reuse it.

By counting: :func:`bigram_counts` (the ``(V, V)`` matrix of how often ``j`` follows ``i``),
:func:`bigram_probs` (add-k smoothed), :func:`bigram_loss` (cross-entropy in nats),
:func:`perplexity` and :func:`sample_bigram`. As a network: :class:`BigramNet`, one ``(V, V)``
table of logits, fitted by :func:`train_bigram_net` on the counts, full batch. Tokenizing,
splitting and contexts longer than one token live elsewhere (:mod:`tinygpt.ngram`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from tinygpt.checks import check_choice, check_float, check_ids, check_instance, check_int


def checked_id_array(ids, vocab_size: int, min_len: int) -> np.ndarray:
    """``ids`` (list, tuple, numpy array or tensor), checked, as a 1-D int64 array."""
    if not isinstance(ids, (str, bytes)):  # as an array first, so that the check is vectorised
        ids = np.asarray(ids.detach().cpu() if isinstance(ids, torch.Tensor) else ids)
        ids = ids if ids.size else ids.astype(np.int64)  # [] is an empty float array
    check_ids(ids, vocab_size, min_len)
    return ids.astype(np.int64)


def _check_table(table: torch.Tensor, name: str, vocab_size: int | None = None) -> int:
    """``V`` if ``table`` is a finite, non-negative ``(V, V)`` tensor (of ``vocab_size``)."""
    if not isinstance(table, torch.Tensor) or table.ndim != 2 or table.shape[0] != table.shape[1]:
        shape = tuple(table.shape) if isinstance(table, torch.Tensor) else type(table).__name__
        raise ValueError(f"{name} must be a square (V, V) tensor, got {shape}")
    if vocab_size is not None and table.shape[0] != vocab_size:
        raise ValueError(f"{name} is {tuple(table.shape)} for vocab_size {vocab_size}")
    if (table.is_floating_point() and not torch.isfinite(table).all()) or (table < 0).any():
        raise ValueError(f"{name} must be finite and non-negative")
    return table.shape[0]


def _check_batch(idx: torch.Tensor, targets: torch.Tensor | None, vocab_size: int) -> None:
    """Raise a clear error unless ``idx`` (and ``targets``) are ``(B, T)`` int64 ids in [0, V)."""
    for name, t in (("idx", idx), ("targets", targets)):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor) or t.ndim != 2 or t.dtype != torch.long:
            shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name} must be a (B, T) int64 tensor, got {shape}")
        check_ids(t.reshape(-1), vocab_size)
    if targets is not None and targets.shape != idx.shape:
        raise ValueError(f"targets {tuple(targets.shape)} and idx {tuple(idx.shape)} differ")


# --- The bigram model by counting ------------------------------------------------------------


def bigram_counts(ids, vocab_size: int) -> torch.Tensor:
    """The ``(V, V)`` int64 matrix whose entry ``[i, j]`` counts token ``j`` right after ``i``."""
    V = check_int(vocab_size, "vocab_size")
    a = torch.from_numpy(checked_id_array(ids, V, min_len=2))  # (N,)
    pair_code = a[:-1] * V + a[1:]  # (N-1,) each bigram (i, j) as the single integer i*V + j
    return torch.bincount(pair_code, minlength=V * V).reshape(V, V)  # (V, V)


def bigram_probs(counts: torch.Tensor, smoothing: float = 1.0) -> torch.Tensor:
    """Next-token probabilities ``(counts + k) / row total``, float64 ``(V, V)``: row ``i`` is
    the distribution after token ``i``. With ``k = 0`` a pair never counted has probability 0,
    and a token never followed by anything has a row of zeros."""
    _check_table(counts, "counts")
    k = check_float(smoothing, "smoothing", 0)
    smoothed = counts.double() + k  # (V, V)
    totals = smoothed.sum(dim=1, keepdim=True)  # (V, 1)
    return torch.where(totals > 0, smoothed / totals.clamp(min=1e-300), 0.0)


def bigram_loss(probs: torch.Tensor, ids) -> float:
    """Cross-entropy of ``ids`` under bigram ``probs``: mean of ``-ln probs[prev, next]`` (nats).

    It is ``inf`` if some bigram of ``ids`` has probability 0.
    """
    V = _check_table(probs, "probs")
    a = torch.from_numpy(checked_id_array(ids, V, min_len=2))  # (N,)
    p = probs.double()[a[:-1], a[1:]]  # (N-1,) probability of each actual next token
    return float(-p.log().mean())


def perplexity(loss: float) -> float:
    """``exp(loss)`` for a loss in nats: the number of equally likely choices it is worth."""
    return math.exp(loss)


def draw_from_cdf(cdf: torch.Tensor, u: float) -> int:
    """The index where ``u * total`` falls in a cumulative distribution (inverse-CDF sampling)."""
    return int(torch.searchsorted(cdf, u * cdf[-1], right=True).clamp(max=len(cdf) - 1))


def sample_bigram(probs: torch.Tensor, start: int, num_tokens: int,
                  generator: torch.Generator) -> list[int]:
    """Walk the Markov chain from ``start`` (not returned): ``num_tokens`` ids, each drawn from
    the row of the one before with ``torch.rand``, so a seeded generator gives the same ids."""
    check_ids([start], _check_table(probs, "probs"))
    check_int(num_tokens, "num_tokens", low=0)
    cdf = probs.double().cumsum(dim=1)  # (V, V) row i: cumulative distribution after token i
    u = torch.rand(num_tokens, generator=generator, dtype=torch.float64)  # (num_tokens,)
    out, current = [], int(start)
    for step in range(num_tokens):
        if cdf[current, -1] <= 0:
            raise ValueError(f"token {current} has no continuation (an all-zero row): smooth it")
        current = draw_from_cdf(cdf[current], float(u[step]))
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
        self.vocab_size = check_int(vocab_size, "vocab_size")
        self.wte = nn.Embedding(self.vocab_size, self.vocab_size)  # (V, V) logits table
        nn.init.zeros_(self.wte.weight)

    def forward(self, idx: torch.Tensor,
                targets: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits ``(B, T, V)`` for ids ``idx`` ``(B, T)``, and the mean cross-entropy against
        ``targets`` ``(B, T)`` if given, else ``None``."""
        _check_batch(idx, targets, self.vocab_size)
        logits = self.wte(idx)  # (B, T, V)
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.reshape(-1, self.vocab_size), targets.reshape(-1))

    def count_loss(self, counts: torch.Tensor) -> torch.Tensor:
        """The mean cross-entropy over every bigram counted in ``counts`` ``(V, V)``, in O(V^2):
        each of the ``counts[i, j]`` pairs ``(i, j)`` adds the same ``-log softmax(row i)[j]``."""
        _check_table(counts, "counts", self.vocab_size)
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

    def __post_init__(self) -> None:
        check_int(self.steps, "steps", low=0)
        check_float(self.lr, "lr", 0, low_open=True)
        check_choice(self.optimizer, "optimizer", ("adam", "sgd"))
        check_float(self.smoothing, "smoothing", 0)


def _check_net_training(counts: torch.Tensor, config: BigramNetConfig,
                        val_counts: torch.Tensor | None) -> int:
    """``V`` once the arguments of :func:`train_bigram_net` are known to be valid."""
    check_instance(config, BigramNetConfig, "config")
    V = _check_table(counts, "counts")
    if val_counts is not None:
        _check_table(val_counts, "val_counts", V)
    return V


def train_bigram_net(
    counts: torch.Tensor,
    config: BigramNetConfig = BigramNetConfig(),
    val_counts: torch.Tensor | None = None,
) -> tuple[BigramNet, dict[str, list[float]]]:
    """Fit a :class:`BigramNet` to ``counts`` by full-batch steps, each O(V^2) whatever the
    corpus length. ``history["train"]`` (and ``["val"]`` for ``val_counts``) holds ``steps + 1``
    losses in nats: before each step, and after the last."""
    net = BigramNet(_check_net_training(counts, config, val_counts))
    objective_counts = counts.float() + config.smoothing  # (V, V)
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
