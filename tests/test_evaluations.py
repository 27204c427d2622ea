"""The book's cached evaluations (``tinygpt.book.evaluations``): computed once, then read from
the cache; computed again when the recipe changes or the entry is corrupt."""

from __future__ import annotations

import pytest

from tinygpt.book import evaluations


@pytest.fixture
def counted(monkeypatch, tmp_path):
    monkeypatch.setenv("TINYGPT_CACHE", str(tmp_path))
    calls = []

    def fake() -> dict:
        calls.append(1)
        return {"rows": [{"rung": "uniform", "n": len(calls)}]}

    monkeypatch.setattr(evaluations, "compute_choice_ladder", fake)
    monkeypatch.setattr(evaluations, "compute_genre_comparison", fake)
    return calls


def test_a_result_is_computed_once_then_read(counted):
    first = evaluations.choice_ladder()
    assert evaluations.choice_ladder() == first and len(counted) == 1
    assert evaluations.genre_comparison() != first and len(counted) == 2  # its own entry


def test_a_new_recipe_or_a_corrupt_entry_is_computed_again(counted, monkeypatch, tmp_path):
    evaluations.choice_ladder()
    monkeypatch.setattr(evaluations, "QUESTIONS", 7)
    evaluations.choice_ladder()
    assert len(counted) == 2
    for entry in (tmp_path / "results").glob("choice-ladder-*.json"):
        entry.write_text(entry.read_text().replace('"n": 2', '"n": 9'))
    with pytest.warns(UserWarning, match="corrupt"):
        assert evaluations.choice_ladder()["rows"][0]["n"] == 3


def test_dynamic_evaluation_encodes_the_corpus_once_and_scores_each_rung_on_it(monkeypatch):
    """Both rungs read one corpus: its split is encoded once, and each rung's model is scored
    on exactly that split, with the settings of ``DYNAMIC``."""
    import types

    import torch

    from tinygpt.book import trained_model
    from tinygpt.book.dynamic_eval import DynamicScore

    val_ids = torch.arange(50) % 7
    encoded, scored = [], []

    def book_data(corpus="shakespeare"):
        encoded.append(corpus)
        return None, None, val_ids

    def book_model(recipe=trained_model.BOOK_RECIPE, *, progress=True):
        return types.SimpleNamespace(model=recipe.model.n_layer, val_loss=2.0)

    def dynamic_score(model, ids, block_size, lr, optimizer, windows_per_chunk, momentum,
                      parts, decay, beta2):
        scored.append((model, ids, lr, optimizer, windows_per_chunk, momentum, parts, decay,
                       beta2))
        return DynamicScore(1.5, [1.0] * 20, 49, lr, optimizer, block_size, windows_per_chunk,
                            momentum, parts, decay, beta2)

    monkeypatch.setattr(trained_model, "book_data", book_data)
    monkeypatch.setattr(trained_model, "book_model", book_model)
    monkeypatch.setattr(evaluations, "dynamic_score", dynamic_score)
    result = evaluations.compute_dynamic_evaluation()
    assert encoded == [trained_model.BOOK_RECIPE.corpus]
    assert trained_model.MODERN_RECIPE.corpus == trained_model.BOOK_RECIPE.corpus
    assert [s[0] for s in scored] == [trained_model.BOOK_RECIPE.model.n_layer,
                                      trained_model.MODERN_RECIPE.model.n_layer]
    assert all(s[1] is val_ids for s in scored)
    assert [s[2:] for s in scored] == [
        (evaluations.DYNAMIC_LR[rung], evaluations.DYNAMIC_OPTIMIZER,
         evaluations.DYNAMIC_WINDOWS, evaluations.DYNAMIC_MOMENTUM,
         evaluations.DYNAMIC_PARTS[rung], evaluations.DYNAMIC_DECAY[rung],
         evaluations.DYNAMIC_BETA2[rung])
        for rung in evaluations.DYNAMIC_RUNGS]
    assert [row["rung"] for row in result["rows"]] == list(evaluations.DYNAMIC_RUNGS)
    assert all(row["static"] == 2.0 and row["dynamic"] == 1.5 for row in result["rows"])
