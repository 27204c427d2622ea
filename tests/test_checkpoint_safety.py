"""A user's files are never lost: the --out folder belongs to tinygpt and nothing else in it is
touched, saves are atomic for readers and locked against a second trainer, every file is
checksummed and validated before anything is allocated, and a diverged run keeps its last good
checkpoint. One test per way a file could be lost or a bad checkpoint read."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import subprocess
import sys
import textwrap
import threading
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import CLI_TEXT, CLI_TINY, rewrite_manifest
from conftest import run_cli as run

import tinygpt
from tinygpt.checkpoint import folder, load_checkpoint, save_checkpoint
from tinygpt.checkpoint.folder import CheckpointError
from tinygpt.config import GPTConfig, TrainConfig
from tinygpt.model import GPT
from tinygpt.tokenizer import BPETokenizer, CharTokenizer
from tinygpt.train import configure_optimizer, train

TEXT, TINY = CLI_TEXT, CLI_TINY
CONFIG = GPTConfig(vocab_size=12, block_size=8, n_layer=1, n_head=2, n_embd=8)


@pytest.fixture
def data(tmp_path: Path) -> Path:
    path = tmp_path / "small.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


def train_cli(capsys, data: Path, out: object, *extra: object) -> tuple[int, str, str]:
    return run(capsys, "train", "--data", data, "--out", out, *TINY, *extra)


def assert_refused(code: int, err: str, *words: str) -> None:
    assert code == 2 and err.startswith("tinygpt: error: ") and err.count("\n") == 1, err
    for word in words:
        assert word in err, (word, err)


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (relative path -> bytes)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def version_dir(folder: Path) -> Path:
    return folder / json.loads((folder / "checkpoint.json").read_text())["folder"]


def replace_listed(folder: Path, name: str, data: bytes) -> None:
    """Replace a file of the checkpoint and update its size and SHA-256 in the manifest."""
    (version_dir(folder) / name).write_bytes(data)
    entry = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    rewrite_manifest(folder, lambda m: m["files"].update({name: entry}))


def save_tiny(folder: Path, step: int = 1, fill: float | None = None, tokenizer=None) -> GPT:
    """A tiny model after one step, saved in ``folder``; its vocabulary is widened to fit a
    larger ``tokenizer`` (a checkpoint refuses a tokenizer of more tokens than the model)."""
    config = CONFIG if tokenizer is None else replace(
        CONFIG, vocab_size=max(CONFIG.vocab_size, tokenizer.vocab_size))
    torch.manual_seed(0)
    model = GPT(config)
    opt = configure_optimizer(model, TrainConfig(batch_size=2, max_iters=5))
    x = torch.randint(config.vocab_size, (2, config.block_size))
    model(x, x)[1].backward()
    opt.step()
    if fill is not None:
        with torch.no_grad():
            for t in [*model.parameters(), *(v for s in opt.state.values() for v in s.values())]:
                t.fill_(fill)
    save_checkpoint(folder, model, opt, config, None, step, tokenizer or CharTokenizer(
        "abcdefghijkl"), {"torch": torch.get_rng_state(), "python": random.getstate()})
    return model


# --- 1. the folder belongs to tinygpt ------------------------------------------------------------

def test_mywork_notes_txt_is_never_deleted(capsys, data, tmp_path):
    mywork = tmp_path / "mywork"
    mywork.mkdir()
    (mywork / "notes.txt").write_text("precious")
    code, _, err = train_cli(capsys, data, mywork)
    assert_refused(code, err, str(mywork), "not empty", "notes.txt", "--overwrite")
    assert sorted(p.name for p in mywork.iterdir()) == ["notes.txt"]  # nothing written
    for _ in range(2):  # --overwrite writes beside it, and replaces only its own checkpoint
        assert train_cli(capsys, data, mywork, "--overwrite")[0] == 0
        assert (mywork / "notes.txt").read_text() == "precious"
        assert load_checkpoint(mywork).step == 2
    assert sorted(p.name for p in mywork.iterdir() if not p.name.startswith("step-")) == [
        ".tinygpt.lock", "checkpoint.json", "notes.txt"]


def test_out_that_is_the_data_file_is_refused(capsys, data, tmp_path):
    before = data.read_bytes()
    assert_refused(*train_cli(capsys, data, data)[::2], "is a file", str(data))
    assert_refused(*train_cli(capsys, data, tmp_path)[::2], "training data")  # a folder holding it
    assert data.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == [
        "small.txt"]


def test_out_that_is_a_file_is_refused(capsys, data, tmp_path):
    thesis = tmp_path / "thesis.txt"
    thesis.write_text("years of work")
    assert_refused(*train_cli(capsys, data, thesis)[::2], "is a file", "thesis.txt")
    assert_refused(*train_cli(capsys, data, thesis, "--overwrite")[::2], "is a file")
    assert thesis.read_text() == "years of work"


def test_resume_and_overwrite_keep_samples_and_logs_beside_the_checkpoint(capsys, data,
                                                                          tmp_path):
    out = tmp_path / "mywork"
    assert train_cli(capsys, data, out)[0] == 0
    (out / "samples.txt").write_text("sampled")
    (out / "logs").mkdir()
    (out / "logs" / "run.log").write_text("log")
    mine = {k: v for k, v in snapshot(out).items() if k in ("samples.txt", "logs/run.log")}
    assert run(capsys, "train", "--data", data, "--out", out, "--resume", "--max-iters", 4,
               "--quiet")[0] == 0
    assert train_cli(capsys, data, out, "--overwrite")[0] == 0
    assert {k: v for k, v in snapshot(out).items() if k in mine} == mine


def test_a_foreign_checkpoint_json_is_never_replaced(capsys, data, tmp_path):
    out = tmp_path / "theirs"
    out.mkdir()
    (out / "checkpoint.json").write_text('{"model": "someone else\'s"}')
    assert_refused(*train_cli(capsys, data, out, "--overwrite")[::2], "not written by tinygpt")
    assert (out / "checkpoint.json").read_text() == '{"model": "someone else\'s"}'
    with pytest.raises(CheckpointError, match="not written by tinygpt"):
        save_tiny(out)


def test_folder_names_are_not_glob_patterns(capsys, data, tmp_path):
    run1 = tmp_path / "run[1]"
    assert train_cli(capsys, data, run1, "--max-iters", 5, "--save-every", 1)[0] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run[1]", "small.txt"]
    assert len([p for p in run1.iterdir() if p.name.startswith("step-")]) == 1  # no old copies
    assert load_checkpoint(run1).step == 5
    exp1 = tmp_path / "exp1"
    assert train_cli(capsys, data, exp1)[0] == 0
    before = snapshot(exp1)
    assert train_cli(capsys, data, tmp_path / "exp*", "--save-every", 1)[0] == 0
    assert snapshot(exp1) == before and load_checkpoint(tmp_path / "exp*").step == 2


@pytest.mark.parametrize("name", ["checkpoint.json", ".tinygpt.lock", ".tinygpt-probe-0123abcd",
                                  ".checkpoint.json.tmp-0123abcd", "../step-000001-0123abcd"])
def test_a_manifest_naming_another_entry_as_its_version_folder_is_refused(tmp_path, name):
    """Of tinygpt's own entries, only a ``step-`` folder is a version: the manifest, the lock or
    a probe named as one is an altered manifest (they all passed the old "is it tinygpt's"
    check)."""
    save_tiny(tmp_path / "ckpt")
    rewrite_manifest(tmp_path / "ckpt", lambda meta: meta.update(folder=name))
    with pytest.raises(CheckpointError, match="not a version folder"):
        load_checkpoint(tmp_path / "ckpt")


def test_only_tinygpt_names_are_its_own_in_a_checkpoint_folder(tmp_path):
    """``CHECKPOINT_ENTRIES`` owns the manifest, the lock, the version folders and the temporary
    names tinygpt's writers give (mkstemp's, as ``write_atomically`` makes them): a look-alike
    of another shape is the user's, and ``remove_stale`` leaves it."""
    import tempfile

    own = folder.CHECKPOINT_ENTRIES
    _, temporary = tempfile.mkstemp(dir=tmp_path, prefix=".checkpoint.json.", suffix=".part")
    ours = ["checkpoint.json", ".tinygpt.lock", "step-000012-0123abcd", "step-1234567-89abcdef",
            Path(temporary).name, ".checkpoint.json.tmp-0123abcd", ".tinygpt-probe-0123abcd"]
    users = ["notes.txt", "step-12-0123abcd", "step-000012-0123ABCD", "step-000012-0123abcd.bak",
             ".checkpoint.json.notes.part", ".checkpoint.json.0123abcd.part.txt", ".part",
             "checkpoint.json.bak", ".tinygpt.lock2", "tokenizer.json", "model.safetensors"]
    assert [name for name in ours if not own.owns(name)] == []
    assert [name for name in users if own.owns(name)] == []
    (tmp_path / "ckpt").mkdir()
    for name in users:
        (tmp_path / "ckpt" / name).write_text("mine")
    save_tiny(tmp_path / "ckpt")
    assert own.user_entries(tmp_path / "ckpt") == sorted(users)
    assert all((tmp_path / "ckpt" / name).read_text() == "mine" for name in users)


KILLER = textwrap.dedent("""
    import sys, time
    import tinygpt.checkpoint as ck  # save_checkpoint calls the names it imported
    from tinygpt.cli import main

    def wait_to_be_killed():
        print("READY", flush=True)
        time.sleep(120)

    swap = ck.swap_manifest
    if sys.argv[1] == "before-switch":
        ck.swap_manifest = lambda out, data: wait_to_be_killed()
    else:
        ck.swap_manifest = lambda out, data: (swap(out, data), wait_to_be_killed())
    main(sys.argv[2:])
""")


@pytest.mark.parametrize("where", ["before-switch", "after-switch"])
def test_a_save_killed_midway_still_counts_as_a_checkpoint(capsys, data, tmp_path, where):
    case = tmp_path / "case"
    assert train_cli(capsys, data, case)[0] == 0
    script = tmp_path / "killer.py"
    script.write_text(KILLER)
    env = {**os.environ, "PYTHONPATH": str(Path(tinygpt.__file__).parents[1])}
    proc = subprocess.Popen([sys.executable, str(script), where, "train", "--data", str(data),
                             "--out", str(case), "--resume", "--max-iters", "4", "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline()
    proc.kill()
    _, err = proc.communicate()
    assert line.strip() == "READY", err
    step = load_checkpoint(case).step
    assert step == (2 if where == "before-switch" else 4)  # the save of step 4 was killed
    code, _, err = train_cli(capsys, data, case)
    assert_refused(code, err, "already holds a checkpoint", "--resume")
    assert load_checkpoint(case).step == step
    assert run(capsys, "sample", "--out", case, "--max-new-tokens", 5)[0] == 0


@pytest.mark.parametrize("spec", [".", "", "sub/..", "CWD"])
def test_out_dot_empty_or_current_folder_is_refused_before_training(capsys, data, tmp_path,
                                                                     monkeypatch, spec):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    spec = str(tmp_path) if spec == "CWD" else spec
    code, _, err = run(capsys, "train", "--data", data, "--out", spec, *TINY, "--overwrite")
    assert_refused(code, err, "--out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["small.txt", "sub"]


def test_read_only_out_is_refused_before_the_first_step(capsys, data, tmp_path, monkeypatch):
    def read_only(path, payload):
        raise OSError(30, "Read-only file system", str(path))

    monkeypatch.setattr(folder, "write_synced", read_only)  # root ignores chmod: simulate it
    out = tmp_path / "ro"
    code, _, err = train_cli(capsys, data, out)
    assert_refused(code, err, str(out), "Read-only file system", "nothing was trained")
    assert not out.exists()  # the folder it created for the run is removed again


def test_a_full_disk_is_refused_before_the_first_step(capsys, data, tmp_path, monkeypatch):
    monkeypatch.setattr(folder.shutil, "disk_usage", lambda path: type(
        "Usage", (), {"free": 10_000, "total": 10**9, "used": 10**9})())
    out = tmp_path / "full"
    code, _, err = train_cli(capsys, data, out)
    assert_refused(code, err, str(out), "MiB free", "needs about", "nothing was trained")
    steps = []
    with pytest.raises(CheckpointError, match="MiB free"):  # the library checks it too
        train(CONFIG, TrainConfig(batch_size=2, max_iters=3, eval_iters=1), torch.arange(
            40) % 12, torch.arange(40) % 12, out_dir=tmp_path / "lib", progress=False,
              callback=lambda record, model: steps.append(record))
    assert steps == []


# --- 2. atomic for readers, locked, checksummed, validated ---------------------------------------

HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from tinygpt.checkpoint import folder
    Path(sys.argv[1]).mkdir()
    with folder.locked(Path(sys.argv[1])):
        print("LOCKED", flush=True)
        sys.stdin.readline()
""")


def test_a_second_trainer_gets_an_error_naming_the_first(capsys, data, tmp_path):
    out = tmp_path / "busy"
    env = {**os.environ, "PYTHONPATH": str(Path(tinygpt.__file__).parents[1])}
    first = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert first.stdout.readline().strip() == "LOCKED"
        code, _, err = train_cli(capsys, data, out)
        assert_refused(code, err, str(out), "in use by another tinygpt process",
                       f"pid {first.pid}")
        assert sorted(p.name for p in out.iterdir()) == [".tinygpt.lock"]
    finally:
        first.communicate("\n", timeout=30)
    assert train_cli(capsys, data, out)[0] == 0  # once it ended, the folder is free


WRITER = textwrap.dedent("""
    import sys, torch
    from tinygpt.checkpoint import save_checkpoint
    from tinygpt.config import GPTConfig
    from tinygpt.model import GPT
    from tinygpt.train import configure_optimizer
    from tinygpt.config import TrainConfig

    config = GPTConfig(vocab_size=12, block_size=8, n_layer=1, n_head=2, n_embd=8)
    model = GPT(config)
    opt = configure_optimizer(model, TrainConfig(batch_size=2, max_iters=5))
    x = torch.zeros(1, 8, dtype=torch.long)
    model(x, x)[1].backward()
    opt.step()
    tensors = [*model.parameters(), *(t for s in opt.state.values() for t in s.values())]
    for step in range(1, int(sys.argv[2]) + 1):  # every tensor of save n holds the value n
        with torch.no_grad():
            for t in tensors:
                t.fill_(step)
        save_checkpoint(sys.argv[1], model, opt, config, None, step)
""")


@pytest.mark.slow
def test_loads_during_saves_never_see_a_mix_of_two(tmp_path):
    out = tmp_path / "live"
    save_tiny(out, step=0, fill=0.0)
    env = {**os.environ, "PYTHONPATH": str(Path(tinygpt.__file__).parents[1])}
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(out), "300"], env=env,
                              stderr=subprocess.PIPE, text=True)
    steps = []
    while writer.poll() is None:
        ck = load_checkpoint(out)  # raises on any corruption: the test fails
        values = {float(t.flatten()[0]) for t in ck.model.state_dict().values()}
        values |= {float(t.flatten()[0]) for s in ck.optimizer_state["state"].values()
                   for t in s.values()}
        assert values == {float(ck.step)}, (ck.step, values)  # one save's files, all of them
        steps.append(ck.step)
    assert writer.returncode == 0, writer.stderr.read()
    assert load_checkpoint(out).step == 300
    assert len(set(steps)) > 3, "the reader should have seen several saves"


EDITS = {
    "head count": lambda m: m["model_config"].update(n_head=1),
    "activation": lambda m: m["model_config"].update(activation="relu"),
    "dropout": lambda m: m["model_config"].update(dropout=0.5),
    "char list": lambda m: m["tokenizer"].update(chars=list("lkjihgfedcba")),
    "rng state": lambda m: m["rng_states"]["torch"].update(bytes="00" * 16),
}


@pytest.mark.parametrize("edit", EDITS)
def test_edited_checkpoint_json_is_caught_by_its_checksum(tmp_path, edit):
    save_tiny(tmp_path / "ck")
    rewrite_manifest(tmp_path / "ck", EDITS[edit], checksum=False)
    message = re.escape("checkpoint.json: its checksum does not match")
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(tmp_path / "ck")


def test_edited_tokenizer_json_pattern_is_caught_by_its_checksum(tmp_path):
    tok = BPETokenizer.train("low lower lowest newer newest " * 20, vocab_size=264)
    save_tiny(tmp_path / "ck", tokenizer=tok)
    path = version_dir(tmp_path / "ck") / "tokenizer.json"
    model = json.loads(path.read_text())
    model["pattern"] = r"\w+"
    path.write_text(json.dumps(model))
    with pytest.raises(CheckpointError, match=r"tokenizer.json: .*(SHA-256 differs|replaced)"):
        load_checkpoint(tmp_path / "ck")


def test_random_bit_flips_in_any_file_are_caught(tmp_path):
    tok = BPETokenizer.train("low lower lowest newer newest " * 20, vocab_size=264)
    save_tiny(tmp_path / "ck", tokenizer=tok)
    reference = load_checkpoint(tmp_path / "ck")
    files = [tmp_path / "ck" / "checkpoint.json",
             *sorted(version_dir(tmp_path / "ck").iterdir())]
    rng = random.Random(16)
    for _ in range(40):
        path = rng.choice(files)
        data = bytearray(path.read_bytes())
        i = rng.randrange(len(data) * 8)
        data[i // 8] ^= 1 << (i % 8)
        original = path.read_bytes()
        path.write_bytes(bytes(data))
        try:
            loaded = load_checkpoint(tmp_path / "ck")
        except CheckpointError as err:
            assert path.name in str(err) or "checkpoint.json" in str(err)
        else:  # only a flip that changes no value can load ('1e-05' -> '1E-05' in the JSON)
            assert path.name == "checkpoint.json" and loaded.step == reference.step
            assert loaded.history == reference.history and loaded.tokenizer.merges == tok.merges
            for a, b in zip(loaded.model.parameters(), reference.model.parameters()):
                assert torch.equal(a, b)
        path.write_bytes(original)


def test_damaged_rng_state_is_a_clear_error_on_resume(capsys, data, tmp_path):
    out = tmp_path / "run"
    assert train_cli(capsys, data, out)[0] == 0
    rewrite_manifest(out, EDITS["rng state"])  # consistent checksum: the state itself is checked
    code, _, err = run(capsys, "train", "--data", data, "--out", out, "--resume", "--max-iters",
                       4, "--quiet")
    assert_refused(code, err, "rng state 'torch' is damaged", "checkpoint.json")


@pytest.mark.parametrize("kind", ["dev-zero", "fifo", "folder"])
def test_non_regular_files_are_refused_without_reading(tmp_path, kind):
    folder = tmp_path / "ck"
    save_tiny(folder)
    target = version_dir(folder) / "model.safetensors"
    if kind == "fifo":  # as checkpoint.json: opening it must not hang
        target = folder / "checkpoint.json"
    target.unlink()
    if kind == "dev-zero":
        target.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(target)
    else:
        target.mkdir()
    result: list[BaseException] = []

    def read() -> None:
        with pytest.raises(CheckpointError) as caught:
            load_checkpoint(folder)
        result.append(caught.value)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout=60)
    assert result and "not a regular file" in str(result[0]) and target.name in str(result[0])


@pytest.mark.parametrize("change, message", [
    (lambda m: m["model_config"].update(vocab_size=2_000_000_000),
     "model_config.vocab_size is 2000000000, more than"),
    (lambda m: m["model_config"].update(vocab_size=2e9), "invalid content"),
    (lambda m: m["files"]["model.safetensors"].update(size=10**12), "more than a checkpoint"),
])
def test_absurd_config_values_are_refused_before_allocating(tmp_path, change, message):
    save_tiny(tmp_path / "ck")
    rewrite_manifest(tmp_path / "ck", change)  # what a hostile editor could write
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(tmp_path / "ck")


@pytest.mark.parametrize("change, message", [
    # each dimension beyond any tinygpt model: refused by its bound, naming the field
    ({"n_layer": 100_000}, "model_config.n_layer is 100000, more than the 1024"),
    ({"n_embd": 1 << 20, "n_head": 2}, "model_config.n_embd is 1048576, more than"),
    ({"block_size": 1 << 30}, "model_config.block_size is 1073741824, more than"),
    ({"block_size": 1 << 20, "positional": "rope", "n_embd": 256, "n_head": 2},
     "a position table of more than"),
    ({"mlp_hidden": 1 << 30}, "model_config.mlp_hidden is 1073741824, more than"),
    # within the bounds, but not the model the weights file holds: refused by its header
    ({"n_layer": 1000}, "n_layer is 1000, the weights hold 1 blocks"),
    ({"n_layer": 3}, "n_layer is 3, the weights hold 1 blocks"),
    ({"n_embd": 4096, "n_head": 2}, "vocab_size x n_embd is 12 x 4096, the token table is 12 x 8"),
    ({"vocab_size": 500_000}, "vocab_size x n_embd is 500000 x 8, the token table is 12 x 8"),
    ({"block_size": 60_000}, "block_size x n_embd is 60000 x 8, the position table is 8 x 8"),
])
def test_an_edited_config_is_refused_by_the_weights_header_before_anything_is_built(
        tmp_path, monkeypatch, change, message):
    """An edit of checkpoint.json (its checksum recomputed) made every loader build the edited
    model: n_layer 100,000 grew to 4 GB. The config is now checked first, quickly."""
    import time

    from tinygpt.checkpoint import verify

    save_tiny(tmp_path / "ck")
    rewrite_manifest(tmp_path / "ck", lambda m: m["model_config"].update(change))
    built: list[object] = []
    monkeypatch.setattr(verify, "layout", lambda config: built.append(config))  # never reached
    start = time.perf_counter()
    with pytest.raises(CheckpointError, match=re.escape(message)) as caught:
        load_checkpoint(tmp_path / "ck")
    assert time.perf_counter() - start < 5 and built == []
    assert "checkpoint.json" in str(caught.value) or "model.safetensors" in str(caught.value)


def test_sample_refuses_an_edited_n_layer_in_one_line(capsys, tmp_path):
    save_tiny(tmp_path / "ck", tokenizer=CharTokenizer("abcdefghijkl"))
    rewrite_manifest(tmp_path / "ck", lambda m: m["model_config"].update(n_layer=30_000))
    code, _, err = run(capsys, "sample", "--out", tmp_path / "ck", "--max-new-tokens", "3")
    assert code != 0 and err.count("\n") == 1 and "n_layer is 30000" in err, err


def test_a_deeply_nested_safetensors_header_is_a_clear_error(tmp_path):
    """A header of 100,000 nested lists gave a RecursionError traceback from every loader."""
    save_tiny(tmp_path / "ck")
    header = b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    replace_listed(tmp_path / "ck", "model.safetensors", len(header).to_bytes(8, "little") +
                   header)
    with pytest.raises(CheckpointError, match=r"model\.safetensors: .*nested too deeply"):
        load_checkpoint(tmp_path / "ck")


def test_a_safetensors_header_claiming_a_huge_tensor_is_refused(tmp_path):
    save_tiny(tmp_path / "ck")
    header = json.dumps({"transformer.embed.wte.weight": {
        "dtype": "F32", "shape": [2_000_000_000, 8], "data_offsets": [0, 64_000_000_000]}})
    blob = len(header).to_bytes(8, "little") + header.encode() + bytes(64)
    replace_listed(tmp_path / "ck", "model.safetensors", blob)
    message = r"model\.safetensors: (not a readable safetensors|the model config does not fit)"
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(tmp_path / "ck")


def test_save_refuses_a_lora_model_never_merged_and_keeps_the_previous(tmp_path):
    """save_checkpoint used to accept it, delete the good checkpoint and leave one no loader
    accepts; now it refuses before anything is replaced, naming the tensors that differ."""
    from tinygpt.lora import add_lora, merge_lora

    save_tiny(tmp_path / "ck")
    before = snapshot(tmp_path / "ck")
    model = GPT(CONFIG)
    add_lora(model, rank=2)
    with pytest.raises(CheckpointError, match=r"ck: not saved: the model does not fit "
                       r"model_config \(missing \[.*unexpected \[.*lora") as caught:
        save_checkpoint(tmp_path / "ck", model, None, CONFIG, None, 2)
    assert "merge_lora" in str(caught.value) and snapshot(tmp_path / "ck") == before
    assert load_checkpoint(tmp_path / "ck").step == 1  # the good one still loads
    save_checkpoint(tmp_path / "ck", merge_lora(model), None, CONFIG, None, 2)  # merged: saved
    assert load_checkpoint(tmp_path / "ck").step == 2


@pytest.mark.parametrize("config", [replace(CONFIG, n_layer=2), replace(CONFIG, n_embd=16),
                                    replace(CONFIG, tie_weights=False),
                                    replace(CONFIG, n_layer=5000)])
def test_save_refuses_a_model_of_another_config_and_keeps_the_previous(tmp_path, config):
    save_tiny(tmp_path / "ck")
    before = snapshot(tmp_path / "ck")
    with pytest.raises(CheckpointError, match=r"ck: .*not saved"):
        save_checkpoint(tmp_path / "ck", GPT(CONFIG), None, config, None, 2)
    assert snapshot(tmp_path / "ck") == before


def test_save_refuses_a_tokenizer_of_more_tokens_than_the_model(tmp_path):
    """A tokenizer of 20 characters beside a model of 12 embedding rows: refused at save, naming
    both numbers, instead of a checkpoint whose ids 12 to 19 fail only when sampled."""
    save_tiny(tmp_path / "ck")
    before = snapshot(tmp_path / "ck")
    model = GPT(CONFIG)
    with pytest.raises(CheckpointError, match=r"has 20 tokens but the model's vocab_size is 12"):
        save_checkpoint(tmp_path / "ck", model, None, CONFIG, None, 2,
                        CharTokenizer("abcdefghijklmnopqrst"))
    assert snapshot(tmp_path / "ck") == before
    save_checkpoint(tmp_path / "small", model, None, CONFIG, None, 2, CharTokenizer("abcde"))
    assert load_checkpoint(tmp_path / "small").tokenizer.vocab_size == 5  # a padded embedding


def test_a_tokenizer_from_another_run_is_refused_on_load_naming_both_sizes(capsys, tmp_path):
    """The tokenizer of a larger run put into a checkpoint, listed as an editor would (sizes,
    SHA-256, the manifest's checksum): loading and sampling name both numbers."""
    save_tiny(tmp_path / "chars")
    rewrite_manifest(tmp_path / "chars", lambda m: m["tokenizer"].update(
        chars=list("abcdefghijklmnopqrst")))
    with pytest.raises(CheckpointError, match=r"checkpoint.json: its tokenizer has 20 tokens "
                                              r"but the model's vocab_size is 12"):
        load_checkpoint(tmp_path / "chars")
    code, _, err = run(capsys, "sample", "--out", tmp_path / "chars", "--max-new-tokens", 5)
    assert_refused(code, err, "20 tokens", "vocab_size is 12")

    small = BPETokenizer.train("low lower lowest newer newest " * 20, vocab_size=264)
    save_tiny(tmp_path / "bpe", tokenizer=small)  # a model of 264 rows
    larger = BPETokenizer.train("low lower lowest newer newest wider widest " * 20,
                                vocab_size=280)
    assert larger.vocab_size > 264
    larger.save(tmp_path / "other.json")
    replace_listed(tmp_path / "bpe", "tokenizer.json", (tmp_path / "other.json").read_bytes())
    message = f"has {larger.vocab_size} tokens but the model's vocab_size is 264"
    with pytest.raises(CheckpointError, match=message):
        tinygpt.load(tmp_path / "bpe")


# --- 3. divergence -------------------------------------------------------------------------------

def test_a_diverged_run_keeps_its_last_good_checkpoint(capsys, data, tmp_path):
    out = tmp_path / "run"
    code, _, err = run(capsys, "train", "--data", data, "--out", out, *TINY, "--max-iters", 50,
                       "--lr", "1e3", "--warmup-iters", "0", "--save-every", "1")
    assert code == 1 and "diverged" in err and "Traceback" not in err
    if (out / "checkpoint.json").exists():  # whatever was kept is finite and samples cleanly
        kept = load_checkpoint(out)
        assert f"checkpoint of step {kept.step} in {out} is kept" in err
        assert all(torch.isfinite(p).all() for p in kept.model.parameters())
        code, text, err = run(capsys, "sample", "--out", out, "--max-new-tokens", 20)
        assert code == 0 and len(text) > 1
        diverged = max(r.get("loss", 0) for r in kept.history) > 10  # ln 32 = 3.5 at the start
        assert diverged or err == ""  # a diverged one: one warning
        assert not diverged or (err.startswith("tinygpt: warning:") and "diverged" in err
                                and err.count("\n") == 1), err
    else:
        assert "no checkpoint was saved" in err


def test_save_refuses_non_finite_weights_and_keeps_the_previous(tmp_path):
    save_tiny(tmp_path / "ck", step=1)
    with pytest.raises(CheckpointError, match=r"inf or a NaN.*kept"):
        save_tiny(tmp_path / "ck", step=2, fill=float("nan"))
    assert load_checkpoint(tmp_path / "ck").step == 1


def test_sampling_a_checkpoint_with_non_finite_weights_is_a_clear_error(capsys, tmp_path):
    out = tmp_path / "ck"
    save_tiny(out)
    from safetensors.torch import load as st_load
    from safetensors.torch import save as st_save

    tensors = st_load((version_dir(out) / "model.safetensors").read_bytes())
    tensors["lm_head.weight" if "lm_head.weight" in tensors else
            "transformer.embed.wte.weight"][0, 0] = float("inf")
    replace_listed(out, "model.safetensors", st_save(tensors))
    code, _, err = run(capsys, "sample", "--out", out, "--max-new-tokens", 5)
    assert_refused(code, err, "model.safetensors", "inf or a NaN")
    with pytest.raises(CheckpointError, match="inf or a NaN"):
        tinygpt.load(out)


def test_a_save_that_fails_midway_names_the_folder_and_what_was_kept(tmp_path, monkeypatch):
    save_tiny(tmp_path / "ck", step=1)
    before = sorted(p.name for p in (tmp_path / "ck").iterdir())

    def disk_full(path, payload):
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(tinygpt.checkpoint, "write_synced", disk_full)  # where save calls it
    with pytest.raises(CheckpointError, match=r"ck: could not save step 2 \(No space left on "
                       r"device: .*model.safetensors\); the checkpoint of step 1 there is kept"):
        save_tiny(tmp_path / "ck", step=2)
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == before
    assert load_checkpoint(tmp_path / "ck").step == 1


def test_an_unreadable_checkpoint_file_says_permission_denied(capsys, tmp_path, monkeypatch):
    # As root, chmod 000 does not stop a read, so the refusal the OS would give is simulated.
    save_tiny(tmp_path / "ck")
    real_open = os.open

    def refuse_manifest(path, *args, **kwargs):
        if Path(path).name == "checkpoint.json":
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", refuse_manifest)
    code, _, err = run(capsys, "sample", "--out", tmp_path / "ck", "--max-new-tokens", 5)
    assert code == 2 and err.startswith("tinygpt: error: ") and "Traceback" not in err
    assert "checkpoint.json" in err and "Permission denied" in err and "JSON" not in err
