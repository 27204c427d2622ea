"""``tinygpt sample``: load a checkpoint, encode the prompt, call ``generate``, print.

It handles the command's own input: the ``\\n``/``\\t`` escapes of ``--prompt`` and ``--stop``,
stop strings that must be one token each, the device, and a memory estimate made before the
model is moved. The sampling settings are checked by ``tinygpt.sample.check_sampling``, the same
check ``generate`` makes; an error it raises is given the name of its option. On the CPU it
samples on as many torch threads as cores are free (``runtime.free_threads``): a small model's
step waits at every parallel loop for a thread whose core another process holds. It imports no
training code (``tinygpt.train``, ``tinygpt.distributed``) and does not sample by itself.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import sys

from tinygpt.cli import preflight, sampling_options

# generate's parameters and their options, to name the option in an error about one
OPTION_NAMES = {**sampling_options.OPTION_NAMES, "max_new_tokens": "--max-new-tokens"}


def unescape(text: str) -> str:
    """``\\n`` -> newline, ``\\t`` -> tab, ``\\\\`` -> backslash; nothing else changes."""
    return re.sub(r"\\([nt\\])", lambda m: {"n": "\n", "t": "\t", "\\": "\\"}[m[1]], text)


def run_sample(args: argparse.Namespace, argv: list[str]) -> int:
    """``tinygpt sample``; an error about a sampling setting ends with its option's name."""
    with sampling_options.naming_the_option(OPTION_NAMES):
        return sample_and_print(args)


def divergence(history: list, vocab_size: int) -> str | None:
    """A warning if the run's last recorded loss says it diverged, else None: not finite, or more
    than twice the loss of guessing uniformly among ``vocab_size`` tokens (ln V), which the
    untrained model starts near. Such a checkpoint samples noise (``kkkk...``)."""
    import math

    losses = [(r.get("step"), float(r[k])) for r in history if isinstance(r, dict)
              for k in ("val_loss", "loss") if isinstance(r.get(k), (int, float))]
    if not losses or not isinstance(vocab_size, int) or vocab_size < 2:
        return None
    step, last = losses[-1]
    limit = 2 * math.log(vocab_size)
    if math.isfinite(last) and last <= limit:
        return None
    return (f"the run diverged: its last recorded loss is {last:.3g} (step {step}), above "
            f"{limit:.2f}, twice that of guessing among {vocab_size} tokens; the samples below "
            "are noise. Train again with a lower --lr or more --warmup-iters")


def sample_and_print(args: argparse.Namespace) -> int:
    """Load the checkpoint in ``--out``, encode the prompt, generate and print the samples."""
    import torch

    from tinygpt.checkpoint import load_checkpoint
    from tinygpt.runtime import free_threads, resolve_device
    from tinygpt.sample import check_sampling, generate

    preflight.check_sample_args(args)  # sizes
    sampling_options.check_sampling_options(args)  # seed and device
    check_sampling(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    ckpt = load_checkpoint(args.out)
    warning = divergence(ckpt.history, getattr(ckpt.model_config, "vocab_size", 0))
    if warning:
        print(f"tinygpt: warning: {args.out}: {warning}", file=sys.stderr)
    tokenizer = ckpt.tokenizer
    if tokenizer is None:
        raise ValueError(f"the checkpoint in {args.out} holds no tokenizer to encode a prompt")
    prompt = unescape(args.prompt)
    try:
        ids = tokenizer.encode(prompt or "\n")  # an empty prompt starts from a newline
    except ValueError as err:
        what = "--prompt" if prompt else "an empty --prompt starts from a newline, but"
        raise ValueError(f"{what}: {err}; give a --prompt made of its characters") from None
    stops = []
    for stop in args.stop:
        try:
            found = tokenizer.encode(unescape(stop))
        except ValueError as err:
            raise ValueError(f"--stop {stop!r}: {err}") from None
        if len(found) != 1:
            raise ValueError(f"--stop {stop!r} is {len(found)} tokens of this tokenizer, not 1: "
                             "only single-token stop strings are supported")
        stops += found
    device = resolve_device(args.device)
    need = preflight.sample_memory(ckpt.model_config, args.num_samples, len(ids),
                                    args.max_new_tokens)
    preflight.check_memory(need, device.type if device.type == "cpu" else str(device),
                            "sampling", "lower --num-samples or --max-new-tokens")
    model = sampling_options.model_on_device(ckpt.model, device, args.device)
    idx = torch.tensor([ids] * args.num_samples, device=device)  # (B, T)
    generator = torch.Generator(device=device).manual_seed(args.seed)
    with free_threads() if device.type == "cpu" else contextlib.nullcontext():
        out = generate(model, idx, args.max_new_tokens, args.temperature, args.top_k,
                       args.top_p, use_cache=not args.no_cache, generator=generator,
                       stop=stops or None)  # (B, T + n)
    for i, row in enumerate(out.tolist()):
        new = row[len(ids):]
        ends = [j for j, t in enumerate(new) if t in stops]
        new = new[:ends[0] + 1] if ends else new  # a finished row is padded with its stop id
        print(("-" * 15 + "\n") * (i > 0) + tokenizer.decode((ids if prompt else []) + new))
    return 0
