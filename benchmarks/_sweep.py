"""A search's candidates, trained in a pool of processes, each result appended to a JSONL file as
it finishes: the ``--train`` part of ``modern_book.py`` and ``speedrun_search.py``.

``run_sweep(run_one, jobs, processes, out, describe)`` calls ``run_one(job)`` for every job (a
JSON-able dict) in a process of its own, ``processes`` at a time, in the order they finish. The
processes are started fresh ("spawn", not "fork"), so a job can use CUDA; ``run_one`` must be a
function at the top of an importable module (the script's own ``main`` guarded by
``if __name__ == "__main__"``). Each result row is written to ``out`` (one JSON object a line,
appended: a sweep cut short keeps the rows it finished, and a second sweep adds to them) and
``describe(row)`` is printed.
"""

from __future__ import annotations

import json
import multiprocessing
from collections.abc import Callable
from pathlib import Path


def run_sweep(
    run_one: Callable[[dict], dict],
    jobs: list[dict],
    processes: int,
    out: str | Path,
    describe: Callable[[dict], str],
) -> list[dict]:
    """Run every job, ``processes`` at a time; append each row to ``out`` and print it described;
    return the rows in the order they finished."""
    if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1:
        raise ValueError(f"processes must be a positive integer (--jobs), got {processes!r}")
    print(f"{len(jobs)} runs, {processes} at a time", flush=True)
    rows = []
    with (
        multiprocessing.get_context("spawn").Pool(processes) as pool,
        open(out, "a", encoding="utf-8") as log,
    ):
        for row in pool.imap_unordered(run_one, jobs):
            log.write(json.dumps(row) + "\n")
            log.flush()
            print(describe(row), flush=True)
            rows.append(row)
        pool.close()  # the workers end on their own (leaving the block would terminate them)
        pool.join()
    return rows
