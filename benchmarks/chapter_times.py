"""How long each chapter takes to run, from the notebooks' own records: the README's table.

Every committed notebook was executed top to bottom, and Jupyter wrote into each code cell the
moments its execution started and ended. The sum over a notebook's cells is the time the
chapter took when it was committed: for chapters 8, 12, 14 and 15 that run trained the book's
cached models from a cold cache (the *first* run of a reader's). ``--warm`` runs those chapters
again, into a scratch folder, with their models now cached: the time of every later run.

    python benchmarks/chapter_times.py            # print the table from the committed notebooks
    python benchmarks/chapter_times.py --warm --out benchmarks/results/chapter_times.json
    python benchmarks/chapter_times.py --readme   # rewrite README.md's table from the record

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
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "benchmarks" / "results" / "chapter_times.json"
README = ROOT / "README.md"
TRAINING = ("08_training", "12_modern", "14_finetuning", "15_chat")  # train cached models
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


def warm_seconds(notebook: Path) -> float:
    """Execute ``notebook`` into a scratch copy (its models cached by now) and time it."""
    with tempfile.TemporaryDirectory() as scratch:
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook",
                        "--execute", "--ExecutePreprocessor.timeout=-1", "--output-dir",
                        scratch, str(notebook)], check=True, capture_output=True)
        return time.perf_counter() - start


def table(record: dict) -> str:
    """The README's table of chapter times, from ``record``."""
    lines = ["| chapter | first run (s) | later runs (s) |", "|---|---:|---:|"]
    for name, row in record["chapters"].items():
        warm = f"{row['warm']:.0f}" if "warm" in row else "same"
        lines.append(f"| {name} | {row['recorded']:.0f} | {warm} |")
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
    parser.add_argument("--warm", action="store_true",
                        help="also run the chapters that train, with their models cached")
    parser.add_argument("--out", type=Path, default=None, help="write the record here (JSON)")
    parser.add_argument("--readme", action="store_true",
                        help="rewrite README.md's table from the committed record")
    args = parser.parse_args()
    if args.readme:
        rewrite_readme(json.loads(RECORD.read_text(encoding="utf-8")))
        return
    record: dict = {"command": " ".join([Path(sys.executable).name, *sys.argv]),
                    "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, "
                               f"Python {platform.python_version()}",
                    "load_before": round(os.getloadavg()[0], 2), "chapters": {}}
    for notebook in chapters():
        row = {"recorded": round(recorded_seconds(notebook), 1)}
        if args.warm and notebook.stem in TRAINING:
            row["warm"] = round(warm_seconds(notebook), 1)
        record["chapters"][notebook.stem] = row
        print(notebook.stem, row)
    record["load_after"] = round(os.getloadavg()[0], 2)
    if args.out:
        args.out.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
