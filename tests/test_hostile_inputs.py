"""Hostile or stray inputs to the files tinygpt reads and writes (checkpoint folders, shards,
prepare's folders): links, devices and FIFOs where tinygpt expects its own files, edited
manifests, another tokenizer's shards, deeply nested JSON. Each is refused with one clear line
naming the file or option, and nothing that tinygpt did not write is changed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import rewrite_shards_manifest as edit_manifest
from conftest import run_cli as run

TEXT = "".join(f"{w} the {v} was {n} and more zebra.\n" for w, v, n in zip(
    ["first", "second", "third", "fourth", "fifth", "sixth"] * 5,
    ["cat", "dog", "fox", "owl", "ant", "bee"] * 5, range(30)))
TINY = ["--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "16",
        "--batch-size", "2", "--max-iters", "5", "--eval-interval", "5", "--eval-iters", "1",
        "--quiet"]


@pytest.fixture
def data(tmp_path: Path) -> Path:
    path = tmp_path / "small.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


def assert_refused(code: int, err: str, *words: str) -> None:
    assert code == 2 and err.startswith("tinygpt: error: ") and err.count("\n") == 1, err
    for word in words:
        assert word in err, (word, err)


# --- the lock file of a checkpoint folder ---------------------------------------------------------

@pytest.mark.parametrize("resume", [False, True])
@pytest.mark.parametrize("kind", ["symlink", "hardlink"])
def test_a_lock_file_that_is_a_link_is_refused_and_its_target_kept(capsys, data, tmp_path,
                                                                   resume, kind):
    out = tmp_path / "run"
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    if resume:
        assert run(capsys, "train", "--data", data, "--out", out, *TINY)[0] == 0
        (out / ".tinygpt.lock").unlink()
    else:
        out.mkdir()
    if kind == "symlink":
        (out / ".tinygpt.lock").symlink_to("../victim.txt")
    else:
        os.link(victim, out / ".tinygpt.lock")
    extra = ["--resume", "--max-iters", "8"] if resume else []
    code, _, err = run(capsys, "train", "--data", data, "--out", out, *TINY, *extra)
    assert_refused(code, err, ".tinygpt.lock", "link")
    assert victim.read_text() == "precious\n"


def test_a_lock_file_that_is_a_fifo_is_refused(capsys, data, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    os.mkfifo(out / ".tinygpt.lock")
    code, _, err = run(capsys, "train", "--data", data, "--out", out, *TINY)
    assert_refused(code, err, ".tinygpt.lock", "not a regular file")


# --- resuming on another tokenizer's shards -------------------------------------------------------

def prepare_cli(capsys, text: str, out: Path, *options: object) -> None:
    folder = out.parent / f"{out.name}-in"
    folder.mkdir()
    for i in range(4):  # four documents, one held out
        (folder / f"doc{i}.txt").write_text(text, encoding="utf-8")
    code, _, err = run(capsys, "prepare", folder, "--out", out, "--val-fraction", "0.3",
                       "--seed", "1", "--workers", "1", "--quiet", *options)
    assert code == 0, err


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_resume_refuses_shards_of_another_tokenizer_of_the_same_type_and_size(capsys, tmp_path,
                                                                             kind):
    from tinygpt.shards import load_shards_tokenizer

    options = ["--tokenizer", kind] + (["--vocab-size", "300"] if kind == "bpe" else [])
    other = TEXT.replace("z", "#") if kind == "char" else TEXT.upper()
    prepare_cli(capsys, TEXT, tmp_path / "mine", *options)
    prepare_cli(capsys, other, tmp_path / "theirs", *options)
    mine = load_shards_tokenizer(tmp_path / "mine")
    theirs = load_shards_tokenizer(tmp_path / "theirs")
    assert (type(mine), mine.vocab_size) == (type(theirs), theirs.vocab_size)
    out = tmp_path / "run"
    assert run(capsys, "train", "--data", tmp_path / "mine", "--out", out, *TINY)[0] == 0
    code, _, err = run(capsys, "train", "--data", tmp_path / "theirs", "--out", out, *TINY,
                       "--resume", "--max-iters", "8")
    assert_refused(code, err, "another of the same size", str(tmp_path / "theirs"))
    assert run(capsys, "train", "--data", tmp_path / "mine", "--out", out, *TINY,
               "--resume", "--max-iters", "8")[0] == 0


def test_the_api_refuses_to_resume_with_another_tokenizer(tmp_path):
    import torch

    from tinygpt.config import GPTConfig, TrainConfig
    from tinygpt.tokenizer import CharTokenizer
    from tinygpt.train import train

    model = GPTConfig(vocab_size=4, block_size=4, n_layer=1, n_head=1, n_embd=8)
    cfg = TrainConfig(batch_size=2, max_iters=4, eval_interval=2, eval_iters=1, warmup_iters=1)
    ids = torch.arange(40) % 4
    train(model, cfg, ids, ids, out_dir=tmp_path, tokenizer=CharTokenizer("abcd"),
          progress=False, callback=lambda record, _: record["step"] >= 2)
    with pytest.raises(ValueError, match="another tokenizer"):
        train(model, cfg, ids, ids, out_dir=tmp_path, tokenizer=CharTokenizer("abce"),
              progress=False, resume=True)
    train(model, cfg, ids, ids, out_dir=tmp_path, tokenizer=CharTokenizer("abcd"),
          progress=False, resume=True)


# --- what a shards manifest names -----------------------------------------------------------------

def char_shards(capsys, tmp_path: Path) -> Path:
    prepare_cli(capsys, TEXT, tmp_path / "shards", "--tokenizer", "char")
    return tmp_path / "shards"


def bpe_shards(capsys, tmp_path: Path) -> Path:
    prepare_cli(capsys, TEXT, tmp_path / "shards", "--tokenizer", "bpe", "--vocab-size", "300")
    return tmp_path / "shards"


def train_in_thread(capsys, *argv: object) -> tuple[int, str, str]:
    """``tinygpt train ARGV`` in a thread: a read that hangs fails the test instead of blocking."""
    import threading

    result: list = []
    worker = threading.Thread(target=lambda: result.append(run(capsys, "train", *argv)),
                              daemon=True)
    worker.start()
    worker.join(timeout=120)
    assert result, "training hung"
    return result[0]


@pytest.mark.parametrize("name", ["../outside_secret.bin", "ABSOLUTE", "sub/train_000000.bin",
                                  "train_000000.bin/..", 7])
def test_a_shard_named_outside_the_folder_is_refused(capsys, tmp_path, name):
    import shutil

    shards = char_shards(capsys, tmp_path)
    secret = tmp_path / "outside_secret.bin"
    shutil.copy(shards / "train_000000.bin", secret)
    (shards / "sub").mkdir()
    shutil.copy(shards / "train_000000.bin", shards / "sub" / "train_000000.bin")
    name = str(secret) if name == "ABSOLUTE" else name
    edit_manifest(shards, lambda m: m["shards"]["train"][0].update(file=name))
    code, _, err = run(capsys, "train", "--data", shards, "--out", tmp_path / "run", *TINY)
    assert_refused(code, err, "shards.json", repr(name) if isinstance(name, str) else "'file'")


@pytest.mark.parametrize("kind", ["dev-zero", "fifo", "symlink"])
@pytest.mark.parametrize("which", ["train_000000.bin", "tokenizer.json"])
def test_a_shard_or_tokenizer_that_is_not_a_regular_file_is_refused(capsys, tmp_path, kind,
                                                                    which):
    shards = bpe_shards(capsys, tmp_path)
    target = shards / which
    (tmp_path / "copy").write_bytes(target.read_bytes())
    target.unlink()
    if kind == "dev-zero":
        target.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(target)
    else:
        target.symlink_to(tmp_path / "copy")
    code, _, err = train_in_thread(capsys, "--data", shards, "--out", tmp_path / "run", *TINY)
    assert_refused(code, err, which, "symbolic link" if kind != "fifo" else "not a regular file")


# --- prepare's lock -------------------------------------------------------------------------------

HOLDER = """
import sys
from pathlib import Path
from tinygpt.checkpoint import folder
with folder.locked(Path(sys.argv[1])):
    print("LOCKED", flush=True)
    sys.stdin.readline()
"""


def test_a_second_prepare_into_a_folder_in_use_is_refused_and_changes_nothing(capsys, tmp_path):
    import subprocess
    import sys

    import tinygpt

    shards = char_shards(capsys, tmp_path)
    before = {p.name: p.read_bytes() for p in shards.iterdir() if p.name != ".tinygpt.lock"}
    env = {**os.environ, "PYTHONPATH": str(Path(tinygpt.__file__).parents[1])}
    first = subprocess.Popen([sys.executable, "-c", HOLDER, str(shards)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert first.stdout.readline().strip() == "LOCKED"
        code, _, err = run(capsys, "prepare", tmp_path / "shards-in", "--out", shards,
                           "--tokenizer", "bpe", "--vocab-size", "300", "--overwrite",
                           "--workers", "1", "--quiet")
        assert_refused(code, err, str(shards), "in use by another tinygpt process",
                       f"pid {first.pid}")
        after = {p.name: p.read_bytes() for p in shards.iterdir() if p.name != ".tinygpt.lock"}
        assert after == before
    finally:
        first.communicate("\n", timeout=60)
    code, _, err = run(capsys, "prepare", tmp_path / "shards-in", "--out", shards, "--tokenizer",
                       "bpe", "--vocab-size", "300", "--overwrite", "--workers", "1", "--quiet",
                       "--val-fraction", "0.3", "--seed", "1")
    assert code == 0, err  # once the first one ended, the folder is free


def test_prepare_takes_a_folder_holding_only_a_left_lock(capsys, tmp_path):
    shards = tmp_path / "shards"
    shards.mkdir()
    (shards / ".tinygpt.lock").write_text("12345\n")  # left by a prepare killed at its start
    prepare_cli(capsys, TEXT, shards, "--tokenizer", "char")
    assert (shards / "shards.json").is_file()


def test_a_finished_prepare_leaves_no_lock_and_a_lock_removed_meanwhile_is_no_lock(capsys,
                                                                                  tmp_path,
                                                                                  monkeypatch):
    import fcntl

    from tinygpt.checkpoint import folder

    shards = char_shards(capsys, tmp_path)
    assert not (shards / ".tinygpt.lock").exists()  # the folder holds the shards only
    real = fcntl.flock

    def holder_ends_first(fd, op):  # the holder removes its lock file just before we get it
        (shards / ".tinygpt.lock").unlink()
        return real(fd, op)

    monkeypatch.setattr(fcntl, "flock", holder_ends_first)
    with pytest.raises(folder.CheckpointError, match="until a moment ago"), \
            folder.locked(shards):
        pass


# --- prepare never reads its own output as text ---------------------------------------------------

def test_prepare_skips_a_shards_folder_among_its_inputs_and_refuses_one_alone(capsys, tmp_path):
    import json

    data = tmp_path / "data"
    data.mkdir()
    prepare_cli(capsys, TEXT, data / "shards", "--tokenizer", "char")  # data/shards-in: the text
    code, _, err = run(capsys, "prepare", data, "--out", tmp_path / "all", "--tokenizer", "char",
                       "--val-fraction", "0.3", "--seed", "1", "--workers", "1", "--quiet")
    assert code == 0, err
    assert f"note: skipping {data / 'shards'}" in err
    inputs = json.loads((tmp_path / "all" / "shards.json").read_text())["fingerprint"]["inputs"]
    assert sorted(name for name, *_ in inputs) == [f"shards-in/doc{i}.txt" for i in range(4)]
    code, _, err = run(capsys, "prepare", data / "shards", "--out", tmp_path / "again",
                       "--tokenizer", "char", "--quiet")
    assert_refused(code, err, "only tinygpt shards folders", str(data / "shards"))
    assert not (tmp_path / "again").exists()


# --- shards.json checks itself, its dtype and the ids ---------------------------------------------

def test_a_bit_flip_in_shards_json_is_caught_by_its_checksum(capsys, tmp_path):
    shards = char_shards(capsys, tmp_path)
    raw = (shards / "shards.json").read_text()
    assert raw.count('"z"') == 1
    (shards / "shards.json").write_text(raw.replace('"z"', '"{"'))  # 'z' is 0x7a, '{' 0x7b
    code, _, err = run(capsys, "train", "--data", shards, "--out", tmp_path / "run", *TINY)
    assert_refused(code, err, "shards.json", "checksum")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("dtype", ["|u1", "<i2", ">u2", "<u4", "<f4"])
def test_a_dtype_tinygpt_does_not_write_is_refused(capsys, tmp_path, dtype):
    shards = char_shards(capsys, tmp_path)
    edit_manifest(shards, lambda m: m.update(dtype=dtype))
    code, _, err = run(capsys, "train", "--data", shards, "--out", tmp_path / "run", *TINY)
    assert_refused(code, err, "shards.json", f"dtype {dtype!r}")


@pytest.mark.parametrize("split", ["train", "val"])
def test_a_shard_holding_an_id_outside_the_vocabulary_is_refused(capsys, tmp_path, split):
    import hashlib

    import numpy as np

    shards = char_shards(capsys, tmp_path)
    path = shards / f"{split}_000000.bin"
    ids = np.fromfile(path, dtype="<u2")
    ids[len(ids) // 2] = 999  # the vocabulary has a few dozen characters
    path.write_bytes(ids.tobytes())
    digest = hashlib.sha256(ids.tobytes()).hexdigest()
    edit_manifest(shards, lambda m: m["shards"][split][0].update(sha256=digest))
    code, _, err = run(capsys, "train", "--data", shards, "--out", tmp_path / "run", *TINY)
    assert_refused(code, err, path.name, "token id 999", "outside the vocabulary")


# --- a pattern read from a file -------------------------------------------------------------------

REDOS = r"(a|a)*c|[\s\S]"  # 'a' * 40 takes 2**40 steps to fail the first branch


def test_a_tokenizer_file_with_an_unknown_pattern_is_refused_unless_given(tmp_path):
    import json

    from tinygpt.tokenizer import BPETokenizer

    path = tmp_path / "tok.json"
    BPETokenizer.train(TEXT, 270).save(path)
    model = json.loads(path.read_text())
    model["pattern"] = REDOS
    path.write_text(json.dumps(model))
    with pytest.raises(ValueError, match=r"tok\.json.*not GPT-2.s or GPT-4.s"):
        BPETokenizer.load(path)
    mine = r"\w+|\s+|[^\w\s]+"  # a pattern of one's own is loaded when it is given
    BPETokenizer.train(TEXT, 270, pattern=mine).save(path)
    with pytest.raises(ValueError, match=r"pattern=\.\.\."):
        BPETokenizer.load(path)
    assert BPETokenizer.load(path, pattern=mine).pattern == mine
    for name in ("gpt2", "gpt4", "none"):
        BPETokenizer.train(TEXT, 270, pattern=name).save(path)
        BPETokenizer.load(path)


def test_shards_whose_tokenizer_has_an_unknown_pattern_are_refused(capsys, tmp_path):
    import hashlib
    import json

    shards = bpe_shards(capsys, tmp_path)
    model = json.loads((shards / "tokenizer.json").read_text())
    model["pattern"] = REDOS
    data = json.dumps(model).encode()
    (shards / "tokenizer.json").write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    edit_manifest(shards, lambda m: m["tokenizer"].update(sha256=digest))
    code, _, err = run(capsys, "train", "--data", shards, "--out", tmp_path / "run", *TINY)
    assert_refused(code, err, "tokenizer.json", "not GPT-2's or GPT-4's")


# --- deeply nested and key-less JSON, in every file tinygpt reads back ----------------------------

NESTED = ("[" * 100_000 + "]" * 100_000).encode()  # json.loads: RecursionError


def test_nested_or_key_less_json_in_any_file_tinygpt_wrote_is_a_clear_error(capsys, tmp_path,
                                                                           monkeypatch):
    import hashlib
    import json
    import shutil
    import warnings

    from conftest import checksum_of, rewrite_manifest

    from tinygpt.book import ladder, results_cache
    from tinygpt.checkpoint import load_checkpoint
    from tinygpt.checkpoint.folder import CheckpointError
    from tinygpt.tokenizer import BPETokenizer

    def refused(argv, *words):
        code, _, err = run(capsys, *argv)
        assert_refused(code, err, *words)

    fields = {"format": "tinygpt-checkpoint", "version": 2}  # with a right checksum, no keys
    ckpt_keyless = json.dumps({**fields, "checksum": checksum_of(fields)}).encode()
    fields = {"format": "tinygpt-shards", "version": 1, "vocab_size": 40, "dtype": "<u2"}
    shards_keyless = json.dumps({**fields, "checksum": checksum_of(fields)}).encode()
    tok_keyless = json.dumps({"format": "tinygpt-bpe", "version": 1}).encode()

    # a checkpoint's manifest, read by sample and load_checkpoint
    ck, text = tmp_path / "ck", tmp_path / "t.txt"
    text.write_text(TEXT)
    code, _, err = run(capsys, "train", "--data", text, "--out", ck, "--tokenizer", "bpe",
                       "--vocab-size", "270", *TINY)
    assert code == 0, err
    good = (ck / "checkpoint.json").read_bytes()
    for payload in (NESTED, ckpt_keyless):
        (ck / "checkpoint.json").write_bytes(payload)
        refused(["sample", "--out", ck, "--max-new-tokens", "5"], "checkpoint.json")
        with pytest.raises(CheckpointError, match=r"checkpoint\.json"):
            load_checkpoint(ck)
    (ck / "checkpoint.json").write_bytes(good)

    # a checkpoint's tokenizer.json (its size and SHA-256 in the manifest updated)
    version = ck / json.loads(good)["folder"]
    tok_good = (version / "tokenizer.json").read_bytes()
    for payload in (NESTED, tok_keyless):
        (version / "tokenizer.json").write_bytes(payload)
        entry = {"sha256": hashlib.sha256(payload).hexdigest(), "size": len(payload)}
        rewrite_manifest(ck, lambda m, e=entry: m["files"].update({"tokenizer.json": e}))
        with pytest.raises(CheckpointError, match=r"tokenizer\.json"):
            load_checkpoint(ck)
        with pytest.raises(ValueError, match=r"tokenizer\.json"):
            BPETokenizer.load(version / "tokenizer.json")

    # a checkpoint without its RNG states, resumed
    (version / "tokenizer.json").write_bytes(tok_good)
    (ck / "checkpoint.json").write_bytes(good)
    rewrite_manifest(ck, lambda m: m.update(rng_states={}))
    refused(["train", "--data", text, "--out", ck, *TINY, "--resume",
             "--max-iters", "8"], "no RNG state 'torch'")

    # a shards folder's manifest and tokenizer file, and prepare's progress file
    folder = bpe_shards(capsys, tmp_path)
    manifest = (folder / "shards.json").read_bytes()
    for payload in (NESTED, shards_keyless):
        (folder / "shards.json").write_bytes(payload)
        refused(["train", "--data", folder, "--out", tmp_path / "run", *TINY], "shards.json")
    (folder / "shards.json").write_bytes(manifest)
    for drop in ("dtype", "tokenizer", "shards", "eot"):
        edit_manifest(folder, lambda m, k=drop: m.pop(k))
        refused(["train", "--data", folder, "--out", tmp_path / "run", *TINY], "shards.json")
        (folder / "shards.json").write_bytes(manifest)
    for split, key in (("val", "file"), ("train", "sha256"), ("val", "tokens")):
        edit_manifest(folder, lambda m, s=split, k=key: m["shards"][s][0].pop(k))
        refused(["train", "--data", folder, "--out", tmp_path / "run", *TINY], "shards.json")
        (folder / "shards.json").write_bytes(manifest)
    tokenizer = (folder / "tokenizer.json").read_bytes()
    special = json.loads(tokenizer)
    assert special["special_tokens"] == {"<|endoftext|>": 299}
    special["special_tokens"] = [[1, 299]]  # a list of pairs: dict() takes it, 1 is no string
    for payload in (NESTED, tok_keyless, json.dumps(special).encode()):
        (folder / "tokenizer.json").write_bytes(payload)
        digest = hashlib.sha256(payload).hexdigest()
        edit_manifest(folder, lambda m, d=digest: m["tokenizer"].update(sha256=d))
        refused(["train", "--data", folder, "--out", tmp_path / "run", *TINY], "tokenizer.json")
        with pytest.raises(ValueError, match=r"tokenizer\.json"):
            BPETokenizer.load(folder / "tokenizer.json")
        (folder / "shards.json").write_bytes(manifest)
    (folder / "tokenizer.json").write_bytes(tokenizer)
    again = tmp_path / "again"
    shutil.copytree(folder, again)
    (again / "shards.json").unlink()
    for payload in (NESTED, shards_keyless):  # a killed run's progress: started over
        (again / ".shards-progress.json").write_bytes(payload)
        code, _, err = run(capsys, "prepare", tmp_path / "shards-in", "--out", again,
                           "--tokenizer", "bpe", "--vocab-size", "300", "--val-fraction", "0.3",
                           "--seed", "1", "--workers", "1", "--quiet")
        assert code == 0, err
        assert (again / "shards.json").read_bytes() == manifest
        (again / "shards.json").unlink()

    # a cached result (ladder.rung_loss): reported, and computed again
    monkeypatch.setenv("TINYGPT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(ladder, "_compute", lambda key: 1.25)
    for payload in (NESTED, b"{}", json.dumps({"sha256": results_cache._checksum(7)}).encode()):
        path = ladder._path("uniform")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(payload)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert ladder.rung_loss("uniform") == 1.25
        assert any("corrupt cache entry" in str(w.message) for w in caught)


# --- --workers ------------------------------------------------------------------------------------

@pytest.mark.parametrize("workers", ["0", "-2", "1025", "1000000000"])
def test_absurd_workers_are_refused(capsys, tmp_path, monkeypatch, workers):
    import tinygpt.prepare as prepare_run
    from tinygpt.prepare import workers as prepare_workers

    def no_pool(n, tokenizer=None):  # were the check missing: fail, never start n processes
        raise AssertionError(f"{n} workers started")

    monkeypatch.setattr(prepare_run, "Mapper", no_pool)  # encoding
    monkeypatch.setattr(prepare_workers, "Mapper", no_pool)  # counting words for BPE
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.txt").write_text(TEXT)
    code, _, err = run(capsys, "prepare", folder, "--out", tmp_path / "out", "--workers",
                       workers, "--quiet")
    assert_refused(code, err, "--workers", "from 1 to 1024", workers)
    assert not (tmp_path / "out").exists()


def test_workers_are_capped_at_the_cores_and_the_tasks(tmp_path, monkeypatch):
    import tinygpt.prepare as prepare_run
    from tinygpt.prepare import documents, workers, write_shards

    started: list[int] = []
    real = workers.Mapper

    class Counted(real):
        def __init__(self, workers, tokenizer=None):
            started.append(workers)
            super().__init__(1, tokenizer)  # the work itself in this process

    monkeypatch.setattr(prepare_run, "Mapper", Counted)  # encoding
    monkeypatch.setattr(workers, "Mapper", Counted)  # counting words for BPE
    folder = tmp_path / "in"
    folder.mkdir()
    for i in range(4):
        (folder / f"doc{i}.txt").write_text(TEXT)  # about 4 x 1,300 characters
    options = documents.Options("bpe", 300, 0.3, 1, 10_000)
    write_shards(folder, tmp_path / "a", options, workers=1024)
    assert started == [1, 1]  # one task to count words, one to encode: one worker each
    monkeypatch.setattr(documents, "PART_CHARS", 500)
    monkeypatch.setattr(workers, "COUNT_CHARS", 500)
    monkeypatch.setattr(prepare_run, "cores", lambda: 3)
    monkeypatch.setattr(workers, "cores", lambda: 3)
    started.clear()
    write_shards(folder, tmp_path / "b", options, workers=1024)
    assert started == [3, 3]  # a dozen tasks, three cores


# --- the out folder, gradient accumulation, the val fraction, file modes, leftovers ---------------

@pytest.mark.parametrize("command", ["train", "prepare"])
@pytest.mark.parametrize("how", ["read-only", "under-a-file"])
def test_an_out_that_cannot_be_created_says_why(capsys, data, tmp_path, monkeypatch, command,
                                                how):
    out = tmp_path / "new" / "run"
    if how == "under-a-file":
        out = data / "sub"  # --out mydata.txt/sub
    else:
        real = Path.mkdir

        def read_only(self, *args, **kwargs):
            if self in (out, out.parent):  # the new folders, not tmp_path
                raise OSError(30, "Read-only file system", str(self))
            return real(self, *args, **kwargs)

        monkeypatch.setattr(Path, "mkdir", read_only)  # root ignores chmod: simulate it
    argv = [command, "--data", data, "--out", out, *TINY] if command == "train" else \
        [command, data, "--out", out, "--quiet"]
    code, _, err = run(capsys, *argv)
    why = "Read-only file system" if how == "read-only" else "Not a directory"
    assert_refused(code, err, str(out), why)
    assert "No such file" not in err and "[Errno" not in err
    assert data.read_text() == TEXT


def test_absurd_gradient_accumulation_is_refused_before_training(capsys, data, tmp_path,
                                                                 monkeypatch):
    import tinygpt.train

    def never(*args, **kwargs):  # were the check missing: fail now, not after 1e9 micro-batches
        raise AssertionError("training started")

    monkeypatch.setattr(tinygpt.train, "train", never)
    code, _, err = run(capsys, "train", "--data", data, "--out", tmp_path / "run", *TINY,
                       "--gradient-accumulation-steps", "1000000000")
    assert_refused(code, err, "--gradient-accumulation-steps 1000000000", "at most 65536")
    assert not (tmp_path / "run").exists()


def test_a_tiny_val_fraction_is_not_printed_in_hundreds_of_digits(capsys, data, tmp_path):
    code, _, err = run(capsys, "train", "--data", data, "--out", tmp_path / "run", *TINY,
                       "--val-fraction", "1e-300")
    assert_refused(code, err, "--val-fraction 1e-300", "about 1.7e+301 in all")
    assert len(err) < 400


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_files_get_the_mode_the_umask_gives(capsys, tmp_path, umask):
    import stat

    old = os.umask(umask)
    try:
        shards = bpe_shards(capsys, tmp_path)
        out = tmp_path / "run"
        code, _, err = run(capsys, "train", "--data", shards, "--out", out, *TINY)
        assert code == 0, err
    finally:
        os.umask(old)
    written = [p for p in [*shards.iterdir(), *out.rglob("*")] if p.is_file()]
    assert len(written) > 8
    for path in written:
        assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask, path


@pytest.mark.parametrize("finished", [True, False])
def test_the_temporary_files_of_a_killed_prepare_are_removed_by_the_next(capsys, tmp_path,
                                                                        finished):
    shards = bpe_shards(capsys, tmp_path)
    if not finished:  # killed before its first shard: the progress file names none
        import json

        from tinygpt.prepare import save_json

        state = json.loads((shards / "shards.json").read_text())
        for key in ("tokens", "documents", "checksum"):
            del state[key]
        state.update(shards={"train": [], "val": []}, resume={"train": [0, 0], "val": [0, 0]})
        save_json(shards, ".shards-progress.json", state)
        for p in shards.glob("*.bin"):
            p.unlink()
        (shards / "shards.json").unlink()
    left = [".train_000001.bin.k2j4h5g6.part", ".tokenizer.json.part", ".tokenizer.json.vocab",
            ".shards.json.x8y7z6w5.part"]
    for name in left:
        (shards / name).write_bytes(b"half")
    prepare_again = ["prepare", tmp_path / "shards-in", "--out", shards, "--tokenizer", "bpe",
                     "--vocab-size", "300", "--val-fraction", "0.3", "--seed", "1",
                     "--workers", "1", "--quiet"]
    code, _, err = run(capsys, *prepare_again)
    assert code == 0, err
    assert not [p.name for p in shards.iterdir() if p.name in left]
    assert (shards / "shards.json").is_file()
