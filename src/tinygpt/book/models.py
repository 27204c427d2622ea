"""The book's cached models and results, made ahead of the chapters: ``python -m
tinygpt.book.models`` (``make models``, which ``make book`` and ``make test`` run first).

Chapters 4, 5, 6, 8, 12, 14 and 15 train models the first time they run (then load them from
the results cache, ``tinygpt.book.results_cache``). On a slow or busy machine a training can take
longer than a notebook cell is given, so the build trains them here first, outside any cell, each
with a progress bar; an interrupted run resumes where its last checkpoint left it
(``tinygpt.book.trained_model``), and one that is cached already is only loaded. It prints what
each step took. It does not execute the chapters or decide what they show.

Steps that run torch on one thread (``SIDE_BY_SIDE``: the genre comparison and dynamic
evaluation) run at the same time, one process each, when as many cores are free; on a busy
machine they run one after the other, so they never oversubscribe it. Each writes its own cache
entry (atomic, locked), so running them apart or together gives the same results.
"""

from __future__ import annotations

import multiprocessing
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed

from tinygpt.book import chat_model, evaluations, ladder, preferences, trained_model
from tinygpt.runtime import threads_free

SIDE_BY_SIDE = ("chapter 14: fine-tuning and LoRA", "chapter 14: dynamic evaluation")
# one torch thread each (``tinygpt.runtime.one_thread``), independent of each other


def steps() -> list[tuple[str, Callable[[], object]]]:
    """What the chapters load, in the order they need it (later steps load earlier ones)."""
    return [
        ("chapter 8: the book model", trained_model.book_model),
        ("chapter 12: the modern model",
         lambda: trained_model.book_model(trained_model.MODERN_RECIPE)),
        *[(f"chapter 14: ladder rung {key}", lambda key=key: ladder.rung_loss(key))
          for key in ladder.KEYS],
        ("chapters 8 and 14: the compressors", ladder.compression_ladder),
        ("chapter 14: the multiple-choice ladder", evaluations.choice_ladder),
        ("chapter 14: fine-tuning and LoRA", evaluations.genre_comparison),
        ("chapter 14: dynamic evaluation", evaluations.dynamic_evaluation),
        ("chapter 15: the chat model", chat_model.chat_model),
        ("chapter 15: the chat model's replies", chat_model.sft_comparison),
        ("chapter 15: the DPO model", preferences.dpo_model),
        ("chapter 15: preference tuning", preferences.preference_comparison),
    ]


def make_step(name: str) -> None:
    """Make the step called ``name`` (in a process of its own, for ``side_by_side``)."""
    dict(steps())[name]()


def side_by_side(names: list[str], make: Callable[[str], object] = make_step) -> None:
    """``make(name)`` for each of ``names`` at the same time, one fresh process each (spawned:
    torch's thread pools do not survive a fork), printing each one's time as it ends."""
    t0 = time.perf_counter()
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(len(names), mp_context=context) as pool:
        running = {pool.submit(make, name): name for name in names}
        for done in as_completed(running):
            done.result()  # a step's error ends the run, as it would one after the other
            print(f"== {running[done]}: {time.perf_counter() - t0:.0f} s", flush=True)


def main() -> int:
    """Make (or load) every step's result; 0 when all are made."""
    start = time.perf_counter()
    together = [name for name, _ in steps() if name in SIDE_BY_SIDE]
    made: set[str] = set()
    for name, make in steps():
        if name in made:
            continue
        first = len(together) > 1 and name == together[0]
        if first and threads_free() >= len(together):
            for other in together:  # the cores are free now, when the steps start
                print(f"== {other}", flush=True)
            side_by_side(together)
            made.update(together)
            continue
        print(f"== {name}", flush=True)
        t0 = time.perf_counter()
        make()
        print(f"== {name}: {time.perf_counter() - t0:.0f} s", flush=True)
    print(f"the book's models and results are cached ({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
