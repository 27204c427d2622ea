"""`make book` on a busy machine: the whole build with CPU hogs running beside it, recorded.

A reader's laptop has a browser open; a shared machine runs other work. This script starts
``--hogs`` processes that each keep one core busy (a Python loop), runs ``make book`` beside
them, and records what happened: whether it passed, how long ``make models`` and each of its
steps took, how long each chapter took to execute (jupyter-cache's own record), and the load
sampled every 30 seconds. With an empty results cache (``--cold``: a new ``TINYGPT_CACHE``
folder and a new ``_build``), every model is trained and every chapter executed::

    python benchmarks/busy_build.py --cold --cache /tmp/cold-cache --hogs 1 \
        --out benchmarks/results/busy_build.json

It writes the record only when ``--out`` is given. The hogs are stopped however the build ends.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _machine import cpu_description

ROOT = Path(__file__).resolve().parents[1]
HOG = "while True:\n    pass\n"


def chapter_seconds(build: Path) -> dict[str, float]:
    """Each executed chapter's seconds, from the jupyter-cache databases of ``build``."""
    found: dict[str, float] = {}
    for db in sorted(build.glob(".jupyter_cache/*/global.db")):
        with sqlite3.connect(db) as connection:
            rows = connection.execute("SELECT uri, data FROM nbcache").fetchall()
        for uri, data in rows:
            seconds = json.loads(data or "{}").get("execution_seconds")
            if seconds is not None:
                found[Path(uri).stem] = round(float(seconds), 1)
    return dict(sorted(found.items()))


def results_entries(env: dict[str, str]) -> int:
    """How many entries the results cache holds (0: every model trains), found as
    ``tinygpt.data.cache_dir`` finds it."""
    if env.get("TINYGPT_CACHE"):
        base = Path(env["TINYGPT_CACHE"]).expanduser()
    else:
        base = Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tinygpt"
    folder = base / "results"
    return sum(1 for p in folder.iterdir() if not p.name.startswith(".")) if folder.is_dir() else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hogs", type=int, default=1, help="processes keeping a core busy")
    parser.add_argument("--cold", action="store_true",
                        help="a new, empty results cache and a new _build (every model trains)")
    parser.add_argument("--cache", help="with --cold: the new cache folder (must not exist), "
                        "kept for later runs (default: a new temporary folder)")
    parser.add_argument("--out", help="write the record here (JSON)")
    parser.add_argument("--log", help="keep the build's output here (default: a temporary file)")
    args = parser.parse_args()

    env = dict(os.environ)
    if args.cold:
        if args.cache:
            Path(args.cache).mkdir(parents=True)  # an error if it exists: it would not be cold
            env["TINYGPT_CACHE"] = str(Path(args.cache).resolve())
        else:
            env["TINYGPT_CACHE"] = tempfile.mkdtemp(prefix="tinygpt-cold-cache-")
        build = ROOT / "_build"
        if build.exists():
            build.rename(ROOT / f"_build.before-busy-build-{int(time.time())}")
    entries_before = results_entries(env)
    built_before = (ROOT / "_build" / ".jupyter_cache").is_dir()
    log_path = Path(args.log or tempfile.mkstemp(prefix="busy-build-", suffix=".log")[1])
    load: list[tuple[float, float]] = []
    done = threading.Event()
    start = time.perf_counter()

    def sample() -> None:
        while not done.is_set():
            load.append((round(time.perf_counter() - start), os.getloadavg()[0]))
            done.wait(30)

    hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(args.hogs)]
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        with open(log_path, "w", encoding="utf-8") as log:
            build_run = subprocess.run(["make", "book"], cwd=ROOT, env=env, stdout=log,
                                       stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
        done.set()
    seconds = time.perf_counter() - start
    text = log_path.read_text(encoding="utf-8", errors="replace")
    steps = {m.group(1): float(m.group(2)) for m in re.finditer(r"^== (.+): (\d+) s$", text, re.M)}
    total = re.search(r"the book's models and results are cached \((\d+) s\)", text)
    record = {
        "command": "python benchmarks/busy_build.py " + " ".join(sys.argv[1:]),
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()}, {cpu_description()}, "
                   f"Python {platform.python_version()}",
        "hogs": args.hogs,
        "cold": args.cold,
        "cache": env.get("TINYGPT_CACHE", "(the default)") if args.cold else "(the default)",
        "results_cache_entries_before": entries_before,
        "chapters_cached_before": built_before,
        "passed": build_run.returncode == 0,
        "returncode": build_run.returncode,
        "seconds": round(seconds),
        "models_seconds": int(total.group(1)) if total else None,
        "model_steps": steps,
        "chapters": chapter_seconds(ROOT / "_build"),
        "load_1min": load,
        "log_tail": text.splitlines()[-15:],
    }
    print(json.dumps({k: v for k, v in record.items() if k != "log_tail"}, indent=1))
    print(f"the build's output: {log_path}")
    if args.out:
        Path(args.out).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return build_run.returncode


if __name__ == "__main__":
    sys.exit(main())
