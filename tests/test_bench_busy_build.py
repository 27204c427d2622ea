"""benchmarks/busy_build.py: a build's chapter times are read from jupyter-cache's own records,
and a cold build is one whose results cache holds nothing."""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from jupyter_cache import get_cache
from jupyter_cache.base import CacheBundleIn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import busy_build


def executed(source: str) -> nbformat.NotebookNode:
    notebook = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell(source, execution_count=1)
    notebook.cells.append(cell)
    return notebook


def test_the_chapter_seconds_are_jupyter_caches_own_records(tmp_path):
    cache = get_cache(tmp_path / "_build" / ".jupyter_cache" / "0123456789abcdef")
    for name, seconds in (("08_training", 261.25), ("12_modern", 301.0)):
        cache.cache_notebook_bundle(CacheBundleIn(
            executed(f"print({name!r})"), f"/book/chapters/{name}.ipynb",
            data={"execution_seconds": seconds}))
    cache.cache_notebook_bundle(CacheBundleIn(executed("1"), "/book/chapters/x.ipynb"))  # no time
    assert busy_build.chapter_seconds(tmp_path / "_build") == {
        "08_training": 261.2, "12_modern": 301.0}
    assert busy_build.chapter_seconds(tmp_path / "nothing") == {}


def test_a_cold_cache_holds_no_entry(tmp_path):
    env = {"TINYGPT_CACHE": str(tmp_path / "cache")}
    assert busy_build.results_entries(env) == 0  # no folder yet
    results = tmp_path / "cache" / "results"
    results.mkdir(parents=True)
    (results / ".book-model-0123.lock").write_text("")  # a lock is not an entry
    assert busy_build.results_entries(env) == 0
    (results / "book-model-0123").mkdir()
    (results / "choice-ladder-4567.json").write_text("{}")
    assert busy_build.results_entries(env) == 2
    xdg = {"XDG_CACHE_HOME": str(tmp_path / "xdg")}
    (tmp_path / "xdg" / "tinygpt" / "results" / "one-89ab.json").parent.mkdir(parents=True)
    (tmp_path / "xdg" / "tinygpt" / "results" / "one-89ab.json").write_text("{}")
    assert busy_build.results_entries(xdg) == 1
