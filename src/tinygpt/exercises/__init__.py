"""Graded exercises: write a piece of the GPT yourself and check it against the package's own.

In a notebook, or any Python::

    from tinygpt import exercises

    def softmax(x, dim=-1):
        ...  # your code

    exercises.check("softmax", softmax)   # prints a short report, returns True or False

``check`` runs your function on fixed cases (large logits, ties, length 1, T = 1, float32 and
float64 ...) and on seeded random ones (the same on every run), and compares each result with
the package's implementation (or torch's). It prints "passed", or the first case that differs:
its inputs, what was expected and what your function gave, and a hint: the classic mistake
(for instance "the largest logit overflows: subtract the max before exp") when that mistake
gives your results on every case, else what differs ("rows sum to 1.33, not 1"). Your function
runs on copies of the inputs (an input changed in place, where a new value is asked for, fails),
with a time limit, and torch's functions put back if it replaces them. A function
that is not written yet (its body is ``...``, it returns ``None`` or raises
``NotImplementedError``) gets "not implemented yet"; an exception in your code is reported with
its line, and never stops the notebook. ``exercises.list()`` gives every exercise's id, chapter
and task; ``tinygpt exercises --from my_gpt.py`` checks a whole file of your functions.

The exercises are defined, chapter by chapter, in ``tokens_to_embeddings`` (chapters 1-4),
``attention_to_gpt`` (5-7), ``training_and_sampling`` (8-9), ``scaling_to_corpora``
(10-13), ``fine_tuning`` (14) and ``chat`` (15); ``grading`` runs them, ``comparison``
compares results, ``workbook`` reads a file.
"""

from __future__ import annotations

import builtins
from typing import NamedTuple

from tinygpt.exercises import (
    attention_to_gpt,
    chat,
    fine_tuning,
    scaling_to_corpora,
    tokens_to_embeddings,
    training_and_sampling,
)
from tinygpt.exercises.grading import Exercise, Result, grade

EXERCISES: dict[str, Exercise] = {
    e.id: e for module in (tokens_to_embeddings, attention_to_gpt, training_and_sampling,
                           scaling_to_corpora, fine_tuning, chat) for e in module.EXERCISES}


class Entry(NamedTuple):
    """One line of ``exercises.list()``."""

    id: str
    chapter: int
    task: str


def exercise(exercise_id: str) -> Exercise:
    """The exercise called ``exercise_id``; a ``ValueError`` naming the valid ids otherwise."""
    if not isinstance(exercise_id, str) or exercise_id not in EXERCISES:
        raise ValueError(f"no exercise {exercise_id!r}; the exercises are: "
                         f"{', '.join(EXERCISES)}")
    return EXERCISES[exercise_id]


def result(exercise_id: str, fn: object, time_limit: float | None = None) -> Result:
    """``check`` without the printing: the ``Result`` (status, report, hint); ``time_limit``
    is the most seconds one call of ``fn`` may take (10 by default)."""
    return grade(exercise(exercise_id), fn, time_limit)


class Verdict:
    """Whether a check passed: true or false in an ``if``, and shown as nothing at the end of a
    notebook cell, where the report printed above it has already said so."""

    def __init__(self, passed: bool) -> None:
        self.passed = passed

    def __bool__(self) -> bool:
        return self.passed

    def __repr__(self) -> str:
        return f"Verdict(passed={self.passed})"

    def _ipython_display_(self) -> None:  # the report is the output; no bare True or False
        pass


def check(exercise_id: str, fn: object) -> Verdict:
    """Check your function ``fn`` for the exercise ``exercise_id``: print a short report and
    return whether it passed (a ``Verdict``, true when it passed; see the module's docstring)."""
    outcome = result(exercise_id, fn)
    print(outcome.report)
    return Verdict(outcome.passed)


def list() -> builtins.list[Entry]:  # the name the book uses, exercises.list(); it shadows
    """Every exercise as ``(id, chapter, task)``, chapter by chapter."""  # the builtin here
    return [Entry(e.id, e.chapter, e.task) for e in EXERCISES.values()]
