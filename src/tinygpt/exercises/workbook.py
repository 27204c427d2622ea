"""The workbook: the whole book's exercises done in one Python file, and the reader's progress.

``load_functions("my_gpt.py")`` runs the reader's file (it is their own code: running it is what
checking it means) and returns the names it defines; ``progress`` checks each exercise's function
found there by its name (``merge``, ``softmax``, ``attention``, ...) and says, exercise by
exercise, "passed", "not yet" (with the reason: not implemented yet, or the hint) or "missing".
The file runs with ``__name__`` set to ``"tinygpt_workbook"``, so that a block under
``if __name__ == "__main__":`` does not run. ``tinygpt exercises --from my_gpt.py`` prints it.
"""

from __future__ import annotations

import contextlib
import io
import runpy
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tinygpt.exercises import EXERCISES
from tinygpt.exercises.grading import Exercise, grade


@dataclass(frozen=True)
class Progress:
    """One exercise's line: ``status`` is "passed", "not yet" or "missing"."""

    exercise: Exercise
    status: str
    detail: str = ""


def load_functions(path: str | Path) -> dict[str, Any]:
    """The names defined by running the reader's Python file at ``path``. A missing file, or an
    exception while the file runs, is a ``ValueError`` that says where."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such file (--from names your Python file of exercises)")
    try:
        return runpy.run_path(str(path), run_name="tinygpt_workbook")
    except (Exception, SystemExit) as error:  # the reader's code: say where it stopped
        frames = [f for f in traceback.extract_tb(error.__traceback__)
                  if Path(f.filename).resolve() == path.resolve()]
        line = f" at line {frames[-1].lineno}" if frames else ""
        raise ValueError(f"running {path} raised {type(error).__name__}{line}: {error}"
                         ) from None


def progress(namespace: dict[str, Any], ids: list[str] | None = None) -> list[Progress]:
    """Each exercise (those of ``ids``, or all) checked with the function ``namespace`` holds
    under its name; the checks' own reports are not printed."""
    rows = []
    for exercise_id in ids or list(EXERCISES):
        exercise = EXERCISES[exercise_id]
        fn = namespace.get(exercise.function)
        if fn is None:
            rows.append(Progress(exercise, "missing", f"define {exercise.signature}"))
            continue
        with contextlib.redirect_stdout(io.StringIO()):  # the reader's own prints
            result = grade(exercise, fn)
        if result.passed:
            rows.append(Progress(exercise, "passed"))
        elif result.status == "not implemented":
            rows.append(Progress(exercise, "not yet", "not implemented yet"))
        elif result.problem.startswith(("raised", "your")):  # the error says more than a hint
            rows.append(Progress(exercise, "not yet", result.problem))
        else:
            rows.append(Progress(exercise, "not yet", result.hint))
    return rows


def progress_table(rows: list[Progress]) -> str:
    """The rows as text: chapter, id, function, status and why, then a count."""
    width = max((len(r.exercise.id) for r in rows), default=0)
    lines = []
    for r in rows:
        line = f"  ch {r.exercise.chapter:>2}  {r.exercise.id:<{width}}  {r.status:<7}"
        lines.append((line + (f"  {r.detail}" if r.detail else "")).rstrip())
    passed = sum(r.status == "passed" for r in rows)
    missing = sum(r.status == "missing" for r in rows)
    lines.append(f"{passed} of {len(rows)} passed, {len(rows) - passed - missing} not yet, "
                 f"{missing} missing")
    return "\n".join(lines)
