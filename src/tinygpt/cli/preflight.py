"""Checks the command line makes before it spends time or memory: devices, seeds, memory.

It handles what ``tinygpt train`` and ``tinygpt sample`` must refuse with a one-line error before
any work: a ``--device`` tinygpt does not run on or this machine lacks (``check_device``), a seed
torch cannot take (``check_seed``), and a run whose closed-form memory estimate (``train_memory``,
``sample_memory``: weights, optimizer state, activations, cache, within a small factor) exceeds
the memory free on its device (``check_memory``); also ``quiet_broken_pipe``, the quiet exit
after a closed stdout. It does not validate the configs' fields
(``GPTConfig``, ``TrainConfig``) or the sampling settings (``tinygpt.sample.check_sampling``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from tinygpt.checks import check_int

SEED_RANGE = (0, 2**63 - 1)  # torch takes 64-bit seeds; training adds 1 + rank to its seed
MAX_GRAD_ACCUM = 1 << 16  # micro-batches per step: more is a mistake (a step would take ages)


def check_device(name: str, flag: str = "--device") -> str:
    """``name`` if it is a device tinygpt supports and this machine has; else ValueError."""
    from tinygpt.runtime import device_problem  # imports torch, which the CLI imports late

    problem = device_problem(name)
    if problem is not None:
        raise ValueError(f"{flag} {name}: {problem}; use cpu or auto")
    return name


def check_seed(seed: int, flag: str = "--seed") -> int:
    """``seed`` if it is in ``SEED_RANGE``; else a ValueError that gives the range."""
    low, high = SEED_RANGE
    if not low <= seed <= high:
        raise ValueError(f"{flag} {seed}: a seed must be an integer from {low} to {high} "
                         "(2**63 - 1)")
    return seed


def check_train_run(model_config, train_config) -> None:
    """Refuse, before any work, a seed torch cannot take, an absent device, or a run whose
    memory estimate exceeds what its device has free."""
    check_seed(train_config.seed)
    if train_config.grad_accum_steps > MAX_GRAD_ACCUM:
        raise ValueError(f"--gradient-accumulation-steps {train_config.grad_accum_steps}: at most "
                         f"{MAX_GRAD_ACCUM} micro-batches per step; for a larger batch, raise "
                         "--batch-size too")
    from tinygpt.runtime import resolve_device

    device = str(resolve_device(check_device(train_config.device)))  # "auto": cuda or cpu
    need = train_memory(model_config, train_config)
    check_memory(need, device, "training", "lower --n-layer, --n-embd, --block-size or "
                 "--batch-size (--gradient-accumulation-steps keeps the batch)")


def check_sample_args(args) -> None:
    """``tinygpt sample``'s sizes, checked before the checkpoint is loaded (its seed and device:
    ``tinygpt.cli.sampling_options``; its sampling settings: ``tinygpt.sample.check_sampling``)."""
    check_int(args.num_samples, "--num-samples")
    check_int(args.max_new_tokens, "--max-new-tokens", 0)


def _size(n: float) -> str:
    """``n`` bytes, readably: 12.3 MiB, 745 GiB, 2.03e+05 TiB."""
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.3g} {unit}"
        n /= 1024
    return f"{n:.3g} TiB"


def train_memory(model_config, train_config) -> dict[str, int]:
    """Peak bytes of a training step, by part: ``weights`` (weights, gradients and AdamW state,
    16 bytes a float32 parameter), ``activations`` (kept for the backward pass of one
    micro-batch, logits included) and ``total``."""
    from tinygpt.model import num_parameters

    c, b = model_config, train_config.batch_size
    t, width, heads = c.block_size, c.n_embd, c.n_head
    per_layer = 4 * b * t * (10 * width + 2 * c.mlp_width)  # (B, T, .) float32 tensors
    if c.dropout > 0:  # attention weights and their dropout mask are kept: (B, H, T, T)
        per_layer += 4 * b * heads * t * t * 3
    logits = 4 * b * t * c.vocab_size * 3  # logits, their log-softmax and its gradient
    weights = 16 * num_parameters(c)
    activations = c.n_layer * per_layer + logits
    return {"weights": weights, "activations": activations, "total": weights + activations}


def sample_memory(model_config, num_samples: int, prompt_tokens: int,
                  max_new_tokens: int) -> dict[str, int]:
    """Peak bytes of ``generate``, by part: ``weights`` (float32), ``cache`` (keys and values
    of every layer for ``num_samples`` rows), ``ids`` (the int64 output, prompt included) and
    ``activations`` (one full forward pass when the context is rebuilt), and ``total``."""
    from tinygpt.model import num_parameters

    c, b = model_config, num_samples
    t = min(c.block_size, prompt_tokens + max_new_tokens)
    parts = {"weights": 4 * num_parameters(c),
             "cache": c.n_layer * 2 * 4 * b * t * c.n_embd,
             "ids": 8 * b * (prompt_tokens + max_new_tokens),
             "activations": 4 * b * (t * (4 * c.n_embd + c.mlp_width) + c.vocab_size)}
    return {**parts, "total": sum(parts.values())}


def available_memory(device: str) -> int | None:
    """Bytes free for a new run on ``device``: CUDA's free memory, or for the CPU Linux's
    ``MemAvailable`` (within a cgroup's limit); None where it cannot be told."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.mem_get_info(torch.device(device))[0]
    if device != "cpu":
        return None
    try:
        meminfo = Path("/proc/meminfo").read_text()
        found = re.search(r"MemAvailable:\s+(\d+) kB", meminfo)
        if found is None:
            return None
        free = int(found[1]) * 1024
    except OSError:
        return None
    try:  # a container's limit (cgroup v2)
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text())
        if limit != "max":
            free = min(free, int(limit) - used)
    except (OSError, ValueError):
        pass
    return free


def check_memory(need: dict[str, int], device: str, what: str, hint: str) -> None:
    """Refuse (ValueError) a run whose estimate ``need["total"]`` exceeds the free memory."""
    free = available_memory(device)
    if free is None or need["total"] <= free:
        return
    parts = ", ".join(f"{k} {_size(v)}" for k, v in need.items() if k != "total")
    raise ValueError(f"{what} needs about {_size(need['total'])} of memory ({parts}), but "
                     f"{device} has {_size(free)} available; {hint}")


def quiet_broken_pipe() -> int:
    """After stdout's reader went away (``tinygpt sample | head``): point stdout at /dev/null,
    so that Python's final flush cannot fail again, and return 141 (128 + SIGPIPE), the code of
    a shell command ended by a closed pipe; nothing is printed."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
    finally:
        os.close(devnull)
    return 141
