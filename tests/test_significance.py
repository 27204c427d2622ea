"""tinygpt.significance against SciPy and against its own exact enumeration."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinygpt import significance

scipy_stats = pytest.importorskip("scipy.stats")  # a test dependency (the `test` extra)


@given(st.lists(st.tuples(st.integers(0, 1), st.integers(0, 1)), min_size=1, max_size=60))
@settings(max_examples=60, deadline=None)
def test_mcnemar_is_scipys_exact_binomial_test(pairs):
    a, b = [x for x, _ in pairs], [y for _, y in pairs]
    result = significance.paired_difference(a, b, resamples=200)
    wins = sum(x > y for x, y in pairs)
    losses = sum(x < y for x, y in pairs)
    assert result.method == "McNemar exact"
    if wins + losses == 0:
        assert result.p_value == 1.0
    else:
        expected = scipy_stats.binomtest(wins, wins + losses, 0.5).pvalue
        assert result.p_value == pytest.approx(expected, rel=1e-9, abs=1e-12)
    assert result.value == pytest.approx((sum(a) - sum(b)) / len(a))


@given(st.lists(st.tuples(st.integers(0, 1), st.integers(0, 1)), min_size=1, max_size=14))
@settings(max_examples=40, deadline=None)
def test_exact_sign_flips_on_single_items_agree_with_mcnemar(pairs):
    # Each item its own group: the sign-flip enumeration and McNemar's binomial are two ways
    # to the same distribution.
    a, b = [x for x, _ in pairs], [y for _, y in pairs]
    flips = significance.paired_difference(a, b, clusters=list(range(len(a))), resamples=200)
    mcnemar = significance.paired_difference(a, b, resamples=200)
    assert flips.method == "sign flips, exact"
    assert flips.p_value == pytest.approx(mcnemar.p_value, abs=1e-12)


def test_random_sign_flips_approach_the_exact_ones(monkeypatch):
    rng = random.Random(1)
    a = [rng.random() for _ in range(14)]
    b = [x - 0.15 + 0.3 * rng.random() for x in a]
    groups = list(range(14))
    exact = significance.paired_difference(a, b, clusters=groups)
    monkeypatch.setattr(significance, "EXACT_CLUSTERS", 0)
    sampled = significance.paired_difference(a, b, clusters=groups, resamples=20_000)
    assert sampled.method.startswith("sign flips, 20,000 random")
    assert 0.0 < exact.p_value < 1.0
    assert sampled.p_value == pytest.approx(exact.p_value, abs=0.015)


def test_item_interval_is_scipys_percentile_bootstrap():
    rng = random.Random(2)
    scores = [float(rng.random() < 0.6) for _ in range(400)]
    ours = significance.cluster_interval(scores, resamples=20_000)
    theirs = scipy_stats.bootstrap((scores,), lambda x: x.mean(), n_resamples=20_000,
                                   method="percentile", random_state=0).confidence_interval
    assert ours.value == pytest.approx(sum(scores) / 400)
    assert ours.low == pytest.approx(theirs.low, abs=0.01)
    assert ours.high == pytest.approx(theirs.high, abs=0.01)


def clustered_scores(seed, groups=12, size=40):
    """Right/wrong answers whose rate differs by group, as speeches' by play."""
    rng = random.Random(seed)
    scores, clusters = [], []
    for g in range(groups):
        rate = rng.uniform(0.2, 0.8)
        for _ in range(size):
            scores.append(float(rng.random() < rate))
            clusters.append(f"play {g}")
    return scores, clusters


def test_groups_that_differ_widen_the_interval():
    scores, clusters = clustered_scores(3)
    items = significance.cluster_interval(scores, resamples=4000)
    plays = significance.cluster_interval(scores, clusters, resamples=4000)
    assert plays.groups == 12 and items.groups == len(scores)
    assert plays.high - plays.low > 1.4 * (items.high - items.low)  # design effect
    assert plays.low <= plays.value <= plays.high


def test_the_cluster_interval_covers_the_truth_about_as_often_as_it_says():
    # 200 draws of 30 groups with a known mean rate: the 95% interval should cover it in
    # roughly 95% of draws (the percentile bootstrap runs a little short with few groups).
    covered = 0
    for seed in range(200):
        rng = random.Random(seed)
        scores, clusters = [], []
        for g in range(30):
            rate = min(1.0, max(0.0, rng.gauss(0.5, 0.15)))
            scores += [float(rng.random() < rate) for _ in range(20)]
            clusters += [g] * 20
        interval = significance.cluster_interval(scores, clusters, resamples=400, seed=seed)
        covered += interval.low <= 0.5 <= interval.high
    assert 170 <= covered <= 200


def test_a_clustered_difference_is_tested_by_group():
    a, clusters = clustered_scores(4)
    rng = random.Random(5)
    b = [x if rng.random() < 0.9 else 1 - x for x in a]
    result = significance.paired_difference(a, b, clusters)
    assert result.method == "sign flips, exact" and result.groups == 12
    assert 0 <= result.p_value <= 1
    assert result.low <= result.value <= result.high


def test_a_clear_difference_is_significant_and_no_difference_is_not():
    rng = random.Random(6)
    b = [float(rng.random() < 0.5) for _ in range(500)]
    better = [1.0 if rng.random() < 0.3 else x for x in b]
    assert significance.paired_difference(better, b).p_value < 1e-6
    same = significance.paired_difference(b, b)
    assert same.p_value == 1.0 and same.value == 0.0 and same.low == same.high == 0.0


@pytest.mark.parametrize("a, b, clusters, message", [
    ([], [], None, "a is empty"),
    ([1.0], [1.0, 0.0], None, "same items"),
    ([1.0, float("nan")], [1.0, 0.0], None, "finite"),
    ([1.0, 0.0], [1.0, 0.0], ["x"], "clusters names 1 items"),
])
def test_bad_input_gets_a_clear_error(a, b, clusters, message):
    with pytest.raises(ValueError, match=message):
        significance.paired_difference(a, b, clusters)
