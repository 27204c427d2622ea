"""Sampling: turning a GPT's next-token logits into text, one token at a time.

Chapter 9 builds it; ``tinygpt sample`` and ``tinygpt chat`` call it.

It handles generation from a trained ``tinygpt.model.GPT``: the logits processing
(``apply_temperature``, ``top_k_filter``, ``top_p_filter``, chained by ``process_logits``),
``sample_next`` (greedy at temperature 0, else one seeded draw per row) and ``generate`` (the
batched loop, with or without the key/value cache, with context cropping and stop tokens).
``check_sampling`` is the one check of the sampling settings, also used by the command line.

Crop and rebuild: the positions are absolute (GPT-2's table ``wpe``), so once the context holds
``T_max = block_size`` tokens a sliding window would leave every cached key at a stale position.
``generate`` instead crops the context to its last ``crop_to`` tokens (default ``T_max // 2``)
and rebuilds the cache from them with one forward pass, every ``T_max - crop_to + 1`` tokens.
The uncached path follows the same schedule, so both give the same tokens.

Portable sampling: ``PCG32`` is O'Neill's pcg32 generator (XSH RR, 64-bit state), seeded as the
reference ``pcg32_srandom(seed, 54)``, ``uniform()`` = ``next() / 2**32``; ``choose_token`` picks
one id from a row of logits in plain float64: temperature 0 is the argmax (lowest id on ties);
otherwise the logits minus their maximum, over the temperature, sorted likeliest first (ties:
lower id first), cut to the ``top_k`` first, then to the smallest prefix whose probability reaches
``top_p`` (kept while the mass before is below ``p``), and ``u * total`` walks that prefix. The
page's engine (book/_static/tinygpt/engine.js) does the same steps, so ``generate(...,
rng=PCG32(seed))`` writes the page's text for that seed; without ``rng``, ``torch.multinomial``.

A row that emits a stop id is finished and padded with that id; generation ends once every row
is finished. It does not tokenize text, load checkpoints, or do beam search or penalties.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch
from torch import Tensor

from tinygpt.checks import (
    ArgumentValueError,
    check_float,
    check_instance,
    check_int,
    check_token_ids,
)
from tinygpt.model import GPT

__all__ = [
    "PCG32",
    "apply_temperature",
    "check_sampling",
    "choose_token",
    "context_schedule",
    "generate",
    "process_logits",
    "sample_next",
    "top_k_filter",
    "top_p_filter",
]


# --- checking arguments --------------------------------------------------------------------------

def check_sampling(logits: object = None, temperature: object = 1.0, top_k: object = None,
                   top_p: object = None, *, vocab_size: int | None = None,
                   greedy: bool = True, rows: bool = False) -> float:
    """Check the sampling settings (and ``logits``, if given); return the temperature as a float.

    ``top_k`` is at most ``vocab_size`` (default: the logits' ``V``); ``greedy=False`` refuses
    temperature 0; ``rows=True`` requires logits of shape ``(B, V)``. ``TypeError`` for a wrong
    type, ``ValueError`` for a wrong value. Each sampling function below calls it in its first
    line, on its own arguments (shapes and numbers only: it reads no tensor's values).
    """
    if logits is not None:
        if not isinstance(logits, Tensor) or not logits.is_floating_point():
            what = logits.dtype if isinstance(logits, Tensor) else type(logits).__name__
            raise TypeError(f"logits must be a floating-point torch.Tensor of shape (..., V), "
                            f"got {what}")
        if logits.ndim < 1 or logits.shape[-1] < 1:
            raise ValueError(f"logits must have shape (..., V) with V >= 1, got "
                             f"{tuple(logits.shape)}")
        if rows and logits.ndim != 2:
            raise ValueError(f"logits must have shape (B, V), got {tuple(logits.shape)}")
        vocab_size = logits.shape[-1] if vocab_size is None else vocab_size
    try:
        temperature = check_float(temperature, "temperature", 0.0, math.inf)
    except ValueError as err:
        raise ArgumentValueError(f"{err} (0 means greedy decoding)", "temperature") from None
    if temperature == 0 and not greedy:
        raise ArgumentValueError("temperature must be > 0 here; temperature 0 means greedy "
                                 "decoding (argmax), see sample_next", "temperature")
    if top_k is not None:
        check_int(top_k, "top_k", 1, vocab_size)
    if top_p is not None:
        check_float(top_p, "top_p", 0.0, 1.0, low_open=True)
    return temperature


# --- logits processing ---------------------------------------------------------------------------

def apply_temperature(logits: Tensor, temperature: float) -> Tensor:
    """``logits / temperature`` (``temperature > 0``): below 1 sharpens, above 1 flattens.

    As ``temperature -> 0`` all the mass goes to the largest logit (greedy, which
    ``sample_next`` handles); ``temperature = 1`` leaves the distribution unchanged.
    """
    check_sampling(logits, temperature, greedy=False)  # a clear error for a bad argument
    return logits / temperature


def top_k_filter(logits: Tensor, k: int) -> Tensor:
    """Keep the ``k`` largest logits of each row (ties: as ``torch.topk``), the others -> -inf."""
    check_sampling(logits, top_k=k)  # a clear error for a bad argument
    values, indices = torch.topk(logits, k, dim=-1)  # (..., k)
    out = torch.full_like(logits, float("-inf"))
    return out.scatter(-1, indices, values)  # (..., V)


def top_p_filter(logits: Tensor, p: float) -> Tensor:
    """Nucleus filtering: keep the smallest set of tokens whose probability reaches ``p``.

    A token is kept when the mass of the likelier tokens before it is still below ``p``, so the
    most likely token is always kept (``p = 1`` keeps everything).
    """
    check_sampling(logits, top_p=p)  # a clear error for a bad argument
    probs = torch.softmax(logits, dim=-1)  # (..., V)
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True)  # (..., V)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs  # (..., V)
    keep_sorted = mass_before < p  # (..., V)
    keep_sorted[..., 0] = True  # the most likely token, even if a tiny p rounds to 0 in float32
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)  # back to id order
    return logits.masked_fill(~keep, float("-inf"))


def process_logits(logits: Tensor, temperature: float = 1.0, top_k: int | None = None,
                   top_p: float | None = None) -> Tensor:
    """Temperature -> top-k -> top-p, in that order; removed tokens get ``-inf``.

    ``temperature`` must be > 0 here (greedy decoding has nothing to process).
    """
    check_sampling(logits, temperature, top_k, top_p, greedy=False)  # a clear error if bad
    logits = apply_temperature(logits, temperature)
    if top_k is not None:
        logits = top_k_filter(logits, top_k)
    if top_p is not None:
        logits = top_p_filter(logits, top_p)
    return logits


def sample_next(logits: Tensor, temperature: float = 1.0, top_k: int | None = None,
                top_p: float | None = None, generator: torch.Generator | None = None) -> Tensor:
    """One next-token id per row of ``logits`` ``(B, V)``: returns ``(B,)`` int64.

    Temperature 0: the argmax (ties -> the lowest id). Otherwise one draw per row from
    ``softmax(process_logits(...))``; a seeded ``generator`` makes it reproducible.
    """
    check_sampling(logits, temperature, top_k, top_p, rows=True)  # a clear error if bad
    if temperature == 0:
        return logits.argmax(dim=-1)  # (B,): the first maximum, so ties go to the lowest id
    if logits.dtype not in (torch.float32, torch.float64):
        logits = logits.float()  # multinomial needs single or double precision
    if temperature < 1e-3:  # logits / temperature could overflow to inf (inf - inf = nan):
        # softmax ignores a shift, and with the largest logit at 0 the division cannot overflow;
        # a temperature the dtype rounds to 0 becomes its smallest normal number (both ~greedy)
        logits = logits - logits.amax(dim=-1, keepdim=True)  # (B, V)
        temperature = max(temperature, torch.finfo(logits.dtype).tiny)
    probs = torch.softmax(process_logits(logits, temperature, top_k, top_p), dim=-1)  # (B, V)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)  # (B,)


# --- portable sampling: the page's generator and sampler ----------------------------------------
_MASK64 = (1 << 64) - 1
_MULT = 6364136223846793005  # the LCG multiplier of PCG's reference code
_DEFAULT_SEQUENCE = 54  # the stream of pcg32-demo, the reference's example


class PCG32:
    """PCG32 (XSH RR): 32-bit outputs from a 64-bit linear congruential state."""

    def __init__(self, seed: int, sequence: int = _DEFAULT_SEQUENCE) -> None:
        check_int(seed, "seed", 0, _MASK64)
        check_int(sequence, "sequence", 0, _MASK64 >> 1)
        self.state = 0
        self.inc = ((sequence << 1) | 1) & _MASK64
        self.next()
        self.state = (self.state + seed) & _MASK64
        self.next()

    def next(self) -> int:
        """The next 32-bit output, in ``[0, 2**32)``."""
        old = self.state
        self.state = (old * _MULT + self.inc) & _MASK64
        xorshifted = (((old >> 18) ^ old) >> 27) & 0xFFFFFFFF
        rot = old >> 59
        return ((xorshifted >> rot) | (xorshifted << ((32 - rot) & 31))) & 0xFFFFFFFF

    def uniform(self) -> float:
        """A float in ``[0, 1)``: ``next() / 2**32``."""
        return self.next() / 4294967296


def _sum(values: list[float]) -> float:
    """Left to right, as the page adds (Python 3.12's ``sum`` compensates, the page does not)."""
    total = 0.0
    for v in values:
        total += v
    return total


def choose_token(logits: Sequence[float], temperature: float, top_k: int | None,
                 top_p: float | None, rng: PCG32) -> int:
    """One id from ``logits`` (``V`` floats), in float64 (see "Portable sampling" in the module
    docstring): what the page's engine picks with the same ``rng`` state."""
    check_instance(rng, PCG32, "rng")
    V = len(logits)
    check_float(temperature, "temperature", 0.0, math.inf)
    if top_k is not None:
        check_int(top_k, "top_k", 1, V)
    if top_p is not None:
        check_float(top_p, "top_p", 0.0, 1.0, low_open=True)
    values = [float(x) for x in logits]
    if temperature == 0:
        return max(range(V), key=lambda i: (values[i], -i))  # the first maximum
    top = max(values)
    z = [(x - top) / temperature for x in values]  # float64, the largest at 0
    order = sorted(range(V), key=lambda i: (-z[i], i))  # likeliest first, ties by id
    kept = order[:top_k] if top_k is not None else order
    probs = [math.exp(z[i]) for i in kept]
    total = _sum(probs)
    if top_p is not None:
        before, n = 0.0, 0
        while n < len(kept) and (n == 0 or before / total < top_p):
            before += probs[n]
            n += 1
        kept, probs = kept[:n], probs[:n]
        total = _sum(probs)
    u = rng.uniform() * total
    cum = 0.0
    for token, p in zip(kept, probs, strict=True):
        cum += p
        if u < cum:
            return token
    return kept[-1]  # u rounded up to the total


# --- generation ----------------------------------------------------------------------------------

def context_schedule(n_tokens: int, start: int, block_size: int, crop_to: int) -> tuple[int, bool]:
    """Where the context starts for predicting the token after ``n_tokens`` tokens.

    ``start`` is where it started for the previous prediction. The context ``[start, n_tokens)``
    stays while it fits in ``block_size``; then it is cropped to its last ``crop_to`` tokens.
    Returns ``(new_start, rebuilt)``: ``rebuilt`` says a key/value cache must be rebuilt.
    """
    if n_tokens - start <= block_size:
        return start, False
    return n_tokens - crop_to, True


def _check_generate_args(model: GPT, idx: Tensor, max_new_tokens: int, crop_to: int | None,
                         stop: int | Iterable[int] | None) -> Tensor:
    """Check ``generate``'s model, prompt, length and cropping; return the stop ids as a tensor."""
    check_instance(model, GPT, "model")
    V, T_max = model.config.vocab_size, model.config.block_size
    if isinstance(idx, Tensor) and idx.ndim == 2 and idx.shape[1] == 0:
        raise ValueError("the prompt is empty (T=0): give at least one token id per row")
    check_token_ids(idx, V)  # tensor, integer dtype, (B, T), ids in [0, V)
    if idx.shape[0] == 0:
        raise ValueError("the batch is empty (B=0): give at least one prompt")
    check_int(max_new_tokens, "max_new_tokens", 0)
    if crop_to is not None:  # keeping T_max tokens would leave no room for the next one
        check_int(crop_to, f"crop_to (tokens kept when the context of T_max={T_max} is full)",
                  1, max(T_max - 1, 1))
    stops = [] if stop is None else [stop] if isinstance(stop, int) else list(stop)
    for s in stops:
        check_int(s, "a stop id", 0, V - 1)
    return torch.tensor(stops, dtype=torch.long, device=idx.device)


def generate(
    model: GPT, idx: Tensor, max_new_tokens: int, temperature: float = 1.0,
    top_k: int | None = None, top_p: float | None = None, use_cache: bool = True,
    generator: torch.Generator | None = None, stop: int | Iterable[int] | None = None,
    crop_to: int | None = None, rng: PCG32 | None = None,
) -> Tensor:
    """Continue each prompt row of ``idx`` ``(B, T)`` by up to ``max_new_tokens`` tokens.

    Returns ``(B, T + n)`` int64 ids, prompt included; ``n < max_new_tokens`` only if every row
    hit a ``stop`` id (a finished row is padded with it). ``temperature``, ``top_k``, ``top_p``,
    ``generator``: as in ``sample_next``. ``use_cache``: through a ``KVCache`` (fast) or not
    (slow), same tokens. ``crop_to``: tokens kept when the context is full (default
    ``block_size // 2``; see the module docstring). ``rng``: a ``PCG32`` picks each token with
    ``choose_token`` (above) (float64, the page's sampler) instead of
    ``torch.multinomial``. Runs in eval mode, without gradients.
    """
    stops = _check_generate_args(model, idx, max_new_tokens, crop_to, stop)
    if rng is not None:
        check_instance(rng, PCG32, "rng")
        if generator is not None:
            raise ValueError("give a torch generator or a PCG32 rng, not both")
    B, T = idx.shape
    V, T_max = model.config.vocab_size, model.config.block_size
    temperature = check_sampling(temperature=temperature, top_k=top_k, top_p=top_p, vocab_size=V)
    crop_to = max(T_max // 2, 1) if crop_to is None else crop_to  # a rebuild every ~T_max / 2
    out = torch.empty(B, T + max_new_tokens, dtype=torch.long, device=idx.device)
    out[:, :T] = idx
    n = T  # tokens so far
    start = max(0, T - T_max)  # the prompt itself is cropped to its last T_max tokens
    caches = model.new_caches(B, device=idx.device) if use_cache else None
    fed = 0  # tokens of the current context already in the cache
    finished = torch.zeros(B, dtype=torch.bool, device=idx.device)
    last = torch.zeros(B, dtype=torch.long, device=idx.device)  # the stop id each row emitted
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for _ in range(max_new_tokens):
                start, rebuilt = context_schedule(n, start, T_max, crop_to)
                if caches is None:
                    logits = model(out[:, start:n], last_only=True)  # (B, 1, V): the last position
                else:
                    if rebuilt:  # the context was cropped: the cache starts again
                        for cache in caches:
                            cache.reset()
                        fed = 0
                    new = out[:, start + fed:n]  # (B, T_new): what the cache has not seen
                    logits = model(new, caches=caches, last_only=True)  # (B, 1, V)
                    fed = n - start
                if rng is None:
                    token = sample_next(logits[:, -1, :], temperature, top_k, top_p,
                                        generator)  # (B,)
                else:  # the portable sampler, one row at a time in float64
                    rows = logits[:, -1, :].double().tolist()  # B lists of V floats
                    token = torch.tensor([choose_token(r, temperature, top_k, top_p, rng)
                                          for r in rows], device=idx.device)  # (B,)
                token = torch.where(finished, last, token)  # finished rows repeat their stop
                out[:, n] = token
                n += 1
                if stops.numel():
                    hit = torch.isin(token, stops) & ~finished
                    last = torch.where(hit, token, last)
                    finished |= hit
                    if bool(finished.all()):
                        break
    finally:
        model.train(was_training)
    return out[:, :n]
