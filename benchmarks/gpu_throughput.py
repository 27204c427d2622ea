"""GPU training throughput: tinygpt's GPT beside nanoGPT's, the same GPT-2 small, the same step.

Both models are GPT-2 small as nanoGPT's ``bench.py`` builds it (12 layers, 12 heads, width 768,
context 1024, vocabulary 50304, no biases, dropout 0, tied embeddings, exact GELU) and take the
same training step: bf16 autocast, forward with the loss, backward, fused AdamW, on one fixed
random batch (``--batch-size`` x 1024 tokens), as ``bench.py`` does with ``real_data=False``.
Each variant runs ``--warmup`` steps, then ``--steps`` timed steps (CUDA synchronised before and
after), and the variants take turns for ``--rounds`` rounds, so that a change of clock or load
hits all of them; the median round is reported.

MFU (model FLOPs utilisation) uses nanoGPT's estimate, the PaLM paper's ``6 N + 12 L H Q T``
FLOPs per token (N: parameters without the position table), against the device's dense bf16
peak given by ``--peak-tflops`` (989 for an H100 SXM or an H200; nanoGPT's own figure is an
A100's 312, so its printed MFU is not comparable across GPUs).

nanoGPT's ``model.py`` is imported from ``NANOGPT_DIR`` (a checkout of karpathy/nanoGPT); without
it only tinygpt runs. Needs a CUDA GPU. The last line printed is one JSON object; ``--out FILE``
also writes it, with the command and the device.

Usage: NANOGPT_DIR=/path/to/nanoGPT PYTHONPATH=src python benchmarks/gpu_throughput.py \
           --out benchmarks/results/gpu_throughput.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

VOCAB, BLOCK, LAYERS, HEADS, WIDTH = 50304, 1024, 12, 12, 768


def tinygpt_model(device: str) -> torch.nn.Module:
    from tinygpt.config import GPTConfig
    from tinygpt.model import GPT

    config = GPTConfig(vocab_size=VOCAB, block_size=BLOCK, n_layer=LAYERS, n_head=HEADS,
                       n_embd=WIDTH, bias=False, activation="gelu", dropout=0.0)
    return GPT(config).to(device)


def tinygpt_optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    from tinygpt.config import TrainConfig
    from tinygpt.train import configure_optimizer

    return configure_optimizer(model, TrainConfig(learning_rate=1e-4, weight_decay=1e-2,
                                                  beta1=0.9, beta2=0.95))


def nanogpt_module(folder: str):
    spec = importlib.util.spec_from_file_location("nanogpt_model", Path(folder) / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def nanogpt_model_and_optimizer(folder: str, device: str):
    nano = nanogpt_module(folder)
    config = nano.GPTConfig(block_size=BLOCK, vocab_size=VOCAB, n_layer=LAYERS, n_head=HEADS,
                            n_embd=WIDTH, dropout=0.0, bias=False)
    model = nano.GPT(config).to(device)
    optimizer = model.configure_optimizers(weight_decay=1e-2, learning_rate=1e-4,
                                           betas=(0.9, 0.95), device_type="cuda")
    return model, optimizer


def flops_per_token(model: torch.nn.Module) -> float:
    """nanoGPT's estimate: 6 N + 12 L H Q T, N without the position table."""
    n = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    positions = next(p for name, p in model.named_parameters() if "wpe" in name)
    n -= positions.numel()
    return 6 * n + 12 * LAYERS * HEADS * (WIDTH // HEADS) * BLOCK


def timed_steps(model, optimizer, x, y, steps: int) -> float:
    """Seconds for ``steps`` training steps (CUDA synchronised at both ends)."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(x, y)
        loss = out[1]
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    loss.item()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch-size", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--compile", action="store_true",
                        help="also run each model under torch.compile")
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():  # `make bench` runs every benchmark: say so, and go on
        print("gpu_throughput.py: skipped, no CUDA GPU here")
        return {}
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    device = "cuda"
    g = torch.Generator(device=device).manual_seed(1337)
    x = torch.randint(VOCAB, (args.batch_size, BLOCK), device=device, generator=g)
    y = torch.randint(VOCAB, (args.batch_size, BLOCK), device=device, generator=g)

    variants = {}
    torch.manual_seed(1337)
    model = tinygpt_model(device)
    variants["tinygpt"] = (model, tinygpt_optimizer(model))
    folder = os.environ.get("NANOGPT_DIR")
    if folder:
        torch.manual_seed(1337)
        variants["nanogpt"] = nanogpt_model_and_optimizer(folder, device)
    if args.compile:
        for name in list(variants):
            model, optimizer = variants[name]
            variants[f"{name} compiled"] = (torch.compile(model), optimizer)
    flops = flops_per_token(variants["tinygpt"][0])
    for model, optimizer in variants.values():
        timed_steps(model, optimizer, x, y, args.warmup)  # warm-up (and compilation)
    seconds = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, (model, optimizer) in variants.items():
            seconds[name].append(timed_steps(model, optimizer, x, y, args.steps))
    tokens = args.batch_size * BLOCK * args.steps
    rows = {}
    for name, runs in seconds.items():
        median = statistics.median(runs)
        rows[name] = {"ms_per_iter": round(1000 * median / args.steps, 2),
                      "tokens_per_s": round(tokens / median),
                      "mfu": round(flops * tokens / median / (args.peak_tflops * 1e12), 4),
                      "ms_per_iter_each_round": [round(1000 * s / args.steps, 2) for s in runs]}
        print(f"{name:>18}: {rows[name]['ms_per_iter']:8.2f} ms/iter, "
              f"{rows[name]['tokens_per_s']:>9,} tokens/s, MFU {100 * rows[name]['mfu']:.1f}%")
    if "nanogpt" in rows:
        ratio = rows["tinygpt"]["ms_per_iter"] / rows["nanogpt"]["ms_per_iter"]
        print(f"tinygpt's time per step / nanoGPT's (both eager): {ratio:.3f}")
    result = {
        "benchmark": "gpu_throughput", "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "device": torch.cuda.get_device_name(), "torch": torch.__version__,
        "python": platform.python_version(), "batch_size": args.batch_size, "block_size": BLOCK,
        "flops_per_token": flops, "peak_tflops": args.peak_tflops, "steps": args.steps,
        "rounds": args.rounds, "results": rows,
    }
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
