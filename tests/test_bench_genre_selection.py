"""benchmarks/genre_selection.py: chapter 14's genre settings are the ones its record chose."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import genre_selection

from tinygpt.book import evaluations
from tinygpt.shakespeare import plays

RECORD = json.loads((Path(__file__).resolve().parents[1] / "benchmarks" / "results"
                     / "genre_selection.json").read_text(encoding="utf-8"))


def test_the_book_uses_what_the_selection_split_chose():
    full, lora = RECORD["chosen"]["full fine-tuning"], RECORD["chosen"]["LoRA"]
    train = evaluations.GENRE_TRAIN
    assert (train.learning_rate, train.max_iters) == (full["lr"], full["steps"])
    lora_train = evaluations.LORA_TRAIN
    assert (evaluations.LORA_RANK, lora_train.learning_rate, lora_train.max_iters) == (
        lora["rank"], lora["lr"], lora["steps"])
    # the rest of the recipe is the one every candidate trained with
    assert (lora_train.batch_size, lora_train.seed) == (train.batch_size, train.seed)


def test_the_choice_is_the_records_best_candidate_of_each_method():
    rows = RECORD["candidates"]
    for method, is_lora in (("full fine-tuning", False), ("LoRA", True)):
        winner = genre_selection.best([r for r in rows if bool(r["rank"]) == is_lora])
        assert {k: winner[k] for k in ("rank", "lr", "steps")} == RECORD["chosen"][method]


def test_a_tie_goes_to_fewer_steps_then_the_smaller_rank():
    rows = [{"accuracy": 0.5, "steps": 300, "rank": 4}, {"accuracy": 0.5, "steps": 150, "rank": 16},
            {"accuracy": 0.5, "steps": 150, "rank": 8}, {"accuracy": 0.4, "steps": 50, "rank": 1}]
    assert genre_selection.best(rows) == rows[2]


def test_the_selection_plays_are_training_plays_never_the_test_plays():
    train, selection, chosen = genre_selection.selection_split()
    test_titles = set(evaluations.genre.held_out_titles(plays(), seed=0))
    assert set(chosen) == set(RECORD["selection_plays"])
    assert not set(chosen) & test_titles
    assert {e.title for e in selection} == set(chosen)
    assert not {e.title for e in train} & (set(chosen) | test_titles)
    assert len(selection) == RECORD["selection_examples"] and len(train) == RECORD["train_examples"]
