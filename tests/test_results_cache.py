"""The results cache's round for a JSON result (``tinygpt.book.results_cache.cached``) and its
lock: computed once, read after; computed again for another recipe; computed once by two
processes that ask for it together; never writing through a file it did not make."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tinygpt.book import results_cache
from tinygpt.runtime import one_thread

SRC = Path(__file__).resolve().parents[1] / "src"


@pytest.fixture
def cache(monkeypatch, tmp_path):
    monkeypatch.setenv("TINYGPT_CACHE", str(tmp_path))
    return tmp_path / "results"


def counting(calls: list[int], result: object):
    def compute() -> object:
        calls.append(1)
        return result

    return compute


def test_a_result_is_computed_once_then_read_as_json_reads_it(cache):
    calls: list[int] = []
    compute = counting(calls, {"pair": (1, 2), "loss": 1.5})
    first = results_cache.cached("a-test", "book.results_cache", {"n": (3,)}, compute)
    again = results_cache.cached("a-test", "book.results_cache", {"n": [3]}, compute)
    assert first == again == {"pair": [1, 2], "loss": 1.5} and len(calls) == 1
    assert [p.name.startswith("a-test-") for p in cache.glob("*.json")] == [True]


def test_another_recipe_or_name_is_computed_again(cache):
    calls: list[int] = []
    compute = counting(calls, [1])
    results_cache.cached("a-test", "book.results_cache", {"n": 1}, compute)
    results_cache.cached("a-test", "book.results_cache", {"n": 2}, compute)
    results_cache.cached("b-test", "book.results_cache", {"n": 1}, compute)
    results_cache.cached("a-test", "book.results_cache", {"n": 1}, compute)
    assert len(calls) == 3


def test_an_entry_of_another_recipe_under_the_key_is_not_used(cache):
    calls: list[int] = []
    results_cache.cached("a-test", "book.results_cache", {"n": 1}, counting(calls, "first"))
    [entry] = cache.glob("a-test-*.json")
    results_cache.write_json(entry, {"recipe": {"n": 99}, "result": "foreign"})
    got = results_cache.cached("a-test", "book.results_cache", {"n": 1}, counting(calls, "new"))
    assert got == "new" and len(calls) == 2


@pytest.mark.parametrize("name", ["", "A-test", "a/b", "../a", "a--b", "a-", 7])
def test_a_name_that_is_not_a_plain_word_is_refused(cache, name):
    with pytest.raises(ValueError, match="name must be"):
        results_cache.cached(name, "book.results_cache", {}, lambda: 1)


def test_a_recipe_that_is_not_json_and_an_unknown_module_are_refused(cache):
    with pytest.raises(TypeError, match="JSON-able"):
        results_cache.cached("a-test", "book.results_cache", {"x": object()}, lambda: 1)
    with pytest.raises(ValueError, match="module must name"):
        results_cache.cached("a-test", "no.such_module", {}, lambda: 1)
    with pytest.raises(TypeError, match="compute must be"):
        results_cache.cached("a-test", "book.results_cache", {}, 7)


def test_a_link_in_the_lock_files_place_is_not_written_through(cache, tmp_path):
    digest = results_cache.key("book.results_cache", {})[:20]
    path = results_cache.folder() / f"a-test-{digest}.json"
    cache.mkdir(parents=True)
    foreign = tmp_path / "not-ours.txt"
    foreign.write_text("keep me")
    results_cache.lock_path(path).symlink_to(foreign)
    with results_cache.lock(path) as held:
        assert held is False
    calls: list[int] = []
    results_cache.cached("a-test", "book.results_cache", {}, counting(calls, 1))
    assert foreign.read_text() == "keep me" and results_cache.lock_path(path).is_symlink()


def test_an_unwritable_cache_computes_without_the_lock(monkeypatch, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("TINYGPT_CACHE", str(blocker))
    calls: list[int] = []
    with pytest.warns(UserWarning, match="cannot cache"):
        assert results_cache.cached("a-test", "book.results_cache", {}, counting(calls, 5)) == 5
    assert blocker.read_text() == "not a folder"


ASKER = """
import json, os, sys
from tinygpt.book import results_cache

def compute():
    with open(sys.argv[1], "a") as log:
        log.write(f"{os.getpid()}\\n")
    print("computing", flush=True)
    sys.stdin.readline()  # until the test lets it finish
    return {"by": os.getpid()}

results_cache.key("book.results_cache", {"n": 1})  # torch imported: the next call is quick
print("asking", flush=True)
got = results_cache.cached("two-processes", "book.results_cache", {"n": 1}, compute)
print(json.dumps(got), flush=True)
"""


def test_two_processes_asking_together_compute_once(cache, tmp_path):
    pytest.importorskip("fcntl")
    log = tmp_path / "computed-by.txt"
    env = {**os.environ, "PYTHONPATH": str(SRC), "TINYGPT_CACHE": str(tmp_path)}

    def start() -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-c", ASKER, str(log)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    first = start()
    second = None
    try:
        assert first.stdout.readline().strip() == "asking"
        assert first.stdout.readline().strip() == "computing"
        second = start()
        assert second.stdout.readline().strip() == "asking"
        waited = time.monotonic() + 1.0  # time for a second process without the lock to compute
        while time.monotonic() < waited and len(log.read_text().split()) < 2:
            time.sleep(0.05)
        first_out, _ = first.communicate("\n", timeout=60)
        second_out, _ = second.communicate("\n", timeout=60)  # a newline, should it compute
    finally:
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.kill()
    assert log.read_text().split() == [str(first.pid)]
    assert json.loads(first_out) == json.loads(second_out.splitlines()[-1]) == {"by": first.pid}


def test_one_thread_runs_the_block_on_one_and_restores_the_count_after_an_error():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with pytest.raises(RuntimeError, match="inside"), one_thread():
            assert torch.get_num_threads() == 1
            raise RuntimeError("inside")
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def entry_name(name: str, i: int, json_file: bool = True) -> str:
    return f"{name}-{i:020x}" + (".json" if json_file else "")


def test_prune_keeps_the_newest_entries_of_the_name_and_touches_nothing_else(cache):
    """Each rebuild with new source added an entry per cached result, kept forever."""
    cache.mkdir(parents=True)
    for i in range(7):  # entry 6 is the newest
        (cache / entry_name("chat-sft", i)).write_text("{}")
        os.utime(cache / entry_name("chat-sft", i), (1000 + i, 1000 + i))
    others = [cache / entry_name("chat-dpo", 1), cache / entry_name("chat-sft", 1, False),
              cache / "notes-of-mine.json", cache / "chat-sft-mine.json"]
    for other in others:
        other.write_text("a file this cache did not write, or of another name")
    os.utime(cache / entry_name("chat-sft", 1, False), (1, 1))
    current = cache / entry_name("chat-sft", 3)
    removed = results_cache.prune(current, keep=3)
    left = sorted(p.name for p in cache.iterdir() if p.name.startswith("chat-sft-0"))
    assert left == sorted([entry_name("chat-sft", i) for i in (3, 5, 6)]
                          + [entry_name("chat-sft", 1, False)])
    assert sorted(p.name for p in removed) == sorted(entry_name("chat-sft", i)
                                                     for i in (0, 1, 2, 4))
    assert all(other.exists() for other in others)


def test_prune_leaves_an_entry_another_process_holds(cache):
    cache.mkdir(parents=True)
    held, current = cache / entry_name("ladder", 1), cache / entry_name("ladder", 2)
    held.write_text("{}")
    current.write_text("{}")
    with results_cache.lock(held):
        assert results_cache.prune(current, keep=1) == [] and held.exists()
    assert results_cache.prune(current, keep=1) == [held] and not held.exists()


def test_a_cached_result_prunes_the_older_keys_of_its_name(cache, monkeypatch):
    for version in range(results_cache.KEEP + 2):  # a new source digest each time
        monkeypatch.setattr(results_cache, "source_digest", lambda module, v=version: str(v))
        results_cache.cached("chat-sft", "book.ladder", {"n": 1}, lambda v=version: v)
        time.sleep(0.01)
    assert len(list(cache.glob("chat-sft-*.json"))) == results_cache.KEEP


def test_store_folder_keeps_one_copy_not_one_per_interrupted_save(cache):
    """Three killed saves of the chat model left three full copies beside the entry."""
    cache.mkdir(parents=True)
    path = cache / entry_name("chat-model", 9, False)
    for i in range(3):
        left = path.with_name(f".{path.name}.tmp-0000000{i}")
        left.mkdir()
        (left / "model.safetensors").write_bytes(b"half")

    def save(tmp: Path) -> None:
        tmp.mkdir()
        (tmp / "model.safetensors").write_bytes(b"whole")

    assert results_cache.store_folder(path, save, "the chat model")
    assert sorted(p.name for p in cache.iterdir() if not p.name.endswith(".lock")) == [path.name]
    assert (path / "model.safetensors").read_bytes() == b"whole"


def test_store_folder_warns_when_it_cannot_cache(cache):
    """It used to fine-tune again on every call without a word."""
    cache.mkdir(parents=True)
    path = cache / entry_name("chat-model", 9, False)

    def full_disk(tmp: Path) -> None:
        tmp.mkdir()
        raise OSError(28, "No space left on device")

    with pytest.warns(UserWarning, match=r"could not cache the chat model in .*chat-model-.*No "
                      r"space left on device"):
        assert not results_cache.store_folder(path, full_disk, "the chat model")
    assert list(cache.iterdir()) == []


def test_a_dangling_link_in_the_cache_is_named_not_errno_17(cache, tmp_path):
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.symlink_to(tmp_path / "nowhere")  # results/ -> a folder that is gone
    with pytest.warns(UserWarning) as caught:
        assert results_cache.cached("a-test", "book.ladder", {"n": 1}, lambda: 3) == 3
    message = " ".join(str(w.message) for w in caught)
    assert f"{cache} is a link to {tmp_path / 'nowhere'}, which does not exist" in message
    assert "Errno 17" not in message and "File exists" not in message
    assert not (tmp_path / "nowhere").exists()
