"""CPU speedrun (chapter 8): tinygpt against nanoGPT and Hugging Face on the "baby GPT".

The configuration is nanoGPT's baby GPT for CPUs: character-level tinyshakespeare (65 characters,
the first 90% of the text for training, the last 10% for validation), 4 layers, 4 heads, width
128, context 64, batch 12, no dropout, no biases, exact GELU, tied embeddings, AdamW (lr 1e-3,
betas 0.9/0.99, weight decay 0.1, clipping 1.0), 100 warm-up steps, cosine decay to 1e-4 at
2000 steps. All in one run, so that the ratios are taken under the same machine load:

1. ``nanogpt`` (with ``NANOGPT_DIR`` pointing at a nanoGPT checkout whose
   ``data/shakespeare_char`` is prepared): nanoGPT's own ``train.py`` in a subprocess, with the
   command its README gives for CPUs (plus ``--always_save_checkpoint=True``, which only makes it
   keep the checkpoint of its last evaluation); its per-iteration times and its validation loss
   at the last step (its estimate, 20 batches) are parsed from its output, and its final
   checkpoint is loaded into a tinygpt ``GPT`` (same layout) and evaluated on the whole
   validation split exactly as tinygpt is, so that the two losses compare like with like.
2. ``tinygpt``: the same model and schedule trained with ``tinygpt.train.train``; ms/iteration,
   tokens/s and the validation loss over the *whole* validation split (non-overlapping windows).
3. ``hf``: the same model in GPT-2's layout (biases, tanh GELU) as tinygpt and as HF
   ``transformers``' ``GPT2LMHeadModel`` (built from a config, same weights), trained step for
   step on the same batches with the same optimizer, alternating blocks: a throughput ratio.
4. ``speedrun``: another recipe and model (options ``--sr-*``; by default the baby GPT with
   **2 layers instead of 4** (same width 128, 4 heads, context 64), batch 16, at most 1100
   iterations, lr 4e-3 after 30 warm-up steps, cosine decay to 0 at step 1100, AdamW betas
   0.9/0.99, weight decay 0.1, clipping 1.0) trained with ``tinygpt.train.train``. From 70% of
   the iterations on, every 25 steps (``--sr-check-every``, ``--sr-check-from``) the whole
   validation split is evaluated and training stops as soon as it is <= ``--target`` (1.8857,
   nanoGPT's at 2000 iterations). The time to target is the sum of the iteration times up to that
   step, *without* these evaluations (their time is printed apart, ``speedrun_eval_s``), as
   nanoGPT's time leaves its evaluations out; it is compared with nanoGPT's time for its 2000
   iterations.

``--concurrent``: nanoGPT (1 and 2 above) and tinygpt train *at the same time*, one thread each
(one core each on a 2-core machine), instead of one after the other with all threads. Whatever
else the machine is doing then slows both alike, so the throughput ratio holds still from run to
run where the sequential one moves by 10-20% with the load of the moment.

Times. A training time is the sum of the per-iteration times (batch, forward, backward, clipping,
optimizer step); evaluations are left out on both sides. nanoGPT's iterations that also evaluate
(every 250, which also writes a checkpoint) are left out of its mean, and its 2000-iteration
time is that mean times the number of iterations. Absolute times depend on the machine and its
load (the machine is printed with ``uptime``'s load); the ratios are the result. Other jobs on a
shared machine stall some iterations for long; the result also gives the ratios of *median*
iteration times (``throughput_ratio_median``, ``time_ratio_median``: speedrun median x its
iterations against nanoGPT's median x 2000), which such stalls do not move.

The last line printed is one JSON object (``tinygpt_ms_per_iter``, ``nanogpt_ms_per_iter``,
``val_loss_at_2000``, ``time_to_target_s``, ``nanogpt_time_2000_s``, ...); with ``--iters N``
the keys keep their names but describe N iterations (``iters`` says which). ``--log CHANGE``
appends this run to ``benchmarks/speedrun_log.json`` as an entry named CHANGE.

What makes tinygpt fast here: torch's one-kernel ``F.layer_norm`` and ``F.gelu`` inside the
modules (the written-out formulas stay as ``explicit`` paths, tested against them), the fused
attention kernel, torch's fused AdamW (``configure_optimizer``), and ``keep_freed_memory``
(``train`` calls it on CPU: glibc's ``malloc`` keeps freed activations for the next step instead
of handing them back to the kernel, which saves about a thousand page faults per step), and
nothing else private: the training loop is the library's.

``--modern``: the speedrun uses chapter 12's modern recipe (``MODERN``: RoPE, ReLU², QK-norm,
zero-initialised projections, RMSNorm, Muon; each ``--sr-*`` option still overrides it); with
``--record`` a complete result is appended to ``benchmarks/results/speedrun_modern.json``
(``runs``: one object per invocation, with its command and machine), the record chapter 12
reads. nanoGPT's baby run, in the same invocation, gives the time it is compared with: a run
without it (``--skip-nanogpt``) or that misses the target is not complete and never recorded.

``--book`` does none of the above, but what chapter 8's speedrun page shows, on the *book's*
corpus and split: the baby recipe as the baseline, then one change at a time toward the book's
recipe, each with its loss curve and its loss over the whole validation split (see
``benchmarks/_bookrun.py``); it writes ``benchmarks/results/speedrun.json``.

Usage: NANOGPT_DIR=/path/to/nanoGPT TINYGPT_DATA=... python benchmarks/speedrun.py
       python benchmarks/speedrun.py --book   (the page's figures, about 10 minutes on 1 core)
       python benchmarks/speedrun.py --skip-nanogpt --skip-hf --iters 200   (a quick check)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from _bookrun import run_book  # benchmarks/_bookrun.py: the speedrun on the book's corpus
from _hf import hf_copy  # benchmarks/_hf.py: the same weights in GPT2LMHeadModel
from _machine import cpu_description  # benchmarks/_machine.py

from tinygpt.config import GPTConfig, TrainConfig
from tinygpt.data import load_text
from tinygpt.model import GPT
from tinygpt.tokenizer import CharTokenizer
from tinygpt.train import configure_optimizer, get_batch, train

TARGET = 1.8857  # nanoGPT's validation loss at iteration 2000 on this configuration
LOG = Path(__file__).with_name("speedrun_log.json")
MODERN_RESULT = Path(__file__).parent / "results" / "speedrun_modern.json"

# nanoGPT's baby GPT: no biases, exact GELU (nn.GELU()), tied weights.
BABY = GPTConfig(vocab_size=65, block_size=64, n_layer=4, n_head=4, n_embd=128, dropout=0.0,
                 bias=False, activation="gelu")
BABY_TRAIN = TrainConfig(batch_size=12, max_iters=2000, learning_rate=1e-3, min_lr=1e-4,
                         warmup_iters=100, lr_decay_iters=2000, weight_decay=0.1, beta1=0.9,
                         beta2=0.99, grad_clip=1.0, eval_iters=20, seed=1337)


# chapter 12's modern recipe for the speedrun: the --sr-* defaults that --modern sets
MODERN = {"sr_positional": "rope", "sr_activation": "relu2", "sr_qk_norm": True,
          "sr_zero_init_proj": True, "sr_norm": "rmsnorm", "sr_optimizer": "muon"}


def speedrun_configs(args: argparse.Namespace) -> tuple[GPTConfig, TrainConfig]:
    """The speedrun's model and training configurations from the ``--sr-*`` options."""
    model = replace(BABY, block_size=args.sr_block, n_layer=args.sr_layers, n_head=args.sr_heads,
                    n_embd=args.sr_embd, positional=args.sr_positional,
                    activation=args.sr_activation, mlp_hidden=args.sr_mlp_hidden,
                    qk_norm=args.sr_qk_norm, zero_init_proj=args.sr_zero_init_proj,
                    norm=args.sr_norm, tie_weights=args.sr_tie_weights)
    cfg = replace(BABY_TRAIN, batch_size=args.sr_batch, max_iters=args.sr_iters,
                  lr_decay_iters=args.sr_iters, learning_rate=args.sr_lr, min_lr=args.sr_min_lr,
                  warmup_iters=args.sr_warmup, beta1=args.sr_beta1, beta2=args.sr_beta2,
                  weight_decay=args.sr_weight_decay, seed=args.sr_seed,
                  eval_interval=args.sr_iters, eval_iters=1, optimizer=args.sr_optimizer,
                  adamw_lr_scale=args.sr_adamw_lr_scale)
    return model, cfg


# what chapter 12 reads of a modern run: a result without one of them is not complete
COMPLETE = ("nanogpt_time_2000_s", "nanogpt_val_loss", "speedrun_iters", "speedrun_train_s",
            "speedrun_val_loss", "speedrun_threads", "speedrun_recipe", "time_ratio")


def missing_from(result: dict) -> list[str]:
    """The keys of ``COMPLETE`` that ``result`` lacks (or holds as None)."""
    return [key for key in COMPLETE if result.get(key) is None]


def record_modern(result: dict, argv: list[str], path: Path = MODERN_RESULT) -> dict:
    """Append this invocation (its command, machine and result) to ``path``'s ``runs``; a result
    that is not complete (``COMPLETE``) is refused (ValueError) and nothing is written."""
    missing = missing_from(result)
    if missing:
        raise ValueError(f"not recorded in {path}: the run has no {', '.join(missing)} (nanoGPT "
                         "runs in the same invocation, and the speedrun must reach the target)")
    done = json.loads(path.read_text()) if path.exists() else {"runs": []}
    done["runs"].append({"command": "NANOGPT_DIR=<nanoGPT checkout> python benchmarks/speedrun.py "
                                    + " ".join(argv), "machine": machine(),
                         "torch": torch.__version__, "result": result})
    path.parent.mkdir(exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(done, indent=1) + "\n")
    os.replace(tmp, path)
    return done


def load_data() -> tuple[torch.Tensor, torch.Tensor, int]:
    """tinyshakespeare as character ids: the first 90% (train), the last 10% (val), vocab."""
    text = load_text("tinyshakespeare")
    tok = CharTokenizer.from_text(text)
    ids = torch.tensor(tok.encode(text), dtype=torch.long)
    n = int(0.9 * len(ids))
    return ids[:n], ids[n:], tok.vocab_size


@torch.no_grad()
def full_val_loss(model: GPT, val: torch.Tensor, batch: int = 256) -> float:
    """Mean cross-entropy over the whole split, cut into non-overlapping windows of ``T``."""
    T = model.config.block_size
    windows = val.unfold(0, T + 1, T)  # (N_w, T+1): every token predicted once
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(windows), batch):
        w = windows[i:i + batch]
        _, loss = model(w[:, :-1], w[:, 1:])
        total += loss.item() * len(w) * T
        count += len(w) * T
    model.train(was_training)
    return total / count


def step_seconds(history: list[dict], tokens_per_step: int) -> list[float]:
    """Each training step's time, from the ``tokens_per_s`` that ``train`` records."""
    return [tokens_per_step / r["tokens_per_s"] for r in history if "tokens_per_s" in r]


def run_tinygpt(model_config: GPTConfig, cfg: TrainConfig, train_ids, val_ids, *,
                stop_at: float | None = None, check_every: int = 50,
                check_from: int = 0) -> dict:
    """Train with ``tinygpt.train.train``; times (evaluations excluded) and the full val loss.

    ``stop_at``: every ``check_every`` steps from step ``check_from`` on, evaluate the whole
    validation split (``full_val_loss``, through ``train``'s callback) and stop training as soon
    as it is ``<= stop_at``. These evaluations are timed apart (``eval_s``, ``checks``).
    """
    torch.manual_seed(cfg.seed)  # what train() does when it builds the model itself
    model = GPT(model_config)
    checks: list[tuple[int, float]] = []
    eval_s = 0.0

    def check(record: dict, m: GPT) -> bool:
        nonlocal eval_s
        step = record["step"]
        if stop_at is None or step < check_from or step % check_every or step == cfg.max_iters:
            return False
        t = time.perf_counter()
        checks.append((step, full_val_loss(m, val_ids)))
        eval_s += time.perf_counter() - t
        return checks[-1][1] <= stop_at

    start = time.perf_counter()
    history = train(model_config, cfg, train_ids, val_ids, model=model, progress=False,
                    callback=check)
    wall = time.perf_counter() - start
    secs = step_seconds(history, cfg.batch_size * cfg.grad_accum_steps * model_config.block_size)
    stopped = bool(checks) and len(secs) == checks[-1][0] and checks[-1][1] <= (stop_at or 0)
    t = time.perf_counter()
    val = checks[-1][1] if stopped else full_val_loss(model, val_ids)
    eval_s += 0.0 if stopped else time.perf_counter() - t
    return {"iters": len(secs), "train_s": sum(secs), "ms_per_iter": 1000 * statistics.fmean(secs),
            "median_ms": 1000 * statistics.median(secs),
            "tokens_per_s": cfg.batch_size * cfg.grad_accum_steps * model_config.block_size
            * len(secs) / sum(secs),
            "val_loss": val, "val_loss_20_batches": history[-1].get("val_loss"),
            "wall_s": wall, "eval_s": eval_s, "checks": checks, "stopped_early": stopped}


NANOGPT_ITER = re.compile(r"^iter (\d+): loss ([\d.]+), time ([\d.]+)ms")
NANOGPT_EVAL = re.compile(r"^step (\d+): train loss ([\d.]+), val loss ([\d.]+)")


def nanogpt_checkpoint_val_loss(path: Path, val: torch.Tensor) -> tuple[float, int]:
    """nanoGPT's saved model (same layout as ``BABY``; only the embeddings' names differ)
    evaluated by ``full_val_loss`` on the whole split; and the iteration it was saved at."""
    ckpt = torch.load(path, map_location="cpu", weights_only=False)  # written by this run
    state = {k.replace("transformer.w", "transformer.embed.w", 1): v
             for k, v in ckpt["model"].items() if not k.endswith(".attn.bias")}
    model = GPT(BABY)
    model.load_state_dict(state, strict=True)
    return full_val_loss(model, val), int(ckpt["iter_num"])


def run_nanogpt(nanogpt_dir: str, iters: int, eval_interval: int = 250,
                threads: int | None = None, val: torch.Tensor | None = None,
                during: Callable[[], dict] | None = None) -> dict:
    """nanoGPT's train.py on the baby configuration, in a subprocess; parse its log.

    ``threads``: set ``OMP_NUM_THREADS`` for it (torch's default thread count otherwise).
    ``val``: evaluate nanoGPT's last checkpoint (it saves one at every evaluation) on this whole
    split with ``full_val_loss``, the estimate tinygpt gets, beside nanoGPT's 20-batch one.
    ``during``: called in this process while nanoGPT runs; its result is returned as
    ``"alongside"`` (the ``--concurrent`` mode: both train at the same time, a core each).
    """
    env = dict(os.environ)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    with tempfile.TemporaryDirectory() as out_dir:
        cmd = [sys.executable, "train.py", "config/train_shakespeare_char.py", "--device=cpu",
               "--compile=False", "--eval_iters=20", "--log_interval=1", "--block_size=64",
               "--batch_size=12", "--n_layer=4", "--n_head=4", "--n_embd=128",
               f"--max_iters={iters}", f"--lr_decay_iters={iters}", "--dropout=0.0",
               f"--eval_interval={eval_interval}", "--always_save_checkpoint=True",
               f"--out_dir={out_dir}"]
        log = Path(out_dir) / "log.txt"  # a file, not a pipe: nothing blocks while we train
        start = time.perf_counter()
        with open(log, "w") as sink:
            proc = subprocess.Popen(cmd, cwd=nanogpt_dir, stdout=sink, stderr=subprocess.STDOUT,
                                    env=env)
            try:
                alongside = during() if during is not None else None
            finally:
                proc.wait()
        wall = time.perf_counter() - start
        output = log.read_text()
        ckpt = Path(out_dir) / "ckpt.pt"
        whole = (nanogpt_checkpoint_val_loss(ckpt, val)
                 if val is not None and proc.returncode == 0 and ckpt.exists() else (None, None))
    if proc.returncode != 0:
        raise RuntimeError(f"nanoGPT failed ({proc.returncode}):\n{output[-3000:]}")
    times, evals = {}, {}
    for line in output.splitlines():
        if m := NANOGPT_ITER.match(line):
            times[int(m[1])] = float(m[3]) / 1000
        elif m := NANOGPT_EVAL.match(line):
            evals[int(m[1])] = float(m[3])
    # iteration 0 starts the clock late; iterations that evaluate include the evaluation
    plain = [t for i, t in times.items() if i > 0 and i % eval_interval != 0]
    mean = statistics.fmean(plain)
    return {"iters": iters, "ms_per_iter": 1000 * mean,
            "median_ms": 1000 * statistics.median(plain),
            "train_s": mean * iters, "val_loss": evals[max(evals)], "val_step": max(evals),
            "wall_s": wall, "command": " ".join(cmd[1:-1]), "val_loss_whole": whole[0],
            "ckpt_iter": whole[1], "alongside": alongside}


def run_hf(train_ids: torch.Tensor, rounds: int, steps: int) -> dict | None:
    """Same GPT-2-layout model and batches in tinygpt and ``GPT2LMHeadModel``: ms per step."""
    cfg = replace(BABY, bias=True, activation="gelu_tanh")  # GPT-2's layout, which HF has
    torch.manual_seed(0)
    ours = GPT(cfg)
    hf = hf_copy(ours)  # the same weights
    if hf is None:  # no transformers
        return None
    tc = BABY_TRAIN

    def make_step(model, is_hf):
        opt = configure_optimizer(model, tc)
        gen = torch.Generator().manual_seed(0)

        def step():
            x, y = get_batch(train_ids, tc.batch_size, cfg.block_size, gen)
            logits = model(x).logits if is_hf else model(x)
            loss = F.cross_entropy(logits.reshape(-1, cfg.vocab_size), y.reshape(-1))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss.item()
        return step

    steps_fn = {"tinygpt": make_step(ours.train(), False), "hf": make_step(hf.train(), True)}
    first = {k: fn() for k, fn in steps_fn.items()}  # warm-up, and the same first loss
    spent = dict.fromkeys(steps_fn, 0.0)
    for _ in range(rounds):
        for k, fn in steps_fn.items():
            t = time.perf_counter()
            for _ in range(steps):
                fn()
            spent[k] += time.perf_counter() - t
    n = rounds * steps
    return {"tinygpt_ms_per_iter": 1000 * spent["tinygpt"] / n,
            "hf_ms_per_iter": 1000 * spent["hf"] / n,
            "ratio": spent["hf"] / spent["tinygpt"], "steps": n,
            "first_loss_tinygpt": first["tinygpt"], "first_loss_hf": first["hf"]}


def machine() -> str:
    load = os.getloadavg()
    return (f"{cpu_description()}, "
            f"load {load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f}, torch threads "
            f"{torch.get_num_threads()}")


def append_log(change: str, result: dict, note: str) -> None:
    """Add this run to ``speedrun_log.json`` (created when missing) and, if it is complete
    (``COMPLETE``: the book reads the result), make it the result."""
    log = json.loads(LOG.read_text()) if LOG.exists() else {"entries": []}
    log.update(machine=machine(), torch=torch.__version__,
               command="NANOGPT_DIR=<nanoGPT checkout> python benchmarks/speedrun.py "
                       + " ".join(sys.argv[1:]))
    log["entries"].append({
        "change": change, "time_to_target_s": result.get("time_to_target_s"),
        "val_loss": result.get("speedrun_val_loss", result.get("val_loss_at_2000")),
        "iters": result.get("speedrun_iters", result.get("iters")),
        "ms_per_iter": result.get("speedrun_ms_per_iter", result.get("tinygpt_ms_per_iter")),
        "nanogpt_ms_per_iter": result.get("nanogpt_ms_per_iter"), "note": note,
        "throughput_ratio": result.get("throughput_ratio"), "baby_iters": result.get("iters"),
        "baby_ms_per_iter": result.get("tinygpt_ms_per_iter"),
        "baby_val_loss": result.get("val_loss_at_2000"), "uptime_load": result["load"]})
    if not missing_from(result):
        log["result"] = result
    LOG.write_text(json.dumps(log, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Set NANOGPT_DIR to run nanoGPT side by side.")
    p.add_argument("--iters", type=int, default=2000, help="iterations of the baby run (2000)")
    p.add_argument("--skip-nanogpt", action="store_true", help="do not run nanoGPT")
    p.add_argument("--skip-tinygpt", action="store_true", help="skip the baby-config tinygpt run")
    p.add_argument("--skip-hf", action="store_true", help="skip the Hugging Face comparison")
    p.add_argument("--skip-speedrun", action="store_true", help="skip the speedrun")
    p.add_argument("--hf-rounds", type=int, default=4, help="alternating rounds (4)")
    p.add_argument("--hf-steps", type=int, default=25, help="steps per round and model (25)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads for tinygpt and nanoGPT alike (default: torch's)")
    p.add_argument("--concurrent", action="store_true",
                   help="run nanoGPT and tinygpt at the same time, one thread each, so that "
                        "both see the same machine load (needs NANOGPT_DIR)")
    p.add_argument("--seed", type=int, default=BABY_TRAIN.seed,
                   help="tinygpt's seed in the baby run (1337, nanoGPT's)")
    p.add_argument("--flush-denormal", action="store_true",
                   help="torch.set_flush_denormal(True) for the tinygpt runs")
    p.add_argument("--target", type=float, default=TARGET, help="speedrun target val loss")
    p.add_argument("--sr-iters", type=int, default=1100,
                   help="speedrun iterations, the end of its decay (1100)")
    p.add_argument("--sr-lr", type=float, default=4e-3, help="speedrun peak learning rate (4e-3)")
    p.add_argument("--sr-min-lr", type=float, default=0.0, help="speedrun final learning rate (0)")
    p.add_argument("--sr-warmup", type=int, default=30, help="speedrun warm-up steps (30)")
    p.add_argument("--sr-batch", type=int, default=16, help="speedrun batch size (16)")
    p.add_argument("--sr-block", type=int, default=64, help="speedrun context length")
    p.add_argument("--sr-beta1", type=float, default=0.9, help="speedrun AdamW beta1 (0.9)")
    p.add_argument("--sr-beta2", type=float, default=0.99, help="speedrun AdamW beta2")
    p.add_argument("--sr-weight-decay", type=float, default=0.1, help="speedrun weight decay")
    p.add_argument("--sr-layers", type=int, default=2, help="speedrun model: layers (2)")
    p.add_argument("--sr-heads", type=int, default=4, help="speedrun model: heads")
    p.add_argument("--sr-embd", type=int, default=128, help="speedrun model: width")
    p.add_argument("--sr-seed", type=int, default=1337, help="speedrun seed")
    p.add_argument("--sr-positional", default="learned", choices=["learned", "rope"],
                   help="speedrun model: positions (learned)")
    p.add_argument("--sr-activation", default="gelu", choices=["gelu", "relu2", "swiglu"],
                   help="speedrun model: MLP activation (gelu)")
    p.add_argument("--sr-mlp-hidden", type=int, default=None,
                   help="speedrun model: MLP hidden width (4 x width)")
    p.add_argument("--sr-qk-norm", action=argparse.BooleanOptionalAction, default=False,
                   help="speedrun model: RMS-normalise queries and keys")
    p.add_argument("--sr-zero-init-proj", action=argparse.BooleanOptionalAction, default=False,
                   help="speedrun model: start the c_proj weights at zero")
    p.add_argument("--sr-norm", default="layernorm", choices=["layernorm", "rmsnorm"],
                   help="speedrun model: normalisation (layernorm)")
    p.add_argument("--sr-optimizer", default="adamw", choices=["adamw", "muon"],
                   help="speedrun optimizer (adamw)")
    p.add_argument("--sr-adamw-lr-scale", type=float, default=1.0,
                   help="with Muon, the AdamW part (embeddings, output layer, norms) at this "
                        "times the learning rate (1)")
    p.add_argument("--sr-tie-weights", action=argparse.BooleanOptionalAction, default=True,
                   help="speedrun model: the output layer shares the embedding's weight (tied, "
                        "as the baby GPT)")
    p.add_argument("--modern", action="store_true",
                   help="speedrun with chapter 12's modern recipe (defaults: "
                        + ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in MODERN.items())
                        + "); with --record, appends the result to "
                        "benchmarks/results/speedrun_modern.json")
    p.add_argument("--record", action="store_true",
                   help="with --modern, append a complete result (nanoGPT run in the same "
                        "invocation, target reached) to benchmarks/results/speedrun_modern.json")
    p.add_argument("--sr-check-every", type=int, default=25,
                   help="evaluate the whole val split every this many steps and stop at the "
                        "target (0: only after the last step)")
    p.add_argument("--sr-check-from", type=int, default=None,
                   help="first step at which those checks start (default: 70%% of --sr-iters)")
    p.add_argument("--sr-threads", type=int, default=None, help="torch threads for the speedrun")
    p.add_argument("--book", action="store_true",
                   help="instead of the above: the baseline and one change at a time toward the "
                        "book's recipe on the book's corpus; writes benchmarks/results/"
                        "speedrun.json (1 torch thread unless --threads)")
    p.add_argument("--book-timing-steps", type=int, default=20,
                   help="with --book: steps per recipe and round (3 rounds) of the timing (20)")
    p.add_argument("--book-keep", action="store_true",
                   help="with --book: keep the rows an interrupted --book run recorded")
    p.add_argument("--log", metavar="CHANGE", default=None,
                   help="append this run to benchmarks/speedrun_log.json as entry CHANGE")
    p.add_argument("--note", default="", help="a note for the log entry")
    if p.parse_known_args(argv)[0].modern:  # the modern recipe's defaults; options override
        p.set_defaults(**MODERN)
    args = p.parse_args(argv)
    if args.record and (not args.modern or args.skip_nanogpt or args.skip_speedrun):
        p.error("--record appends a complete --modern run: it needs --modern, nanoGPT's run and "
                "the speedrun (no --skip-nanogpt or --skip-speedrun)")

    if args.book:
        torch.set_num_threads(args.threads or 1)
        run_book((BABY, BABY_TRAIN), args.book_timing_steps,
                 sys.argv[1:] if argv is None else argv, keep=args.book_keep)
        return 0
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.flush_denormal:
        torch.set_flush_denormal(True)
    train_ids, val_ids, vocab = load_data()
    if vocab != BABY.vocab_size:
        raise SystemExit(f"expected 65 characters in tinyshakespeare, found {vocab}")
    threads = torch.get_num_threads()
    result: dict = {"iters": args.iters, "load": os.getloadavg()[0], "threads": threads,
                    "concurrent": False}
    print(f"machine: {machine()}; torch {torch.__version__}; train {len(train_ids):,} / val "
          f"{len(val_ids):,} characters", flush=True)

    nano_dir = os.environ.get("NANOGPT_DIR")
    cfg = replace(BABY_TRAIN, max_iters=args.iters, lr_decay_iters=args.iters,
                  eval_interval=args.iters, seed=args.seed)
    ours = None
    if args.concurrent:
        if not nano_dir or args.skip_nanogpt or args.skip_tinygpt:
            p.error("--concurrent runs nanoGPT and tinygpt together: it needs NANOGPT_DIR and "
                    "both runs")
        result.update(concurrent=True, threads=1)
        torch.set_num_threads(1)
        print("concurrent: nanoGPT and tinygpt train at the same time, one thread each",
              flush=True)
    if nano_dir and not args.skip_nanogpt:
        nano = run_nanogpt(nano_dir, args.iters, threads=1 if args.concurrent else args.threads,
                           val=val_ids, during=(lambda: run_tinygpt(BABY, cfg, train_ids, val_ids))
                           if args.concurrent else None)
        ours = nano.pop("alongside")
        torch.set_num_threads(threads)  # back to the sequential runs' count
        print(f"nanoGPT  {nano['iters']} iters: {nano['ms_per_iter']:.1f} ms/iter (median "
              f"{nano['median_ms']:.1f}), {nano['train_s']:.1f} s of iterations, val loss "
              f"{nano['val_loss']:.4f} at step {nano['val_step']} (its 20-batch estimate)"
              + (f"; its checkpoint of step {nano['ckpt_iter']} on the whole split: "
                 f"{nano['val_loss_whole']:.4f}" if nano["val_loss_whole"] is not None else ""),
              flush=True)
        result.update(nanogpt_ms_per_iter=nano["ms_per_iter"], nanogpt_time_2000_s=nano["train_s"],
                      nanogpt_val_loss=nano["val_loss"], nanogpt_wall_s=nano["wall_s"],
                      nanogpt_median_ms_per_iter=nano["median_ms"],
                      nanogpt_val_loss_whole=nano["val_loss_whole"],
                      nanogpt_ckpt_iter=nano["ckpt_iter"])
    else:
        result.update(nanogpt_ms_per_iter=None, nanogpt_time_2000_s=None)

    if not args.skip_tinygpt:
        ours = ours or run_tinygpt(BABY, cfg, train_ids, val_ids)
        print(f"tinygpt  {ours['iters']} iters: {ours['ms_per_iter']:.1f} ms/iter (median "
              f"{ours['median_ms']:.1f}), {ours['tokens_per_s']:.0f} tokens/s, "
              f"{ours['train_s']:.1f} s of iterations, val loss {ours['val_loss']:.4f} (whole "
              f"split; 20-batch estimate {ours['val_loss_20_batches']:.4f})", flush=True)
        result.update(tinygpt_ms_per_iter=ours["ms_per_iter"],
                      tinygpt_median_ms_per_iter=ours["median_ms"],
                      tinygpt_tokens_per_s=ours["tokens_per_s"],
                      tinygpt_time_2000_s=ours["train_s"], val_loss_at_2000=ours["val_loss"])
        if result["nanogpt_ms_per_iter"]:
            result["throughput_ratio"] = result["nanogpt_ms_per_iter"] / ours["ms_per_iter"]
            # medians: robust to the stalls other jobs cause on a shared machine
            result["throughput_ratio_median"] = nano["median_ms"] / ours["median_ms"]
            print(f"goal 1: throughput {result['throughput_ratio']:.2f}x nanoGPT's (>= 1.3), "
                  f"val loss {ours['val_loss']:.4f} (<= {TARGET})", flush=True)
    else:
        result.update(tinygpt_ms_per_iter=None, val_loss_at_2000=None)

    if not args.skip_hf:
        hf = run_hf(train_ids, args.hf_rounds, args.hf_steps)
        if hf is None:
            print("transformers is not installed: no Hugging Face comparison")
        else:
            print(f"GPT-2 layout, {hf['steps']} steps each: tinygpt {hf['tinygpt_ms_per_iter']:.1f}"
                  f" ms/iter, HF GPT2LMHeadModel {hf['hf_ms_per_iter']:.1f} ms/iter: tinygpt "
                  f"{hf['ratio']:.2f}x HF's throughput (first losses {hf['first_loss_tinygpt']:.4f}"
                  f" / {hf['first_loss_hf']:.4f})", flush=True)
            result.update(hf_ms_per_iter=hf["hf_ms_per_iter"], hf_ratio=hf["ratio"],
                          hf_tinygpt_ms_per_iter=hf["tinygpt_ms_per_iter"])

    result["time_to_target_s"] = None
    if not args.skip_speedrun:
        if args.sr_threads:
            torch.set_num_threads(args.sr_threads)
        sr_model, sr_cfg = speedrun_configs(args)
        sr = run_tinygpt(sr_model, sr_cfg, train_ids, val_ids,
                         stop_at=args.target if args.sr_check_every else None,
                         check_every=args.sr_check_every or 1,
                         check_from=(int(0.7 * args.sr_iters) if args.sr_check_from is None
                                     else args.sr_check_from))
        reached = sr["val_loss"] <= args.target
        result.update(speedrun_iters=sr["iters"], speedrun_ms_per_iter=sr["ms_per_iter"],
                      speedrun_val_loss=sr["val_loss"], speedrun_train_s=sr["train_s"],
                      speedrun_threads=torch.get_num_threads(),
                      speedrun_eval_s=sr["eval_s"], speedrun_checks=sr["checks"],
                      speedrun_stopped_early=sr["stopped_early"],
                      speedrun_recipe={"model": asdict(sr_model), "lr": args.sr_lr,
                                       "min_lr": args.sr_min_lr, "warmup": args.sr_warmup,
                                       "batch_size": args.sr_batch, "max_iters": args.sr_iters,
                                       "beta1": args.sr_beta1, "beta2": args.sr_beta2,
                                       "adamw_lr_scale": args.sr_adamw_lr_scale,
                                       "weight_decay": args.sr_weight_decay,
                                       "seed": args.sr_seed,
                                       "optimizer": args.sr_optimizer},
                      time_to_target_s=sr["train_s"] if reached else None)
        print(f"speedrun {sr['iters']} iters (lr {args.sr_lr}, batch {args.sr_batch}, context "
              f"{args.sr_block}, {torch.get_num_threads()} threads): {sr['train_s']:.1f} s, "
              f"{sr['ms_per_iter']:.1f} ms/iter, val loss {sr['val_loss']:.4f} (whole split"
              f"{', stopped at the target' if sr['stopped_early'] else ''}; {len(sr['checks'])} "
              f"checks took {sr['eval_s']:.1f} s, not counted): "
              + ("target reached" if reached else f"target {args.target} NOT reached"), flush=True)
        if reached and result.get("nanogpt_time_2000_s"):
            result["time_ratio"] = sr["train_s"] / result["nanogpt_time_2000_s"]
            # the same with median iteration times on both sides (robust to stalls)
            result["time_ratio_median"] = (sr["median_ms"] * sr["iters"]) / (
                result["nanogpt_median_ms_per_iter"] * args.iters)
            goal = 0.15 if args.modern else 0.5
            print(f"goal 2: time to target {sr['train_s']:.1f} s = {result['time_ratio']:.2f}x "
                  f"nanoGPT's {result['nanogpt_time_2000_s']:.1f} s (<= {goal}); with median "
                  f"iteration times on both sides {result['time_ratio_median']:.2f}x", flush=True)
    if args.log:
        append_log(args.log, result, args.note)
    if args.record:
        try:
            record_modern(result, sys.argv[1:] if argv is None else argv)
        except ValueError as err:
            print(f"speedrun: {err}", file=sys.stderr)
            return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
