"""Grading one exercise: run the reader's function on every case, compare it with the reference,
and write a short report with a hint.

An ``Exercise`` holds the reference (the package's own function, or torch's), its cases (fixed
ones, then seeded random ones: the same every run) and its known ``Mistake`` s, each a small
wrong implementation. ``grade`` computes every expected result first, then calls the reader's
function (through ``running.run``: on copies of the inputs, with a time limit, torch's functions
put back if replaced) case by case; the first case whose result differs from the reference's, or
whose inputs the function changed in place where a new value is asked for, fails the check. The
hint names a mistake only when that mistake's implementation gives the reader's results on
every case (an error on a case counts as a result: the same kind and message); otherwise it
says what differs, concretely (``comparison.what_differs``). A function that returns ``None``
on the first case, or raises ``NotImplementedError``, is "not implemented yet"; any other
exception, ``sys.exit()`` included, is reported with the line of the reader's code that raised
it, never as a traceback.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from tinygpt.exercises.comparison import brief, difference, what_differs
from tinygpt.exercises.running import Raised, Run, TookTooLong, restore, run, safe_repr


@dataclass(frozen=True)
class Case:
    """One call: ``fn(*args, **kwargs)``, with a few words on what the case tests."""

    args: tuple
    kwargs: dict[str, Any] = field(default_factory=dict)
    note: str = ""
    tolerance: dict[torch.dtype, tuple[float, float]] = field(default_factory=dict)


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
    rtol, atol) loosens ``comparison.TOLERANCE`` where a correct formula may round more (a
    case's own ``tolerance`` loosens it for that case); ``may_change`` names the inputs the
    function may change in place (all others must stay as given); ``describe(case, expected,
    got)`` may say what differs in the exercise's terms ("rows sum to 1.33, not 1")."""

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
    may_change: tuple[str, ...] = ()
    describe: Callable[[Case, Any, Any], str | None] | None = None


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


def call(fn: Callable[..., Any], case: Case) -> Any:
    """A trusted function (a reference or a known mistake) on a copy of the case's inputs; an
    exception comes back as ``Raised``."""
    args, kwargs = copy.deepcopy(case.args), copy.deepcopy(case.kwargs)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return fn(*args, **kwargs)
    except Exception as error:  # a mistake's model may raise as the reader's code does
        return Raised(error, "")


def is_stub(got: Any) -> bool:
    """A result that says "not written yet": ``None`` or ``NotImplementedError``."""
    return got is None or (isinstance(got, Raised)
                           and isinstance(got.error, NotImplementedError))


def grade(exercise: Exercise, fn: object, time_limit: float | None = None) -> Result:
    """Run ``fn`` on every case of ``exercise`` and report how it did; ``time_limit`` is the
    most seconds one call may take (``running.TIME_LIMIT`` by default)."""
    head = f"{exercise.id} (chapter {exercise.chapter}): "
    if not callable(fn):
        return Result(exercise.id, "failed", f"{head}check needs a function, "
                      f"{exercise.signature}; got {brief(fn)}")
    replaced = restore()  # torch's own functions, before any reference runs
    if replaced:
        return Result(exercise.id, "failed", f"{head}{', '.join(replaced)} had been replaced "
                      "(by your file or notebook) since tinygpt.exercises was imported; the "
                      "check needs the originals: it put them back. Run the check again.",
                      "don't replace torch's or the package's functions", problem="replaced "
                      + ", ".join(replaced))
    cases = exercise.cases()
    expected = [exercise.reference(*copy.deepcopy(c.args), **copy.deepcopy(c.kwargs))
                for c in cases]  # all of them before the reader's code runs
    runs: list[Run] = []
    for i, case in enumerate(cases):
        runs.append(run(fn, case.args, case.kwargs, exercise.names, time_limit))
        got = runs[-1].value
        if i == 0 and is_stub(got):
            return Result(exercise.id, "not implemented", f"{head}not implemented yet. Write "
                          f"{exercise.signature}: {exercise.task}; then run the check again.")
        problem = problem_with(expected[i], runs[-1], exercise, case)
        if problem is not None:
            hint = hint_for(exercise, fn, cases, expected, runs, time_limit)
            return Result(exercise.id, "failed", failure_report(
                exercise, case, i, len(cases), expected[i], got, problem, hint), hint,
                len(cases), problem)
    return Result(exercise.id, "passed", f"{head}passed all {len(cases)} cases.",
                  cases=len(cases))


def problem_with(expected: Any, outcome: Run, exercise: Exercise, case: Case) -> str | None:
    """What is wrong with the reader's call ``outcome``, or None if it is right."""
    got = outcome.value
    if outcome.replaced:
        return (f"your code replaced {', '.join(outcome.replaced)} (the check put the "
                "original back)")
    if isinstance(got, Raised):
        if isinstance(got.error, SystemExit):
            return (f"raised SystemExit: your code called sys.exit({safe_repr(got.error.code)})"
                    + (f" (at {got.where})" if got.where else ""))
        if isinstance(got.error, TookTooLong):
            return f"your function {got}: stopped"
        return f"raised {got.kind}: {got}" + (f" (at {got.where})" if got.where else "")
    if got is None:
        return "returned None (a missing return statement?)"
    found = compared(expected, got, exercise, case)
    if found is None:
        changed = [n for n in outcome.changed if n not in exercise.may_change]
        if changed:
            return (f"changed its input {', '.join(changed)} in place; the task asks for a "
                    "new value and the caller's input must stay as it was")
    return found


def compared(expected: Any, got: Any, exercise: Exercise, case: Case) -> str | None:
    """``difference`` of the reader's ``got``, which may be an object that cannot be compared."""
    tolerance = {**exercise.tolerance, **case.tolerance}
    try:
        return difference(expected, got, exercise.parts, tolerance=tolerance)
    except Exception as error:  # the reader's object: its == or len may raise
        return (f"your result, {brief(got)}, cannot be compared with the expected "
                f"{type(expected).__name__}: {type(error).__name__}")


def hint_for(exercise: Exercise, fn: Callable[..., Any], cases: list[Case],
             expected: list[Any], runs: list[Run], time_limit: float | None) -> str:
    """The mistake whose implementation gives the reader's results on every case, else what
    differs on the first failing case. ``runs`` holds the reader's calls up to that case; the
    others are made here."""
    index, last = len(runs) - 1, runs[-1]
    got = last.value
    if last.replaced:
        return ("compute with your own code: the check compares with torch's functions, so "
                "it puts back any you replace")
    if isinstance(got, Raised) and isinstance(got.error, SystemExit):
        return "a function returns its result: don't end the program (sys.exit) from it"
    if isinstance(got, Raised) and isinstance(got.error, TookTooLong):
        return "an endless loop? every case is small: each should take well under a second"
    theirs = [r.value for r in runs] + [
        run(fn, c.args, c.kwargs, exercise.names, time_limit).value for c in cases[index + 1:]]
    for mistake in exercise.mistakes:
        if all(agrees(mistake.model, case, their, exercise) for case, their in zip(cases, theirs)):
            return mistake.hint
    wrong = sum(compared(e, t, exercise, c) is not None or isinstance(t, Raised)
                for e, t, c in zip(expected, theirs, cases))
    tally = f" (wrong on {wrong} of {len(cases)} cases)"
    if isinstance(got, Raised) and isinstance(got.error, OverflowError):
        return ("a number overflowed (math.exp of a large value?): subtract the largest "
                "value first" + tally)
    if isinstance(got, Raised) and "must match the size of tensor" in str(got):
        return ("the shapes don't line up: a sum or max along a dimension needs keepdim=True "
                "to broadcast back (and check which dimension you use)" + tally)
    if isinstance(got, Raised):
        return "your function stopped with an error: read the message and the line above"
    changed = [n for n in last.changed if n not in exercise.may_change]
    if changed and compared(expected[index], got, exercise, cases[index]) is None:
        return (f"leave {', '.join(changed)} as given: build the result in a new object "
                "(or work on a copy), don't edit the caller's")
    try:
        observed = (exercise.describe(cases[index], expected[index], got) if exercise.describe
                    and isinstance(got, torch.Tensor) else None) or what_differs(
            expected[index], got, exercise.parts)
    except Exception:  # the reader's object: it may refuse anything asked of it
        observed = compared(expected[index], got, exercise, cases[index]) or "it differs"
    return observed + tally


def agrees(model: Callable[..., Any], case: Case, got: Any, exercise: Exercise) -> bool:
    """Whether the wrong implementation ``model`` gives ``got`` on ``case``: the same value,
    or the same kind of error with the same message."""
    theirs = call(model, case)
    if isinstance(theirs, Raised) or isinstance(got, Raised):
        return (isinstance(theirs, Raised) and isinstance(got, Raised)
                and type(theirs.error) is type(got.error) and str(theirs) == str(got))
    if got is None:
        return False
    try:
        return difference(theirs, got, exercise.parts, tolerance={
            **exercise.tolerance, **case.tolerance}) is None
    except Exception:  # the reader's object cannot be compared: no mistake gives it
        return False


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
