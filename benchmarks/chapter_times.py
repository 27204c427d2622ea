"""How long each chapter takes to run, from the notebooks' own records: the README's table.

Every committed notebook was executed top to bottom, and Jupyter wrote into each code cell the
moments its execution started and ended. The sum over a notebook's cells is the time the
chapter took when it was committed, with the book's models already cached: ``make models``
(``python -m tinygpt.book.models``) trains them first, and its log (``--models-log``) gives
the time of each, which a reader's first run of chapters 8, 12, 14 and 15 adds once.

    python -m tinygpt.book.models | tee models.log    # from a cold cache
    (execute the chapters)
    python benchmarks/chapter_times.py --models-log models.log \
        --out benchmarks/results/chapter_times.json
    python benchmarks/chapter_times.py --readme   # rewrite README.md's tables from the record

The README's table (between ``<!-- chapter-times -->`` and ``<!-- /chapter-times -->``) is
written from the committed record; ``tests/test_bench_chapter_times.py`` checks that the record
agrees with the notebooks and the README with the record.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "benchmarks" / "results" / "chapter_times.json"
README = ROOT / "README.md"
BEGIN, END = "<!-- chapter-times -->", "<!-- /chapter-times -->"


def _moment(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


def recorded_seconds(notebook: Path) -> float:
    """The seconds a notebook's code cells took when it was last executed (their own records)."""
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    total = 0.0
    for cell in cells:
        moments = cell.get("metadata", {}).get("execution", {})
        start, end = moments.get("iopub.execute_input"), moments.get("shell.execute_reply")
        if cell["cell_type"] == "code" and start and end:
            total += (_moment(end) - _moment(start)).total_seconds()
    return total


def chapters() -> list[Path]:
    return sorted((ROOT / "chapters").glob("[0-9][0-9]_*.ipynb"))


def model_seconds(log: str) -> dict[str, float]:
    """The seconds of each step of ``make models``, from its log's ``== NAME: S s`` lines."""
    return {m.group(1): float(m.group(2))
            for m in re.finditer(r"^== (.+): (\d+) s$", log, re.M)}


def table(record: dict) -> str:
    """The README's tables of chapter and model times, from ``record``."""
    lines = ["| chapter | seconds, its models cached |", "|---|---:|"]
    lines += [f"| {name} | {row['recorded']:.0f} |" for name, row in record["chapters"].items()]
    lines += ["", "| made once by `make models` | seconds |", "|---|---:|"]
    lines += [f"| {name} | {seconds:.0f} |" for name, seconds in record["models"].items()]
    return "\n".join(lines)


def rewrite_readme(record: dict) -> None:
    text = README.read_text(encoding="utf-8")
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise SystemExit(f"error: README.md has no {BEGIN} ... {END} block to rewrite")
    README.write_text(pattern.sub(lambda _: f"{BEGIN}\n{table(record)}\n{END}", text),
                      encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models-log", type=Path, default=None,
                        help="the log of `python -m tinygpt.book.models` from a cold cache")
    parser.add_argument("--out", type=Path, default=None, help="write the record here (JSON)")
    parser.add_argument("--note", default=None,
                        help="what a reader of the record must know (a shared machine, say)")
    parser.add_argument("--readme", action="store_true",
                        help="rewrite README.md's table from the committed record")
    args = parser.parse_args()
    if args.readme:
        rewrite_readme(json.loads(RECORD.read_text(encoding="utf-8")))
        return
    record: dict = {"command": " ".join([Path(sys.executable).name, *sys.argv]),
                    "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, "
                               f"Python {platform.python_version()}",
                    "chapters": {}, "models": {}}
    for notebook in chapters():
        record["chapters"][notebook.stem] = {"recorded": round(recorded_seconds(notebook), 1)}
        print(notebook.stem, record["chapters"][notebook.stem])
    if args.models_log:
        record["models"] = model_seconds(args.models_log.read_text(encoding="utf-8"))
    if args.note:
        record["note"] = args.note
    if args.out:
        args.out.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
