"""Training from token shards (``tinygpt.shards.TokenShards``, ``tinygpt train --data DIR``):
the same run as from the in-memory tensor, resumable bit for bit, windows inside a shard; and
what a shards folder may hold (``tinygpt.shards``'s checks of it): a manifest naming only
regular files inside the folder, checked by its checksum, of a dtype tinygpt writes; shards of
ids inside the vocabulary; a tokenizer of a known pattern. Each is refused in one line."""

from __future__ import annotations

import os
from dataclasses import replace

import numpy as np
import pytest
import torch
from conftest import (
    FOLDER_TINY,
    REDOS,
    assert_one_line_error,
    prepare_bpe_shards,
    prepare_char_shards,
    rewrite_shards_manifest,
)
from conftest import run_cli as run
from test_prepare import make_corpus, make_small_corpus

import tinygpt.prepare as prepare_run
from tinygpt.checkpoint import load_checkpoint
from tinygpt.cli import main
from tinygpt.config import GPTConfig, TrainConfig
from tinygpt.prepare import write_shards
from tinygpt.prepare.documents import Options
from tinygpt.shards import TokenShards
from tinygpt.train import get_batch, train

MODEL = GPTConfig(vocab_size=1, block_size=16, n_layer=1, n_head=2, n_embd=16)
CFG = TrainConfig(batch_size=4, max_iters=6, warmup_iters=1, learning_rate=3e-3, min_lr=3e-4,
                  eval_interval=3, eval_iters=2)


def without_timing(history):
    return [{k: v for k, v in r.items() if k != "tokens_per_s"} for r in history]


def prepared(tmp_path, shard_tokens=1 << 20):
    out = tmp_path / "shards"
    m = write_shards(make_corpus(tmp_path / "in"), out, Options("char", val_fraction=0.3,
                     seed=2, shard_tokens=shard_tokens), workers=1)
    return out, m["vocab_size"]


def tensor_of(shards: TokenShards) -> torch.Tensor:
    return torch.from_numpy(np.concatenate(shards.arrays).astype(np.int64))


def test_training_from_one_shard_equals_training_from_the_tensor(tmp_path):
    out, vocab = prepared(tmp_path)
    tr, va = TokenShards(out, "train"), TokenShards(out, "val")
    assert len(tr.arrays) == len(va.arrays) == 1
    model = replace(MODEL, vocab_size=vocab)
    torch.manual_seed(0)
    from_shards = train(model, CFG, tr, va, progress=False)
    torch.manual_seed(0)
    from_tensor = train(model, CFG, tensor_of(tr), tensor_of(va), progress=False)
    assert without_timing(from_shards) == without_timing(from_tensor)
    assert len(from_shards) == CFG.max_iters + 1


def test_a_run_from_shards_resumes_bit_for_bit(tmp_path):
    out, vocab = prepared(tmp_path, shard_tokens=900)
    tr, va = TokenShards(out, "train"), TokenShards(out, "val")
    assert len(tr.arrays) > 2
    model = replace(MODEL, vocab_size=vocab)
    straight = train(model, CFG, tr, va, out_dir=tmp_path / "a", progress=False)
    train(model, CFG, tr, va, out_dir=tmp_path / "b", progress=False,
          callback=lambda record, m: record["step"] == 3)
    assert load_checkpoint(tmp_path / "b").step == 3
    resumed = train(model, CFG, tr, va, out_dir=tmp_path / "b", resume=True, progress=False)
    assert without_timing(resumed) == without_timing(straight)
    a, b = load_checkpoint(tmp_path / "a").model, load_checkpoint(tmp_path / "b").model
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))


def test_windows_never_cross_a_shard_boundary_and_reach_every_shard(tmp_path):
    out, _ = prepared(tmp_path, shard_tokens=900)
    shards = TokenShards(out, "train")
    T = 16
    texts = [a.tobytes() for a in shards.arrays]
    g = torch.Generator().manual_seed(0)
    seen = set()
    for _ in range(50):
        x, y = get_batch(shards, 8, T, g)
        assert x.shape == y.shape == (8, T) and x.dtype == torch.long
        assert torch.equal(x[:, 1:], y[:, :-1])
        for row in torch.cat([x, y[:, -1:]], 1):  # (T+1,): must lie inside one shard
            window = row.numpy().astype(shards.dtype).tobytes()
            found = [k for k, t in enumerate(texts) if window in t]
            assert found
            seen.update(found)
    assert seen == set(range(len(texts)))


def test_the_shards_are_memory_mapped(tmp_path):
    out, _ = prepared(tmp_path)
    assert all(isinstance(a, np.memmap) for a in TokenShards(out, "train").arrays)


def test_cli_trains_from_a_shards_folder_and_refuses_a_tokenizer_option(tmp_path, capsys):
    out, _ = prepared(tmp_path)
    args = ["train", "--data", str(out), "--out", str(tmp_path / "ck"), "--max-iters", "4",
            "--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "16",
            "--eval-iters", "2", "--quiet"]
    assert main(args) == 0
    assert "trained to step 4" in capsys.readouterr().out
    assert load_checkpoint(tmp_path / "ck").tokenizer.vocab_size == TokenShards(out).vocab_size
    assert main([*args[:4], str(tmp_path / "ck2"), "--tokenizer", "bpe", *args[5:]]) == 2
    err = capsys.readouterr().err
    assert "shards folder with its own tokenizer" in err and err.count("\n") == 1
    assert main([*args[:4], str(tmp_path / "ck3"), "--val-fraction", "0.2", *args[5:]]) == 2
    err = capsys.readouterr().err
    assert "leave --val-fraction out" in err and err.count("\n") == 1


def test_too_short_shards_are_a_clear_error(tmp_path):
    out, vocab = prepared(tmp_path)
    model = replace(MODEL, vocab_size=vocab, block_size=1 << 16)
    with pytest.raises(ValueError, match=r"no train shard .* holds a window"):
        train(model, CFG, TokenShards(out, "train"), TokenShards(out, "val"), progress=False)


def test_ids_are_uint16_when_the_vocabulary_fits_else_uint32():
    from tinygpt.shards import shard_dtype

    assert shard_dtype(50257) == np.dtype("<u2") and shard_dtype(1 << 16) == np.dtype("<u2")
    assert shard_dtype((1 << 16) + 1) == np.dtype("<u4")


# Two ranks (torchrun, gloo on the CPU) train from one shards folder. Each rank opens it itself
# and records, at its first batch, the files its arrays map and the shard files that the kernel
# lists in the rank's /proc/self/maps (Linux); then it trains and saves nothing but its results.
RANKS_SCRIPT = """
import json, os, sys
from dataclasses import replace
import numpy as np
from tinygpt.config import GPTConfig, TrainConfig
from tinygpt.shards import TokenShards
from tinygpt.train import train

shards, out, rank = sys.argv[1], sys.argv[2], int(os.environ["RANK"])
model, cfg = GPTConfig(**json.loads(sys.argv[3])), TrainConfig(**json.loads(sys.argv[4]))
tr, va = TokenShards(shards, "train"), TokenShards(shards, "val")
seen = {}
draw = tr.get_batch
def first_batch_looks(*args, **kwargs):
    if not seen:
        maps = open("/proc/self/maps").read() if os.path.exists("/proc/self/maps") else None
        seen["maps"] = None if maps is None else sorted(
            {line.split()[-1] for line in maps.splitlines() if line.endswith(".bin")})
    return draw(*args, **kwargs)
tr.get_batch = first_batch_looks  # train still gets the TokenShards object itself
history = train(model, cfg, tr, va, out_dir=f"{out}/ck", progress=False)  # rank 0 writes
result = {"history": history, "maps": seen["maps"],
          "memmap": [isinstance(a, np.memmap) for a in tr.arrays + va.arrays],
          "files": [os.path.realpath(a.filename) if isinstance(a, np.memmap) else None
                    for a in tr.arrays + va.arrays]}
with open(f"{out}/result-rank{rank}.json", "w") as f:
    json.dump(result, f)
"""


def folder_state(folder):
    """Each file's name, size, modification time and SHA-256: what writing or copying changes."""
    import hashlib

    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns,
                     hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(folder.rglob("*"))}


def test_torchrun_ranks_map_the_same_shard_files_and_match_one_process(tmp_path):
    import json
    import os
    import sys

    from test_distributed import torchrun

    out, vocab = prepared(tmp_path, shard_tokens=900)
    before = folder_state(out)
    model = replace(MODEL, vocab_size=vocab)
    cfg = replace(CFG, grad_accum_steps=2)
    (tmp_path / "ranks.py").write_text(RANKS_SCRIPT)
    torchrun(["ranks.py", str(out), str(tmp_path), json.dumps(model.__dict__),
              json.dumps(cfg.__dict__)], cwd=tmp_path)
    results = [json.loads((tmp_path / f"result-rank{r}.json").read_text()) for r in range(2)]

    shard_files = sorted(os.path.realpath(p) for p in out.glob("*.bin"))
    assert len(shard_files) > 3  # several train shards and a val shard
    for r in results:  # every rank mapped the folder's files themselves: no copy elsewhere
        assert all(r["memmap"]) and sorted(r["files"]) == shard_files
        if sys.platform.startswith("linux"):  # the kernel's list of the rank's mappings
            assert sorted(r["maps"]) == shard_files
    assert folder_state(out) == before  # nothing written, copied or touched in the shards folder

    # own_share: the two ranks' micro-batches are the ones one process draws in a row, so two
    # ranks with accumulation A equal one process with 2A, up to the order of float additions
    # (see test_distributed's test of the same equality for tensors, and its tolerance)
    tr, va = TokenShards(out, "train"), TokenShards(out, "val")
    one = train(model, replace(cfg, grad_accum_steps=4), tr, va, out_dir=tmp_path / "one",
                progress=False)
    two = load_checkpoint(tmp_path / "ck").model.state_dict()
    for (name, p), q in zip(load_checkpoint(tmp_path / "one").model.state_dict().items(),
                            two.values(), strict=True):
        torch.testing.assert_close(q, p, rtol=0, atol=1e-5, msg=name)
    for a, b in zip(results[0]["history"], one, strict=True):
        assert a["step"] == b["step"]
        for key in ("loss", "train_loss", "val_loss"):
            if key in a:
                assert a[key] == pytest.approx(b[key], rel=1e-5), (a["step"], key)
    assert without_timing(results[0]["history"]) == without_timing(results[1]["history"])


def test_a_shard_truncated_during_training_is_a_clear_error_not_sigbus(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "out"
    prepare_run.write_shards(make_small_corpus(tmp_path / "in"), out,
                             Options(tokenizer="char", val_fraction=0.25, seed=3), workers=1)
    script = f"""
import os, sys, torch
from tinygpt.shards import ShardError, TokenShards
shards = TokenShards({str(out)!r}, "train")
shards.get_batch(4, 8)
os.truncate({str(out / "train_000000.bin")!r}, 2)  # another program truncates it
try:
    for _ in range(50):
        shards.get_batch(4, 8, torch.Generator().manual_seed(_))
except ShardError as err:
    print(err)
    sys.exit(3)
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=False, timeout=120)
    assert run.returncode == 3, (run.returncode, run.stderr[-500:])  # was -7: SIGBUS
    assert "truncated to 2 bytes while in use" in run.stdout
    assert "train_000000.bin" in run.stdout


# --- what a shards manifest names, and the files it names ----------------------------------------

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

    shards = prepare_char_shards(capsys, tmp_path)
    secret = tmp_path / "outside_secret.bin"
    shutil.copy(shards / "train_000000.bin", secret)
    (shards / "sub").mkdir()
    shutil.copy(shards / "train_000000.bin", shards / "sub" / "train_000000.bin")
    name = str(secret) if name == "ABSOLUTE" else name
    rewrite_shards_manifest(shards, lambda m: m["shards"]["train"][0].update(file=name))
    code, _, err = run(capsys, "train", "--data", shards, "--out", tmp_path / "run", *FOLDER_TINY)
    assert_one_line_error(code, err, "shards.json",
                          repr(name) if isinstance(name, str) else "'file'")


@pytest.mark.parametrize("kind", ["dev-zero", "fifo", "symlink"])
@pytest.mark.parametrize("which", ["train_000000.bin", "tokenizer.json"])
def test_a_shard_or_tokenizer_that_is_not_a_regular_file_is_refused(capsys, tmp_path, kind,
                                                                    which):
    shards = prepare_bpe_shards(capsys, tmp_path)
    target = shards / which
    (tmp_path / "copy").write_bytes(target.read_bytes())
    target.unlink()
    if kind == "dev-zero":
        target.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(target)
    else:
        target.symlink_to(tmp_path / "copy")
    code, _, err = train_in_thread(capsys, "--data", shards, "--out", tmp_path / "run",
                                   *FOLDER_TINY)
    assert_one_line_error(code, err, which,
                          "symbolic link" if kind != "fifo" else "not a regular file")


def test_a_bit_flip_in_shards_json_is_caught_by_its_checksum(capsys, tmp_path):
    shards = prepare_char_shards(capsys, tmp_path)
    raw = (shards / "shards.json").read_text()
    assert raw.count('"z"') == 1
    (shards / "shards.json").write_text(raw.replace('"z"', '"{"'))  # 'z' is 0x7a, '{' 0x7b
    code, _, err = run(capsys, "train", "--data", shards, "--out", tmp_path / "run", *FOLDER_TINY)
    assert_one_line_error(code, err, "shards.json", "checksum")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("dtype", ["|u1", "<i2", ">u2", "<u4", "<f4"])
def test_a_dtype_tinygpt_does_not_write_is_refused(capsys, tmp_path, dtype):
    shards = prepare_char_shards(capsys, tmp_path)
    rewrite_shards_manifest(shards, lambda m: m.update(dtype=dtype))
    code, _, err = run(capsys, "train", "--data", shards, "--out", tmp_path / "run", *FOLDER_TINY)
    assert_one_line_error(code, err, "shards.json", f"dtype {dtype!r}")


@pytest.mark.parametrize("split", ["train", "val"])
def test_a_shard_holding_an_id_outside_the_vocabulary_is_refused(capsys, tmp_path, split):
    import hashlib

    import numpy as np

    shards = prepare_char_shards(capsys, tmp_path)
    path = shards / f"{split}_000000.bin"
    ids = np.fromfile(path, dtype="<u2")
    ids[len(ids) // 2] = 999  # the vocabulary has a few dozen characters
    path.write_bytes(ids.tobytes())
    digest = hashlib.sha256(ids.tobytes()).hexdigest()
    rewrite_shards_manifest(shards, lambda m: m["shards"][split][0].update(sha256=digest))
    code, _, err = run(capsys, "train", "--data", shards, "--out", tmp_path / "run", *FOLDER_TINY)
    assert_one_line_error(code, err, path.name, "token id 999", "outside the vocabulary")


def test_shards_whose_tokenizer_has_an_unknown_pattern_are_refused(capsys, tmp_path):
    import hashlib
    import json

    shards = prepare_bpe_shards(capsys, tmp_path)
    model = json.loads((shards / "tokenizer.json").read_text())
    model["pattern"] = REDOS
    data = json.dumps(model).encode()
    (shards / "tokenizer.json").write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    rewrite_shards_manifest(shards, lambda m: m["tokenizer"].update(sha256=digest))
    code, _, err = run(capsys, "train", "--data", shards, "--out", tmp_path / "run", *FOLDER_TINY)
    assert_one_line_error(code, err, "tokenizer.json", "not GPT-2's or GPT-4's")

