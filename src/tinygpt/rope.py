"""Rotary position embeddings (RoPE): positions enter attention as rotations of queries and keys.

Chapter 12 builds it.

Each head's ``d_k`` dimensions form ``d_k / 2`` pairs; at position ``t`` pair ``i`` is turned by
the angle ``t * theta_i``, ``theta_i = base^(-2i / d_k)``. Since rotations compose, the dot product
of a query at ``i`` and a key at ``j`` depends on their contents and on ``i - j`` only.

Two layouts say which dimensions form a pair: ``rotate_halves`` pairs ``m`` with ``m + d_k/2``
(GPT-NeoX and Hugging Face's Llama, the layout ``RoPE`` uses) and ``rotate_interleaved`` pairs
``2i`` with ``2i + 1`` (the RoFormer paper, Meta's original Llama code). They are the same
rotation once the head's dimensions are permuted (``halves_order``). Attention calls ``RoPE``
(``tinygpt.attention``); this module does not attend, cache keys or add anything to the embeddings.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from tinygpt.checks import check_float, check_int


def rope_angles(T: int, head_size: int, base: float = 10000.0) -> Tensor:
    """The angles ``t * base^(-2i / d_k)``, ``(T, d_k / 2)``, in float32 like Hugging Face."""
    check_int(T, "T")
    check_int(head_size, "head_size")
    check_float(base, "base", 1.0, low_open=True)
    if head_size % 2:
        raise ValueError(f"RoPE rotates pairs of dimensions: head_size must be even, got "
                         f"{head_size}")
    inv_freq = 1.0 / base ** (torch.arange(0, head_size, 2, dtype=torch.int64).float() / head_size)
    t = torch.arange(T, dtype=torch.int64).float()  # (T,)
    return torch.outer(t, inv_freq)  # (T, d_k/2)


def rotate_halves(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate pairs ``(x[m], x[m + d/2])`` of ``x`` ``(..., T, d)`` by angles with ``cos`` and
    ``sin`` ``(T, d/2)``."""
    x1, x2 = x.chunk(2, dim=-1)  # (..., T, d/2) each: the pairs' first and second coordinates
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)  # (..., T, d)


def rotate_interleaved(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate pairs ``(x[2i], x[2i + 1])`` of ``x`` ``(..., T, d)`` by the same angles."""
    x1, x2 = x[..., 0::2], x[..., 1::2]  # (..., T, d/2) each
    out = torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)  # (..., T, d/2, 2)
    return out.flatten(-2)  # (..., T, d): the pairs side by side again


def halves_order(head_size: int) -> Tensor:
    """The permutation ``p`` with ``rotate_halves(x[..., p]) == rotate_interleaved(x)[..., p]``:
    ``p = [0, 2, 4, ..., 1, 3, 5, ...]`` puts each interleaved pair into the two halves."""
    check_int(head_size, "head_size")
    return torch.cat([torch.arange(0, head_size, 2), torch.arange(1, head_size, 2)])


class RoPE(nn.Module):
    """Rotates ``(B, H, T, d_k)`` queries or keys to their positions, in the halves layout.

    The angles of positions ``0 .. T_max - 1`` are computed once, as ``cos`` and ``sin`` buffers
    that are not saved (they are recomputed from ``block_size``, ``head_size`` and ``base``).
    """

    cos: Tensor  # the buffers registered below (for the type checker: a buffer is a tensor)
    sin: Tensor

    def __init__(self, head_size: int, block_size: int, base: float = 10000.0) -> None:
        super().__init__()
        angles = rope_angles(block_size, head_size, base)  # (T_max, d_k/2)
        self.head_size, self.block_size, self.base = head_size, block_size, base
        self.register_buffer("cos", angles.cos(), persistent=False)  # (T_max, d_k/2)
        self.register_buffer("sin", angles.sin(), persistent=False)  # (T_max, d_k/2)

    def forward(self, x: Tensor, start: int = 0) -> Tensor:
        """``x`` ``(B, H, T, d_k)`` holding positions ``start .. start + T - 1``, rotated."""
        T = x.shape[-2]
        cos, sin = self.cos[start:start + T], self.sin[start:start + T]  # (T, d_k/2)
        return rotate_halves(x, cos.to(x.dtype), sin.to(x.dtype))  # (B, H, T, d_k)

    def extra_repr(self) -> str:
        return f"head_size={self.head_size}, block_size={self.block_size}, base={self.base:g}"
