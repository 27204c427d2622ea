"""Sampling: turning a GPT's next-token logits into text, one token at a time.

It handles generation from a trained ``tinygpt.model.GPT``:

* the logits processing, one small function per step so each can be shown and tested:
  ``apply_temperature`` (divide by ``tau``), ``top_k_filter`` (keep the ``k`` largest),
  ``top_p_filter`` (keep the smallest set of tokens whose probability reaches ``p``), and
  ``process_logits``, which chains them in that order: temperature -> top-k -> top-p;
* ``sample_next``: one token per row from ``(B, V)`` logits -- the argmax when the temperature is
  0 (greedy; ties go to the lowest id), else a draw with ``torch.multinomial`` from the processed
  distribution, reproducible with a seeded ``torch.Generator``;
* ``generate``: the autoregressive loop, batched, with or without the key/value cache, with
  context cropping and stop tokens.

Context cropping ("crop and rebuild"). The model accepts at most ``T_max = block_size``
positions, and its positions are *absolute* (GPT-2's learned table ``wpe``). Once the context is
full, the oldest tokens must go. A sliding window over the cache would not work: every cached
key was computed with the position it had when it entered; dropping the first token shifts every
other token's position by one, so all cached keys and values are stale. Instead, when the
context is full, ``generate`` keeps the last ``keep`` tokens (default ``T_max // 2``) and
rebuilds the cache from them with one full forward pass. The uncached path follows the *same*
schedule (it feeds exactly the tokens the cache would hold), so with and without the cache give
the same tokens, also past the context length; they differ only in cost. A rebuild happens every
``T_max - keep + 1`` tokens: ``keep = T_max - 1`` would rebuild (a full forward pass) every
other token and lose most of the cache's gain; the default keeps half the context, so a rebuild
comes every ``T_max // 2`` tokens or so, at the price of a shorter context right after it.

Stop tokens: a row that emits a stop id is finished; it keeps its length, padded with that stop
id, and generation ends early once every row is finished, so the result may be shorter than
``T + max_new_tokens``.

It does not tokenize or decode text (``tinygpt.tokenizer``), load checkpoints, or implement beam
search, repetition penalties or batches of prompts with different lengths.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor

from tinygpt.checks import check_token_ids
from tinygpt.model import GPT

__all__ = [
    "apply_temperature",
    "context_schedule",
    "generate",
    "process_logits",
    "sample_next",
    "top_k_filter",
    "top_p_filter",
]


# --- checking arguments --------------------------------------------------------------------------

def _check_logits(logits: object) -> None:
    if not isinstance(logits, Tensor) or not logits.is_floating_point():
        what = logits.dtype if isinstance(logits, Tensor) else type(logits).__name__
        raise TypeError(f"logits must be a floating-point torch.Tensor of shape (..., V), got {what}")
    if logits.ndim < 1 or logits.shape[-1] < 1:
        raise ValueError(f"logits must have shape (..., V) with V >= 1, got {tuple(logits.shape)}")


def _check_temperature(temperature: object) -> float:
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise TypeError(f"temperature must be a number >= 0, got {temperature!r}")
    if not temperature >= 0 or temperature == float("inf"):  # also rejects nan
        raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), "
                         f"got {temperature!r}")
    return float(temperature)


def _check_top_k(top_k: object, vocab_size: int) -> None:
    if top_k is None:
        return
    if isinstance(top_k, bool) or not isinstance(top_k, int):
        raise TypeError(f"top_k must be an integer in [1, {vocab_size}] or None, got {top_k!r}")
    if not 1 <= top_k <= vocab_size:
        raise ValueError(f"top_k must be in [1, {vocab_size}] (the vocabulary size), got {top_k}")


def _check_top_p(top_p: object) -> None:
    if top_p is None:
        return
    if isinstance(top_p, bool) or not isinstance(top_p, (int, float)):
        raise TypeError(f"top_p must be a number in (0, 1] or None, got {top_p!r}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")


# --- logits processing ---------------------------------------------------------------------------

def apply_temperature(logits: Tensor, temperature: float) -> Tensor:
    """``logits / temperature`` (``temperature > 0``): below 1 sharpens, above 1 flattens.

    ``softmax(z / tau)``: as ``tau -> 0`` all the mass goes to the largest logit (greedy, which
    ``sample_next`` handles separately); ``tau = 1`` leaves the model's distribution unchanged.
    """
    _check_logits(logits)
    if _check_temperature(temperature) == 0:
        raise ValueError("apply_temperature needs temperature > 0; temperature 0 means greedy "
                         "decoding (argmax), see sample_next")
    return logits / temperature


def top_k_filter(logits: Tensor, k: int) -> Tensor:
    """Keep the ``k`` largest logits of each row, set the others to ``-inf``.

    Exactly ``k`` survive (ties at the boundary are broken by ``torch.topk``).
    """
    _check_logits(logits)
    _check_top_k(k, logits.shape[-1])
    values, indices = torch.topk(logits, k, dim=-1)  # (..., k)
    out = torch.full_like(logits, float("-inf"))
    return out.scatter(-1, indices, values)  # (..., V)


def top_p_filter(logits: Tensor, p: float) -> Tensor:
    """Nucleus filtering: keep the smallest set of tokens whose probability reaches ``p``.

    Sort the probabilities in decreasing order; a token is kept when the mass of the tokens
    strictly before it is still below ``p``. So the most likely token is always kept, and the
    kept set is the shortest prefix whose total reaches ``p`` (``p = 1`` keeps everything).
    """
    _check_logits(logits)
    _check_top_p(p)
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
    logits = apply_temperature(logits, temperature)
    if top_k is not None:
        logits = top_k_filter(logits, top_k)
    if top_p is not None:
        logits = top_p_filter(logits, top_p)
    return logits


def sample_next(logits: Tensor, temperature: float = 1.0, top_k: int | None = None,
                top_p: float | None = None, generator: torch.Generator | None = None) -> Tensor:
    """One next-token id per row of ``logits`` ``(B, V)``: returns ``(B,)`` int64.

    Temperature 0: the argmax (ties -> the lowest id), no randomness. Otherwise one draw per
    row from ``softmax(process_logits(...))`` with ``torch.multinomial``; pass a seeded
    ``torch.Generator`` (on the logits' device) for reproducible samples.
    """
    _check_logits(logits)
    if logits.ndim != 2:
        raise ValueError(f"logits must have shape (B, V), got {tuple(logits.shape)}")
    temperature = _check_temperature(temperature)
    _check_top_k(top_k, logits.shape[-1])
    _check_top_p(top_p)
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


# --- generation ----------------------------------------------------------------------------------

def context_schedule(n_tokens: int, start: int, block_size: int, keep: int) -> tuple[int, bool]:
    """Where the context starts for predicting the token after ``n_tokens`` tokens.

    ``start`` is where it started for the previous prediction. While the context
    ``[start, n_tokens)`` fits in ``block_size``, it stays; once it would exceed ``block_size``,
    it is cropped to the last ``keep`` tokens. Returns ``(new_start, rebuilt)``: ``rebuilt`` says
    the context was cropped, so a key/value cache must be rebuilt from it.
    """
    if n_tokens - start <= block_size:
        return start, False
    return n_tokens - keep, True


def _check_generate_args(model: object, idx: object, max_new_tokens: object,
                         keep: object) -> None:
    if not isinstance(model, GPT):
        raise TypeError(f"model must be a tinygpt GPT, got {type(model).__name__}")
    V, T_max = model.config.vocab_size, model.config.block_size
    if isinstance(idx, Tensor) and idx.ndim == 2 and idx.shape[1] == 0:
        raise ValueError("the prompt is empty (T=0): give at least one token id per row")
    check_token_ids(idx, V)  # tensor, integer dtype, (B, T), ids in [0, V)
    if idx.shape[0] == 0:  # type: ignore[union-attr]
        raise ValueError("the batch is empty (B=0): give at least one prompt")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
        raise TypeError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    most = max(T_max - 1, 1)  # keeping T_max would leave no room for the next token
    if isinstance(keep, bool) or not isinstance(keep, int) or not 1 <= keep <= most:
        raise ValueError(f"keep must be an integer in [1, {most}] (tokens kept "
                         f"when the context of T_max={T_max} is full), got {keep!r}")


def _stop_ids(stop: int | Iterable[int] | None, vocab_size: int, device: torch.device) -> Tensor:
    if stop is None:
        return torch.empty(0, dtype=torch.long, device=device)
    ids = [stop] if isinstance(stop, int) else list(stop)
    for s in ids:
        if isinstance(s, bool) or not isinstance(s, int) or not 0 <= s < vocab_size:
            raise ValueError(f"stop ids must be integers in [0, {vocab_size - 1}], got {s!r}")
    return torch.tensor(ids, dtype=torch.long, device=device)


def generate(
    model: GPT, idx: Tensor, max_new_tokens: int, temperature: float = 1.0,
    top_k: int | None = None, top_p: float | None = None, use_cache: bool = True,
    generator: torch.Generator | None = None, stop: int | Iterable[int] | None = None,
    keep: int | None = None,
) -> Tensor:
    """Continue each prompt row of ``idx`` ``(B, T)`` by up to ``max_new_tokens`` tokens.

    Returns ``(B, T + n)`` int64 ids, prompt included, with ``n = max_new_tokens`` unless every
    row hit a ``stop`` id first (a finished row is padded with the stop id it emitted).
    ``temperature``, ``top_k``, ``top_p``, ``generator``: as in ``sample_next``.
    ``use_cache``: feed one token per step through a ``KVCache`` (fast) or the whole context
    (slow); both give the same tokens. ``keep``: tokens kept when the context is full (default
    ``block_size // 2``; see the module docstring, "crop and rebuild"). Runs in ``eval`` mode
    under ``torch.no_grad()``; the model's training mode is restored afterwards.
    """
    _check_generate_args(model, idx, max_new_tokens, 1 if keep is None else keep)
    V, T_max = model.config.vocab_size, model.config.block_size
    keep = max(T_max // 2, 1) if keep is None else keep  # a rebuild every ~T_max / 2 tokens
    temperature = _check_temperature(temperature)
    _check_top_k(top_k, V)
    _check_top_p(top_p)
    stops = _stop_ids(stop, V, idx.device)

    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            return _generate(model, idx.long(), max_new_tokens, temperature, top_k, top_p,
                             use_cache, generator, stops, keep)
    finally:
        model.train(was_training)


def _generate(model: GPT, idx: Tensor, max_new_tokens: int, temperature: float,
              top_k: int | None, top_p: float | None, use_cache: bool,
              generator: torch.Generator | None, stops: Tensor, keep: int) -> Tensor:
    B, T = idx.shape
    T_max = model.config.block_size
    out = torch.empty(B, T + max_new_tokens, dtype=torch.long, device=idx.device)
    out[:, :T] = idx
    n = T  # tokens so far
    start = max(0, T - T_max)  # the prompt itself is cropped to its last T_max tokens
    caches = model.new_caches(B, device=idx.device) if use_cache else None
    fed = 0  # tokens of the current context already in the cache
    finished = torch.zeros(B, dtype=torch.bool, device=idx.device)
    last = torch.zeros(B, dtype=torch.long, device=idx.device)  # the stop id each row emitted
    for _ in range(max_new_tokens):
        start, rebuilt = context_schedule(n, start, T_max, keep)
        if caches is None:
            logits = model(out[:, start:n], last_only=True)  # (B, 1, V): the last position
        else:
            if rebuilt:
                for cache in caches:
                    cache.reset()
                fed = 0
            new = out[:, start + fed:n]  # (B, T_new): what the cache has not seen
            logits = model(new, caches=caches, last_only=True)  # (B, 1, V)
            fed = n - start
        token = sample_next(logits[:, -1, :], temperature, top_k, top_p, generator)  # (B,)
        token = torch.where(finished, last, token)  # finished rows repeat their stop id
        out[:, n] = token
        n += 1
        if stops.numel():
            hit = torch.isin(token, stops) & ~finished
            last = torch.where(hit, token, last)
            finished |= hit
            if bool(finished.all()):
                break
    return out[:, :n]
