"""benchmarks/modern_book.py: a candidate chosen on the selection split never trains on it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import modern_book

from tinygpt import data
from tinygpt.model import GPT


def test_a_selection_run_trains_on_the_first_90_percent_and_scores_the_rest(monkeypatch,
                                                                           tmp_path):
    generator = torch.Generator().manual_seed(0)
    train_ids = torch.randint(0, 70, (6000,), generator=generator)
    val_ids = torch.randint(0, 70, (800,), generator=generator)
    monkeypatch.setattr(modern_book, "book_data", lambda: (None, train_ids, val_ids))
    seen: dict = {}
    real_train, real_score = modern_book.train, modern_book.score

    def spy_train(model_cfg, cfg, fit_on, check_on, **kwargs):
        seen["fit_on"], seen["check_on"] = fit_on, check_on
        return real_train(model_cfg, cfg, fit_on, check_on, **kwargs)

    scored = []

    def spy_score(model, ids, block_size):
        scored.append(ids)
        return real_score(model, ids, block_size)

    monkeypatch.setattr(modern_book, "train", spy_train)
    monkeypatch.setattr(modern_book, "score", spy_score)
    job = {"name": "tiny", "shape": [1, 16, 2, 16, 4], "lr": 5e-3, "steps": 3, "seed": 0,
           "device": "cpu", "split": "selection", "save": str(tmp_path / "w.pt")}
    row = modern_book.run_one(job)
    fit_on, select = data.split_train_val(train_ids)
    assert torch.equal(seen["fit_on"], fit_on) and torch.equal(seen["check_on"], select)
    assert len(fit_on) + len(select) == len(train_ids) and len(select) == 600
    assert [len(ids) for ids in scored] == [600, 800]  # the selection split, then validation
    assert torch.equal(scored[0], select) and torch.equal(scored[1], val_ids)
    assert row["selection_loss"] != row["whole_val_loss"]
    model = GPT(modern_book.configs((1, 16, 2, 16, 4), 5e-3, 3)[0])
    model.load_state_dict(torch.load(tmp_path / "w.pt", weights_only=True))
    assert real_score(model, select, 16) == row["selection_loss"]  # the weights it scored


def test_a_run_without_the_selection_split_trains_on_all_of_the_training_text(monkeypatch):
    train_ids = torch.randint(0, 70, (3000,), generator=torch.Generator().manual_seed(1))
    val_ids = torch.randint(0, 70, (500,), generator=torch.Generator().manual_seed(2))
    monkeypatch.setattr(modern_book, "book_data", lambda: (None, train_ids, val_ids))
    seen = []
    real_train = modern_book.train
    monkeypatch.setattr(modern_book, "train", lambda m, c, fit_on, check_on, **kw: (
        seen.append((fit_on, check_on)) or real_train(m, c, fit_on, check_on, **kw)))
    row = modern_book.run_one({"name": "tiny", "shape": [1, 16, 2, 16, 4], "lr": 5e-3,
                               "steps": 2, "seed": 0, "device": "cpu"})
    assert torch.equal(seen[0][0], train_ids) and torch.equal(seen[0][1], val_ids)
    assert "selection_loss" not in row and row["whole_val_loss"] > 0


def test_levers_are_compared_with_the_base_seed_by_seed_on_the_selection_split():
    def run(tag, seed, selection, val, split="selection"):
        return {"tag": tag, "seed": seed, "name": "s", "lr": 5e-3, "steps": 10, "split": split,
                "selection_loss": selection, "whole_val_loss": val}

    rows = [run("base", 1, 1.50, 1.40), run("base", 2, 1.60, 1.45), run("base", 3, 1.55, 1.42),
            run("cap", 1, 1.48, 1.41), run("cap", 2, 1.57, 1.43),  # seeds 1 and 2 only
            run("cap", 9, 1.00, 1.00, split=None)]  # not a selection run: left out
    table = {row["tag"]: row for row in modern_book.summarise_levers(rows)}
    cap = table["cap"]
    assert cap["seeds"] == cap["paired_seeds"] == [1, 2]
    assert cap["selection_loss"] == pytest.approx(1.525)
    assert cap["change"] == pytest.approx(-0.025)  # -0.02 and -0.03
    assert (cap["change_low"], cap["change_high"]) == pytest.approx((-0.03, -0.02))
    assert cap["val_change"] == pytest.approx(-0.005)  # +0.01 and -0.02
    assert table["base"]["change"] == 0 and list(table) == ["base", "cap"]
    with pytest.raises(ValueError, match="base"):
        modern_book.summarise_levers(rows[3:])
