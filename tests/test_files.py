"""Tests of tinygpt.files: how tinygpt reads and writes its own files.

Reading (``files.reading``): only a regular file, never blocking on a FIFO, of a bounded size,
each error the caller's own. Writing (``files.writing``): a file replaced whole or not at all,
with the mode the umask gives. Locking (``files.locking``): one holder at a time, across
processes. Manifests (``files.manifest``): a checksum that catches an edit, and the tokenizer
entry that checkpoints and shards folders share, read back as it was written. And, over the
files tinygpt writes and reads back through the command line, a nested or key-less JSON file is
a clear error.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import (
    BAD_TOKENIZER_ENTRIES,
    FOLDER_TEXT,
    FOLDER_TINY,
    assert_one_line_error,
    prepare_bpe_shards,
    rewrite_shards_manifest,
    saved_tokenizer,
)
from conftest import run_cli as run

from tinygpt.files.locking import CAN_LOCK, open_lock, take_lock
from tinygpt.files.manifest import (
    TOKENIZER_FILE,
    manifest_checksum,
    parse_manifest,
    tokenizer_entry,
    tokenizer_from_entry,
)
from tinygpt.files.reading import open_regular, read_regular, sha256_of
from tinygpt.files.writing import temporary_names, write_atomically, write_synced
from tinygpt.tokenizer import BPETokenizer, tokenizer_fingerprint


class ManifestError(ValueError):
    """Stands for a manifest's own error class (CheckpointError, ShardError)."""


class Missing(ManifestError):
    """Stands for a folder's 'missing file' error (MissingCheckpointFile, MissingShardFile)."""


# --- reading ---------------------------------------------------------------------------------


def test_a_regular_file_is_read_whole_and_its_digest_is_sha256(tmp_path):
    import hashlib

    path = tmp_path / "f.bin"
    path.write_bytes(b"tinygpt" * 1000)
    assert read_regular(path, error=ManifestError) == b"tinygpt" * 1000
    assert read_regular(path, error=ManifestError, size=7000) == b"tinygpt" * 1000
    assert sha256_of(path) == hashlib.sha256(b"tinygpt" * 1000).hexdigest()


def test_a_missing_file_raises_the_callers_missing_error_naming_it(tmp_path):
    with pytest.raises(Missing, match=r"nothing\.json: missing"):
        read_regular(tmp_path / "nothing.json", error=ManifestError, missing=Missing)
    with pytest.raises(ManifestError, match="missing") as caught:  # no missing class: the error
        open_regular(tmp_path / "nothing.json", error=ManifestError)
    assert type(caught.value) is ManifestError


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="this system has no FIFOs")
def test_a_fifo_or_folder_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)  # opening it for reading would block until a writer comes: it must not
    for path in (fifo, tmp_path):
        with pytest.raises(ManifestError, match=r"not a regular file.*a folder holds files only"):
            read_regular(path, error=ManifestError, holds="a folder holds files only")


def test_a_link_is_followed_only_when_allowed(tmp_path):
    target = tmp_path / "target"
    target.write_bytes(b"x")
    link = tmp_path / "link"
    link.symlink_to(target)
    assert read_regular(link, error=ManifestError) == b"x"
    with pytest.raises(ManifestError, match=r"link: is a symbolic link; ours are files"):
        read_regular(link, error=ManifestError, follow_links=False, holds="ours are files")


def test_sizes_are_checked_before_reading(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"0123456789")
    with pytest.raises(ManifestError, match="10 bytes, more than the 9"):
        read_regular(path, error=ManifestError, max_size=9)
    with pytest.raises(ManifestError, match="10 bytes, more than the 9"):
        open_regular(path, error=ManifestError, max_size=9)
    with pytest.raises(ManifestError, match=r"10 bytes, but the manifest says 11: .*truncated"):
        read_regular(path, error=ManifestError, size=11)
    assert read_regular(path, error=ManifestError, max_size=10) == b"0123456789"


# --- writing ---------------------------------------------------------------------------------


def test_a_failed_atomic_write_leaves_the_old_file_and_no_temporary_one(tmp_path, monkeypatch):
    target = tmp_path / "result.json"
    write_atomically(b"old", target)

    def no_room(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_room)
    with pytest.raises(OSError, match="No space left") as caught:
        write_atomically(b"new", target)
    assert caught.value.filename == str(target)  # named, though f.write names no file
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]


def test_temporary_names_match_what_a_killed_writer_leaves_and_nothing_else(tmp_path,
                                                                          monkeypatch):
    import re
    import tempfile

    made = []
    real = tempfile.mkstemp

    def remembered(*args, **kwargs):
        fd, name = real(*args, **kwargs)
        made.append(Path(name).name)
        return fd, name

    monkeypatch.setattr(tempfile, "mkstemp", remembered)
    write_atomically(b"x", tmp_path / "shards.json")
    pattern = temporary_names(re.escape("shards.json"))
    assert re.fullmatch(pattern, made[0])
    for other in ("shards.json", ".shards.json.part", ".notes.json.abcdefgh.part",
                  ".shards.json.abcdefgh.part.bak"):
        assert not re.fullmatch(pattern, other), other


def test_a_synced_write_never_replaces_a_file(tmp_path):
    path = tmp_path / "model.safetensors"
    write_synced(path, b"weights")
    with pytest.raises(FileExistsError):
        write_synced(path, b"other")
    assert path.read_bytes() == b"weights"


def test_a_tokenizer_save_that_fails_keeps_the_saved_tokenizer(tmp_path, monkeypatch):
    tokenizer = saved_tokenizer("bpe")
    path = tmp_path / TOKENIZER_FILE
    tokenizer.save(path)
    before = path.read_bytes(), path.with_suffix(".vocab").read_bytes()
    other = BPETokenizer.train(FOLDER_TEXT, 260)

    def no_room(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_room)
    with pytest.raises(OSError, match="No space left"):
        other.save(path)
    monkeypatch.undo()
    assert (path.read_bytes(), path.with_suffix(".vocab").read_bytes()) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tokenizer.json", "tokenizer.vocab"]


# --- locking ---------------------------------------------------------------------------------


@pytest.mark.skipif(not CAN_LOCK, reason="this system has no flock")
def test_a_lock_has_one_holder_across_processes(tmp_path):
    path = tmp_path / ".tinygpt.lock"
    holder = subprocess.Popen(  # holds the lock until its stdin closes
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys
            from pathlib import Path
            from tinygpt.files.locking import open_lock, take_lock
            fd = open_lock(Path({str(path)!r}))
            assert take_lock(fd)
            print("held", flush=True)
            sys.stdin.read()
        """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        fd = open_lock(path)
        try:
            assert take_lock(fd) is False  # another process holds it
        finally:
            os.close(fd)
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    fd = open_lock(path)
    try:
        assert take_lock(fd) is True  # let go when the holder ended
    finally:
        os.close(fd)


def test_a_lock_file_is_never_a_link_or_a_hard_link(tmp_path):
    other = tmp_path / "user-file"
    other.write_text("the user's")
    (tmp_path / "link.lock").symlink_to(other)
    with pytest.raises(ManifestError, match="is a symbolic link, not tinygpt's lock file"):
        open_lock(tmp_path / "link.lock", ManifestError)
    os.link(other, tmp_path / "hard.lock")
    with pytest.raises(ManifestError, match="a hard link, not tinygpt's lock file"):
        open_lock(tmp_path / "hard.lock", ManifestError)
    assert other.read_text() == "the user's"


# --- manifests ---------------------------------------------------------------------------------


def test_a_manifest_reads_back_and_an_edit_is_caught(tmp_path):
    content = {"format": "tinygpt-test", "version": 3, "files": {"a": 1}}
    raw = json.dumps({**content, "checksum": manifest_checksum(content)}).encode()
    path = tmp_path / "m.json"
    assert parse_manifest(raw, path, "tinygpt-test", 3, ManifestError, "try again") == content
    edited = raw.replace(b'"a": 1', b'"a": 2')
    with pytest.raises(ManifestError, match=r"m\.json: its checksum does not match.*try again"):
        parse_manifest(edited, path, "tinygpt-test", 3, ManifestError, "try again")
    with pytest.raises(ManifestError, match="format version 3 is not supported"):
        parse_manifest(raw, path, "tinygpt-test", 4, ManifestError, "try again")
    with pytest.raises(ManifestError, match="not a tinygpt-other file"):
        parse_manifest(raw, path, "tinygpt-other", 3, ManifestError, "try again")


@pytest.mark.parametrize("kind", ["char", "bpe", "gpt2"])
def test_the_entry_reader_gives_back_what_the_writer_wrote(kind, tmp_path):
    tokenizer = saved_tokenizer(kind)
    entry = json.loads(json.dumps(tokenizer_entry(tokenizer, tmp_path)))  # as a manifest holds it
    read: list[str] = []

    def read_file(name: str) -> bytes:
        read.append(name)
        return (tmp_path / name).read_bytes()

    again = tokenizer_from_entry(entry, tmp_path / "manifest.json", tmp_path, read_file)
    assert type(again) is type(tokenizer)
    assert tokenizer_fingerprint(again) == tokenizer_fingerprint(tokenizer)
    assert read == ([] if kind == "char" else [TOKENIZER_FILE])
    text = "to be, or not to be: café 雪\n\t"
    assert again.encode(text) == tokenizer.encode(text)


@pytest.mark.parametrize("case", BAD_TOKENIZER_ENTRIES)
def test_an_entry_the_writer_never_writes_is_refused_naming_the_manifest(case, tmp_path):
    entry, words = BAD_TOKENIZER_ENTRIES[case]

    def read_file(name: str) -> bytes:
        raise AssertionError(f"no file is read for an entry that is not one ({name})")

    where = tmp_path / "manifest.json"
    with pytest.raises(ManifestError) as caught:
        tokenizer_from_entry(entry, where, tmp_path, read_file, error=ManifestError)
    message = str(caught.value)
    assert message.startswith(f"{where}: ") and words in message and "\n" not in message


def test_the_entry_reader_lets_the_manifests_file_check_speak_and_names_a_bad_file(tmp_path):
    entry = {"type": "bpe", "file": TOKENIZER_FILE}

    def altered(name: str) -> bytes:
        raise ManifestError(f"{tmp_path / name}: SHA-256 differs from the manifest's")

    with pytest.raises(ManifestError, match="SHA-256 differs"):
        tokenizer_from_entry(entry, tmp_path / "m.json", tmp_path, altered, error=ManifestError)
    with pytest.raises(ManifestError) as caught:  # checked bytes that are no tokenizer file
        tokenizer_from_entry(entry, tmp_path / "m.json", tmp_path / "v1",
                             lambda name: b'{"format": "something else"}', error=ManifestError)
    assert str(caught.value).startswith(f"cannot load a tokenizer from {tmp_path / 'v1'}/"
                                        f"{TOKENIZER_FILE}: ")


# --- every JSON file tinygpt writes and reads back ----------------------------------------

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
        assert_one_line_error(code, err, *words)

    fields = {"format": "tinygpt-checkpoint", "version": 2}  # with a right checksum, no keys
    ckpt_keyless = json.dumps({**fields, "checksum": checksum_of(fields)}).encode()
    fields = {"format": "tinygpt-shards", "version": 1, "vocab_size": 40, "dtype": "<u2"}
    shards_keyless = json.dumps({**fields, "checksum": checksum_of(fields)}).encode()
    tok_keyless = json.dumps({"format": "tinygpt-bpe", "version": 1}).encode()

    # a checkpoint's manifest, read by sample and load_checkpoint
    ck, text = tmp_path / "ck", tmp_path / "t.txt"
    text.write_text(FOLDER_TEXT)
    code, _, err = run(capsys, "train", "--data", text, "--out", ck, "--tokenizer", "bpe",
                       "--vocab-size", "270", *FOLDER_TINY)
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
    refused(["train", "--data", text, "--out", ck, *FOLDER_TINY, "--resume",
             "--max-iters", "8"], "no RNG state 'torch'")

    # a shards folder's manifest and tokenizer file, and prepare's progress file
    folder = prepare_bpe_shards(capsys, tmp_path)
    manifest = (folder / "shards.json").read_bytes()
    for payload in (NESTED, shards_keyless):
        (folder / "shards.json").write_bytes(payload)
        refused(["train", "--data", folder, "--out", tmp_path / "run", *FOLDER_TINY], "shards.json")
    (folder / "shards.json").write_bytes(manifest)
    for drop in ("dtype", "tokenizer", "shards", "eot"):
        rewrite_shards_manifest(folder, lambda m, k=drop: m.pop(k))
        refused(["train", "--data", folder, "--out", tmp_path / "run", *FOLDER_TINY], "shards.json")
        (folder / "shards.json").write_bytes(manifest)
    for split, key in (("val", "file"), ("train", "sha256"), ("val", "tokens")):
        rewrite_shards_manifest(folder, lambda m, s=split, k=key: m["shards"][s][0].pop(k))
        refused(["train", "--data", folder, "--out", tmp_path / "run", *FOLDER_TINY], "shards.json")
        (folder / "shards.json").write_bytes(manifest)
    tokenizer = (folder / "tokenizer.json").read_bytes()
    special = json.loads(tokenizer)
    assert special["special_tokens"] == {"<|endoftext|>": 299}
    special["special_tokens"] = [[1, 299]]  # a list of pairs: dict() takes it, 1 is no string
    for payload in (NESTED, tok_keyless, json.dumps(special).encode()):
        (folder / "tokenizer.json").write_bytes(payload)
        digest = hashlib.sha256(payload).hexdigest()
        rewrite_shards_manifest(folder, lambda m, d=digest: m["tokenizer"].update(sha256=d))
        refused(["train", "--data", folder, "--out", tmp_path / "run", *FOLDER_TINY],
                "tokenizer.json")
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


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_files_get_the_mode_the_umask_gives(capsys, tmp_path, umask):
    import stat

    old = os.umask(umask)
    try:
        shards = prepare_bpe_shards(capsys, tmp_path)
        out = tmp_path / "run"
        code, _, err = run(capsys, "train", "--data", shards, "--out", out, *FOLDER_TINY)
        assert code == 0, err
    finally:
        os.umask(old)
    written = [p for p in [*shards.iterdir(), *out.rglob("*")] if p.is_file()]
    assert len(written) > 8
    for path in written:
        assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask, path
