"""Is one model better than another on the same test? Paired comparisons and cluster intervals.

Chapter 14 ranks models that sat the *same* questions, and classifiers tested on the *same*
speeches. Two separate intervals that overlap, or do not, answer the wrong question: what
matters is the difference on each item, because most items are easy or hard for both models
alike. This module compares per-item scores (a right answer 1, a wrong one 0, a share of a tie
in between) pair by pair:

* ``paired_difference(a, b)``: the mean of ``a - b``, a percentile bootstrap interval of it, and
  the two-sided p-value of a *sign-flip test* — under "neither is better", each item's
  difference is as likely to have had the other sign. For right/wrong scores this is exactly
  McNemar's test (only the items where the two disagree count; it is computed exactly from the
  binomial distribution); otherwise the signs are flipped at random ``resamples`` times.
* ``clusters=``: where items come in groups that are not independent (the speeches of one play
  share its names and its style), the same resampling and sign flips act on whole groups: an
  interval and a p-value at the level the data clusters. With few groups the sign flips are
  enumerated exactly.
* ``cluster_interval(scores, clusters)``: the mean score with a bootstrap interval over groups.

It does not choose a test for you, correct for many comparisons, or handle items that only one
model sat: the two score lists must line up item by item.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

RESAMPLES = 10_000
EXACT_CLUSTERS = 16  # up to this many groups, every sign flip is enumerated (2 ** 16 patterns)


@dataclass(frozen=True)
class Interval:
    """A mean and its 95% interval, over ``n`` items in ``groups`` groups."""

    value: float
    low: float
    high: float
    n: int
    groups: int


@dataclass(frozen=True)
class Difference:
    """The mean of ``a - b`` with its 95% interval, and the two-sided p-value that ``a`` and
    ``b`` score alike. ``method`` names the test: ``"McNemar exact"``, ``"sign flips, exact"`` or
    ``"sign flips, 10,000 random"``."""

    value: float
    low: float
    high: float
    p_value: float
    n: int
    groups: int
    method: str


def _scores(values: Sequence[float], name: str) -> list[float]:
    scores = [float(v) for v in values]
    if not scores:
        raise ValueError(f"{name} is empty: a comparison needs at least one item")
    if any(not math.isfinite(s) for s in scores):
        raise ValueError(f"{name} holds a value that is not a finite number")
    return scores


def _groups(clusters: Sequence[Hashable] | None, n: int) -> list[list[int]]:
    """The items' indices, one list per group (each item its own group when none are given)."""
    if clusters is None:
        return [[i] for i in range(n)]
    if len(clusters) != n:
        raise ValueError(f"clusters names {len(clusters)} items, the scores hold {n}")
    found: dict[Hashable, list[int]] = {}
    for i, c in enumerate(clusters):
        found.setdefault(c, []).append(i)
    return list(found.values())


def _percentiles(values: list[float]) -> tuple[float, float]:
    values = sorted(values)
    last = len(values) - 1
    return values[round(0.025 * last)], values[round(0.975 * last)]


def _bootstrap_mean(totals: list[tuple[float, int]], resamples: int, seed: int) -> tuple[float,
                                                                                         float]:
    """A 95% percentile interval of sum(score) / sum(count), drawing groups with replacement."""
    rng = random.Random(seed)
    means = []
    for _ in range(resamples):
        drawn = rng.choices(totals, k=len(totals))
        means.append(sum(t for t, _ in drawn) / sum(c for _, c in drawn))
    return _percentiles(means)


def cluster_interval(scores: Sequence[float], clusters: Sequence[Hashable] | None = None, *,
                     resamples: int = RESAMPLES, seed: int = 0) -> Interval:
    """The mean of ``scores`` and a 95% bootstrap interval that resamples whole groups
    (``clusters[i]`` is item ``i``'s group: its play, say), or single items without groups."""
    values = _scores(scores, "scores")
    groups = _groups(clusters, len(values))
    totals = [(sum(values[i] for i in g), len(g)) for g in groups]
    low, high = _bootstrap_mean(totals, resamples, seed)
    return Interval(sum(values) / len(values), low, high, len(values), len(groups))


def _mcnemar_exact(discordant_a: int, discordant_b: int) -> float:
    """Two-sided exact McNemar p-value: the binomial(n, 1/2) tail of the smaller count."""
    n, k = discordant_a + discordant_b, min(discordant_a, discordant_b)
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


def _sign_flip_p(sums: list[float], resamples: int, seed: int) -> tuple[float, str]:
    """Two-sided p-value of the sign-flip test on the groups' summed differences."""
    observed = abs(sum(sums))
    tolerance = 1e-9 * (1 + sum(abs(s) for s in sums))
    if len(sums) <= EXACT_CLUSTERS:
        extreme = total = 0
        for signs in itertools.product((1, -1), repeat=len(sums)):
            total += 1
            extreme += abs(sum(s * d for s, d in zip(signs, sums))) >= observed - tolerance
        return extreme / total, "sign flips, exact"
    rng = random.Random(seed)
    extreme = sum(abs(sum(d if rng.random() < 0.5 else -d for d in sums)) >= observed - tolerance
                  for _ in range(resamples))
    return (extreme + 1) / (resamples + 1), f"sign flips, {resamples:,} random"


def paired_difference(a: Sequence[float], b: Sequence[float],
                      clusters: Sequence[Hashable] | None = None, *,
                      resamples: int = RESAMPLES, seed: int = 0) -> Difference:
    """How much better ``a`` scores than ``b`` on the same items: the mean of ``a - b``, its
    95% bootstrap interval, and the p-value of the paired sign-flip test (McNemar's exact test
    when every score is 0 or 1 and there are no groups). ``clusters`` resamples and flips whole
    groups instead of items."""
    first, second = _scores(a, "a"), _scores(b, "b")
    if len(first) != len(second):
        raise ValueError(f"a and b must score the same items: got {len(first)} and "
                         f"{len(second)} scores")
    if resamples < 100:
        raise ValueError(f"resamples must be at least 100, got {resamples}")
    differences = [x - y for x, y in zip(first, second)]
    groups = _groups(clusters, len(differences))
    sums = [sum(differences[i] for i in g) for g in groups]
    low, high = _bootstrap_mean([(s, len(g)) for s, g in zip(sums, groups)], resamples, seed)
    binary = all(x in (0.0, 1.0) for x in first + second)
    if clusters is None and binary:
        wins = sum(d > 0 for d in differences)
        p_value, method = _mcnemar_exact(wins, sum(d < 0 for d in differences)), "McNemar exact"
    else:
        p_value, method = _sign_flip_p(sums, resamples, seed)
    return Difference(sum(differences) / len(differences), low, high, p_value, len(differences),
                      len(groups), method)
