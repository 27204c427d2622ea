"""Shared test policy for data files that may have to be downloaded.

Tests that need a file such as ``gpt2/vocab.json`` ask the ``data_path`` fixture for it::

    def test_vocab(data_path):
        vocab = data_path("gpt2/vocab.json")

The fixture returns the checked local path. When the file cannot be had (no ``TINYGPT_DATA``
copy, no cached copy, no network), the test is skipped with the reason -- unless the ``CI``
environment variable is set, in which case it fails: continuous integration must never pass by
skipping. A file with a wrong checksum is always an error, never a skip.

This module does not decide where files are looked for; ``tinygpt.data`` does.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from hypothesis import strategies as st

from tinygpt.data import DataNotFoundError, get_path


def in_ci() -> bool:
    """Whether the tests run under continuous integration (``CI`` set to a true-ish value)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def require_data(name: str) -> Path:
    """The path of data file ``name``; skip the calling test if it cannot be had (fail under CI)."""
    try:
        return get_path(name)
    except DataNotFoundError as error:
        if in_ci():
            pytest.fail(f"data file {name!r} is required under CI:\n{error}", pytrace=False)
        pytest.skip(f"data file {name!r} is not available: {error}")


@pytest.fixture(autouse=True, scope="session")
def one_torch_thread():
    """Run the tests on one torch thread. Their tensors are tiny: a second thread only adds
    synchronisation, which on a busy two-core machine costs far more than the arithmetic
    (seconds instead of milliseconds). Imported lazily so that non-torch tests stay light."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def data_path() -> Callable[[str], Path]:
    """A function ``name -> Path`` applying the ``require_data`` policy."""
    return require_data


@st.composite
def corpora(draw, min_len: int = 1, max_len: int = 300) -> tuple[list[int], int]:
    """Hypothesis strategy: a vocabulary size V (1 to 12) and a random id sequence over it."""
    V = draw(st.integers(1, 12))
    ids = draw(st.lists(st.integers(0, V - 1), min_size=min_len, max_size=max_len))
    return ids, V


def random_ids(n: int, V: int, seed: int) -> list[int]:
    """``n`` ids drawn uniformly from ``range(V)`` with a seeded generator."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (n,), generator=g).tolist()


# A small corpus and the smallest model the command-line tests train, in a second or two.
CLI_TEXT = "".join(f"{w} the {v} was {n} and more.\n" for w, v, n in zip(
    ["first", "second", "third", "fourth", "fifth", "sixth"] * 5,
    ["cat", "dog", "fox", "owl", "ant", "bee"] * 5, range(30)))
CLI_TINY = ["--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "8",
            "--batch-size", "4", "--max-iters", "2", "--eval-interval", "2", "--eval-iters", "1",
            "--warmup-iters", "1", "--quiet"]


def train_cli_checkpoint(folder: Path, flags: list[str] = CLI_TINY) -> Path:
    """``tinygpt train`` on ``CLI_TEXT`` (written to ``folder/corpus.txt``) with ``flags``; the
    run folder ``folder/run`` it wrote."""
    from tinygpt.cli import main

    (folder / "corpus.txt").write_text(CLI_TEXT, encoding="utf-8")
    assert main(["train", "--data", str(folder / "corpus.txt"), "--out", str(folder / "run"),
                 *flags]) == 0
    return folder / "run"


def count_calls(monkeypatch, where: list[tuple[object, str]]) -> list[str]:
    """Replace each function ``module.name`` by one that records ``"module.name"`` (the module's
    last name, e.g. ``"sample.check_sampling"``) and then calls it; the list of records."""
    calls: list[str] = []
    for module, name in where:
        real = getattr(module, name)
        label = f"{module.__name__.rsplit('.', 1)[-1]}.{name}"

        def counted(*args, real=real, label=label, **kwargs):
            calls.append(label)
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)
    return calls


def run_cli(capsys, *argv: object) -> tuple[int, str, str]:
    """``tinygpt ARGV`` in this process: (exit code, stdout, stderr)."""
    from tinygpt.cli import main

    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def checksum_of(manifest: dict) -> str:
    """The checksum a manifest (a checkpoint's, a shards folder's) carries, computed here as
    their format says: the SHA-256 of its JSON without the checksum, sorted keys, no spaces."""
    content = {k: v for k, v in manifest.items() if k != "checksum"}
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(canonical).hexdigest()


def rewrite_manifest(folder: Path, change: Callable[[dict], object], checksum: bool = True) -> None:
    """Edit a checkpoint's manifest with ``change``; with ``checksum``, recompute its checksum
    as a deliberate (or hostile) editor would, so that the checks behind the checksum are
    tested."""
    meta = json.loads((folder / "checkpoint.json").read_text())
    change(meta)
    meta.pop("checksum")
    if checksum:
        meta["checksum"] = checksum_of(meta)
    (folder / "checkpoint.json").write_text(json.dumps(meta))


def rewrite_shards_manifest(folder: Path, change: Callable[[dict], object]) -> None:
    """Edit a shards folder's ``shards.json`` with ``change`` and recompute its checksum, as a
    deliberate (or hostile) editor would, so that the checks behind the checksum are tested."""
    manifest = json.loads((folder / "shards.json").read_text())
    change(manifest)
    manifest["checksum"] = checksum_of(manifest)
    (folder / "shards.json").write_text(json.dumps(manifest))


@pytest.fixture
def cli_corpus(tmp_path: Path) -> Path:
    """``CLI_TEXT`` in ``tmp_path/corpus.txt``."""
    path = tmp_path / "corpus.txt"
    path.write_text(CLI_TEXT, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def cli_checkpoint(tmp_path_factory) -> Path:
    """A checkpoint of a tiny char model trained for 2 steps on ``CLI_TEXT`` (``CLI_TINY``),
    shared by a test module's sampling tests."""
    return train_cli_checkpoint(tmp_path_factory.mktemp("trained"))


def assert_one_line_error(code: int, err: str, *words: str) -> None:
    """The command refused its input as every bad input is refused: exit code 2 and one line,
    ``tinygpt: error: ...``, that holds each of ``words``."""
    assert code == 2 and err.startswith("tinygpt: error: ") and err.count("\n") == 1, err
    for word in words:
        assert word in err, (word, err)


# --- the folders tinygpt writes and reads back: checkpoints, shards (test_checkpoint,
# test_shards, test_prepare, test_data, test_cli_train) -------------------------------------------

# CLI_TEXT with a "zebra" on every line (a 'z', which one flipped bit turns into '{'), and a model
# trained on it for five steps.
FOLDER_TEXT = "".join(f"{w} the {v} was {n} and more zebra.\n" for w, v, n in zip(
    ["first", "second", "third", "fourth", "fifth", "sixth"] * 5,
    ["cat", "dog", "fox", "owl", "ant", "bee"] * 5, range(30)))
FOLDER_TINY = ["--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "16",
               "--batch-size", "2", "--max-iters", "5", "--eval-interval", "5",
               "--eval-iters", "1", "--quiet"]
REDOS = r"(a|a)*c|[\s\S]"  # 'a' * 40 takes 2**40 steps to fail the first branch


@pytest.fixture
def folder_data(tmp_path: Path) -> Path:
    """``FOLDER_TEXT`` in ``tmp_path/small.txt``."""
    path = tmp_path / "small.txt"
    path.write_text(FOLDER_TEXT, encoding="utf-8")
    return path


def prepare_cli(capsys, text: str, out: Path, *options: object) -> None:
    """``tinygpt prepare`` of four documents of ``text`` (in ``OUT-in``, one held out) into
    ``out`` with ``options``."""
    folder = out.parent / f"{out.name}-in"
    folder.mkdir()
    for i in range(4):  # four documents, one held out
        (folder / f"doc{i}.txt").write_text(text, encoding="utf-8")
    code, _, err = run_cli(capsys, "prepare", folder, "--out", out, "--val-fraction", "0.3",
                           "--seed", "1", "--workers", "1", "--quiet", *options)
    assert code == 0, err


def prepare_char_shards(capsys, tmp_path: Path) -> Path:
    """``tmp_path/shards``: ``FOLDER_TEXT`` prepared with a character tokenizer."""
    prepare_cli(capsys, FOLDER_TEXT, tmp_path / "shards", "--tokenizer", "char")
    return tmp_path / "shards"


def prepare_bpe_shards(capsys, tmp_path: Path) -> Path:
    """``tmp_path/shards``: ``FOLDER_TEXT`` prepared with a BPE tokenizer of 300 tokens."""
    prepare_cli(capsys, FOLDER_TEXT, tmp_path / "shards", "--tokenizer", "bpe", "--vocab-size",
                "300")
    return tmp_path / "shards"


def check_an_out_that_cannot_be_created(capsys, folder_data: Path, tmp_path: Path, monkeypatch,
                                        command: str, how: str) -> None:
    """``tinygpt COMMAND`` (train or prepare) into an ``--out`` that cannot be created (``how``:
    on a read-only file system, or under a file) says why in one line, and changes nothing."""
    out = tmp_path / "new" / "run"
    if how == "under-a-file":
        out = folder_data / "sub"  # --out mydata.txt/sub
    else:
        real = Path.mkdir

        def read_only(self, *args, **kwargs):
            if self in (out, out.parent):  # the new folders, not tmp_path
                raise OSError(30, "Read-only file system", str(self))
            return real(self, *args, **kwargs)

        monkeypatch.setattr(Path, "mkdir", read_only)  # root ignores chmod: simulate it
    argv = [command, "--data", folder_data, "--out", out, *FOLDER_TINY] if command == "train" \
        else [command, folder_data, "--out", out, "--quiet"]
    code, _, err = run_cli(capsys, *argv)
    why = "Read-only file system" if how == "read-only" else "Not a directory"
    assert_one_line_error(code, err, str(out), why)
    assert "No such file" not in err and "[Errno" not in err
    assert folder_data.read_text() == FOLDER_TEXT


# --- the tokenizer entry of both manifests (test_tokenizer, test_checkpoint, test_prepare) ------

# Entries that tinygpt.files.manifest.tokenizer_entry never writes, and words the error must say
# besides the manifest's name (a checkpoint's and a shards folder's alike).
BAD_TOKENIZER_ENTRIES: dict[str, tuple[object, str]] = {
    "a list": (["char", "abc"], "tokenizer entry is list, not an object"),
    "an unknown type": ({"type": "words", "chars": ["a"]}, "unknown tokenizer type 'words'"),
    "no characters": ({"type": "char"}, "no list of characters"),
    "characters that are not text": ({"type": "char", "chars": [1, 2]}, "no list of characters"),
    "a repeated character": ({"type": "char", "chars": ["a", "b", "a"]}, "'a' is repeated"),
    "a string of characters": ({"type": "char", "chars": ["ab", "c"]}, "'ab' is not a single"),
    "a file outside": ({"type": "bpe", "file": "../tokenizer.json", "sha256": "0" * 64},
                       "names the file '../tokenizer.json'"),
    "another file": ({"type": "bpe", "file": "model.safetensors", "sha256": "0" * 64},
                     "names the file 'model.safetensors'"),
    "no file": ({"type": "bpe", "sha256": "0" * 64}, "names the file None"),
}


def saved_tokenizer(kind: str) -> Any:
    """A tokenizer of each kind a manifest stores: ``"char"`` (with characters beyond ASCII,
    among them the three a chat template adds), ``"bpe"`` (trained, with a special token) and
    ``"gpt2"`` (GPT-2's, from its data files: skipped if they cannot be had)."""
    from tinygpt.tokenizer import EOT, BPETokenizer, CharTokenizer

    if kind == "char":
        plays = CharTokenizer.from_text("to be, or not to be: café 雪\n\t")
        return CharTokenizer([*plays.chars, "\u25b7", "\u25b6", "\u25a0"])  # last, unsorted
    if kind == "bpe":
        return BPETokenizer.train("low lower lowest newer newest " * 20, vocab_size=265,
                                  special_tokens=[EOT])
    if kind == "gpt2":
        from tinygpt.gpt2 import load_tokenizer

        return load_tokenizer(require_data("gpt2/vocab.json"), require_data("gpt2/merges.txt"))
    raise ValueError(f"no tokenizer of kind {kind!r}")


# --- the loss ladder on a small corpus (tests/test_ladder.py, tests/test_failure_modes.py) ------

def small_text() -> str:
    """A few thousand characters with some structure (words of a small alphabet, line breaks)."""
    import torch

    gen = torch.Generator().manual_seed(0)
    words = ["to", "be", "or", "not", "the", "king", "queen", "and", "a", "do", "be."]
    picks = torch.randint(len(words), (900,), generator=gen).tolist()
    return "".join(words[i] + ("\n" if j % 9 == 8 else " ") for j, i in enumerate(picks))


class LadderCorpus(NamedTuple):
    """What ``ladder_corpus`` put in place of the book's data, and the corpora asked for."""

    tokenizer: Any  # a CharTokenizer of small_text()
    train: list[int]
    val: list[int]
    calls: list[str]  # the corpus named in each call of book_data


@pytest.fixture
def ladder_corpus(monkeypatch, tmp_path) -> LadderCorpus:
    """``small_text()`` in place of the book's corpus (``trained_model.book_data``, split 9:1),
    a private cache (``TINYGPT_CACHE``) and trained rungs of a few steps, so that ladder tests
    are fast and never read or write the user's cache."""
    import dataclasses

    import torch

    from tinygpt.book import ladder, trained_model
    from tinygpt.tokenizer import CharTokenizer

    monkeypatch.setenv("TINYGPT_CACHE", str(tmp_path))
    text = small_text()
    tok = CharTokenizer.from_text(text)
    ids = torch.tensor(tok.encode(text))
    train_ids, val_ids = ids[: len(ids) * 9 // 10], ids[len(ids) * 9 // 10 :]
    calls: list[str] = []

    def book_data(corpus: str = "shakespeare"):
        calls.append(corpus)
        return tok, train_ids, val_ids

    monkeypatch.setattr(trained_model, "book_data", book_data)
    monkeypatch.setattr(ladder, "RUNG_TRAIN", dataclasses.replace(
        ladder.RUNG_TRAIN, max_iters=3, warmup_iters=1, batch_size=4))
    return LadderCorpus(tok, train_ids.tolist(), val_ids.tolist(), calls)


def default_ctrl_c() -> None:
    """A child's ``preexec_fn``: Ctrl-C (SIGINT) back to its default. A shell starts background
    jobs (``make test &``, ``nohup``) with SIGINT ignored, children inherit that, and Python
    then installs no KeyboardInterrupt handler: the Ctrl-C tests would test nothing."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


LOCK_HOLDER = """
import sys
from pathlib import Path
from tinygpt.checkpoint import folder
Path(sys.argv[1]).mkdir(exist_ok=True)
with folder.locked(Path(sys.argv[1])):
    print("LOCKED", flush=True)
    sys.stdin.readline()
"""


@contextlib.contextmanager
def lock_held_elsewhere(path: Path) -> Iterator[subprocess.Popen]:
    """Another process holding the tinygpt lock of the folder ``path`` (made if missing) for the
    block; the process is yielded (its ``pid`` is what an error must name), released after."""
    import tinygpt

    env = {**os.environ, "PYTHONPATH": str(Path(tinygpt.__file__).parents[1])}
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(path)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "LOCKED"
        yield holder
    finally:
        holder.communicate("\n", timeout=60)
