"""The build never fails for time: the cached models are made before the chapters, outside any
cell (``python -m tinygpt.book.models``, ``make models``), and no cell has a timeout."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from tinygpt.book import models

ROOT = Path(__file__).resolve().parents[1]


def test_every_step_is_made_once_in_order(monkeypatch, capsys):
    made: list[str] = []
    steps = [(name, lambda name=name: made.append(name)) for name in ("a", "b", "c")]
    monkeypatch.setattr(models, "steps", lambda: steps)
    assert models.main() == 0
    assert made == ["a", "b", "c"]
    out = capsys.readouterr().out
    assert all(f"== {name}: " in out for name in made)


def test_the_steps_cover_every_cached_model_the_chapters_make():
    text = "\n".join("".join(c["source"]) for ch in sorted((ROOT / "chapters").glob("*.ipynb"))
                     for c in json.loads(ch.read_text(encoding="utf-8"))["cells"]
                     if c["cell_type"] == "code")
    names = " ".join(name for name, _ in models.steps())
    for call, step in [("book_model(", "the book model"),
                       ("book_model(MODERN_RECIPE)", "the modern model"),
                       ("choice_ladder(", "multiple-choice ladder"),
                       ("genre_comparison(", "fine-tuning and LoRA"),
                       ("compression_ladder(", "the compressors"),
                       ("dynamic_evaluation(", "dynamic evaluation"),
                       ("chat_model.chat_model(", "the chat model"),
                       ("sft_comparison(", "the chat model's replies"),
                       ("preference_comparison(", "preference tuning")]:
        assert call in text and step in names, call


def test_make_book_makes_the_models_first_and_no_cell_times_out():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^book: setup models$", makefile, re.M)
    assert re.search(r"^models: setup\n\t\$\(BIN\)/python -m tinygpt\.book\.models$",
                     makefile, re.M)
    assert "--nbval-cell-timeout=86400" in makefile
    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
    assert config["execute"]["timeout"] == -1  # nbclient: no timeout


def record_process(folder: Path, lane: tuple[str, ...]) -> None:  # made in a spawned process
    import os

    for name in lane:
        if name == "fails":
            raise RuntimeError("this step failed")
        (folder / name).write_text(str(os.getpid()), encoding="utf-8")


def test_side_by_side_lanes_run_in_processes_of_their_own(tmp_path):
    import functools
    import os

    models.side_by_side([["x", "y"], ["z"]], make=functools.partial(record_process, tmp_path))
    pids = {n: (tmp_path / n).read_text(encoding="utf-8") for n in ("x", "y", "z")}
    assert str(os.getpid()) not in pids.values()
    assert pids["x"] == pids["y"] != pids["z"]  # a lane's steps in one process, lanes apart
    with pytest.raises(RuntimeError, match="this step failed"):
        models.side_by_side([["x"], ["fails"]], make=functools.partial(record_process, tmp_path))


def test_the_lanes_are_the_last_steps_each_in_the_steps_order():
    names = [name for name, _ in models.steps()]
    in_lanes = [name for lane in models.LANES for name in lane]
    assert len(set(in_lanes)) == len(in_lanes) and len(models.LANES) == 2
    assert set(names[-len(in_lanes):]) == set(in_lanes)  # everything they load is made before
    for lane in models.LANES:
        assert [n for n in names if n in lane] == list(lane)


@pytest.mark.parametrize("free, together", [(2, True), (1, False)])
def test_the_lanes_run_together_only_on_free_cores(monkeypatch, capsys, free, together):
    made: list[object] = []
    lanes = (("b", "c"), ("d",))
    names = ["a", "b", "d", "c"]
    monkeypatch.setattr(models, "LANES", lanes)
    monkeypatch.setattr(models, "steps", lambda: [(n, lambda n=n: made.append(n)) for n in names])
    monkeypatch.setattr(models, "threads_free", lambda *args: free)
    monkeypatch.setattr(models, "side_by_side",
                        lambda group: made.append(tuple(tuple(lane) for lane in group)))
    assert models.main() == 0
    assert made == (["a", lanes] if together else names)
    out = capsys.readouterr().out
    assert all(f"== {name}: " in out for name in (["a"] if together else names))
