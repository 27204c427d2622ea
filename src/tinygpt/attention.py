"""Causal multi-head self-attention, in GPT-2's layout, with a key/value cache.

It handles one attention layer of a GPT:

* ``CausalSelfAttention(config)``: ``c_attn`` projects each position's vector to its query, key
  and value at once (``C -> 3C``), the heads attend causally, and ``c_proj`` mixes the
  concatenated heads back to ``C``. Two paths compute the same thing: an explicit one (scores,
  mask, softmax, weighted sum -- it can also return the attention weights) and a fused one
  through ``torch.nn.functional.scaled_dot_product_attention``.
* ``KVCache``: the keys and values of positions already seen, so that new tokens can be fed a
  few at a time (one at a time when sampling) and give exactly what the full sequence gives.
* ``causal_mask(t_query, t_key)``: which keys each query may see.

It does not add the residual connection or the normalisation around attention (the transformer
block does), nor positional information (the embeddings do). The softmax is ``torch.softmax``,
which already subtracts the row maximum; the cache is meant for inference (``torch.no_grad()``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tinygpt.config import GPTConfig


def causal_mask(t_query: int, t_key: int, device: torch.device | str | None = None) -> Tensor:
    """Boolean ``(t_query, t_key)`` mask, ``True`` where a query may attend to a key.

    The queries are the *last* ``t_query`` of the ``t_key`` positions (the earlier ones come from
    a cache), so query ``i`` sits at position ``t_key - t_query + i`` and sees keys ``s <= ``
    that position. With ``t_query == t_key`` this is the lower triangle, diagonal included.
    """
    if not 1 <= t_query <= t_key:
        raise ValueError(f"need 1 <= t_query <= t_key, got t_query={t_query}, t_key={t_key}")
    ones = torch.ones(t_query, t_key, dtype=torch.bool, device=device)
    return ones.tril(diagonal=t_key - t_query)  # (t_query, t_key)


class KVCache:
    """The keys and values one attention layer has computed so far, for ``B`` sequences.

    Storage is pre-allocated: two ``(B, H, T_max, d_k)`` tensors and a ``length``. Appending
    writes the new positions in place, so a step costs only the new tokens, and memory is fixed
    up front (concatenating instead would copy the whole cache at every step). A model keeps one
    cache per layer. Use it under ``torch.no_grad()``; ``reset()`` starts a new sequence.
    """

    def __init__(
        self,
        batch_size: int,
        n_head: int,
        max_len: int,
        head_size: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        for name, value in [("batch_size", batch_size), ("n_head", n_head),
                            ("max_len", max_len), ("head_size", head_size)]:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"KVCache {name} must be a positive integer, got {value!r}")
        shape = (batch_size, n_head, max_len, head_size)
        self.k = torch.zeros(shape, device=device, dtype=dtype)  # (B, H, T_max, d_k)
        self.v = torch.zeros(shape, device=device, dtype=dtype)  # (B, H, T_max, d_k)
        self.length = 0  # positions filled so far

    @classmethod
    def for_config(cls, config: GPTConfig, batch_size: int, **kwargs) -> KVCache:
        """An empty cache for one layer of a model with ``config``, ``max_len = block_size``."""
        return cls(batch_size, config.n_head, config.block_size, config.head_size, **kwargs)

    @property
    def max_len(self) -> int:
        """``T_max``, the number of positions the cache can hold."""
        return self.k.shape[2]

    def reset(self) -> None:
        """Forget every position (the storage is kept and overwritten later)."""
        self.length = 0

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store ``(B, H, T_new, d_k)`` keys and values; return all of them, ``(B, H, T, d_k)``."""
        B, H, T_new, hs = k.shape
        if (B, H, hs) != (self.k.shape[0], self.k.shape[1], self.k.shape[3]):
            raise ValueError(
                f"keys of shape {tuple(k.shape)} do not fit a cache of shape {tuple(self.k.shape)}"
                " (batch, heads and head size must match)"
            )
        end = self.length + T_new
        if end > self.max_len:
            raise ValueError(
                f"cache holds {self.length} positions; adding {T_new} makes {end}, more than its "
                f"max_len={self.max_len} (the context length T_max)"
            )
        self.k[:, :, self.length:end] = k
        self.v[:, :, self.length:end] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]  # (B, H, T, d_k) each


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention: ``(B, T, C) -> (B, T, C)``.

    Parameters (GPT-2 names): ``c_attn`` with weight ``(3C, C)`` -- rows ``[0, C)`` make the
    queries, ``[C, 2C)`` the keys, ``[2C, 3C)`` the values; head ``h`` uses columns
    ``[h*d_k, (h+1)*d_k)`` of each -- and ``c_proj`` with weight ``(C, C)``.
    ``fused=True`` uses ``F.scaled_dot_product_attention``; ``False`` the explicit path.
    """

    def __init__(self, config: GPTConfig, *, fused: bool = True) -> None:
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise TypeError(f"config must be a GPTConfig, got {type(config).__name__}")
        C = config.n_embd
        self.config = config
        self.n_head = config.n_head
        self.head_size = config.head_size
        self.fused = fused
        self.c_attn = nn.Linear(C, 3 * C, bias=config.bias)  # x -> [q | k | v]
        self.c_proj = nn.Linear(C, C, bias=config.bias)  # concatenated heads -> C
        self.attn_dropout = nn.Dropout(config.dropout)  # on the attention weights
        self.resid_dropout = nn.Dropout(config.dropout)  # on the output

    def _check_input(self, x: object, cache: KVCache | None) -> None:
        if not isinstance(x, Tensor):
            raise TypeError(f"x must be a torch.Tensor of shape (B, T, C), got {type(x).__name__}")
        if x.ndim != 3:
            raise ValueError(f"x must have shape (B, T, C), got shape {tuple(x.shape)}"
                             + (" (for one sequence, use x[None])" if x.ndim == 2 else ""))
        if not x.is_floating_point():
            raise TypeError(f"x must be a floating-point tensor, got {x.dtype}")
        _, T, C = x.shape
        if C != self.config.n_embd:
            raise ValueError(f"x has width C={C} but this layer expects n_embd="
                             f"{self.config.n_embd}; x must have shape (B, T, {self.config.n_embd})")
        if T < 1:
            raise ValueError("x must hold at least one position (T >= 1), got T=0")
        past = 0 if cache is None else cache.length
        if past + T > self.config.block_size:
            where = f"{past} cached + {T} new = {past + T}" if cache is not None else f"T={T}"
            raise ValueError(f"sequence too long: {where} positions, more than block_size="
                             f"{self.config.block_size} (the context length T_max)")

    def _split_heads(self, t: Tensor) -> Tensor:
        B, T, _ = t.shape
        return t.view(B, T, self.n_head, self.head_size).transpose(1, 2)  # (B, H, T, d_k)

    def forward(
        self, x: Tensor, *, cache: KVCache | None = None, return_weights: bool = False
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Attend causally over ``x`` (after the cached positions, if a cache is given).

        ``x``: ``(B, T, C)``. Returns ``(B, T, C)``; with ``return_weights=True`` also the
        attention weights ``(B, H, T, T_past + T)``, computed on the explicit path (the fused
        kernel does not expose them). With a cache, the new keys and values are appended to it.
        """
        self._check_input(x, cache)
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)  # 3 x (B, T, C)
        q, k, v = self._split_heads(q), self._split_heads(k), self._split_heads(v)  # (B, H, T, d_k)
        if cache is not None:
            k, v = cache.append(k, v)  # (B, H, T_past + T, d_k): all positions so far
        T_all = k.shape[2]
        weights = None
        if self.fused and not return_weights:
            p = self.attn_dropout.p if self.training else 0.0
            if T_all == T:  # no past: the standard causal triangle
                y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
            elif T == 1:  # one new query, the last position: it may see every key, no mask
                y = F.scaled_dot_product_attention(q, k, v, dropout_p=p)
            else:  # queries sit after the cached keys: give the shifted mask explicitly
                mask = causal_mask(T, T_all, device=x.device)  # (T, T_all)
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
        else:
            scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_size)  # (B, H, T, T_all)
            mask = causal_mask(T, T_all, device=x.device)  # (T, T_all), True = visible
            scores = scores.masked_fill(~mask, float("-inf"))  # future -> -inf
            weights = torch.softmax(scores, dim=-1)  # (B, H, T, T_all), rows sum to 1
            y = self.attn_dropout(weights) @ v  # (B, H, T, d_k)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # heads side by side: (B, T, C)
        y = self.resid_dropout(self.c_proj(y))  # (B, T, C)
        if return_weights:
            return y, weights
        return y
