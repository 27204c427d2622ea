"""Tests for tinygpt.distributed and the data-parallel path of tinygpt.train: real 2-process
``torchrun`` runs on the CPU (gloo) against one-process runs with the same global batch, the
single writer of checkpoints, resuming, a failing rank, bf16 autocast, and a one-process run that
initialises nothing."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tinygpt.checkpoint import load_checkpoint
from tinygpt.checkpoint.run_state import rng_key, saved_world_size
from tinygpt.config import GPTConfig, TrainConfig
from tinygpt.distributed import (
    DistContext,
    all_reduce_mean,
    context_from_env,
    distributed,
    is_main_process,
    own_share,
)
from tinygpt.train import train

TEXT = "the quick brown fox jumps over the lazy dog; a lazy dog sleeps in the sun. " * 30
IDS = torch.tensor([ord(c) % 32 for c in TEXT])
TRAIN, VAL = IDS[:2000], IDS[2000:]
MODEL = GPTConfig(vocab_size=32, block_size=16, n_layer=2, n_head=2, n_embd=16, dropout=0.0)
CFG = TrainConfig(batch_size=4, max_iters=6, warmup_iters=2, eval_interval=3, eval_iters=3,
                  grad_accum_steps=2, learning_rate=3e-3)

# One torchrun launch does everything (starting two interpreters costs seconds on 2 cores):
# run "a" straight to step 6; run "b" to step 3 and resume it to 6; then a run whose rank 0
# raises in its callback at step 1. Every call of save_checkpoint is logged with its rank.
SCRIPT = """
import json, os, sys, time
import torch
import tinygpt.checkpoint
from dataclasses import replace
from tinygpt.config import GPTConfig
from tinygpt.train import train
from tinygpt.config import TrainConfig

out, rank = sys.argv[1], int(os.environ["RANK"])
real_save = tinygpt.checkpoint.save_checkpoint
def logged_save(*args, **kwargs):
    with open(f"{out}/saves-rank{rank}.txt", "a") as f:
        f.write(f"{args[5]}\\n")  # the step
    return real_save(*args, **kwargs)
tinygpt.checkpoint.save_checkpoint = logged_save

ids = torch.tensor(json.loads(open(f"{out}/ids.json").read()))
model, cfg = GPTConfig(**json.loads(sys.argv[2])), TrainConfig(**json.loads(sys.argv[3]))
result = {"a": train(model, cfg, ids[:2000], ids[2000:], out_dir=f"{out}/a", progress=False)}
train(model, replace(cfg, max_iters=3), ids[:2000], ids[2000:], out_dir=f"{out}/b",
      progress=False)
result["b"] = train(model, cfg, ids[:2000], ids[2000:], out_dir=f"{out}/b", resume=True,
                    progress=False)
result["left_group"] = not torch.distributed.is_initialized()
def boom(record, model):
    raise KeyError("boom")
t0 = time.perf_counter()
try:
    train(model, cfg, ids[:2000], ids[2000:], progress=False, callback=boom)
except Exception as err:
    result["error"] = "RuntimeError" if isinstance(err, RuntimeError) else type(err).__name__
result["error_seconds"] = time.perf_counter() - t0
result["left_group_after_error"] = not torch.distributed.is_initialized()
with open(f"{out}/result-rank{rank}.json", "w") as f:
    json.dump(result, f)
"""


def free_port() -> int:
    """A TCP port that is free on this machine now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(args: list[str], cwd: Path, timeout: float = 180,
             attempts: int = 2) -> subprocess.CompletedProcess:
    """``torchrun --nproc_per_node=2 ARGS`` in ``cwd`` on a free port; its output on failure.

    Each attempt runs on a port picked just before it (static rendezvous on 127.0.0.1, no
    port-0 negotiation). An attempt that outlives ``timeout`` -- a stuck rendezvous on a busy CI
    machine -- is stopped (SIGTERM, which torchrun passes on to its workers; SIGKILL 30 s later),
    the files it wrote in ``cwd`` are removed, and the run is tried once more on a new port. A run
    that fails, or times out every time, fails the test with torchrun's output.
    """
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    before = set(cwd.iterdir())
    log = []
    for attempt in range(1, attempts + 1):
        port = free_port()
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1",
               "--nproc-per-node=2", "--master-addr=127.0.0.1", f"--master-port={port}", *args]
        # Output to files, not pipes: a worker that outlives a killed agent cannot block us.
        with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
            proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=err, text=True,
                                    start_new_session=True)
            try:
                proc.wait(timeout=timeout)
                timed_out = False
            except subprocess.TimeoutExpired:
                timed_out = True
                proc.terminate()  # SIGTERM: torchrun stops its workers (each in its own session)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
            out.seek(0)
            err.seek(0)
            stdout, stderr = out.read(), err.read()
        if timed_out:
            log.append(f"attempt {attempt} (port {port}) timed out after {timeout:.0f} s:\n"
                       f"--- stdout ---\n{stdout[-3000:]}\n--- stderr ---\n{stderr[-3000:]}")
            for path in set(cwd.iterdir()) - before:  # what the stopped run wrote
                if path.is_dir():
                    shutil.rmtree(path)
                else:
                    path.unlink()
            continue
        if proc.returncode != 0:
            log.append(f"torchrun exited with {proc.returncode} (port {port}):\n"
                       f"--- stdout ---\n{stdout[-3000:]}\n--- stderr ---\n{stderr[-3000:]}")
            pytest.fail("\n\n".join(log), pytrace=False)
        return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)
    pytest.fail("\n\n".join(log), pytrace=False)


def without_timing(history: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "tokens_per_s"} for r in history]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> tuple[Path, list[dict]]:
    out = tmp_path_factory.mktemp("ddp")
    (out / "ids.json").write_text(json.dumps(IDS.tolist()))
    (out / "script.py").write_text(SCRIPT)
    torchrun(["script.py", str(out), json.dumps(MODEL.__dict__), json.dumps(CFG.__dict__)],
             cwd=out)
    return out, [json.loads((out / f"result-rank{r}.json").read_text()) for r in range(2)]


def test_two_processes_match_one_process_with_twice_the_accumulation(two_ranks):
    out, results = two_ranks
    one = train(MODEL, replace(CFG, grad_accum_steps=2 * CFG.grad_accum_steps), TRAIN, VAL,
                out_dir=out / "one", progress=False)
    two = load_checkpoint(out / "a")
    # The same windows and the same initial weights: only the order of float32 additions differs
    # (gloo sums the two ranks' half-gradients; one process adds the micro-batches one by one),
    # a relative ~1e-7 per gradient. Most weights then differ by < 3e-8. The largest difference,
    # ~6e-7, is in the attention key biases, whose true gradient is 0 (softmax ignores a shift
    # of all scores), so their "gradient" is rounding noise that AdamW normalises into steps of
    # up to lr = 3e-3 in either direction. atol 1e-5 covers that with margin and would still
    # catch a wrong batch or a missing average (differences of order lr, 1e-3).
    for (name, p), q in zip(load_checkpoint(out / "one").model.state_dict().items(),
                            two.model.state_dict().values(), strict=True):
        torch.testing.assert_close(q, p, rtol=0, atol=1e-5, msg=name)
    assert not any(name.startswith("module.") for name in two.model.state_dict())
    for a, b in zip(results[0]["a"], one, strict=True):  # losses and evaluations agree as well
        assert a.keys() == b.keys() and a["step"] == b["step"]
        for key in ("loss", "train_loss", "val_loss"):
            if key in a:
                assert a[key] == pytest.approx(b[key], rel=1e-5), (a["step"], key)
    assert without_timing(results[0]["a"]) == without_timing(results[1]["a"])  # same on all ranks


def test_only_rank_0_writes_checkpoints(two_ranks):
    out, _ = two_ranks
    assert not (out / "saves-rank1.txt").exists()
    assert (out / "saves-rank0.txt").read_text().split() == ["6", "3", "6"]  # a; b; resumed b
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]  # no temp folders left
    ckpt = load_checkpoint(out / "a")
    assert saved_world_size(ckpt.rng_states) == 2 and rng_key("torch", 1) in ckpt.rng_states


def test_resumed_distributed_run_continues_like_the_uninterrupted_one(two_ranks):
    out, results = two_ranks
    assert without_timing(results[0]["b"]) == without_timing(results[0]["a"])
    a, b = load_checkpoint(out / "a"), load_checkpoint(out / "b")
    for (name, p), q in zip(a.model.state_dict().items(), b.model.state_dict().values(),
                            strict=True):
        assert torch.equal(p, q), name


def test_every_rank_leaves_the_group_and_an_error_on_one_rank_stops_the_other(two_ranks):
    _, results = two_ranks
    assert all(r["left_group"] and r["left_group_after_error"] for r in results)
    assert results[0]["error"] == "KeyError"  # rank 0's own error
    assert results[1]["error"] == "RuntimeError"  # gloo: "connection closed by peer"
    assert results[1]["error_seconds"] < 60  # not the 300 s collective timeout


def test_one_process_initialises_no_process_group(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)

    def forbidden(*args, **kwargs):
        raise AssertionError("a one-process run must not create a process group")

    monkeypatch.setattr(dist, "init_process_group", forbidden)
    history = train(MODEL, replace(CFG, max_iters=2), TRAIN, VAL, progress=False)
    assert len(history) == 3 and not dist.is_initialized()
    with distributed(torch.device("cpu")) as ctx:
        assert ctx == DistContext() and ctx.is_main and not ctx.is_distributed
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("LOCAL_RANK", "0")
    with distributed(torch.device("cpu")) as ctx:  # torchrun with one process: still nothing
        assert ctx.world_size == 1


def test_own_share_splits_one_stream_in_rank_order():
    draws = iter(range(100))
    shares = [own_share(lambda: next(draws), DistContext(rank=r, world_size=3)) for r in range(3)]
    assert shares == [0, 4, 8]  # each call consumes three draws and keeps the rank-th
    assert all_reduce_mean({"x": 2.0}, DistContext()) == {"x": 2.0}


@pytest.mark.parametrize("env, match", [
    ({"RANK": "2", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, "RANK=2"),
    ({"RANK": "x", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, "RANK must be an integer"),
])
def test_bad_torchrun_environment_is_a_clear_error(env, match):
    with pytest.raises(ValueError, match=match):
        context_from_env(torch.device("cpu"), env)


def test_bfloat16_autocast_trains_close_to_float32():
    cfg = replace(CFG, max_iters=4)
    f32 = train(MODEL, cfg, TRAIN, VAL, progress=False)
    bf16 = train(MODEL, replace(cfg, dtype="bfloat16"), TRAIN, VAL, progress=False)
    # bf16 keeps 8 bits of mantissa (relative rounding 2**-9 ~ 0.002); the losses of the same
    # steps differ by about that fraction of ln 32 ~ 3.5, far less than a step's improvement
    for a, b in zip(f32[1:], bf16[1:], strict=True):
        assert b["loss"] == pytest.approx(a["loss"], abs=0.03)
    assert bf16[-1]["loss"] != f32[-1]["loss"]  # autocast did run in lower precision
    with pytest.raises(ValueError, match="float16 needs loss scaling"):
        TrainConfig(dtype="float16")


def test_the_cli_runs_under_torchrun_and_writes_one_checkpoint(tmp_path):
    (tmp_path / "tiny.txt").write_text(TEXT)
    done = torchrun(["-m", "tinygpt", "train", "--data", "tiny.txt", "--tokenizer", "char",
                     "--out", "out", "--n-layer", "1", "--n-head", "2", "--n-embd", "16",
                     "--block-size", "16", "--batch-size", "4", "--max-iters", "3",
                     "--warmup-iters", "1", "--eval-iters", "2", "--eval-interval", "3"],
                    cwd=tmp_path)
    assert done.stdout.count("effective batch: 4 sequences x 1 accumulation steps x 2 "
                             "process(es) = 8 sequences") == 1  # printed by rank 0 alone
    assert done.stdout.count("tinygpt: trained to step 3") == 1  # the summary line, rank 0 only
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "tiny.txt"]  # no temp folders
    ckpt = load_checkpoint(tmp_path / "out")
    assert ckpt.step == 3 and saved_world_size(ckpt.rng_states) == 2


def test_only_rank_0_is_the_main_process():
    assert is_main_process({}) and is_main_process({"RANK": "0"})  # a single process, rank 0
    assert not is_main_process({"RANK": "1"}) and not is_main_process({"RANK": "3"})


def test_data_parallel_lets_go_of_ddp_before_the_group_is_destroyed(tmp_path):
    """DDP holds the process group: ``data_parallel`` drops it on the way out, even while the
    caller still holds the handle (as ``train``'s locals do until it returns, and an error's
    traceback after that). Kept alive past ``destroy_process_group``, gloo could hang."""
    import gc
    import weakref

    from tinygpt.distributed import data_parallel
    from tinygpt.model import GPT

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        model = GPT(MODEL)
        ctx = DistContext(world_size=2)  # makes wrap_model wrap: the group itself has one rank
        with data_parallel(model, ctx) as net:
            assert isinstance(net.ddp, torch.nn.parallel.DistributedDataParallel)
            ddp = weakref.ref(net.ddp)
            x = TRAIN[:16][None]  # (1, 16)
            net(x, x)[1].backward()  # the wrapper is usable through the handle
            with net.no_sync():
                pass
        gc.collect()
        assert ddp() is None and net.ddp is None  # gone, though `net` is still referenced
        with data_parallel(model, DistContext()) as plain:
            assert plain is model  # one process: the model itself
    finally:
        dist.destroy_process_group()
