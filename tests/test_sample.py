"""Tests for tinygpt.sample: logits processing against numpy references, greedy and seeded
sampling, cached against uncached generation (also past the context length), stop tokens and
the argument checks."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import count_calls
from conftest import run_cli as run
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import tinygpt.sample as sample_module
from tinygpt.config import GPTConfig
from tinygpt.model import GPT
from tinygpt.sample import (
    apply_temperature,
    context_schedule,
    generate,
    process_logits,
    sample_next,
    top_k_filter,
    top_p_filter,
)

ROOT = Path(__file__).resolve().parents[1]
TINY = GPTConfig(vocab_size=23, block_size=12, n_layer=2, n_head=2, n_embd=16)


def tiny_model(config: GPTConfig = TINY, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    model = GPT(config)
    with torch.no_grad():  # larger weights than GPT-2's init: sharper, more varied logits
        for p in model.parameters():
            p.mul_(8.0)
    return model


def prompt(B: int, T: int, V: int = TINY.vocab_size, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))


# Greedy runs computed two ways (cached and uncached, one token or the whole sequence at a time)
# round differently in the last bits, and so do different CPUs' kernels; the chosen tokens are
# equal only if no choice is a near-tie. The tests below check that every argmax they compare
# wins by at least MARGIN -- a hundred times the float32 rounding of logits of size ~20 -- so token
# equality holds on any machine, and a kernel that changed a choice would have to be wrong.
MARGIN = 1e-3


def top2_gap(logits: torch.Tensor) -> float:
    """The smallest gap, over all rows, between the largest and the second-largest logit."""
    top = logits.topk(2, dim=-1).values  # (..., 2)
    return float((top[..., 0] - top[..., 1]).min())


def greedy_reference(model: GPT, idx: torch.Tensor, n: int, crop_to: int,
                     gaps: list[float] | None = None) -> torch.Tensor:
    """The textbook loop, written independently: full forward on the context each step.

    ``gaps``, when given, collects each step's smallest top-2 logit gap (see ``MARGIN``).
    """
    T_max = model.config.block_size
    seq = idx.clone()
    start = max(0, idx.shape[1] - T_max)
    with torch.no_grad():
        for _ in range(n):
            if seq.shape[1] - start > T_max:
                start = seq.shape[1] - crop_to
            logits = model(seq[:, start:])[:, -1]  # (B, V)
            if gaps is not None:
                gaps.append(top2_gap(logits))
            seq = torch.cat([seq, logits.argmax(-1, keepdim=True)], dim=1)
    return seq


# --- logits processing ---------------------------------------------------------------------------

row_logits = arrays(np.float64, st.integers(2, 30),
                    elements=st.floats(-10, 10, allow_nan=False, allow_infinity=False))


def test_temperature_scales_and_softmax_sharpens():
    z = torch.tensor([[1.0, 2.0, 4.0]])
    assert torch.allclose(apply_temperature(z, 0.5), z * 2)
    p_cold = torch.softmax(apply_temperature(z, 0.5), -1)[0, -1]
    p_hot = torch.softmax(apply_temperature(z, 2.0), -1)[0, -1]
    assert p_cold > torch.softmax(z, -1)[0, -1] > p_hot


@settings(max_examples=60, deadline=None)
@given(row_logits, st.data())
def test_top_k_keeps_exactly_the_k_largest(z, data):
    k = data.draw(st.integers(1, len(z)))
    out = top_k_filter(torch.tensor(z)[None], k)[0].numpy()
    kept = np.isfinite(out)
    assert kept.sum() == k
    assert np.array_equal(out[kept], z[kept])  # kept logits are unchanged
    if k < len(z):
        assert z[kept].min() >= z[~kept].max()  # nothing dropped beats anything kept


@settings(max_examples=80, deadline=None)
@given(row_logits, st.floats(0.01, 1.0))
def test_top_p_keeps_the_smallest_set_reaching_p(z, p):
    probs = np.exp(z - z.max())
    probs /= probs.sum()
    sorted_p = np.sort(probs)[::-1]
    cum = np.cumsum(sorted_p)
    assume(np.all(np.abs(cum - p) > 1e-9))  # no boundary decided by rounding
    n_ref = int(np.searchsorted(cum, p) + 1) if p < cum[-1] else len(z)  # smallest n: cum >= p
    n_ref = min(n_ref, len(z))
    out = top_p_filter(torch.tensor(z)[None], p)[0].numpy()
    kept = np.isfinite(out)
    assert kept.sum() == n_ref
    assert np.isclose(probs[kept].sum(), cum[n_ref - 1])
    if n_ref < len(z):
        assert probs[kept].min() >= probs[~kept].max()
        assert probs[kept].sum() >= p > probs[kept].sum() - probs[kept].min()  # minimal
    assert np.array_equal(out[kept], z[kept])


@pytest.mark.parametrize("p,n_kept", [(0.25, 1), (0.5, 2), (0.75, 3), (0.76, 4), (1.0, 4)])
def test_top_p_stops_as_soon_as_the_mass_reaches_p(p, n_kept):
    # four equal logits: probabilities 1/4 each, cumulative sums exact in binary
    kept = torch.isfinite(top_p_filter(torch.zeros(1, 4), p))
    assert int(kept.sum()) == n_kept


def test_top_p_one_keeps_all_and_tiny_p_keeps_the_argmax():
    z = torch.tensor([[0.3, 2.0, -1.0, 1.9]])
    assert torch.isfinite(top_p_filter(z, 1.0)).all()
    assert torch.isfinite(top_p_filter(z, 1e-6)).tolist() == [[False, True, False, False]]


def test_process_logits_order_temperature_then_top_k_then_top_p():
    z = torch.tensor([[0.0, 1.0, 2.0, 3.0]])
    # temperature 0.25 gives token 3 ~98% of the mass, so top-p 0.9 keeps it alone
    out = process_logits(z, temperature=0.25, top_k=3, top_p=0.9)
    assert torch.isfinite(out).tolist() == [[False, False, False, True]]
    # top-p sees the distribution renormalised over the top k: over all 4 tokens the two best
    # hold 0.881 < 0.9 (three needed), over the top 3 they hold 0.910 >= 0.9 (two suffice)
    full = np.exp(np.arange(4.0)) / np.exp(np.arange(4.0)).sum()
    top3 = full[1:] / full[1:].sum()
    assert full[2:].sum() < 0.9 <= top3[1:].sum()
    out = process_logits(z, temperature=1.0, top_k=3, top_p=0.9)
    assert torch.isfinite(out).tolist() == [[False, False, True, True]]
    assert torch.isfinite(top_p_filter(z, 0.9)).tolist() == [[False, True, True, True]]


@settings(max_examples=30, deadline=None)
@given(row_logits, st.data())
def test_sampling_with_top_k_never_leaves_the_top_k(z, data):
    k = data.draw(st.integers(1, len(z)))
    seed = data.draw(st.integers(0, 2**31))
    logits = torch.tensor(z)[None].expand(64, -1)  # 64 draws at once
    ids = sample_next(logits, 1.5, top_k=k, generator=torch.Generator().manual_seed(seed))
    kth = np.sort(z)[::-1][k - 1]
    assert (z[ids.numpy()] >= kth).all()


def test_temperature_zero_is_argmax_with_ties_to_the_lowest_id():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(50, 40, generator=g)
    assert torch.equal(sample_next(z, 0.0), torch.from_numpy(np.argmax(z.numpy(), axis=1)))
    tie = torch.tensor([[1.0, 5.0, 5.0, 0.0], [7.0, 7.0, 7.0, 7.0]])
    assert sample_next(tie, 0).tolist() == [1, 0]


def test_sampling_frequencies_match_the_softmax():
    z = torch.tensor([0.0, 1.0, 2.0])
    ids = sample_next(z[None].expand(20000, -1), 1.0, generator=torch.Generator().manual_seed(3))
    freq = torch.bincount(ids, minlength=3).double() / ids.numel()
    assert torch.allclose(freq, torch.softmax(z.double(), -1), atol=0.015)


# --- generation ----------------------------------------------------------------------------------

def test_context_schedule_crops_to_the_last_crop_to_tokens_once_full():
    assert context_schedule(10, 0, 12, 11) == (0, False)
    assert context_schedule(12, 0, 12, 11) == (0, False)
    assert context_schedule(13, 0, 12, 11) == (2, True)  # 11 tokens kept: 2..12
    assert context_schedule(13, 2, 12, 11) == (2, False)


@pytest.mark.parametrize("crop_to", [None, 4])
def test_cached_and_uncached_greedy_agree_past_the_context_length(crop_to):
    model = tiny_model()
    idx = prompt(3, 5)
    n = 2 * TINY.block_size + 3  # well past T_max = 12: several crops and rebuilds
    cached = generate(model, idx, n, temperature=0, use_cache=True, crop_to=crop_to)
    uncached = generate(model, idx, n, temperature=0, use_cache=False, crop_to=crop_to)
    assert cached.shape == (3, 5 + n)
    assert torch.equal(cached[:, :5], idx)
    gaps: list[float] = []
    reference = greedy_reference(model, idx, n, crop_to or TINY.block_size // 2, gaps)
    assert min(gaps) > MARGIN  # no near-tie: the token-for-token comparisons hold on any CPU
    assert torch.equal(cached, uncached)
    assert torch.equal(cached, reference)
    assert len(set(cached[0, 5:].tolist())) > 1  # not a degenerate constant output


def test_within_the_context_generation_equals_full_forward_argmax():
    model = tiny_model(seed=4)
    idx = prompt(2, 3, seed=5)
    out = generate(model, idx, TINY.block_size - 3, temperature=0)
    with torch.no_grad():
        logits = model(out[:, :-1])  # one pass over the whole sequence, T = T_max - 1
    assert top2_gap(logits[:, 2:]) > MARGIN  # no near-tie (see MARGIN)
    assert torch.equal(out[:, 3:], logits[:, 2:].argmax(-1))


def test_a_prompt_longer_than_the_context_is_cropped():
    model = tiny_model()
    idx = prompt(1, 20)  # T = 20 > T_max = 12
    out = generate(model, idx, 5, temperature=0)
    assert torch.equal(out[:, :20], idx)
    gaps: list[float] = []
    assert torch.equal(out, greedy_reference(model, idx, 5, TINY.block_size // 2, gaps))
    assert min(gaps) > MARGIN  # no near-tie (see MARGIN)


def test_seeded_sampling_is_reproducible_and_cache_independent():
    # float64: the cached and uncached paths round differently, by ~1e-16 here (~1e-7 in float32,
    # where a draw landing between the two paths' probabilities on some CPU's kernels is rare
    # but possible); comparing their samples draw for draw is then safe on any machine.
    model = tiny_model().double()
    idx = prompt(2, 4)
    runs = [generate(model, idx, 20, temperature=1.3, top_k=10, top_p=0.95, use_cache=c,
                     generator=torch.Generator().manual_seed(42)) for c in (True, True, False)]
    assert torch.equal(runs[0], runs[1]) and torch.equal(runs[0], runs[2])
    other = generate(model, idx, 20, temperature=1.3, generator=torch.Generator().manual_seed(7))
    assert not torch.equal(runs[0], other)


def chapter_9_loop():
    """``generate_loop``, the generation loop chapter 9 writes on the page, taken from the
    notebook's code cell: the page's own code, run here without running the chapter."""
    notebook = json.loads((ROOT / "chapters" / "09_sampling.ipynb").read_text(encoding="utf-8"))
    [code] = ["".join(c["source"]) for c in notebook["cells"]
              if c["cell_type"] == "code" and "def generate_loop(" in "".join(c["source"])]
    namespace: dict = {"torch": torch}
    exec(code, namespace)  # defines generate_loop, nothing else
    return namespace["generate_loop"]


@pytest.mark.parametrize("use_cache", [False, True])
def test_chapter_9s_loop_is_generate_on_the_greedy_path(use_cache):
    generate_loop = chapter_9_loop()
    model = tiny_model(seed=6).eval()
    idx = prompt(2, 3, seed=7)
    n = TINY.block_size - 3  # the text fits in the window
    ours = generate_loop(model, idx, n, temperature=0)
    with torch.no_grad():
        assert top2_gap(model(ours[:, :-1])[:, 2:]) > MARGIN  # no near-tie (see MARGIN)
    assert torch.equal(ours, generate(model, idx, n, temperature=0, use_cache=use_cache))


@pytest.mark.parametrize("use_cache", [False, True])
def test_chapter_9s_loop_is_generate_on_the_seeded_path(use_cache):
    generate_loop = chapter_9_loop()
    model = tiny_model(seed=8).double().eval()  # float64: see the test above
    idx = prompt(3, 2, seed=9)
    n = TINY.block_size - 2
    for temperature, top_k in [(3.0, 3), (1.3, 10), (0.7, None)]:  # a hot top-3: its cut matters
        ours = generate_loop(model, idx, n, temperature, top_k,
                             generator=torch.Generator().manual_seed(11))
        theirs = generate(model, idx, n, temperature=temperature, top_k=top_k,
                          use_cache=use_cache, generator=torch.Generator().manual_seed(11))
        assert torch.equal(ours, theirs), (temperature, top_k)
        other = generate_loop(model, idx, n, temperature, top_k,
                              generator=torch.Generator().manual_seed(12))
        assert not torch.equal(ours, other)  # the draws do depend on the generator


def test_generate_restores_training_mode_and_needs_no_grad():
    model = tiny_model().train()
    out = generate(model, prompt(1, 2), 3)
    assert model.training and not out.requires_grad


def test_zero_new_tokens_returns_the_prompt():
    idx = prompt(2, 3)
    assert torch.equal(generate(tiny_model(), idx, 0), idx)


def test_stop_token_ends_rows_and_pads_finished_ones():
    model = tiny_model()
    idx = prompt(3, 4)
    free = generate(model, idx, 20, temperature=0)
    stop = int(free[0, 6])  # row 0 emits this as its 3rd new token
    out = generate(model, idx, 20, temperature=0, stop=stop)
    for row, full in zip(out, free):
        hits = (full[4:] == stop).nonzero()
        if len(hits):  # the row matches the free run up to its stop, then repeats the stop id
            first = 4 + int(hits[0])
            assert torch.equal(row[:first + 1], full[:first + 1])
            assert (row[first:] == stop).all()
        else:
            assert torch.equal(row, full[:len(row)])
    rows_stop = [(full[4:] == stop).any() for full in free]
    if all(rows_stop):  # all rows finished: generation ended at the last one's stop
        last = max(4 + int((full[4:] == stop).nonzero()[0]) for full in free)
        assert out.shape[1] == last + 1
    else:
        assert out.shape[1] == 24


def test_stop_set_with_a_single_row_ends_early():
    model = tiny_model()
    idx = prompt(1, 4)
    free = generate(model, idx, 10, temperature=0)
    out = generate(model, idx, 10, temperature=0, stop={int(free[0, 5]), 22})
    first = 4 + int((free[0, 4:] == free[0, 5]).nonzero()[0])
    assert torch.equal(out, free[:, :first + 1])


@pytest.mark.parametrize("kwargs,error,match", [
    ({"temperature": -0.1}, ValueError, "temperature"),
    ({"temperature": float("nan")}, ValueError, "temperature"),
    ({"top_k": 0}, ValueError, r"top_k must be an integer in \[1, 23\]"),
    ({"top_k": 24}, ValueError, r"top_k must be an integer in \[1, 23\]"),
    ({"top_p": 0.0}, ValueError, r"top_p must be in \(0, 1\]"),
    ({"top_p": 1.5}, ValueError, r"top_p must be in \(0, 1\]"),
    ({"max_new_tokens": -1}, ValueError, "max_new_tokens must be an integer >= 0"),
    ({"max_new_tokens": 2.5}, TypeError, "max_new_tokens"),
    ({"stop": 23}, ValueError, r"a stop id must be an integer in \[0, 22\]"),
    ({"crop_to": 12}, ValueError, r"crop_to .* \[1, 11\]"),
])
def test_bad_arguments_raise_clear_errors(kwargs, error, match):
    args = {"max_new_tokens": 3, **kwargs}
    with pytest.raises(error, match=match):
        generate(tiny_model(), prompt(1, 3), **args)


@pytest.mark.parametrize("idx,error,match", [
    (torch.zeros(1, 0, dtype=torch.long), ValueError, "empty"),
    (torch.tensor([[1, 23]]), ValueError, "outside the vocabulary"),
    (torch.tensor([[1, -1]]), ValueError, "outside the vocabulary"),
    (torch.tensor([[1.0, 2.0]]), TypeError, "integer"),
    (torch.tensor([1, 2]), ValueError, r"shape \(B, T\)"),
    ([[1, 2]], TypeError, "torch.Tensor"),
])
def test_bad_prompts_raise_clear_errors(idx, error, match):
    with pytest.raises(error, match=match):
        generate(tiny_model(), idx, 3)


def test_bad_logits_and_temperature_for_the_processing_functions():
    with pytest.raises(ValueError, match="greedy"):
        apply_temperature(torch.zeros(1, 3), 0.0)
    with pytest.raises(TypeError, match="floating-point"):
        top_k_filter(torch.zeros(1, 3, dtype=torch.long), 1)
    with pytest.raises(ValueError, match=r"\(B, V\)"):
        sample_next(torch.zeros(3), 1.0)


def test_generate_checks_each_forward_and_each_sampling_call_exactly_once(monkeypatch):
    """No switch skips a check inside ``generate``: the prompt and the settings are checked once
    at the door, every forward of the model checks its ids once, and every sampling function
    called checks its own arguments once (sample_next, process_logits and the three filters:
    five cheap checks of shapes and numbers per token), none of them twice."""
    import tinygpt.model
    import tinygpt.sample

    functions = ["sample_next", "process_logits", "apply_temperature", "top_k_filter",
                 "top_p_filter"]
    calls = count_calls(monkeypatch, [(tinygpt.sample, "check_sampling"),
                                      (tinygpt.sample, "check_token_ids"),
                                      (tinygpt.model, "check_token_ids"),
                                      *[(tinygpt.sample, name) for name in functions]])
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8))
    for use_cache in (True, False):
        calls.clear()
        out = tinygpt.sample.generate(model, torch.zeros(1, 3, dtype=torch.long), 12,
                                      temperature=0.8, top_k=5, top_p=0.9, use_cache=use_cache,
                                      generator=torch.Generator().manual_seed(1))
        assert out.shape == (1, 15)
        assert calls[:2] == ["sample.check_token_ids", "sample.check_sampling"], calls[:2]
        assert calls.count("sample.check_token_ids") == 1  # the prompt, at the door
        assert calls.count("model.check_token_ids") == 12  # one forward per new token
        for name in functions:
            assert calls.count(f"sample.{name}") == 12, name  # each once per token
        # generate's own check, then one per sampling function called
        assert calls.count("sample.check_sampling") == 1 + 12 * len(functions)
    with pytest.raises(ValueError, match="top_k"):  # and the check still happens
        tinygpt.sample.generate(model, torch.zeros(1, 3, dtype=torch.long), 2, top_k=99)


def count_rebuilds(monkeypatch, model: GPT, n: int,
                   crop_to: int | None) -> tuple[int, torch.Tensor]:
    real, rebuilds = sample_module.context_schedule, []

    def counting(*args):
        start, rebuilt = real(*args)
        rebuilds.append(rebuilt)
        return start, rebuilt

    monkeypatch.setattr(sample_module, "context_schedule", counting)
    idx = torch.zeros(1, 1, dtype=torch.long)
    out = generate(model, idx, n, temperature=0, crop_to=crop_to)
    monkeypatch.setattr(sample_module, "context_schedule", real)
    return sum(rebuilds), out


def test_the_default_crop_to_rebuilds_every_half_context(monkeypatch):
    torch.manual_seed(0)
    T_max = 16
    model = GPT(GPTConfig(vocab_size=11, block_size=T_max, n_layer=1, n_head=2, n_embd=8)).eval()
    period = T_max - T_max // 2 + 1  # tokens between rebuilds with crop_to = T_max // 2: 9
    n = T_max + 9 * period  # a 1-token prompt: the context is full after T_max - 1 new tokens
    default, out_default = count_rebuilds(monkeypatch, model, n, None)
    _, out_half = count_rebuilds(monkeypatch, model, n, T_max // 2)
    old, _ = count_rebuilds(monkeypatch, model, n, T_max - 1)
    assert torch.equal(out_default, out_half)  # the default is crop_to = block_size // 2
    assert default == 9  # at n = 17, 26, ..., 89 tokens: one per period past the context
    assert old == len(range(T_max + 1, n + 1, 2)) == 41  # crop_to = T_max - 1: every other token


# --- tiny temperatures and top-p, from the command line too --------------------------------------

def test_sample_temperature_1e_300_is_greedy_not_a_traceback(capsys, cli_checkpoint):
    code, tiny, err = run(capsys, "sample", "--out", cli_checkpoint, "--temperature", "1e-300",
                          "--max-new-tokens", "20", "--prompt", "the")
    assert code == 0, err
    code, greedy, err = run(capsys, "sample", "--out", cli_checkpoint, "--temperature", "0",
                            "--max-new-tokens", "20", "--prompt", "the")
    assert code == 0 and tiny == greedy
    logits = torch.randn(8, 50, generator=torch.Generator().manual_seed(0))
    assert torch.equal(sample_next(logits, 1e-300), logits.argmax(-1))


def test_sample_top_p_1e_300_keeps_the_most_likely_token(capsys, cli_checkpoint):
    logits = torch.randn(8, 50, generator=torch.Generator().manual_seed(0))
    kept = torch.isfinite(top_p_filter(logits, 1e-300))  # (8, 50)
    assert kept.sum(-1).tolist() == [1] * 8
    assert torch.equal(kept.float().argmax(-1), logits.argmax(-1))
    code, out, err = run(capsys, "sample", "--out", cli_checkpoint, "--top-p", "1e-300",
                         "--max-new-tokens", "20", "--prompt", "the")
    assert code == 0, err
    code, greedy, err = run(capsys, "sample", "--out", cli_checkpoint, "--temperature", "0",
                            "--max-new-tokens", "20", "--prompt", "the")
    assert out == greedy
