"""Grading one exercise: run the reader's function on every case, compare it with the reference,
and write a short report with a hint that names the likely mistake.

An ``Exercise`` holds the reference (the package's own function, or torch's), its cases (fixed
ones, then seeded random ones: the same every run) and its known ``Mistake`` s, each a small
wrong implementation. ``grade`` calls the reader's function on copies of each case's inputs, so
that it may change them in place; the first case whose result differs from the reference's
stops the run. The hint is the mistake whose wrong implementation gives the reader's result on
that case (the one that agrees with the reader on the most cases, when several do); else a
general one about the shape, the dtype or an overflow. A function that returns ``None`` on the
first case, or raises ``NotImplementedError``, is "not implemented yet"; any other exception
is reported with the line of the reader's code that raised it, never as a traceback.
"""

from __future__ import annotations

import copy
import math
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tinygpt.exercises.comparison import brief, difference


@dataclass(frozen=True)
class Case:
    """One call: ``fn(*args, **kwargs)``, with a few words on what the case tests."""

    args: tuple
    kwargs: dict[str, Any] = field(default_factory=dict)
    note: str = ""


@dataclass(frozen=True)
class Mistake:
    """A classic mistake: the hint that names it, and a function that makes it."""

    hint: str
    model: Callable[..., Any]


@dataclass(frozen=True)
class Exercise:
    """What the reader writes (``function``, ``signature``, ``task``), for which chapter, the
    reference it is graded against, its cases and its known mistakes. ``names`` labels the
    arguments in a report; ``parts`` the items of a tuple result; ``tolerance`` (dtype ->
    rtol, atol) loosens ``comparison.TOLERANCE`` where a correct formula may round more."""

    id: str
    chapter: int
    function: str
    signature: str
    task: str
    reference: Callable[..., Any]
    cases: Callable[[], list[Case]]
    mistakes: tuple[Mistake, ...] = ()
    names: tuple[str, ...] = ()
    parts: tuple[str, ...] = ()
    tolerance: dict[torch.dtype, tuple[float, float]] = field(default_factory=dict)


@dataclass(frozen=True)
class Result:
    """How a reader's function did: ``status`` is "passed", "not implemented" or "failed";
    ``report`` is the text ``check`` prints; ``problem`` what differed on the first failing
    case, ``hint`` the likely mistake."""

    exercise: str
    status: str
    report: str
    hint: str = ""
    cases: int = 0
    problem: str = ""

    @property
    def passed(self) -> bool:
        return self.status == "passed"


class Raised(Exception):
    """The reader's function raised ``error``; ``where`` is the line of their code."""

    def __init__(self, error: BaseException, where: str) -> None:
        super().__init__(str(error))
        self.error = error
        self.where = where


def call(fn: Callable[..., Any], case: Case) -> Any:
    """``fn`` on a copy of the case's inputs; its exception comes back as ``Raised``."""
    args, kwargs = copy.deepcopy(case.args), copy.deepcopy(case.kwargs)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return fn(*args, **kwargs)
    except Exception as error:  # the reader's code: any exception is part of the report
        return Raised(error, raised_where(error))


def raised_where(error: BaseException) -> str:
    """``file:line, in name`` of the last frame of the traceback outside torch and this
    checker: the reader's line that raised, or called what raised."""
    frames = traceback.extract_tb(error.__traceback__)[1:]  # the first one is ``call``'s
    here = Path(__file__).parent
    torch_dir = Path(torch.__file__).parent
    own = [f for f in frames if not Path(f.filename).is_relative_to(torch_dir)
           and not Path(f.filename).is_relative_to(here)]
    if not (own or frames):
        return ""
    frame = (own or frames)[-1]
    return f"{Path(frame.filename).name}:{frame.lineno}, in {frame.name}"


def is_stub(got: Any) -> bool:
    """A result that says "not written yet": ``None`` or ``NotImplementedError``."""
    return got is None or (isinstance(got, Raised)
                           and isinstance(got.error, NotImplementedError))


def grade(exercise: Exercise, fn: object) -> Result:
    """Run ``fn`` on every case of ``exercise`` and report how it did."""
    head = f"{exercise.id} (chapter {exercise.chapter}): "
    if not callable(fn):
        return Result(exercise.id, "failed", f"{head}check needs a function, "
                      f"{exercise.signature}; got {brief(fn)}")
    cases = exercise.cases()
    for i, case in enumerate(cases):
        got = call(fn, case)
        if i == 0 and is_stub(got):
            return Result(exercise.id, "not implemented", f"{head}not implemented yet. Write "
                          f"{exercise.signature}: {exercise.task}; then run the check again.")
        expected = exercise.reference(*copy.deepcopy(case.args), **copy.deepcopy(case.kwargs))
        problem = problem_with(expected, got, exercise)
        if problem is not None:
            hint = hint_for(exercise, fn, cases, i, expected, got)
            return Result(exercise.id, "failed", failure_report(
                exercise, case, i, len(cases), expected, got, problem, hint), hint, len(cases),
                problem)
    return Result(exercise.id, "passed", f"{head}passed all {len(cases)} cases.",
                  cases=len(cases))


def problem_with(expected: Any, got: Any, exercise: Exercise) -> str | None:
    """What is wrong with the reader's result ``got``, or None if it matches."""
    if isinstance(got, Raised):
        kind = type(got.error).__name__
        return f"raised {kind}: {got.error}" + (f" (at {got.where})" if got.where else "")
    if got is None:
        return "returned None (a missing return statement?)"
    return difference(expected, got, exercise.parts, tolerance=exercise.tolerance)


def hint_for(exercise: Exercise, fn: Callable[..., Any], cases: list[Case], index: int,
             expected: Any, got: Any) -> str:
    """The mistake whose wrong implementation gives the reader's result, else a general hint."""
    if isinstance(got, Raised) and isinstance(got.error, OverflowError):
        return ("a number overflowed (math.exp of a large value?): subtract the largest "
                "value first")
    if isinstance(got, Raised) and "must match the size of tensor" in str(got.error):
        return ("the shapes don't line up: a sum or max along a dimension needs keepdim=True "
                "to broadcast back (and check which dimension you use)")
    if isinstance(got, Raised):
        return "your function stopped with an error: read the message and the line above"
    if got is None:
        return "every path through the function must return its result"
    matching = [m for m in exercise.mistakes if agrees(m.model, cases[index], got, exercise)]
    if len(matching) > 1:  # the one that agrees with the reader on the most cases
        theirs = [call(fn, case) for case in cases]
        return max(matching, key=lambda m: sum(
            agrees(m.model, case, their, exercise) for case, their in zip(cases, theirs)
            if not isinstance(their, Raised) and their is not None)).hint
    if matching:
        return matching[0].hint
    return general_hint(expected, got)


def agrees(model: Callable[..., Any], case: Case, got: Any, exercise: Exercise) -> bool:
    """Whether the wrong implementation ``model`` gives ``got`` on ``case``."""
    theirs = call(model, case)
    return not isinstance(theirs, Raised) and difference(
        theirs, got, exercise.parts, tolerance=exercise.tolerance) is None


def general_hint(expected: Any, got: Any) -> str:
    """A hint from what the result looks like, when no known mistake gives it."""
    if isinstance(expected, torch.Tensor) and isinstance(got, torch.Tensor):
        if tuple(got.shape) != tuple(expected.shape):
            return ("the shape differs: check which dimension you reduce or index over, and "
                    "keepdim=True where the result must broadcast back")
        if got.dtype != expected.dtype:
            return (f"the result is {got.dtype}, the expected {expected.dtype}: keep the "
                    f"input's dtype (torch.zeros_like(x), dtype=x.dtype), don't convert it")
        if got.is_floating_point() and expected.is_floating_point():
            finite = torch.isfinite(expected)
            if (~torch.isfinite(got) & finite).any():
                return ("your result has nan or inf where the expected is finite: a number "
                        "overflowed (exp of a large value?) or was divided by zero")
    elif isinstance(expected, float) and isinstance(got, float) and math.isfinite(expected) \
            and not math.isfinite(got):
        return "your result is nan or inf where the expected is finite: an overflow?"
    return ("no classic mistake gives this result: compare expected and got on this input, "
            "working it out by hand on the smallest case")


def failure_report(exercise: Exercise, case: Case, index: int, total: int, expected: Any,
                   got: Any, problem: str, hint: str) -> str:
    """The report of a failed case: its inputs, expected and got, what differs, the hint."""
    names = exercise.names or tuple(f"arg{i}" for i in range(len(case.args)))
    inputs = [f"{n} = {brief(v)}" for n, v in zip(names, case.args)]
    inputs += [f"{k} = {brief(v)}" for k, v in case.kwargs.items()]
    note = f" ({case.note})" if case.note else ""
    lines = [f"{exercise.id} (chapter {exercise.chapter}): not yet: case {index + 1} of "
             f"{total}{note}",
             "  input:    " + ", ".join(inputs)]
    if not isinstance(got, Raised):
        lines += [f"  expected: {brief(expected)}", f"  got:      {brief(got)}"]
    lines += [f"  problem:  {problem}", f"  hint:     {hint}"]
    return "\n".join(lines)
