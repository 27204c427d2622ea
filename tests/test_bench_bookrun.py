"""benchmarks/_bookrun.py: the speedrun page's ladder of recipes and the curves it records."""

from __future__ import annotations

import itertools
import sys
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import _bookrun
import speedrun

from tinygpt.book.trained_model import BOOK_RECIPE


def baseline():
    same = {f: getattr(BOOK_RECIPE.train, f) for f in ("eval_interval", "eval_iters",
                                                       "log_interval", "seed")}
    return (replace(speedrun.BABY, vocab_size=BOOK_RECIPE.model.vocab_size),
            replace(speedrun.BABY_TRAIN, **same))


def test_the_ladder_starts_at_the_baby_recipe_and_ends_at_the_books():
    rows = _bookrun.ladder(baseline())
    assert rows[0][1:] == baseline()
    assert rows[-1][1:] == (BOOK_RECIPE.model, BOOK_RECIPE.train)
    assert len(rows) >= 3  # the baby recipe and the book's differ in more than one stage


def test_each_rung_changes_the_fields_of_one_stage_only():
    rows = _bookrun.ladder(baseline())
    stages = {name: set(fields) for name, _, fields in _bookrun.STAGES}
    for (_, m0, t0), (name, m1, t1) in itertools.pairwise(rows):
        changed = {f for f in vars(m0) if getattr(m0, f) != getattr(m1, f)} | \
                  {f for f in vars(t0) if getattr(t0, f) != getattr(t1, f)}
        assert changed and changed <= stages[name], (name, changed)


def test_a_recipe_the_stages_cannot_reach_is_refused():
    model, cfg = baseline()
    with pytest.raises(SystemExit, match="STAGES"):
        _bookrun.ladder((model, replace(cfg, dtype="bfloat16")))


def test_curves_time_the_steps_and_leave_the_evaluations_out():
    # the untrained model's evaluation, then 20 steps of 100 tokens at 1000 tokens/s (0.1 s
    # each), with evaluations at steps 10 and 20
    steps = [{"step": s, "loss": float(s), "tokens_per_s": 1000.0,
              **({"val_loss": 5.0 - s / 10} if s % 10 == 0 else {})} for s in range(1, 21)]
    history = [{"step": 0, "val_loss": 5.0}, *steps]
    c = _bookrun.curves(history, tokens_per_step=100)
    assert c["val"] == [[0, 0.0, 5.0], [10, 1.0, 4.0], [20, 2.0, 3.0]]
    assert c["train"] == [[10, 1.0, 5.5], [20, 2.0, 15.5]]  # means of steps 1-10, 11-20
    assert c["median_ms"] == pytest.approx(100.0)
    assert c["train_s"] == pytest.approx(2.0)
