"""``tinygpt prepare`` (``tinygpt.prepare``): shards that round-trip to the
documents, a manifest that catches altered shards, determinism, idempotence, a killed run, bounded
memory, one-line CLI errors; its lock (a second prepare into a folder in use is refused, a lock
left behind is no lock), its own output never read as text, ``--workers`` bounded, and what a
killed run left removed by the next."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tiktoken
from conftest import (
    BAD_TOKENIZER_ENTRIES,
    CLI_TINY,
    FOLDER_TEXT,
    assert_one_line_error,
    check_an_out_that_cannot_be_created,
    lock_held_elsewhere,
    prepare_bpe_shards,
    prepare_char_shards,
    prepare_cli,
    require_data,
    rewrite_shards_manifest,
    run_cli,
)

import tinygpt.prepare as prepare_run
import tinygpt.prepare.documents as prepare_documents
import tinygpt.prepare.workers as prepare_workers
from tinygpt.cli import main
from tinygpt.gpt2 import load_tokenizer, tokenizer_files
from tinygpt.prepare.documents import Options, is_val
from tinygpt.shards import (
    PROGRESS,
    ShardError,
    TokenShards,
    check_shard,
    load_shards_tokenizer,
    read_manifest,
)
from tinygpt.tokenizer import EOT, BPETokenizer, CharTokenizer, tokenizer_fingerprint

WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog;", "sun,", "moon",
         "and", "star!\n", "café", "naïve", "雪", " gap", "tab\t", "it's"]


def make_corpus(folder: Path, files: int = 5, docs: int = 4, words: int = 200,
                seed: int = 0) -> Path:
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        texts = [" ".join(rng.choice(WORDS) for _ in range(words)) for _ in range(docs)]
        (folder / f"doc{f}.txt").write_text(EOT.join(texts), encoding="utf-8")
    return folder


def documents(folder: Path, options: Options) -> dict[str, list[str]]:
    """Each split's documents, found independently of prepare: split the files on EOT."""
    out: dict[str, list[str]] = {"train": [], "val": []}
    for path in sorted(folder.iterdir()):
        for i, doc in enumerate(path.read_text(encoding="utf-8").split(EOT)):
            if doc:
                out["val" if is_val(path.name, i, options) else "train"].append(doc)
    return out


def decoded(out: Path, split: str) -> str:
    tokenizer = load_shards_tokenizer(out)
    ids = np.concatenate(TokenShards(out, split).arrays).tolist()
    return tokenizer.decode(ids)


def shard_bytes(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


SMALL = Options(tokenizer="bpe", vocab_size=300, val_fraction=0.25, seed=3, shard_tokens=700)


@pytest.mark.parametrize("kind", ["bpe", "char"])
def test_shards_round_trip_to_the_documents_of_each_split(tmp_path, kind):
    corpus = make_corpus(tmp_path / "in")
    options = Options(kind, 300, 0.25, 3, 700)
    manifest = prepare_run.write_shards(corpus, tmp_path / "out", options, workers=1)
    docs = documents(corpus, options)
    assert docs["train"] and docs["val"]
    sep = EOT if kind == "bpe" else ""  # BPE documents end with <|endoftext|>
    for split in ("train", "val"):
        assert decoded(tmp_path / "out", split) == "".join(d + sep for d in docs[split])
        assert manifest["documents"][split] == len(docs[split])
    assert len(manifest["shards"]["train"]) > 1  # several shards, cut mid-document
    assert np.dtype(manifest["dtype"]) == np.uint16


def test_the_manifest_detects_a_truncated_or_altered_shard(tmp_path):
    out = tmp_path / "out"
    prepare_run.write_shards(make_corpus(tmp_path / "in"), out, SMALL, workers=1)
    shard = out / "train_000001.bin"
    good = shard.read_bytes()
    shard.write_bytes(good[:-2])
    with pytest.raises(ShardError, match="truncated or altered"):
        TokenShards(out, "train")
    shard.write_bytes(bytes([good[0] ^ 1]) + good[1:])
    with pytest.raises(ShardError, match=r"SHA-256 .* altered"):
        TokenShards(out, "train")


def test_prepare_is_deterministic_for_any_number_of_workers(tmp_path, monkeypatch):

    corpus = make_corpus(tmp_path / "in")
    prepare_run.write_shards(corpus, tmp_path / "a", SMALL, workers=1)
    monkeypatch.setattr(prepare_documents, "PART_CHARS", 4000)  # tasks enough for two workers
    monkeypatch.setattr(prepare_workers, "COUNT_CHARS", 4000)
    monkeypatch.setattr(prepare_run, "cores", lambda: 2)
    monkeypatch.setattr(prepare_workers, "cores", lambda: 2)
    prepare_run.write_shards(corpus, tmp_path / "b", SMALL, workers=2)
    assert shard_bytes(tmp_path / "a") == shard_bytes(tmp_path / "b")


def test_a_rerun_reuses_the_finished_shards_and_other_options_are_refused(tmp_path, monkeypatch):
    corpus, out = make_corpus(tmp_path / "in"), tmp_path / "out"
    first = prepare_run.write_shards(corpus, out, SMALL, workers=1)
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    monkeypatch.setattr(prepare_run, "_write_shard", lambda *a: pytest.fail("rewrote a shard"))
    assert prepare_run.write_shards(corpus, out, SMALL, workers=1) == first
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before
    other = Options("bpe", 290, 0.25, 3, 700)
    with pytest.raises(ValueError, match="other inputs or options"):
        prepare_run.write_shards(corpus, out, other, workers=1)


def test_a_killed_run_resumes_to_the_uninterrupted_result(tmp_path, monkeypatch):
    corpus = make_corpus(tmp_path / "in")
    prepare_run.write_shards(corpus, tmp_path / "straight", SMALL, workers=1)
    real, calls = prepare_run._write_shard, []

    def dies_after_two(out, name, tokens):
        if len(calls) == 2:
            raise KeyboardInterrupt  # killed after two shards
        calls.append(name)
        return real(out, name, tokens)

    monkeypatch.setattr(prepare_run, "_write_shard", dies_after_two)
    with pytest.raises(KeyboardInterrupt):
        prepare_run.write_shards(corpus, tmp_path / "killed", SMALL, workers=1)
    assert not (tmp_path / "killed" / "shards.json").exists()  # not finished: no manifest
    with pytest.raises(ShardError, match="not a finished shards folder"):
        TokenShards(tmp_path / "killed")
    rewritten: list[str] = []
    monkeypatch.setattr(prepare_run, "_write_shard",
                        lambda out, name, tokens: rewritten.append(name) or real(out, name, tokens))
    prepare_run.write_shards(corpus, tmp_path / "killed", SMALL, workers=1)
    assert not set(calls) & set(rewritten)  # the two finished shards were kept, not redone
    assert shard_bytes(tmp_path / "killed") == shard_bytes(tmp_path / "straight")


def test_a_folder_that_is_not_a_shards_folder_is_refused_and_left_alone(tmp_path):
    corpus, out = make_corpus(tmp_path / "in"), tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="not a tinygpt shards folder"):
        prepare_run.write_shards(corpus, out, SMALL, workers=1)
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    with pytest.raises(ValueError, match="inside the input folder"):
        prepare_run.write_shards(corpus, corpus / "shards", SMALL, workers=1)


@pytest.mark.parametrize("name", [".notes.part", ".shards.json.mine.part",
                                  ".train_000000.bin.part", ".tokenizer.json.vocab.bak"])
def test_a_users_file_like_a_temporary_one_is_never_removed(tmp_path, name):
    """A killed run's leftovers are ``write_atomically``'s temporary names (mkstemp's 8
    characters) of the files prepare writes, or the two fixed ones of earlier versions: any
    other file is the user's, and a re-run refuses the folder, leaving it (prepare used to
    remove every hidden ``.part`` file)."""
    corpus, out = make_corpus(tmp_path / "in"), tmp_path / "out"
    prepare_run.write_shards(corpus, out, SMALL, workers=1)
    before = shard_bytes(out)
    (out / name).write_text("mine")
    with pytest.raises(ValueError, match="not a tinygpt shards folder"):
        prepare_run.write_shards(corpus, out, SMALL, workers=1)
    assert shard_bytes(out) == {**before, name: b"mine"}


def test_every_name_prepare_writes_is_its_own_and_nothing_else(tmp_path):
    """``SHARDS_ENTRIES`` owns each file of a finished shards folder, a shard past the
    millionth (7 digits), and the temporary name mkstemp gives each file written atomically."""
    import tempfile

    from tinygpt.prepare import SHARDS_ENTRIES
    from tinygpt.shards import shard_name

    out = tmp_path / "out"
    prepare_run.write_shards(make_corpus(tmp_path / "in"), out, SMALL, workers=1)
    written = sorted(p.name for p in out.iterdir())
    assert {"shards.json", "tokenizer.json", "tokenizer.vocab"} <= set(written)
    assert SHARDS_ENTRIES.user_entries(out) == []
    assert not [n for n in written if SHARDS_ENTRIES.is_temporary(n)]
    atomic = ["shards.json", ".shards-progress.json", "tokenizer.json", shard_name("train", 0),
              shard_name("val", 10**6)]
    temporary = [Path(tempfile.mkstemp(dir=tmp_path, prefix=f".{n}.", suffix=".part")[1]).name
                 for n in atomic]
    assert all(SHARDS_ENTRIES.owns(n) for n in atomic)
    assert all(SHARDS_ENTRIES.is_temporary(n) for n in temporary)
    users = ["notes.txt", "train_00001.bin", "train_000001.bin.bak", "test_000000.bin",
             ".train_000001.bin.1234567.part", ".notes.abcdefgh.part", "checkpoint.json"]
    assert not [n for n in users if SHARDS_ENTRIES.owns(n)]


def test_the_manifest_records_the_tokenizer_as_before(tmp_path):
    """The tokenizer entry (``tinygpt.files.manifest.tokenizer_entry``, shared with checkpoints)
    keeps the shards format: BPE's file as ``BPETokenizer.save`` writes it, with its SHA-256 in
    the entry; a char tokenizer's characters inline."""
    out = tmp_path / "bpe"
    prepare_run.write_shards(make_corpus(tmp_path / "in"), out, SMALL, workers=1)
    entry = read_manifest(out)["tokenizer"]
    data = (out / "tokenizer.json").read_bytes()
    assert entry == {"type": "bpe", "file": "tokenizer.json",
                     "sha256": hashlib.sha256(data).hexdigest()}
    load_shards_tokenizer(out).save(tmp_path / "again.json")
    assert (tmp_path / "again.json").read_bytes() == data
    assert (tmp_path / "again.vocab").read_bytes() == (out / "tokenizer.vocab").read_bytes()
    chars = Options(tokenizer="char", val_fraction=0.25, seed=3, shard_tokens=700)
    prepare_run.write_shards(tmp_path / "in", tmp_path / "char", chars, workers=1)
    entry = read_manifest(tmp_path / "char")["tokenizer"]
    assert entry == {"type": "char", "chars": load_shards_tokenizer(tmp_path / "char").chars}
    assert not (tmp_path / "char" / "tokenizer.json").exists()



@pytest.mark.parametrize("kind", ["char", "bpe", "gpt2"])
def test_every_kind_of_tokenizer_comes_back_from_a_shards_folder(tmp_path, kind):
    """What prepare made, read back through the manifest, against tokenizers made here: the
    characters of every document, BPE trained on the training documents, GPT-2's."""
    corpus = make_corpus(tmp_path / "in", files=3)
    options = Options(kind, 300, 0.25, 3, 700)
    prepare_run.write_shards(corpus, tmp_path / "out", options, workers=1)
    docs = documents(corpus, options)
    if kind == "char":
        reference = CharTokenizer.from_text("".join(docs["train"] + docs["val"]))
    elif kind == "bpe":
        reference = BPETokenizer.train(EOT.join(docs["train"]), 300, special_tokens=[EOT])
    else:
        reference = load_tokenizer(*tokenizer_files())
    loaded = load_shards_tokenizer(tmp_path / "out")
    assert type(loaded) is type(reference)
    assert tokenizer_fingerprint(loaded) == tokenizer_fingerprint(reference)


@pytest.fixture(scope="module")
def char_shards(tmp_path_factory) -> Path:
    """A finished shards folder of a character tokenizer (copy it before changing it)."""
    folder = tmp_path_factory.mktemp("char-shards")
    options = Options("char", val_fraction=0.25, seed=3, shard_tokens=700)
    prepare_run.write_shards(make_corpus(folder / "in", files=3), folder / "out", options,
                             workers=1)
    return folder / "out"


# The entries no manifest may hold, and those a shards manifest may not: a BPE entry without
# its file's SHA-256, or naming a file the folder does not hold (the error names that file)
BAD_SHARDS_ENTRIES = {
    **BAD_TOKENIZER_ENTRIES,
    "no checksum": ({"type": "bpe", "file": "tokenizer.json"}, "no 'sha256'"),
    "no such file": ({"type": "bpe", "file": "tokenizer.json", "sha256": "0" * 64},
                     "tokenizer.json: missing"),
}


@pytest.mark.parametrize("case", BAD_SHARDS_ENTRIES)
def test_a_tokenizer_entry_tinygpt_never_writes_is_a_clear_error(tmp_path, capsys, char_shards,
                                                                 case):
    import shutil

    entry, words = BAD_SHARDS_ENTRIES[case]
    out = tmp_path / "shards"
    shutil.copytree(char_shards, out)
    rewrite_shards_manifest(out, lambda manifest: manifest.update(tokenizer=entry))
    with pytest.raises(ShardError) as caught:
        load_shards_tokenizer(out)
    message = str(caught.value)
    named = out / ("tokenizer.json" if case == "no such file" else "shards.json")
    assert message.startswith(f"{named}: ") and words in message and "\n" not in message
    code, _, err = run_cli(capsys, "train", "--data", out, "--out", tmp_path / "run", *CLI_TINY)
    assert code == 2 and err == f"tinygpt: error: {message}\n"

def test_gpt2_shards_are_gpt2_token_ids(tmp_path):
    corpus = make_corpus(tmp_path / "in", files=2)
    options = Options("gpt2", val_fraction=0.3, seed=1)
    prepare_run.write_shards(corpus, tmp_path / "out", options, workers=1)
    enc = tiktoken.Encoding("gpt2-local", pat_str=load_tokenizer(*tokenizer_files()).pattern,
                            mergeable_ranks=dict(ranks_of(load_tokenizer(*tokenizer_files()))),
                            special_tokens={EOT: 50256})
    docs = documents(corpus, options)
    want = [i for d in docs["train"] for i in enc.encode_ordinary(d) + [50256]]
    assert np.concatenate(TokenShards(tmp_path / "out").arrays).tolist() == want


def ranks_of(tokenizer):
    return {t: i for i, t in enumerate(tokenizer.tokens[:50256])}


MEMORY_SCRIPT = """
import resource, sys
from tinygpt.prepare.documents import Options
from tinygpt.prepare import write_shards
write_shards(sys.argv[1], sys.argv[2], Options("char", val_fraction=0.5, shard_tokens=1 << 20),
             workers=1)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def peak_kib(tmp_path: Path, name: str, megabytes: int) -> int:
    corpus = tmp_path / name
    corpus.mkdir()
    line = "".join(random.Random(0).choice("abcdefgh \n") for _ in range(1 << 16))
    with open(corpus / "big.txt", "w") as f:
        for i in range(megabytes * 16):
            f.write(line + (EOT if i % 7 == 6 else ""))
    src = str(Path(__file__).parent.parent / "src")
    run = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT, str(corpus),
                          str(tmp_path / f"{name}-out")], capture_output=True, text=True,
                         env={"PYTHONPATH": src, "PATH": "/usr/bin:/bin"}, check=True)
    return int(run.stdout.split()[-1])


def test_prepare_streams_in_bounded_memory(tmp_path):
    small, large = peak_kib(tmp_path, "small", 8), peak_kib(tmp_path, "large", 48)
    assert large - small < 20 * 1024, (small, large)  # 40 MB more text, < 20 MB more memory


LIMITED_SCRIPT = """
import resource, sys
from tinygpt.prepare.documents import Options
from tinygpt.prepare import write_shards
corpus, out, limit, what = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))  # for this process and its workers
try:
    if what == "read":  # the control: the whole file does not fit under the limit
        text = open(corpus + "/big.txt").read()
    else:
        write_shards(corpus, out, Options("gpt2", shard_tokens=1 << 22), workers=2)
except MemoryError:
    print("MemoryError")
else:
    print("done")
"""


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_DATA bounds mmap'ed memory on Linux")
def test_prepare_encodes_a_file_larger_than_its_memory_limit(tmp_path):
    """A 280 MB file prepared by a process (and its workers) limited to 256 MiB of data each,
    with GPT-2's tokenizer (the fastest here: no training, words from the standard re)."""
    vocab = require_data("gpt2/vocab.json")
    corpus = tmp_path / "in"
    corpus.mkdir()
    rng = random.Random(0)
    line = " ".join(rng.choice(WORDS[:12]) for _ in range(1 << 14)) + "\n"
    with open(corpus / "big.txt", "w") as f:
        while f.tell() < 280_000_000:
            f.write(line + EOT)
    limit = 256 * 2**20
    assert (corpus / "big.txt").stat().st_size > limit
    src = str(Path(__file__).parent.parent / "src")

    def run(what: str) -> str:
        out = subprocess.run([sys.executable, "-c", LIMITED_SCRIPT, str(corpus),
                              str(tmp_path / "out"), str(limit), what], capture_output=True,
                             text=True, env={"PYTHONPATH": src, "PATH": "/usr/bin:/bin",
                                             "TINYGPT_DATA": str(vocab.parent.parent),
                                             "OPENBLAS_NUM_THREADS": "1"})
        return out.stdout.strip() or out.stderr.strip().splitlines()[-1]

    assert run("read") == "MemoryError"  # the limit bites
    assert run("prepare") == "done"
    manifest = read_manifest(tmp_path / "out")
    assert sum(manifest["tokens"].values()) > 50_000_000


@pytest.mark.parametrize("argv, message", [
    (["prepare", "/no/such/file.txt", "--out", "X"], "no such file"),
    (["prepare", "IN", "--out", "AFILE"], "is a file"),
    (["prepare", "IN", "--out", "X", "--val-fraction", "1.5"], "--val-fraction must be"),
    (["prepare", "IN", "--out", "X", "--vocab-size", "100"], "--vocab-size at least 257"),
])
def test_prepare_errors_are_one_line(tmp_path, capsys, argv, message):
    corpus = make_corpus(tmp_path / "IN", files=2)
    (tmp_path / "afile").write_text("mine")
    names = {"IN": corpus, "X": tmp_path / "x", "AFILE": tmp_path / "afile"}
    argv = [str(names.get(a, a)) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("tinygpt: error:") and message in err and err.count("\n") == 1


def test_a_single_document_is_a_clear_error(tmp_path, capsys):
    (tmp_path / "one.txt").write_text("just one document " * 50)
    assert main(["prepare", str(tmp_path / "one.txt"), "--out", str(tmp_path / "o"),
                 "--quiet", "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert "validation tokens" in err and err.count("\n") == 1


def test_the_tokenizer_file_is_json_and_checked(tmp_path):
    out = tmp_path / "out"
    prepare_run.write_shards(make_corpus(tmp_path / "in"), out, SMALL, workers=1)
    entry = read_manifest(out)["tokenizer"]
    data = (out / entry["file"]).read_bytes()
    assert data.startswith(b"{") and hashlib.sha256(data).hexdigest() == entry["sha256"]
    (out / entry["file"]).write_bytes(data + b" ")  # still valid JSON, but altered
    with pytest.raises(ShardError, match="altered"):
        load_shards_tokenizer(out)


def killed_run(corpus: Path, out: Path, monkeypatch) -> Path:
    """``out`` after a prepare run killed once it wrote two shards: its progress file, no
    ``shards.json``."""
    real, calls = prepare_run._write_shard, []

    def dies_after_two(folder, name, tokens):
        if len(calls) == 2:
            raise KeyboardInterrupt
        calls.append(name)
        return real(folder, name, tokens)

    with monkeypatch.context() as patch:
        patch.setattr(prepare_run, "_write_shard", dies_after_two)
        with pytest.raises(KeyboardInterrupt):
            prepare_run.write_shards(corpus, out, SMALL, workers=1)
    assert (out / PROGRESS).is_file() and not (out / "shards.json").exists()
    return out


def test_an_unfinished_runs_errors_name_its_progress_file(tmp_path, monkeypatch):
    """What is read from an unfinished run's ``.shards-progress.json`` is reported against it,
    not against a ``shards.json`` that is not there."""
    out = killed_run(make_corpus(tmp_path / "in"), tmp_path / "out", monkeypatch)
    progress = out / PROGRESS
    manifest = read_manifest(out, PROGRESS)
    assert load_shards_tokenizer(out, manifest, PROGRESS).vocab_size == manifest["vocab_size"]

    def refused(call, *named: Path) -> str:  # the message, once it names these files
        with pytest.raises(ShardError) as caught:
            call()
        message = str(caught.value)
        assert all(str(path) in message for path in named), message
        assert "shards.json" not in message.replace(PROGRESS, ""), message
        return message

    tokenizer_file = out / manifest["tokenizer"]["file"]
    original = tokenizer_file.read_bytes()
    tokenizer_file.write_bytes(original + b" ")
    refused(lambda: load_shards_tokenizer(out, manifest, PROGRESS), tokenizer_file, progress)
    tokenizer_file.write_bytes(original)
    altered = {**manifest, "vocab_size": manifest["vocab_size"] - 1}
    message = refused(lambda: load_shards_tokenizer(out, altered, PROGRESS), progress)
    assert message.startswith(f"{progress}: vocab_size {manifest['vocab_size'] - 1}")
    first = manifest["shards"]["train"][0]
    shard = out / first["file"]
    shard.write_bytes(shard.read_bytes()[:-2])
    message = refused(lambda: check_shard(out, first, np.dtype(manifest["dtype"]), name=PROGRESS),
                      shard)
    assert f"{PROGRESS} says {shard.stat().st_size + 2}" in message, message
    progress.unlink()
    assert "no unfinished run" in refused(lambda: read_manifest(out, PROGRESS), progress)


# Damage any manifest can suffer, and the words its error says after the file's name
MANIFEST_DAMAGE = {
    "not JSON": (lambda raw: raw[: len(raw) // 2], "not valid JSON ("),
    "not UTF-8": (lambda raw: b"\xff" + raw, "not valid JSON ("),
    "nested too deeply": (lambda raw: b"[" * 100_000 + b"]" * 100_000,
                          "not a FORMAT file (JSON nested too deeply)"),
    "another format": (lambda raw: raw.replace(b'"tinygpt-', b'"nanogpt-', 1), "not a FORMAT file"),
    "a later version": (lambda raw: json_edit(raw, version=99),
                        "format version 99 is not supported (this tinygpt reads version"),
    "edited": (lambda raw: json_edit(raw, comment="mine"),
               "its checksum does not match its content (or it has none)"),
    "no checksum": (lambda raw: json_edit(raw, checksum=None),
                    "its checksum does not match its content (or it has none)"),
}


def json_edit(raw: bytes, **changes) -> bytes:
    """The manifest ``raw`` with ``changes``, its checksum kept as it was (a ``None`` removes)."""
    import json

    content = {**json.loads(raw), **changes}
    return json.dumps({k: v for k, v in content.items() if v is not None}).encode()


@pytest.mark.parametrize("damage", MANIFEST_DAMAGE)
def test_every_manifest_is_read_by_one_reader_with_the_same_errors(tmp_path, monkeypatch,
                                                                  damage):
    """A checkpoint's ``checkpoint.json``, a shards folder's ``shards.json`` and an unfinished
    run's ``.shards-progress.json``, damaged alike, are refused alike: the file's name, the same
    words, what to do."""
    import torch

    from tinygpt.checkpoint import load_checkpoint, save_checkpoint
    from tinygpt.checkpoint.folder import CheckpointError
    from tinygpt.config import GPTConfig
    from tinygpt.model import GPT

    corpus = make_corpus(tmp_path / "in", files=2)
    config = GPTConfig(vocab_size=8, block_size=4, n_layer=1, n_head=1, n_embd=4)
    torch.manual_seed(0)
    save_checkpoint(tmp_path / "ck", GPT(config), None, config, None, 1)
    prepare_run.write_shards(corpus, tmp_path / "done", SMALL, workers=1)
    killed_run(corpus, tmp_path / "killed", monkeypatch)
    readers = [(tmp_path / "ck" / "checkpoint.json", CheckpointError, "tinygpt-checkpoint",
                lambda: load_checkpoint(tmp_path / "ck")),
               (tmp_path / "done" / "shards.json", ShardError, "tinygpt-shards",
                lambda: read_manifest(tmp_path / "done")),
               (tmp_path / "killed" / PROGRESS, ShardError, "tinygpt-shards",
                lambda: read_manifest(tmp_path / "killed", PROGRESS))]
    change, words = MANIFEST_DAMAGE[damage]
    for path, error, file_format, read in readers:
        path.write_bytes(change(path.read_bytes()))
        with pytest.raises(error) as caught:
            read()
        message = str(caught.value)
        assert message.startswith(f"{path}: ") and "\n" not in message, message
        assert words.replace("FORMAT", file_format) in message, message
        assert message.endswith(("; run tinygpt prepare again", "; load another checkpoint or "
                                 "train anew")), message


def test_bpe_counted_by_workers_learns_what_bpe_train_learns_on_the_training_documents(tmp_path):
    from tinygpt.tokenizer import BPETokenizer

    corpus = make_corpus(tmp_path / "in")
    prepare_run.write_shards(corpus, tmp_path / "out", SMALL, workers=2)
    docs = documents(corpus, SMALL)["train"]
    reference = BPETokenizer.train(EOT.join(docs), SMALL.vocab_size, special_tokens=[EOT])
    ours = load_shards_tokenizer(tmp_path / "out")
    assert ours.merges == reference.merges and ours.tokens == reference.tokens
    assert ours.special_tokens == reference.special_tokens == {EOT: SMALL.vocab_size - 1}


def test_tiny_reads_and_parts_give_the_same_shards(tmp_path, monkeypatch):
    """Files read 5 characters at a time (a separator split across reads) and documents cut
    into parts of about 40 characters encode exactly as whole documents do."""

    corpus = make_corpus(tmp_path / "in", files=3)
    prepare_run.write_shards(corpus, tmp_path / "whole", SMALL, workers=1)
    monkeypatch.setattr(prepare_documents, "READ_CHARS", 5)
    monkeypatch.setattr(prepare_documents, "PART_CHARS", 40)
    monkeypatch.setattr(prepare_workers, "COUNT_CHARS", 40)  # words counted part by part for BPE
    prepare_run.write_shards(corpus, tmp_path / "pieces", SMALL, workers=1)
    assert shard_bytes(tmp_path / "pieces") == shard_bytes(tmp_path / "whole")
    docs = documents(corpus, SMALL)
    assert decoded(tmp_path / "pieces", "val") == "".join(d + EOT for d in docs["val"])


FEW_WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog;", "sun,", "moon"]


TINY_SHARDS = Options(tokenizer="char", val_fraction=0.25, seed=3, shard_tokens=50)


def make_small_corpus(folder: Path, files: int = 4, docs: int = 4, words: int = 120) -> Path:
    rng = random.Random(0)
    folder.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        texts = [" ".join(rng.choice(FEW_WORDS) for _ in range(words)) for _ in range(docs)]
        (folder / f"doc{f}.txt").write_text(EOT.join(texts), encoding="utf-8")
    return folder


def folder_bytes(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


def test_many_small_shards_do_not_rewrite_the_progress_file_for_each(tmp_path, monkeypatch):
    monkeypatch.setattr(prepare_run.time, "monotonic", lambda: 0.0)  # a fast machine
    saves = []
    real = prepare_run.save_json
    monkeypatch.setattr(prepare_run, "save_json",
                        lambda out, name, m: saves.append(name) or real(out, name, m))
    manifest = prepare_run.write_shards(make_small_corpus(tmp_path / "in"), tmp_path / "out",
                                        TINY_SHARDS, workers=1)
    shards = sum(len(v) for v in manifest["shards"].values())
    assert shards > 150
    # was one save a shard (quadratic bytes); now after 1, 2, 4, 8... shards
    assert saves.count(PROGRESS) <= 12, (saves.count(PROGRESS), shards)


@pytest.mark.parametrize("killed_after", [5, 37])
def test_a_run_killed_between_progress_saves_resumes_exactly(tmp_path, monkeypatch, killed_after):
    monkeypatch.setattr(prepare_run.time, "monotonic", lambda: 0.0)  # a fast machine
    corpus = make_small_corpus(tmp_path / "in")
    prepare_run.write_shards(corpus, tmp_path / "straight", TINY_SHARDS, workers=1)
    real, calls = prepare_run._write_shard, []

    def dies(out, name, tokens):
        if len(calls) == killed_after:
            raise KeyboardInterrupt
        calls.append(name)
        return real(out, name, tokens)

    monkeypatch.setattr(prepare_run, "_write_shard", dies)
    with pytest.raises(KeyboardInterrupt):
        prepare_run.write_shards(corpus, tmp_path / "killed", TINY_SHARDS, workers=1)
    rewritten: list[str] = []
    monkeypatch.setattr(prepare_run, "_write_shard",
                        lambda out, name, tokens: rewritten.append(name) or real(out, name, tokens))
    prepare_run.write_shards(corpus, tmp_path / "killed", TINY_SHARDS, workers=1)
    assert set(calls) & set(rewritten) != set(calls)  # some finished shards were kept
    assert folder_bytes(tmp_path / "killed") == folder_bytes(tmp_path / "straight")


def test_an_input_changed_with_the_same_size_and_time_is_prepared_again(tmp_path):

    corpus, out = make_small_corpus(tmp_path / "in"), tmp_path / "out"
    first = prepare_run.write_shards(corpus, out, TINY_SHARDS, workers=1)
    path = corpus / "doc0.txt"
    stat = path.stat()
    text = path.read_text(encoding="utf-8")
    path.write_text(text.replace("fox", "cat"), encoding="utf-8")  # same size
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # and the same time
    assert path.stat().st_size == stat.st_size
    with pytest.raises(ValueError, match="other inputs or options"):  # was: the old shards
        prepare_run.write_shards(corpus, out, TINY_SHARDS, workers=1)
    again = prepare_run.write_shards(corpus, out, TINY_SHARDS, workers=1, overwrite=True)
    assert again["shards"] != first["shards"]


def test_a_full_disk_names_the_file_and_says_what_to_do(capsys, tmp_path, monkeypatch):
    import errno

    from conftest import run_cli as run

    import tinygpt.data

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tinygpt.data.os, "fsync", full)
    corpus = make_small_corpus(tmp_path / "in")
    code, _, err = run(capsys, "prepare", corpus, "--out", tmp_path / "out", "--tokenizer",
                       "char", "--workers", "1", "--quiet")
    assert code == 2 and err.count("\n") == 1, err
    assert "[Errno 28]" not in err  # was: tinygpt: error: [Errno 28] No space left on device
    assert "the disk is full while writing" in err and str(tmp_path / "out") in err
    assert "free some space" in err


@pytest.mark.parametrize("kind", ["device", "fifo"])
def test_prepare_of_a_device_or_fifo_says_what_it_is_not_no_such_file(capsys, tmp_path, kind):

    from conftest import run_cli as run

    path = Path("/dev/zero")
    if kind == "fifo":
        path = tmp_path / "pipe"
        os.mkfifo(path)
    code, _, err = run(capsys, "prepare", path, "--out", tmp_path / "out", "--quiet")
    assert code == 2 and err.count("\n") == 1, err
    assert "no such file" not in err  # was: "/dev/zero: no such file, no file in that folder..."
    assert ("a character device" if kind == "device" else "a FIFO") in err, err
    assert not (tmp_path / "out").exists()


def test_a_killed_runs_shards_are_kept_from_a_run_of_other_options(tmp_path, monkeypatch):
    """A prepare of other options (or inputs) into a killed run's folder is refused, its
    finished shards kept, unless --overwrite; the same options then finish the killed run."""
    corpus = make_corpus(tmp_path / "in")
    out = killed_run(corpus, tmp_path / "out", monkeypatch)
    before = folder_bytes(out)
    other = Options(tokenizer="bpe", vocab_size=300, val_fraction=0.25, seed=4, shard_tokens=700)
    with pytest.raises(ValueError, match=r"unfinished run of other inputs or options.*--overwrite"):
        prepare_run.write_shards(corpus, out, other, workers=1)
    assert folder_bytes(out) == before  # nothing deleted
    prepare_run.write_shards(corpus, out, other, workers=1, overwrite=True)
    assert read_manifest(out)["fingerprint"]["options"]["seed"] == 4


@pytest.mark.parametrize("tokenizer", ["char", "bpe"])
def test_a_file_growing_while_it_is_read_is_read_to_its_size_at_the_start(tmp_path, monkeypatch,
                                                                          tokenizer):
    """A writer appending to an input once the run has begun (a log, a download) changes
    nothing: the run reads, hashes and records each file's size at its start."""
    import shutil

    options = dataclasses.replace(TINY_SHARDS, tokenizer=tokenizer, vocab_size=270)
    straight = prepare_run.write_shards(make_small_corpus(tmp_path / "a"), tmp_path / "straight",
                                        options, workers=1)
    corpus = tmp_path / "b"
    shutil.copytree(tmp_path / "a", corpus)
    real = prepare_run.fingerprint

    def then_grows(*args, **kwargs):  # the inputs as the run began, then a writer appends
        found = real(*args, **kwargs)
        with open(corpus / "doc1.txt", "a", encoding="utf-8") as f:
            f.write(" ZEBRA QUAGGA" * 500)
        return found

    monkeypatch.setattr(prepare_run, "fingerprint", then_grows)
    grown = prepare_run.write_shards(corpus, tmp_path / "grown", options, workers=1)
    assert grown["tokens"] == straight["tokens"] and grown["vocab_size"] == straight["vocab_size"]
    assert folder_bytes(tmp_path / "grown") == folder_bytes(tmp_path / "straight")


# --- prepare's lock ------------------------------------------------------------------------------

def test_a_second_prepare_into_a_folder_in_use_is_refused_and_changes_nothing(capsys, tmp_path):
    shards = prepare_char_shards(capsys, tmp_path)
    before = {p.name: p.read_bytes() for p in shards.iterdir() if p.name != ".tinygpt.lock"}
    with lock_held_elsewhere(shards) as first:
        code, _, err = run_cli(capsys, "prepare", tmp_path / "shards-in", "--out", shards,
                               "--tokenizer", "bpe", "--vocab-size", "300", "--overwrite",
                               "--workers", "1", "--quiet")
        assert_one_line_error(code, err, str(shards), "in use by another tinygpt process",
                       f"pid {first.pid}")
        after = {p.name: p.read_bytes() for p in shards.iterdir() if p.name != ".tinygpt.lock"}
        assert after == before
    code, _, err = run_cli(capsys, "prepare", tmp_path / "shards-in", "--out", shards,
                           "--tokenizer", "bpe", "--vocab-size", "300", "--overwrite",
                           "--workers", "1", "--quiet", "--val-fraction", "0.3", "--seed", "1")
    assert code == 0, err  # once the first one ended, the folder is free


def test_prepare_takes_a_folder_holding_only_a_left_lock(capsys, tmp_path):
    shards = tmp_path / "shards"
    shards.mkdir()
    (shards / ".tinygpt.lock").write_text("12345\n")  # left by a prepare killed at its start
    prepare_cli(capsys, FOLDER_TEXT, shards, "--tokenizer", "char")
    assert (shards / "shards.json").is_file()


def test_a_finished_prepare_leaves_no_lock_and_a_lock_removed_meanwhile_is_no_lock(capsys,
                                                                                  tmp_path,
                                                                                  monkeypatch):
    import fcntl

    from tinygpt.checkpoint import folder

    shards = prepare_char_shards(capsys, tmp_path)
    assert not (shards / ".tinygpt.lock").exists()  # the folder holds the shards only
    real = fcntl.flock

    def holder_ends_first(fd, op):  # the holder removes its lock file just before we get it
        (shards / ".tinygpt.lock").unlink()
        return real(fd, op)

    monkeypatch.setattr(fcntl, "flock", holder_ends_first)
    with pytest.raises(folder.CheckpointError, match="until a moment ago"), \
            folder.locked(shards):
        pass


# --- prepare never reads its own output as text --------------------------------------------------

def test_prepare_skips_a_shards_folder_among_its_inputs_and_refuses_one_alone(capsys, tmp_path):
    import json

    data = tmp_path / "data"
    data.mkdir()
    # data/shards-in: the text
    prepare_cli(capsys, FOLDER_TEXT, data / "shards", "--tokenizer", "char")
    code, _, err = run_cli(capsys, "prepare", data, "--out", tmp_path / "all", "--tokenizer",
                           "char", "--val-fraction", "0.3", "--seed", "1", "--workers", "1",
                           "--quiet")
    assert code == 0, err
    assert f"note: skipping {data / 'shards'}" in err
    inputs = json.loads((tmp_path / "all" / "shards.json").read_text())["fingerprint"]["inputs"]
    assert sorted(name for name, *_ in inputs) == [f"shards-in/doc{i}.txt" for i in range(4)]
    code, _, err = run_cli(capsys, "prepare", data / "shards", "--out", tmp_path / "again",
                           "--tokenizer", "char", "--quiet")
    assert_one_line_error(code, err, "only tinygpt shards folders", str(data / "shards"))
    assert not (tmp_path / "again").exists()


# --- --workers -----------------------------------------------------------------------------------

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
    (folder / "a.txt").write_text(FOLDER_TEXT)
    code, _, err = run_cli(capsys, "prepare", folder, "--out", tmp_path / "out", "--workers",
                           workers, "--quiet")
    assert_one_line_error(code, err, "--workers", "from 1 to 1024", workers)
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
        (folder / f"doc{i}.txt").write_text(FOLDER_TEXT)  # about 4 x 1,300 characters
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


# --- the out folder, leftovers -------------------------------------------------------------------

@pytest.mark.parametrize("how", ["read-only", "under-a-file"])
def test_an_out_that_prepare_cannot_create_says_why(capsys, folder_data, tmp_path, monkeypatch,
                                                    how):
    check_an_out_that_cannot_be_created(capsys, folder_data, tmp_path, monkeypatch, "prepare",
                                        how)


@pytest.mark.parametrize("finished", [True, False])
def test_the_temporary_files_of_a_killed_prepare_are_removed_by_the_next(capsys, tmp_path,
                                                                        finished):
    shards = prepare_bpe_shards(capsys, tmp_path)
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
    code, _, err = run_cli(capsys, *prepare_again)
    assert code == 0, err
    assert not [p.name for p in shards.iterdir() if p.name in left]
    assert (shards / "shards.json").is_file()

