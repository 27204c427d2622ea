"""What the dtype of Muon's Newton-Schulz costs on CPUs with and without native bfloat16.

One optimizer step of the modern speedrun's model (``benchmarks/speedrun.py --modern``: 2 layers,
width 128, 4 heads, context 64, RoPE, ReLU², QK-norm, RMSNorm) is timed with Muon whose
Newton-Schulz runs in bfloat16, with Muon in float32, and with the book's AdamW, the three
alternating in rounds so that they see the same machine load; the median of the rounds is
reported. Each configuration runs twice, in a fresh process each time: natively, and with
``ONEDNN_MAX_CPU_ISA=AVX2``, which stops oneDNN (torch's CPU matrix products) from using
AVX-512 and its bfloat16 instructions, so that bfloat16 is emulated as on an AVX2-only CPU
(``ATEN_CPU_CAPABILITY=avx2`` does not reach oneDNN's bfloat16 path). Each process also reports
the dtype ``tinygpt.muon.fast_ns_dtype`` chooses there and the two timings it chose by.

Usage: python benchmarks/muon_dtype.py [--rounds 7] [--steps 5] [--threads 1] [--record]
``--record`` writes benchmarks/results/muon_dtype.json (command, machine, load, torch version).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
from _machine import cpu_model  # benchmarks/_machine.py

from tinygpt.config import GPTConfig, TrainConfig
from tinygpt.model import GPT
from tinygpt.muon import configure_muon, fast_ns_dtype, ns_seconds
from tinygpt.train import configure_optimizer

RESULT = Path(__file__).parent / "results" / "muon_dtype.json"
# the modern speedrun's model: speedrun.py's BABY with the --modern and --sr-* defaults
MODEL = GPTConfig(vocab_size=65, block_size=64, n_layer=2, n_head=4, n_embd=128, dropout=0.0,
                  bias=False, positional="rope", activation="relu2", qk_norm=True,
                  zero_init_proj=True, norm="rmsnorm")
TRAIN = TrainConfig(learning_rate=4e-3, weight_decay=0.1, beta1=0.9, beta2=0.99)
SETTINGS = {"native": {}, "AVX2 (ONEDNN_MAX_CPU_ISA=AVX2)": {"ONEDNN_MAX_CPU_ISA": "AVX2"}}


def optimizers(model: GPT) -> dict[str, torch.optim.Optimizer]:
    betas = (TRAIN.beta1, TRAIN.beta2)
    return {"Muon, bfloat16": configure_muon(model, TRAIN.learning_rate, TRAIN.weight_decay,
                                             betas, ns_dtype="bfloat16"),
            "Muon, float32": configure_muon(model, TRAIN.learning_rate, TRAIN.weight_decay,
                                            betas, ns_dtype="float32"),
            "AdamW": configure_optimizer(model, replace(TRAIN, optimizer="adamw"))}


def measure(rounds: int, steps: int) -> dict:
    """Median seconds of one step of each optimizer (``steps`` steps a round), in this process."""
    torch.manual_seed(0)
    model = GPT(MODEL)
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-2
    opts = optimizers(model)
    times: dict[str, list[float]] = {name: [] for name in opts}
    for opt in opts.values():  # warm up: state made, kernels loaded
        opt.step()
    for _ in range(rounds):
        for name, opt in opts.items():
            start = time.perf_counter()
            for _ in range(steps):
                opt.step()
            times[name].append((time.perf_counter() - start) / steps)
    cpu = torch.device("cpu")
    return {"step_ms": {n: round(1e3 * statistics.median(t), 3) for n, t in times.items()},
            "step_ms_spread": {n: [round(1e3 * min(t), 3), round(1e3 * max(t), 3)]
                               for n, t in times.items()},
            "chooser_ns_ms": {str(d).removeprefix("torch."): round(1e3 * ns_seconds(d, cpu), 3)
                              for d in (torch.bfloat16, torch.float32)},
            "chooser_picks": str(fast_ns_dtype(cpu)).removeprefix("torch.")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7, help="timing rounds (7)")
    p.add_argument("--steps", type=int, default=5, help="steps per optimizer and round (5)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (1, as the speedrun)")
    p.add_argument("--record", action="store_true", help=f"write {RESULT}")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.child:
        print(json.dumps(measure(args.rounds, args.steps)))
        return 0
    load_start, rows = os.getloadavg(), []
    for setting, env in SETTINGS.items():
        env = {**os.environ, **env}
        env.pop("TINYGPT_NS_DTYPE", None)  # the chooser must choose
        out = subprocess.run([sys.executable, __file__, "--child", "--rounds", str(args.rounds),
                              "--steps", str(args.steps), "--threads", str(args.threads)],
                             env=env, check=True, capture_output=True, text=True).stdout
        row = {"setting": setting, **json.loads(out.strip().splitlines()[-1])}
        rows.append(row)
        ms = row["step_ms"]
        print(f"{setting}: one step " + ", ".join(f"{n} {v:.2f} ms" for n, v in ms.items())
              + f"; bfloat16/float32 {ms['Muon, bfloat16'] / ms['Muon, float32']:.2f}x; "
              f"the chooser picks {row['chooser_picks']}")
    name, flags = cpu_model()
    result = {"command": "python benchmarks/muon_dtype.py " + " ".join(argv or sys.argv[1:]),
              "machine": f"{name}, {os.cpu_count()} CPU cores, flags {' '.join(flags)}",
              "torch": torch.__version__, "threads": args.threads,
              "load_start": [round(v, 2) for v in load_start],
              "load_end": [round(v, 2) for v in os.getloadavg()],
              "rounds": args.rounds, "steps_per_round": args.steps,
              "model": "modern speedrun: 2 layers, width 128, 4 heads, context 64, vocab 65",
              "rows": rows}
    if args.record:
        RESULT.parent.mkdir(parents=True, exist_ok=True)
        RESULT.write_text(json.dumps(result, indent=1) + "\n")
        print(f"recorded in {RESULT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
