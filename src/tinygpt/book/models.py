"""The book's cached models and results, made ahead of the chapters: ``python -m
tinygpt.book.models`` (``make models``, which ``make book`` and ``make test`` run first).

Chapters 4, 5, 6, 8, 12, 14 and 15 train models the first time they run (then load them from
the results cache, ``tinygpt.book.results_cache``). On a slow or busy machine a training can take
longer than a notebook cell is given, so the build trains them here first, outside any cell, each
with a progress bar; an interrupted run resumes where its last checkpoint left it
(``tinygpt.book.trained_model``), and one that is cached already is only loaded. It prints what
each step took. It does not execute the chapters or decide what they show.

The last steps run torch on one thread each (``tinygpt.runtime.one_thread``; the compressors
are single-threaded C) and split into two ``LANES`` that do not load each other's results:
chapter 15's chat models one after another, and chapter 14's compressors, genre comparison and
dynamic evaluation. When both cores are free the two lanes run at the same time, one process
each; on a busy machine every step runs one after the other, so they never oversubscribe it.
Each step writes its own cache entry (atomic, locked), so running them apart or together gives
the same results.
"""

from __future__ import annotations

import multiprocessing
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed

from tinygpt.book import chat_model, evaluations, ladder, preferences, trained_model
from tinygpt.runtime import threads_free

LANES = (
    ("chapter 15: the chat model", "chapter 15: the chat model's replies",
     "chapter 15: the DPO model", "chapter 15: preference tuning"),
    ("chapters 8 and 14: the compressors", "chapter 14: fine-tuning and LoRA",
     "chapter 14: dynamic evaluation"),
)
"""The last steps, in two lanes that may run side by side: each lane's steps in their order, one
torch thread each, and no step loading a result of the other lane."""


def steps() -> list[tuple[str, Callable[[], object]]]:
    """What the chapters load, in the order they need it (later steps load earlier ones)."""
    return [
        ("chapter 8: the book model", trained_model.book_model),
        ("chapter 12: the modern model",
         lambda: trained_model.book_model(trained_model.MODERN_RECIPE)),
        *[(f"chapter 14: ladder rung {key}", lambda key=key: ladder.rung_loss(key))
          for key in ladder.KEYS],
        ("chapter 14: the multiple-choice ladder", evaluations.choice_ladder),
        ("chapters 8 and 14: the compressors", ladder.compression_ladder),
        ("chapter 14: fine-tuning and LoRA", evaluations.genre_comparison),
        ("chapter 14: dynamic evaluation", evaluations.dynamic_evaluation),
        ("chapter 15: the chat model", chat_model.chat_model),
        ("chapter 15: the chat model's replies", chat_model.sft_comparison),
        ("chapter 15: the DPO model", preferences.dpo_model),
        ("chapter 15: preference tuning", preferences.preference_comparison),
    ]


def make_step(name: str) -> None:
    """Make the step called ``name``, printing its time."""
    print(f"== {name}", flush=True)
    t0 = time.perf_counter()
    dict(steps())[name]()
    print(f"== {name}: {time.perf_counter() - t0:.0f} s", flush=True)


def make_lane(names: Sequence[str]) -> None:
    """Make the steps ``names`` one after another (in a process of its own: ``side_by_side``)."""
    for name in names:
        make_step(name)


def side_by_side(lanes: Sequence[Sequence[str]],
                 make: Callable[[Sequence[str]], object] = make_lane) -> None:
    """``make(lane)`` for each of ``lanes`` at the same time, one fresh process each (spawned:
    torch's thread pools do not survive a fork). A lane's error is raised here once the other
    lane has ended, so that what the other lane made is kept (cached) and the run still fails."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(len(lanes), mp_context=context) as pool:
        for done in as_completed([pool.submit(make, tuple(lane)) for lane in lanes]):
            done.result()


def main() -> int:
    """Make (or load) every step's result; 0 when all are made."""
    start = time.perf_counter()
    in_lanes = {name for lane in LANES for name in lane}
    made: set[str] = set()
    for name, _ in steps():
        if name in made:
            continue
        if name in in_lanes and threads_free() >= len(LANES):  # free now, when the lanes start
            side_by_side([[n for n in lane if n not in made] for lane in LANES])
            made.update(in_lanes)
            continue
        make_step(name)
        made.add(name)
    print(f"the book's models and results are cached ({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
