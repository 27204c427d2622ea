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
