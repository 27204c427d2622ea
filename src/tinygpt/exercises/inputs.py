"""Seeded random inputs for the exercises' generated cases: the same cases on every run.

``Draw(seed)`` holds a ``random.Random`` and a ``torch.Generator`` seeded alike, so that an
exercise's cases depend only on its seed (not on the global random state, which the reader's
notebook may have set or used), and a failing case can be shown again.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import torch

DTYPES = (torch.float32, torch.float64)


class Draw:
    """Random sizes, choices and tensors from one seed."""

    def __init__(self, seed: int) -> None:
        self.random = random.Random(seed)
        self.generator = torch.Generator().manual_seed(seed)

    def integer(self, low: int, high: int) -> int:
        """An integer in ``[low, high]``."""
        return self.random.randint(low, high)

    def choice(self, options: Sequence):
        """One of ``options``."""
        return options[self.random.randrange(len(options))]

    def normal(self, *shape: int, dtype: torch.dtype = torch.float32,
               scale: float = 1.0) -> torch.Tensor:
        """Standard normal values times ``scale``, drawn in float64 and then cast, so that the
        float32 and float64 cases of a seed hold the same numbers."""
        x = torch.randn(*shape, generator=self.generator, dtype=torch.float64) * scale
        return x.to(dtype)

    def uniform(self, *shape: int, dtype: torch.dtype = torch.float32, low: float = 0.0,
                high: float = 1.0) -> torch.Tensor:
        """Uniform values in ``[low, high)``."""
        x = torch.rand(*shape, generator=self.generator, dtype=torch.float64)
        return (low + (high - low) * x).to(dtype)

    def ids(self, n: int, vocab_size: int) -> list[int]:
        """``n`` token ids below ``vocab_size``."""
        return [self.random.randrange(vocab_size) for _ in range(n)]

    def batch_shape(self, max_dims: int = 2, max_size: int = 3) -> tuple[int, ...]:
        """Leading dimensions: none, or up to ``max_dims`` of size 1 to ``max_size``."""
        return tuple(self.integer(1, max_size) for _ in range(self.integer(0, max_dims)))
