"""benchmarks/_sweep.py: a search's candidates run in a pool of processes, each row appended to a
JSONL file as it finishes, for ``modern_book.py --train`` and ``speedrun_search.py --train``."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import _sweep


def square(job: dict) -> dict:  # run in a spawned process: a function at the module's top
    return {**job, "square": job["n"] ** 2, "pid": os.getpid()}


def test_every_job_runs_in_another_process_and_each_row_is_appended(tmp_path, capsys):
    out = tmp_path / "sweep.jsonl"
    out.write_text('{"from": "an earlier sweep"}\n')
    jobs = [{"n": n} for n in range(5)]
    rows = _sweep.run_sweep(square, jobs, 2, out, lambda row: f"n {row['n']}: {row['square']}")
    assert sorted((r["n"], r["square"]) for r in rows) == [(n, n * n) for n in range(5)]
    assert all(r["pid"] != os.getpid() for r in rows)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines == [{"from": "an earlier sweep"}, *rows]  # appended, in the order finished
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "5 runs, 2 at a time"
    assert sorted(printed[1:]) == sorted(f"n {n}: {n * n}" for n in range(5))


@pytest.mark.parametrize("processes", [0, -1, 1.5, True, "2"])
def test_a_number_of_processes_that_is_not_positive_is_refused(tmp_path, processes):
    with pytest.raises(ValueError, match="processes must be a positive integer"):
        _sweep.run_sweep(square, [{"n": 1}], processes, tmp_path / "out.jsonl", str)
    assert not (tmp_path / "out.jsonl").exists()
