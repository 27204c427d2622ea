"""Benchmark of generation (chapter 9): the key/value cache, and tinygpt against Hugging Face.

What it measures, all in one run, greedy decoding of ``--new`` tokens (512) from a 16-token
prompt, batch 1, random weights, on models whose context (1024) holds prompt and output:

* tokens/s of ``tinygpt.sample.generate`` with the cache and without it, and of Hugging Face
  ``transformers``' ``GPT2LMHeadModel.generate`` (its own cache) holding the same weights
  (``tinygpt.gpt2.to_hf_state_dict``); it checks that the three produce the same tokens;
* the time of one generation step at a few positions, cached (one new token against a cache of
  ``t - 1`` positions) and uncached (a full forward pass over ``t`` positions);
* the key/value cache memory: bytes per token per layer, ``2 C`` times the dtype size, computed
  and measured from the cache tensors.

Two models: "small" (4 layers, width 256, 4 heads, vocab 256) and "gpt2" (GPT-2 small's shape:
12 layers, 768, 12 heads, vocab 50257). Without the cache the cost of a step grows with its
position, so the uncached run of "gpt2" is limited to ``--uncached-new`` tokens (64) and
compared with a cached run of the same length. ``--quick``: 64 new tokens, fewer repeats.

``--past-context``: instead, the cost of running past the context. Once the context is full,
``generate`` crops it to its last ``crop_to`` tokens and rebuilds the cache from them (a full
forward pass). It times ``4 T_max`` new tokens after a full-context prompt, on one thread, for
``crop_to = T_max - 1`` (the old default: a rebuild every other token), ``crop_to = T_max // 2``
(the default) and without the cache, on the "small" model with contexts of 64 and 256: tokens/s, the
median of ``--repeat`` (5) alternating runs.

Results depend on the machine (CPU, thread count, other load); the thread count is printed.
tinygpt and HF runs alternate (best of ``--repeat``) after a warm-up. Batch-1 steps are
small: on a machine shared with other jobs, ``--threads 1`` is often faster and steadier.

Usage: python benchmarks/bench_sampling.py [--quick] [--new 512] [--models small,gpt2]
       [--threads N] [--uncached-new 64]
       python benchmarks/bench_sampling.py --past-context [--repeat 5]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time

import torch
from _hf import hf_copy  # benchmarks/_hf.py: the same weights in GPT2LMHeadModel

from tinygpt.config import GPTConfig
from tinygpt.model import GPT
from tinygpt.sample import context_schedule, generate

MODELS = {
    "small": GPTConfig(vocab_size=256, block_size=1024, n_layer=4, n_head=4, n_embd=256),
    "gpt2": GPTConfig(vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768),
}
PROMPT_LEN = 16


def timed(fn, repeat: int = 1):
    """The result of ``fn()`` and its best wall time in seconds over ``repeat`` runs."""
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        runs.append(time.perf_counter() - start)
    return out, min(runs)


def hf_generate(hf, idx: torch.Tensor, n: int) -> torch.Tensor:
    with torch.no_grad():
        return hf.generate(idx, attention_mask=torch.ones_like(idx), max_new_tokens=n,
                           min_new_tokens=n, do_sample=False, use_cache=True,
                           pad_token_id=0, eos_token_id=None)


def agreement(a: torch.Tensor, b: torch.Tensor) -> str:
    """``'all N agree'`` or where the first difference is (float rounding can flip a tie)."""
    a, b = a[0, PROMPT_LEN:], b[0, PROMPT_LEN:]
    n = min(len(a), len(b))
    diff = (a[:n] != b[:n]).nonzero()
    return f"all {n} agree" if len(diff) == 0 else f"first {int(diff[0])} of {n} agree"


def step_times(model: GPT, idx: torch.Tensor, positions: list[int], repeat: int):
    """Median seconds of one step at each position ``t``: cached and uncached."""
    rows = []
    with torch.no_grad():
        for t in positions:
            caches = model.new_caches(1)
            model(idx[:, :t - 1], caches=caches)  # prefill t - 1 positions
            cached = []
            for _ in range(repeat):
                start = time.perf_counter()
                model(idx[:, t - 1:t], caches=caches)  # one token against t - 1 cached
                cached.append(time.perf_counter() - start)
                for cache in caches:
                    cache.length = t - 1  # forget it again
            uncached = []
            for _ in range(max(1, repeat // 3)):
                start = time.perf_counter()
                model(idx[:, :t])
                uncached.append(time.perf_counter() - start)
            rows.append((t, statistics.median(cached), statistics.median(uncached)))
    return rows


def kv_memory(model: GPT) -> None:
    c = model.config
    caches = model.new_caches(1)
    size = caches[0].k.element_size()
    computed = 2 * c.n_embd * size
    measured = sum(x.k.nbytes + x.v.nbytes for x in caches) / (c.n_layer * caches[0].max_len)
    print(f"  KV cache: 2*C*{size} = {computed} bytes per token per layer (computed), "
          f"{measured:.0f} (measured from the cache tensors); {computed * c.n_layer} bytes per "
          f"token for {c.n_layer} layers; {computed * c.n_layer * c.block_size / 2**20:.1f} MiB "
          f"for a full context of {c.block_size}")
    assert computed == measured


def bench_model(name: str, new: int, uncached_new: int, repeat: int) -> None:
    config = MODELS[name]
    torch.manual_seed(0)
    model = GPT(config).eval()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"\n[{name}] L={config.n_layer} C={config.n_embd} H={config.n_head} "
          f"V={config.vocab_size} T_max={config.block_size}: {n_params / 1e6:.1f}M parameters")
    idx = torch.randint(0, config.vocab_size, (1, PROMPT_LEN),
                        generator=torch.Generator().manual_seed(1))

    def run(n: int, cache: bool):
        return generate(model, idx, n, temperature=0, use_cache=cache)

    hf = hf_copy(model)
    # tinygpt and HF alternate, best of `repeat` each, so that a change in the machine's load
    # during the run does not favour one of them
    run(4, True), run(4, False)  # warm-up: first calls pay one-off allocation costs
    if hf is not None:
        hf_generate(hf, idx, 4)
    t_cache = t_hf = float("inf")
    for _ in range(repeat):
        ours, t = timed(lambda: run(new, True))
        t_cache = min(t_cache, t)
        if hf is not None:
            theirs, t = timed(lambda: hf_generate(hf, idx, new))
            t_hf = min(t_hf, t)
    print(f"  tinygpt, cache     : {new} tokens in {t_cache:7.2f} s = {new / t_cache:8.1f} tok/s")
    if hf is None:
        print("  transformers is not installed: no Hugging Face comparison")
    else:
        print(f"  HF generate, cache : {new} tokens in {t_hf:7.2f} s = {new / t_hf:8.1f} tok/s")
        print(f"  tokens, tinygpt vs HF: {agreement(ours, theirs)}")
        print(f"  tinygpt cached / HF cached speed: {t_hf / t_cache:.2f}x")
        del hf
    n_unc = min(new, uncached_new)
    plain, t_plain = timed(lambda: run(n_unc, False), 1)
    if n_unc < new:
        _, t_cache_short = timed(lambda: run(n_unc, True), repeat)
        note = f" (cached, same {n_unc} tokens: {n_unc / t_cache_short:.1f} tok/s)"
    else:
        t_cache_short, note = t_cache, ""
    print(f"  tinygpt, no cache  : {n_unc} tokens in {t_plain:7.2f} s = "
          f"{n_unc / t_plain:8.1f} tok/s{note}")
    print(f"  tokens, cache vs no cache: {agreement(ours, plain)}")
    print(f"  speed-up of the cache at {n_unc} new tokens: {t_plain / t_cache_short:.1f}x")

    positions = [t for t in (PROMPT_LEN + 1, 64, 128, 256, 512, PROMPT_LEN + new)
                 if t <= PROMPT_LEN + new]
    print("  one step at position t (median):   t   cached ms   uncached ms   ratio")
    for t, c, u in step_times(model, torch.cat([idx, ours[:, PROMPT_LEN:]], 1)[:, :max(positions)],
                              sorted(set(positions)), repeat=5 if name == "small" else 3):
        print(f"  {'':34}{t:4d} {c * 1e3:11.2f} {u * 1e3:13.2f} {u / c:7.1f}")
    kv_memory(model)


def bench_past_context(repeat: int) -> None:
    """tokens/s past the context: crop_to = T_max - 1, T_max // 2 (default), no cache."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        print(f"torch {torch.__version__}, 1 thread, greedy, batch 1, float32, CPU: "
              f"4 T_max new tokens after a full-context prompt, median of {repeat} runs")
        for T_max in (64, 256):
            config = dataclasses.replace(MODELS["small"], block_size=T_max)
            torch.manual_seed(0)
            model = GPT(config).eval()
            idx = torch.randint(0, config.vocab_size, (1, T_max),
                                generator=torch.Generator().manual_seed(1))
            n = 4 * T_max
            runs = {"crop_to = T_max - 1 (old default)": {"crop_to": T_max - 1},
                    "crop_to = T_max // 2 (default)": {"crop_to": None},
                    "no cache (same schedule)": {"use_cache": False}}
            generate(model, idx, 8, temperature=0)  # warm-up
            times: dict[str, list[float]] = {name: [] for name in runs}
            outs = {}
            for _ in range(repeat):  # alternate, so that a change of load hits all alike
                for name, kwargs in runs.items():
                    start = time.perf_counter()
                    outs[name] = generate(model, idx, n, temperature=0, **kwargs)
                    times[name].append(time.perf_counter() - start)
            print(f"\n[small, T_max={T_max}] L={config.n_layer} C={config.n_embd}: "
                  f"{n} new tokens")
            for name, kwargs in runs.items():
                crop_to = kwargs.get("crop_to") or T_max // 2
                start, rebuilds = 0, 0
                for k in range(T_max, T_max + n):
                    start, rebuilt = context_schedule(k, start, T_max, crop_to)
                    rebuilds += rebuilt
                tps = n / statistics.median(times[name])
                cached = kwargs.get("use_cache", True)
                what = f"{rebuilds} rebuilds" if cached else "a full pass each"
                print(f"  {name:35}: {tps:8.1f} tok/s  ({what})")
            old, new = (statistics.median(times[k]) for k in list(runs)[:2])
            print(f"  default crop_to vs old default: {old / new:.1f}x the tokens/s")
            assert torch.equal(*(outs[k] for k in list(runs)[1:]))  # default == no cache
    finally:
        torch.set_num_threads(previous)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="64 new tokens, one repeat")
    parser.add_argument("--repeat", type=int, default=None, help="timed runs (default 2)")
    parser.add_argument("--new", type=int, default=None, help="new tokens (default 512)")
    parser.add_argument("--uncached-new", type=int, default=None,
                        help="cap on uncached new tokens for gpt2 (default 64)")
    parser.add_argument("--models", default="small,gpt2", help="comma-separated: small,gpt2")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--past-context", action="store_true",
                        help="only the cost past the context: crop_to = T_max - 1 vs the default")
    args = parser.parse_args()
    if args.past_context:
        bench_past_context(args.repeat or 5)
        return
    new = args.new or (64 if args.quick else 512)
    repeat = args.repeat or (1 if args.quick else 2)
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"prompt {PROMPT_LEN} tokens, {new} new tokens, greedy, batch 1, float32, CPU")
    for name in args.models.split(","):
        if name not in MODELS:
            raise SystemExit(f"unknown model {name!r}; choose from {sorted(MODELS)}")
        cap = new if name == "small" else (args.uncached_new or 64)
        bench_model(name, new, cap, repeat)


if __name__ == "__main__":
    main()
