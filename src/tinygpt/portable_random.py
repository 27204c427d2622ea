"""Sampling that another language can repeat exactly: PCG32 and a float64 choice of token.

``PCG32`` is O'Neill's pcg32 generator (XSH RR output, 64-bit state), seeded as the reference
``pcg32_srandom(seed, 54)``; ``uniform()`` is ``next() / 2**32``. ``choose_token`` picks one id
from a row of logits with the book's settings, in plain float64 arithmetic: temperature 0 is the
argmax (lowest id on ties); otherwise the logits, shifted by their maximum, are divided by the
temperature, sorted likeliest first (ties: lower id first), cut to the ``top_k`` first, then to the
smallest prefix whose probability reaches ``top_p`` (a token is kept while the mass before it is
below ``p``), and ``u * total`` walks that prefix. The page's engine
(book/_static/tinygpt/engine.js) does the same steps, so the same seed gives the same tokens.

``generate(..., rng=PCG32(seed))`` in ``tinygpt.sample`` uses it instead of ``torch.multinomial``;
without ``rng`` sampling is unchanged. It does not batch, run a model or tokenize.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from tinygpt.checks import check_float, check_instance, check_int

__all__ = ["PCG32", "choose_token"]

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
    """One id from ``logits`` (``V`` floats), as described in the module docstring."""
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
