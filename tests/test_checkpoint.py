"""Tests for tinygpt.checkpoint: round trips, tied weights, no pickle, clear errors on damaged
folders, and atomic saving checked by killing a writer (SIGKILL) in the middle of a save.
(The folder's safety -- user files, locks, readers during saves -- is in test_checkpoint_safety.)"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import random
import signal
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import BAD_TOKENIZER_ENTRIES, saved_tokenizer
from conftest import rewrite_manifest as edit_json

import tinygpt
from tinygpt.checkpoint import load_checkpoint, save_checkpoint, unique_tensors
from tinygpt.checkpoint.folder import MODEL_FILE, CheckpointError
from tinygpt.checkpoint.run_state import restore_optimizer
from tinygpt.config import GPTConfig, TrainConfig
from tinygpt.model import GPT
from tinygpt.tokenizer import BPETokenizer, CharTokenizer, tokenizer_fingerprint
from tinygpt.train import configure_optimizer

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
    """The tokenizer entry (``tinygpt.tokenizer.tokenizer_entry``, shared with shards folders)
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


TEXT = "".join(f"{w} the {v} was {n} and more zebra.\n" for w, v, n in zip(
    ["first", "second", "third", "fourth", "fifth", "sixth"] * 5,
    ["cat", "dog", "fox", "owl", "ant", "bee"] * 5, range(30), strict=False))


TINY = ["--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "16",
        "--batch-size", "2", "--max-iters", "5", "--eval-interval", "5", "--eval-iters", "1",
        "--quiet"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    from tinygpt.cli import main

    folder = tmp_path_factory.mktemp("run")
    (folder / "small.txt").write_text(TEXT, encoding="utf-8")
    assert main(["train", "--data", str(folder / "small.txt"), "--out", str(folder / "out"),
                 *TINY]) == 0
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
                       *TINY, "--resume", "--max-iters", "8")
    assert code == 2 and err.count("\n") == 1, err  # was: torch's kernel signatures, or rc 0
    assert "the optimizer's betas must be two numbers in [0, 1)" in err, err
    assert "checkpoint.json" in err
