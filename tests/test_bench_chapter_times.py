"""benchmarks/chapter_times.py: the README's chapter times come from the notebooks' own records."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import chapter_times


@pytest.fixture(scope="module")
def record():
    return json.loads(chapter_times.RECORD.read_text(encoding="utf-8"))


def test_the_seconds_are_the_sum_of_the_cells_records(tmp_path):
    cell = {"cell_type": "code", "metadata": {"execution": {
        "iopub.execute_input": "2026-11-27T06:48:27.000000Z",
        "shell.execute_reply": "2026-11-27T06:48:29.500000Z"}}}
    unrun = {"cell_type": "code", "metadata": {}}
    text = {"cell_type": "markdown", "metadata": {}}
    notebook = tmp_path / "n.ipynb"
    notebook.write_text(json.dumps({"cells": [cell, unrun, text, cell]}))
    assert chapter_times.recorded_seconds(notebook) == pytest.approx(5.0)


def test_the_record_is_the_committed_notebooks(record):
    names = [nb.stem for nb in chapter_times.chapters()]
    assert list(record["chapters"]) == names
    for notebook in chapter_times.chapters():
        recorded = record["chapters"][notebook.stem]["recorded"]
        assert recorded == pytest.approx(chapter_times.recorded_seconds(notebook), abs=0.2), (
            f"{notebook.name} was executed again: run python benchmarks/chapter_times.py "
            "--models-log LOG --out benchmarks/results/chapter_times.json, then --readme")
    assert "the book model" in " ".join(record["models"])  # make models' steps were read


def test_the_models_log_is_read_step_by_step():
    log = "== chapter 8: the book model\nstep 0 ...\n== chapter 8: the book model: 191 s\n"
    assert chapter_times.model_seconds(log) == {"chapter 8: the book model": 191.0}


def test_the_readme_shows_the_record(record):
    readme = chapter_times.README.read_text(encoding="utf-8")
    assert f"{chapter_times.BEGIN}\n{chapter_times.table(record)}\n{chapter_times.END}" in readme


def test_the_readmes_promise_holds(record):
    # README: "in a minute or a few once the book's models are cached; training and evaluating
    # those models takes several minutes each, once".
    seconds = sorted(row["recorded"] for row in record["chapters"].values())
    assert seconds[len(seconds) // 2] < 90 and seconds[-1] < 600
    assert all(s < 1200 for s in record["models"].values())
