"""``tinygpt exercises``: the book's graded exercises, and a reader's progress through them
(``--from my_gpt.py``); the checking itself is ``tinygpt.exercises``."""

from __future__ import annotations

import argparse
import sys
from typing import Any

DESCRIPTION = """\
List the book's graded exercises, or check your own implementations of them.

With --from FILE, tinygpt RUNS YOUR PYTHON FILE (it is your code: it executes as any script
would, with __name__ set to "tinygpt_workbook"), then checks each function it defines under an
exercise's name (merge, softmax, attention, ...) and prints passed, not yet (with a hint) or
missing. Name exercise ids to see their full reports."""

EPILOG = """\
examples:
  tinygpt exercises                             the exercises, chapter by chapter
  tinygpt exercises --from my_gpt.py            your progress
  tinygpt exercises --from my_gpt.py softmax    the full report of one exercise
"""


def add_exercises(commands: Any, add_option: Any) -> None:
    """Add the ``exercises`` command to the ``tinygpt`` parser's ``commands``."""
    parser = commands.add_parser(
        "exercises", help="list the graded exercises, or check yours (--from FILE)",
        description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("ids", nargs="*", metavar="ID",
                        help="exercises (ids, or their functions' names) to show in full "
                        "(default: all, one line each)")
    add_option(parser, "--from", "your Python file of exercise functions; it is run (it is "
               "your code) and its functions are checked", shown="none: list the exercises",
               dest="source", metavar="FILE")
    add_option(parser, "--chapter", "only this chapter's exercises", shown="all", type=int,
               metavar="N")
    parser.set_defaults(run=run_exercises)


def run_exercises(args: argparse.Namespace, argv: list[str]) -> int:
    """``tinygpt exercises``: the list, or the progress of ``--from``'s functions."""
    from tinygpt.exercises import EXERCISES, exercise, result
    from tinygpt.exercises.running import restore
    from tinygpt.exercises.workbook import load_functions, progress, progress_table

    by_function = {e.function: e.id for e in EXERCISES.values()}  # `attention` for
    ids = [exercise(by_function.get(i, i)).id for i in args.ids] or [  # causal_attention
        e.id for e in EXERCISES.values() if args.chapter in (None, e.chapter)]
    if not ids:
        raise ValueError(f"no exercises in chapter {args.chapter}; the chapters are "
                         f"{sorted({e.chapter for e in EXERCISES.values()})}")
    if args.source is None:
        for i in ids:
            e = EXERCISES[i]
            print(f"ch {e.chapter:>2}  {e.id}\n        {e.signature}\n        {e.task}")
        print(f"{len(ids)} exercises; check yours with: tinygpt exercises --from my_gpt.py")
        return 0
    namespace = load_functions(args.source)
    replaced = restore()  # what the file replaced at its top level, put back before any check
    if replaced:
        print(f"note: {args.source} replaced {', '.join(replaced)}; the checks need the "
              "originals: they were put back", file=sys.stderr)
    if args.ids:
        for i in ids:
            fn = namespace.get(EXERCISES[i].function)
            print(result(i, fn).report if fn is not None else
                  f"{i}: missing: define {EXERCISES[i].signature} in {args.source}")
        return 0
    print(progress_table(progress(namespace, ids)))
    return 0
