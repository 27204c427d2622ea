"""Tests for tinygpt.checkpoint: round trips, tied weights, no pickle, clear errors on damaged
folders, and atomic saving checked by killing a writer (SIGKILL) in the middle of a save.

The folder's safety: the --out folder belongs to tinygpt and nothing else in it is touched,
saves are atomic for readers and locked against a second trainer, every file is checksummed and
validated before anything is allocated, a diverged run keeps its last good checkpoint, and a
resumed run refuses another tokenizer."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import random
import re
import signal
import subprocess
import sys
import textwrap
import threading
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import (
    BAD_TOKENIZER_ENTRIES,
    CLI_TEXT,
    CLI_TINY,
    FOLDER_TEXT,
    FOLDER_TINY,
    assert_one_line_error,
    check_an_out_that_cannot_be_created,
    lock_held_elsewhere,
    rewrite_manifest,
    saved_tokenizer,
)
from conftest import rewrite_manifest as edit_json
from conftest import run_cli as run

import tinygpt
from tinygpt.checkpoint import folder, load_checkpoint, save_checkpoint, unique_tensors
from tinygpt.checkpoint.folder import MODEL_FILE, CheckpointError
from tinygpt.checkpoint.run_state import restore_optimizer
from tinygpt.config import GPTConfig, TrainConfig
from tinygpt.model import GPT
from tinygpt.tokenizer import BPETokenizer, CharTokenizer, tokenizer_fingerprint
from tinygpt.train import configure_optimizer, train

CONFIG = GPTConfig(vocab_size=40, block_size=8, n_layer=1, n_head=2, n_embd=8)
TRAIN_CONFIG = TrainConfig(batch_size=2, max_iters=5)


def trained_model_and_optimizer(config: GPTConfig = CONFIG, seed: int = 0):
    """A model after two AdamW steps, so that the optimizer holds state."""
    torch.manual_seed(seed)
    model = GPT(config)
    opt = configure_optimizer(model, TRAIN_CONFIG)
    for _ in range(2):
        x = torch.randint(config.vocab_size, (2, config.block_size))
        model(x, x)[1].backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def assert_same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for name in sa:
        assert torch.equal(sa[name], sb[name]), name


def save(path: Path, step: int = 3, seed: int = 0, tokenizer=None, **kw) -> tuple:
    """Save a model after two steps in ``path``; its vocabulary is widened to fit a larger
    ``tokenizer`` (a checkpoint refuses a tokenizer of more tokens than the model)."""
    config = CONFIG if tokenizer is None or not hasattr(tokenizer, "vocab_size") else replace(
        CONFIG, vocab_size=max(CONFIG.vocab_size, tokenizer.vocab_size))
    model, opt = trained_model_and_optimizer(config, seed=seed)
    rng = {"torch": torch.get_rng_state(), "python": random.getstate(),
           "batch": torch.Generator().manual_seed(7).get_state()}
    save_checkpoint(path, model, opt, config, TRAIN_CONFIG, step, tokenizer, rng,
                    [{"step": 1, "loss": 3.25}], **kw)
    return model, opt, rng


# --- round trips ---------------------------------------------------------------------------------

def version_dir(folder: Path) -> Path:
    """The version folder that the manifest of ``folder`` names."""
    return folder / json.loads((folder / "checkpoint.json").read_text())["folder"]


def test_round_trip_restores_everything(tmp_path):
    tok = CharTokenizer("abcdefghij")
    model, opt, rng = save(tmp_path / "ckpt", tokenizer=tok)
    names = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert names[:2] == [".tinygpt.lock", "checkpoint.json"] and len(names) == 3
    assert names[2].startswith("step-000003-") and version_dir(tmp_path / "ckpt").name == names[2]
    assert sorted(p.name for p in version_dir(tmp_path / "ckpt").iterdir()) == [
        "model.safetensors", "optimizer.safetensors"]
    ck = load_checkpoint(tmp_path / "ckpt")
    assert ck.step == 3 and ck.model_config == CONFIG and ck.train_config == TRAIN_CONFIG
    assert ck.history == [{"step": 1, "loss": 3.25}] and ck.tokenizer.chars == tok.chars
    assert not ck.model.training
    assert_same_weights(model, ck.model)
    assert ck.model.lm_head.weight is ck.model.transformer.embed.wte.weight  # re-tied
    assert torch.equal(ck.rng_states["torch"], rng["torch"])
    assert torch.equal(ck.rng_states["batch"], rng["batch"])
    assert ck.rng_states["python"] == rng["python"]
    # the optimizer state goes back into a fresh optimizer and matches the original
    fresh = configure_optimizer(ck.model, TRAIN_CONFIG)
    restore_optimizer(fresh, ck.optimizer_state)
    ours, theirs = fresh.state_dict(), opt.state_dict()
    assert ours["param_groups"] == theirs["param_groups"]
    for i, state in theirs["state"].items():
        for key, value in state.items():
            assert torch.equal(ours["state"][i][key], value), (i, key)


def test_a_failed_save_keeps_the_previous_checkpoint_and_leaves_nothing(tmp_path):
    model, *_ = save(tmp_path / "ckpt", step=1)
    before = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    with pytest.raises(TypeError, match="tokenizer must be"):
        save(tmp_path / "ckpt", step=2, tokenizer="not a tokenizer")
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == before
    ck = load_checkpoint(tmp_path / "ckpt")
    assert ck.step == 1
    assert_same_weights(model, ck.model)


def test_tied_weights_are_stored_once_untied_twice():
    tensors, aliases = unique_tensors(GPT(CONFIG))
    assert "lm_head.weight" not in tensors and aliases == {
        "lm_head.weight": "transformer.embed.wte.weight"}
    tensors, aliases = unique_tensors(GPT(replace(CONFIG, tie_weights=False)))
    assert "lm_head.weight" in tensors and aliases == {}


def test_bpe_tokenizer_travels_in_its_own_file(tmp_path):
    tok = BPETokenizer.train("low lower lowest newer newest " * 20, vocab_size=264)
    save(tmp_path / "ckpt", tokenizer=tok)
    assert (version_dir(tmp_path / "ckpt") / "tokenizer.json").exists()
    model, loaded = tinygpt.load(tmp_path / "ckpt")
    assert isinstance(model, GPT) and loaded.merges == tok.merges and loaded.tokens == tok.tokens


def test_the_manifest_records_the_tokenizer_as_before(tmp_path):
    """The tokenizer entry (``tinygpt.files.manifest.tokenizer_entry``, shared with shards folders)
    keeps the checkpoint format: the characters inline, or BPE's ``tokenizer.json`` (the bytes
    ``BPETokenizer.save`` writes) and ``tokenizer.vocab`` listed with the version's other files;
    no ``sha256`` in the entry and nothing else in the version folder."""
    tok = BPETokenizer.train("low lower lowest newer newest " * 20, vocab_size=264)
    tok.save(tmp_path / "reference.json")
    save(tmp_path / "bpe", tokenizer=tok)
    meta = json.loads((tmp_path / "bpe" / "checkpoint.json").read_text())
    assert meta["tokenizer"] == {"type": "bpe", "file": "tokenizer.json"}
    files = ["model.safetensors", "optimizer.safetensors", "tokenizer.json", "tokenizer.vocab"]
    version = version_dir(tmp_path / "bpe")
    assert sorted(meta["files"]) == sorted(p.name for p in version.iterdir()) == files
    for name, reference in [("tokenizer.json", "reference.json"),
                            ("tokenizer.vocab", "reference.vocab")]:
        data = (version / name).read_bytes()
        assert data == (tmp_path / reference).read_bytes()
        assert meta["files"][name] == {"sha256": hashlib.sha256(data).hexdigest(),
                                       "size": len(data)}
    chars = CharTokenizer.from_text("to be or not")
    save(tmp_path / "char", tokenizer=chars)
    meta = json.loads((tmp_path / "char" / "checkpoint.json").read_text())
    assert meta["tokenizer"] == {"type": "char", "chars": chars.chars}
    assert sorted(meta["files"]) == files[:2]
    assert load_checkpoint(tmp_path / "char").tokenizer.chars == chars.chars



@pytest.mark.parametrize("kind", ["char", "bpe", "gpt2"])
def test_every_kind_of_tokenizer_comes_back_from_a_checkpoint(tmp_path, kind):
    tokenizer = saved_tokenizer(kind)
    save(tmp_path / "ckpt", tokenizer=tokenizer)
    loaded = load_checkpoint(tmp_path / "ckpt").tokenizer
    assert type(loaded) is type(tokenizer)
    assert tokenizer_fingerprint(loaded) == tokenizer_fingerprint(tokenizer)


# The entries no manifest may hold, and one a checkpoint's may not: a file it does not list
BAD_CHECKPOINT_ENTRIES = {**BAD_TOKENIZER_ENTRIES, "a file not listed": (
    {"type": "bpe", "file": "tokenizer.json"}, "tokenizer.json is not among the files it lists")}


@pytest.mark.parametrize("case", BAD_CHECKPOINT_ENTRIES)
def test_a_tokenizer_entry_tinygpt_never_writes_is_a_clear_error(tmp_path, case):
    entry, words = BAD_CHECKPOINT_ENTRIES[case]
    save(tmp_path / "ckpt", tokenizer=CharTokenizer("abc"))
    edit_json(tmp_path / "ckpt", lambda meta: meta.update(tokenizer=entry))  # checksum made right
    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(tmp_path / "ckpt")
    message = str(caught.value)
    assert message.startswith(f"{tmp_path / 'ckpt' / 'checkpoint.json'}: ") and words in message
    assert "\n" not in message

def test_loading_never_unpickles(tmp_path, monkeypatch):
    save(tmp_path / "ckpt")

    def forbidden(*args, **kwargs):
        raise AssertionError("a checkpoint must load without pickle")

    for module, name in [(torch, "load"), (pickle, "load"), (pickle, "loads")]:
        monkeypatch.setattr(module, name, forbidden)
    assert load_checkpoint(tmp_path / "ckpt").step == 3


def test_import_tinygpt_stays_light():
    code = "import sys, tinygpt; print('torch' in sys.modules, callable(tinygpt.load))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]


TRAINING_CODE = ("tinygpt.train", "tinygpt.distributed", "tinygpt.checkpoint.run_state")


def test_loading_a_checkpoint_imports_no_training_code(tmp_path):
    save(tmp_path / "ckpt")
    code = textwrap.dedent(f"""
        import sys
        import tinygpt.checkpoint
        loaded = [m for m in {TRAINING_CODE!r} if m in sys.modules]
        model, tokenizer = tinygpt.load(sys.argv[1])
        after = [m for m in {TRAINING_CODE!r} if m in sys.modules]
        print(loaded, after, type(model).__name__)
    """)
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "ckpt")],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[0] == "[] [] GPT"


def test_checkpoint_modules_never_import_training_code():
    """Also not inside a function that the load above did not run (an import cycle)."""
    import ast

    src = Path(tinygpt.__file__).parent / "checkpoint"
    for name in ("__init__", "folder", "verify"):  # the format; run_state is training's side
        tree = ast.parse((src / f"{name}.py").read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            found = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
                if isinstance(node, ast.ImportFrom) else [])
            assert not set(found) & set(TRAINING_CODE), (name, found)


# --- damaged folders -----------------------------------------------------------------------------

def replace_file(folder: Path, name: str, data: bytes, manifest: bool = True) -> None:
    """Replace a file of the checkpoint; with ``manifest``, update its size and SHA-256 there."""
    (version_dir(folder) / name).write_bytes(data)
    if manifest:
        entry = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
        edit_json(folder, lambda m: m["files"].update({name: entry}))


def truncate_model(folder: Path, manifest: bool = False) -> None:
    data = (version_dir(folder) / MODEL_FILE).read_bytes()
    replace_file(folder, MODEL_FILE, data[: len(data) // 2], manifest)


DAMAGE = {
    "missing folder": (lambda d: d.rename(d.with_name("elsewhere")), "no such checkpoint"),
    "missing json": (lambda d: (d / "checkpoint.json").unlink(), "checkpoint.json: missing"),
    "edited json": (lambda d: edit_json(d, lambda m: m.update(step=4), checksum=False),
                    "checkpoint.json: its checksum does not match"),
    "corrupt json": (lambda d: (d / "checkpoint.json").write_text("{\"format\": "),
                     "checkpoint.json: not valid JSON"),
    "other format": (lambda d: edit_json(d, lambda m: m.update(format="nanogpt")),
                     "not a tinygpt-checkpoint"),
    "newer version": (lambda d: edit_json(d, lambda m: m.update(version=99)),
                      "version 99 is not supported"),
    "truncated weights": (truncate_model, "model.safetensors: .*truncated or was replaced"),
    "flipped byte": (lambda d: replace_file(d, MODEL_FILE, bytes(
        b ^ (i == 300) for i, b in enumerate((version_dir(d) / MODEL_FILE).read_bytes())),
        manifest=False), "model.safetensors: its SHA-256 differs"),
    "truncated, checksums updated": (lambda d: truncate_model(d, manifest=True),
                                     "model.safetensors: not a readable safetensors"),
    "missing weights": (lambda d: (version_dir(d) / MODEL_FILE).unlink(),
                        "model.safetensors: missing"),
    "config mismatch": (lambda d: edit_json(d, lambda m: m["model_config"].update(n_embd=16)),
                        "model.safetensors: the model config does not fit these weights: "
                        "vocab_size x n_embd"),
    "fewer layers": (lambda d: edit_json(d, lambda m: m["model_config"].update(n_layer=2)),
                     "model.safetensors: .*does not fit .*n_layer is 2, the weights hold"),
    "bad config value": (lambda d: edit_json(d, lambda m: m["model_config"].update(n_head=3)),
                         "checkpoint.json: invalid content .*n_head"),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_checkpoint_is_a_clear_error(tmp_path, damage):
    folder = tmp_path / "ckpt"
    save(folder)
    change, message = DAMAGE[damage]
    change(folder)
    with pytest.raises(CheckpointError, match=message) as info:
        load_checkpoint(folder)
    assert isinstance(info.value, ValueError) and "ckpt" in str(info.value)


def test_optimizer_state_of_another_model_is_refused(tmp_path):
    save(tmp_path / "ckpt")
    other = GPT(replace(CONFIG, n_embd=16))
    with pytest.raises(CheckpointError, match="shape"):
        restore_optimizer(configure_optimizer(other, TRAIN_CONFIG),
                          load_checkpoint(tmp_path / "ckpt").optimizer_state)


# --- atomic saving -------------------------------------------------------------------------------

WRITER = textwrap.dedent("""
    import sys, time
    import torch
    import tinygpt.checkpoint as ck  # save_checkpoint calls the names it imported
    from tinygpt.config import GPTConfig
    from tinygpt.model import GPT

    out, where = sys.argv[1], sys.argv[2]

    def wait_to_be_killed():
        print("READY", flush=True)
        time.sleep(120)

    if where == "mid-file":  # half of the first file is on disk
        def write(path, data):
            with open(path, "wb") as f:
                f.write(data[: len(data) // 2])
                f.flush()
            wait_to_be_killed()
        ck.write_synced = write
    elif where == "before-switch":  # the new version is complete, the manifest not yet replaced
        ck.swap_manifest = lambda out, data: wait_to_be_killed()
    else:  # "after-switch": the manifest names the new version, the old one is not yet removed
        swap = ck.swap_manifest
        ck.swap_manifest = lambda out, data: (swap(out, data), wait_to_be_killed())
    torch.manual_seed(1)
    config = GPTConfig(**{k: int(v) for k, v in (kv.split("=") for kv in sys.argv[3:])})
    ck.save_checkpoint(out, GPT(config), None, config, None, step=2)
""")


def test_a_writer_killed_mid_save_leaves_the_previous_checkpoint(tmp_path):
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    sizes = [f"{k}={getattr(CONFIG, k)}" for k in ("vocab_size", "block_size", "n_layer",
                                                     "n_head", "n_embd")]
    points = ["mid-file", "before-switch", "after-switch"]
    models, writers = {}, {}
    for where in points:
        models[where] = save(tmp_path / where / "ckpt", step=1)[0]
        writers[where] = subprocess.Popen(
            [sys.executable, str(script), str(tmp_path / where / "ckpt"), where, *sizes],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for where in points:  # the writers run at once; kill each when it reaches its point
        proc = writers[where]
        line = proc.stdout.readline()
        if line.strip() != "READY":
            proc.kill()
            pytest.fail(f"writer {where} did not reach its point: {proc.communicate()[1]}")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    for where in points:
        folder = tmp_path / where / "ckpt"
        versions = [p.name for p in folder.iterdir() if p.name.startswith("step-")]
        assert len(versions) == 2, "the writer should have left a second version folder behind"
        ck = load_checkpoint(folder)
        if where == "after-switch":  # the new checkpoint was complete and in place
            assert ck.step == 2 and ck.optimizer_state is None
        else:
            assert ck.step == 1
            assert_same_weights(models[where], ck.model)
        # the next save completes and clears what the killed one left
        model, *_ = save(folder, step=3, seed=5)
        names = sorted(p.name for p in folder.iterdir())
        assert names[:2] == [".tinygpt.lock", "checkpoint.json"] and len(names) == 3
        ck = load_checkpoint(folder)
        assert ck.step == 3
        assert_same_weights(model, ck.model)


def test_the_folder_helpers_import_without_torch():
    """prepare takes a folder's lock from tinygpt.checkpoint.folder: importing it (and so the
    package tinygpt.checkpoint) must not import torch, which prepare never needs."""
    code = ("import sys, tinygpt.checkpoint.folder, tinygpt.prepare; "
            "print(sorted(m for m in ('torch', 'numpy', 'tinygpt.model') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]", out


def test_a_manifest_write_killed_midway_is_cleaned_up_by_the_next_save(tmp_path):
    """The manifest is written through ``write_atomically``'s temporary name: what a killed
    save leaves of it is tinygpt's, and the next save removes it; a look-alike of another
    length is the user's, and stays."""
    folder = tmp_path / "ckpt"
    save(folder, step=1)
    leftover = folder / ".checkpoint.json.ab3_x9zq.part"  # as mkstemp names it
    users = folder / ".checkpoint.json.notes.part"
    leftover.write_bytes(b"{half a manifest")
    users.write_bytes(b"mine")
    save(folder, step=2)
    assert not leftover.exists() and users.read_bytes() == b"mine"
    assert load_checkpoint(folder).step == 2


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    from tinygpt.cli import main

    folder = tmp_path_factory.mktemp("run")
    (folder / "small.txt").write_text(FOLDER_TEXT, encoding="utf-8")
    assert main(["train", "--data", str(folder / "small.txt"), "--out", str(folder / "out"),
                 *FOLDER_TINY]) == 0
    return folder / "out"


def test_sample_warns_when_the_checkpoints_losses_say_the_run_diverged(capsys, trained,
                                                                       tmp_path):
    import shutil

    from conftest import rewrite_manifest
    from conftest import run_cli as run

    code, _, err = run(capsys, "sample", "--out", trained, "--max-new-tokens", "5")
    assert code == 0 and "diverged" not in err, err
    diverged = tmp_path / "diverged"
    shutil.copytree(trained, diverged)

    def blow_up(meta):
        meta["history"][-1].update(loss=2.9e9, val_loss=1.6e7, train_loss=1.6e7)

    rewrite_manifest(diverged, blow_up)
    code, _, err = run(capsys, "sample", "--out", diverged, "--max-new-tokens", "5")
    assert code == 0
    assert "tinygpt: warning:" in err and "diverged" in err and "2.9e+09" in err, err


@pytest.mark.parametrize("betas", [[2, 0.9], "ab", [0.9], None])
def test_a_checkpoint_with_bad_betas_is_refused_in_one_line(capsys, trained, tmp_path, betas):
    import shutil

    from conftest import rewrite_manifest
    from conftest import run_cli as run

    out = tmp_path / "run"
    shutil.copytree(trained, out)
    rewrite_manifest(out, lambda m: m["optimizer"]["param_groups"][0].update(betas=betas))
    code, _, err = run(capsys, "train", "--data", trained.parent / "small.txt", "--out", out,
                       *FOLDER_TINY, "--resume", "--max-iters", "8")
    assert code == 2 and err.count("\n") == 1, err  # was: torch's kernel signatures, or rc 0
    assert "the optimizer's betas must be two numbers in [0, 1)" in err, err
    assert "checkpoint.json" in err


# --- the --out folder belongs to tinygpt ---------------------------------------------------------

CONFIG_12 = GPTConfig(vocab_size=12, block_size=8, n_layer=1, n_head=2, n_embd=8)  # abcdefghijkl


@pytest.fixture
def data(tmp_path: Path) -> Path:
    """``CLI_TEXT`` in ``tmp_path/small.txt``."""
    path = tmp_path / "small.txt"
    path.write_text(CLI_TEXT, encoding="utf-8")
    return path


def train_cli(capsys, data: Path, out: object, *extra: object) -> tuple[int, str, str]:
    return run(capsys, "train", "--data", data, "--out", out, *CLI_TINY, *extra)


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (relative path -> bytes)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def save_tiny(folder: Path, step: int = 1, fill: float | None = None, tokenizer=None) -> GPT:
    """A tiny model after one step, saved in ``folder``; its vocabulary is widened to fit a
    larger ``tokenizer`` (a checkpoint refuses a tokenizer of more tokens than the model)."""
    config = CONFIG_12 if tokenizer is None else replace(
        CONFIG_12, vocab_size=max(CONFIG_12.vocab_size, tokenizer.vocab_size))
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


def test_mywork_notes_txt_is_never_deleted(capsys, data, tmp_path):
    mywork = tmp_path / "mywork"
    mywork.mkdir()
    (mywork / "notes.txt").write_text("precious")
    code, _, err = train_cli(capsys, data, mywork)
    assert_one_line_error(code, err, str(mywork), "not empty", "notes.txt", "--overwrite")
    assert sorted(p.name for p in mywork.iterdir()) == ["notes.txt"]  # nothing written
    for _ in range(2):  # --overwrite writes beside it, and replaces only its own checkpoint
        assert train_cli(capsys, data, mywork, "--overwrite")[0] == 0
        assert (mywork / "notes.txt").read_text() == "precious"
        assert load_checkpoint(mywork).step == 2
    assert sorted(p.name for p in mywork.iterdir() if not p.name.startswith("step-")) == [
        ".tinygpt.lock", "checkpoint.json", "notes.txt"]


def test_out_that_is_the_data_file_is_refused(capsys, data, tmp_path):
    before = data.read_bytes()
    assert_one_line_error(*train_cli(capsys, data, data)[::2], "is a file", str(data))
    # a folder holding it
    assert_one_line_error(*train_cli(capsys, data, tmp_path)[::2], "training data")
    assert data.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == [
        "small.txt"]


def test_out_that_is_a_file_is_refused(capsys, data, tmp_path):
    thesis = tmp_path / "thesis.txt"
    thesis.write_text("years of work")
    assert_one_line_error(*train_cli(capsys, data, thesis)[::2], "is a file", "thesis.txt")
    assert_one_line_error(*train_cli(capsys, data, thesis, "--overwrite")[::2], "is a file")
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
    assert_one_line_error(*train_cli(capsys, data, out, "--overwrite")[::2],
                          "not written by tinygpt")
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
    assert_one_line_error(code, err, "already holds a checkpoint", "--resume")
    assert load_checkpoint(case).step == step
    assert run(capsys, "sample", "--out", case, "--max-new-tokens", 5)[0] == 0


@pytest.mark.parametrize("spec", [".", "", "sub/..", "CWD"])
def test_out_dot_empty_or_current_folder_is_refused_before_training(capsys, data, tmp_path,
                                                                     monkeypatch, spec):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    spec = str(tmp_path) if spec == "CWD" else spec
    code, _, err = run(capsys, "train", "--data", data, "--out", spec, *CLI_TINY, "--overwrite")
    assert_one_line_error(code, err, "--out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["small.txt", "sub"]


def test_read_only_out_is_refused_before_the_first_step(capsys, data, tmp_path, monkeypatch):
    def read_only(path, payload):
        raise OSError(30, "Read-only file system", str(path))

    monkeypatch.setattr(folder, "write_synced", read_only)  # root ignores chmod: simulate it
    out = tmp_path / "ro"
    code, _, err = train_cli(capsys, data, out)
    assert_one_line_error(code, err, str(out), "Read-only file system", "nothing was trained")
    assert not out.exists()  # the folder it created for the run is removed again


def test_a_full_disk_is_refused_before_the_first_step(capsys, data, tmp_path, monkeypatch):
    monkeypatch.setattr(folder.shutil, "disk_usage", lambda path: type(
        "Usage", (), {"free": 10_000, "total": 10**9, "used": 10**9})())
    out = tmp_path / "full"
    code, _, err = train_cli(capsys, data, out)
    assert_one_line_error(code, err, str(out), "MiB free", "needs about", "nothing was trained")
    steps = []
    with pytest.raises(CheckpointError, match="MiB free"):  # the library checks it too
        train(CONFIG_12, TrainConfig(batch_size=2, max_iters=3, eval_iters=1), torch.arange(
            40) % 12, torch.arange(40) % 12, out_dir=tmp_path / "lib", progress=False,
              callback=lambda record, model: steps.append(record))
    assert steps == []


@pytest.mark.parametrize("how", ["read-only", "under-a-file"])
def test_an_out_that_train_cannot_create_says_why(capsys, folder_data, tmp_path, monkeypatch,
                                                  how):
    check_an_out_that_cannot_be_created(capsys, folder_data, tmp_path, monkeypatch, "train", how)


# --- the lock file of a checkpoint folder --------------------------------------------------------

@pytest.mark.parametrize("resume", [False, True])
@pytest.mark.parametrize("kind", ["symlink", "hardlink"])
def test_a_lock_file_that_is_a_link_is_refused_and_its_target_kept(capsys, folder_data, tmp_path,
                                                                   resume, kind):
    out = tmp_path / "run"
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    if resume:
        assert run(capsys, "train", "--data", folder_data, "--out", out, *FOLDER_TINY)[0] == 0
        (out / ".tinygpt.lock").unlink()
    else:
        out.mkdir()
    if kind == "symlink":
        (out / ".tinygpt.lock").symlink_to("../victim.txt")
    else:
        os.link(victim, out / ".tinygpt.lock")
    extra = ["--resume", "--max-iters", "8"] if resume else []
    code, _, err = run(capsys, "train", "--data", folder_data, "--out", out, *FOLDER_TINY, *extra)
    assert_one_line_error(code, err, ".tinygpt.lock", "link")
    assert victim.read_text() == "precious\n"


def test_a_lock_file_that_is_a_fifo_is_refused(capsys, folder_data, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    os.mkfifo(out / ".tinygpt.lock")
    code, _, err = run(capsys, "train", "--data", folder_data, "--out", out, *FOLDER_TINY)
    assert_one_line_error(code, err, ".tinygpt.lock", "not a regular file")


# --- a second trainer, readers during saves ------------------------------------------------------

def test_a_second_trainer_gets_an_error_naming_the_first(capsys, data, tmp_path):
    out = tmp_path / "busy"
    with lock_held_elsewhere(out) as first:
        code, _, err = train_cli(capsys, data, out)
        assert_one_line_error(code, err, str(out), "in use by another tinygpt process",
                       f"pid {first.pid}")
        assert sorted(p.name for p in out.iterdir()) == [".tinygpt.lock"]
    assert train_cli(capsys, data, out)[0] == 0  # once it ended, the folder is free


FILLING_WRITER = textwrap.dedent("""
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
    writer = subprocess.Popen([sys.executable, "-c", FILLING_WRITER, str(out), "300"], env=env,
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


# --- checksummed and validated before anything is allocated --------------------------------------

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
    assert_one_line_error(code, err, "rng state 'torch' is damaged", "checkpoint.json")


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
    replace_file(tmp_path / "ck", "model.safetensors", len(header).to_bytes(8, "little") +
                   header)
    with pytest.raises(CheckpointError, match=r"model\.safetensors: .*nested too deeply"):
        load_checkpoint(tmp_path / "ck")


def test_a_safetensors_header_claiming_a_huge_tensor_is_refused(tmp_path):
    save_tiny(tmp_path / "ck")
    header = json.dumps({"transformer.embed.wte.weight": {
        "dtype": "F32", "shape": [2_000_000_000, 8], "data_offsets": [0, 64_000_000_000]}})
    blob = len(header).to_bytes(8, "little") + header.encode() + bytes(64)
    replace_file(tmp_path / "ck", "model.safetensors", blob)
    message = r"model\.safetensors: (not a readable safetensors|the model config does not fit)"
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(tmp_path / "ck")


def test_save_refuses_a_lora_model_never_merged_and_keeps_the_previous(tmp_path):
    """save_checkpoint used to accept it, delete the good checkpoint and leave one no loader
    accepts; now it refuses before anything is replaced, naming the tensors that differ."""
    from tinygpt.lora import add_lora, merge_lora

    save_tiny(tmp_path / "ck")
    before = snapshot(tmp_path / "ck")
    model = GPT(CONFIG_12)
    add_lora(model, rank=2)
    with pytest.raises(CheckpointError, match=r"ck: not saved: the model does not fit "
                       r"model_config \(missing \[.*unexpected \[.*lora") as caught:
        save_checkpoint(tmp_path / "ck", model, None, CONFIG_12, None, 2)
    assert "merge_lora" in str(caught.value) and snapshot(tmp_path / "ck") == before
    assert load_checkpoint(tmp_path / "ck").step == 1  # the good one still loads
    save_checkpoint(tmp_path / "ck", merge_lora(model), None, CONFIG_12, None, 2)  # merged: saved
    assert load_checkpoint(tmp_path / "ck").step == 2


@pytest.mark.parametrize("config", [replace(CONFIG_12, n_layer=2), replace(CONFIG_12, n_embd=16),
                                    replace(CONFIG_12, tie_weights=False),
                                    replace(CONFIG_12, n_layer=5000)])
def test_save_refuses_a_model_of_another_config_and_keeps_the_previous(tmp_path, config):
    save_tiny(tmp_path / "ck")
    before = snapshot(tmp_path / "ck")
    with pytest.raises(CheckpointError, match=r"ck: .*not saved"):
        save_checkpoint(tmp_path / "ck", GPT(CONFIG_12), None, config, None, 2)
    assert snapshot(tmp_path / "ck") == before


def test_save_refuses_a_tokenizer_of_more_tokens_than_the_model(tmp_path):
    """A tokenizer of 20 characters beside a model of 12 embedding rows: refused at save, naming
    both numbers, instead of a checkpoint whose ids 12 to 19 fail only when sampled."""
    save_tiny(tmp_path / "ck")
    before = snapshot(tmp_path / "ck")
    model = GPT(CONFIG_12)
    with pytest.raises(CheckpointError, match=r"has 20 tokens but the model's vocab_size is 12"):
        save_checkpoint(tmp_path / "ck", model, None, CONFIG_12, None, 2,
                        CharTokenizer("abcdefghijklmnopqrst"))
    assert snapshot(tmp_path / "ck") == before
    save_checkpoint(tmp_path / "small", model, None, CONFIG_12, None, 2, CharTokenizer("abcde"))
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
    assert_one_line_error(code, err, "20 tokens", "vocab_size is 12")

    small = BPETokenizer.train("low lower lowest newer newest " * 20, vocab_size=264)
    save_tiny(tmp_path / "bpe", tokenizer=small)  # a model of 264 rows
    larger = BPETokenizer.train("low lower lowest newer newest wider widest " * 20,
                                vocab_size=280)
    assert larger.vocab_size > 264
    larger.save(tmp_path / "other.json")
    replace_file(tmp_path / "bpe", "tokenizer.json", (tmp_path / "other.json").read_bytes())
    message = f"has {larger.vocab_size} tokens but the model's vocab_size is 264"
    with pytest.raises(CheckpointError, match=message):
        tinygpt.load(tmp_path / "bpe")


# --- non-finite weights, a save that fails -------------------------------------------------------

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
    replace_file(out, "model.safetensors", st_save(tensors))
    code, _, err = run(capsys, "sample", "--out", out, "--max-new-tokens", 5)
    assert_one_line_error(code, err, "model.safetensors", "inf or a NaN")
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


# --- resuming with another tokenizer -------------------------------------------------------------

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


def test_a_version_folder_a_save_left_midway_is_removed_whole_but_a_users_file_stays(tmp_path):
    from tinygpt.checkpoint.folder import remove_version

    version = tmp_path / "step-000010-abcdef12"
    version.mkdir()
    (version / "model.safetensors").write_bytes(b"weights")
    (version / ".tokenizer.json.abcd_123.part").write_bytes(b"half a tokenizer")  # killed here
    remove_version(version)
    assert not version.exists()
    version.mkdir()
    (version / "model.safetensors").write_bytes(b"weights")
    (version / "notes.txt").write_text("the user's")
    remove_version(version)
    assert [p.name for p in version.iterdir()] == ["notes.txt"]

