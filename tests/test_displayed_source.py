"""The package's code a chapter displays (``show.source``) is the code the package has now.

A chapter shows a function by printing it from the package when the chapter runs, headed by its
file and lines (``tinygpt/train.py, lines 120–141``). The committed notebook keeps that output,
so after an edit to the package it would show old code until the chapter runs again. This test
reads every such output in the committed chapters and requires each displayed line to be, in
order, in the named file between the named lines: stale code or stale line numbers fail it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "chapters").rglob("*.ipynb"))
HEADER = re.compile(r"`(?P<path>tinygpt/[\w/]+\.py)`, lines (?P<first>\d+)\u2013(?P<last>\d+)\n")
BLOCK = re.compile(r"^(?P<fence>`{3,})python\n(?P<code>.*?)\n(?P=fence)\n", re.DOTALL | re.M)


def displayed_sources(path: Path) -> list[tuple[int, str, int, int, str]]:
    """(cell index, file, first line, last line, code) of each show.source output."""
    found = []
    for index, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
        for output in cell.get("outputs", []):
            text = output.get("data", {}).get("text/markdown")
            if text is None:
                continue
            text = "".join(text) if isinstance(text, list) else text
            header, block = HEADER.search(text), BLOCK.search(text)
            if header and block:
                first, last = int(header["first"]), int(header["last"])
                found.append((index, header["path"], first, last, block["code"]))
    return found


def is_in_order(shown: list[str], lines: list[str]) -> bool:
    """Whether every shown line (the "    ..." separators of members= aside) appears in
    ``lines``, in the same order."""
    rest = iter(lines)
    return all(
        any(line == candidate for candidate in rest) for line in shown if line.strip() != "..."
    )


def test_there_are_displayed_sources():
    assert sum(len(displayed_sources(path)) for path in NOTEBOOKS) > 50


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_displayed_source_is_the_package_now(path):
    stale = []
    for index, file, first, last, code in displayed_sources(path):
        lines = (ROOT / "src" / file).read_text(encoding="utf-8").splitlines()[first - 1 : last]
        if not is_in_order(code.splitlines(), lines):
            stale.append(f"cell {index}: {file}, lines {first}-{last}")
    message = f"{path.name} shows code the package no longer has there (run it again):\n"
    assert not stale, message + "\n".join(stale)


def test_a_changed_line_is_caught():
    lines = ["def f(x):", "    return x + 1"]
    assert is_in_order(["def f(x):", "    ...", "    return x + 1"], lines)
    assert not is_in_order(["def f(x):", "    return x + 2"], lines)
    assert not is_in_order(["    return x + 1", "def f(x):"], lines)
