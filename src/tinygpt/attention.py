"""Causal multi-head self-attention in GPT-2's layout, with a key/value cache for sampling.

Chapter 5 builds it; chapter 9 samples with its ``KVCache``, and chapter 12 adds QK-norm and RoPE
(``add_modern_parts``).

``CausalSelfAttention`` is one attention layer, with an explicit path (which can return the
attention weights) and a fused one (``F.scaled_dot_product_attention``); ``KVCache`` keeps the
keys and values already computed; ``causal_mask`` says which keys each query may see, and
``scaled_dot_product_attention`` is the formula written out for any boolean mask. A layer may
RMS-normalise its queries and keys (``qk_norm``) and rotate them to their positions (RoPE,
``tinygpt.rope``). The residual connection and the norms are the block's job, positions added to
the input the embeddings'.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tinygpt.checks import check_instance, check_int
from tinygpt.config import GPTConfig
from tinygpt.rope import RoPE


def causal_mask(t_query: int, t_key: int, device: torch.device | str | None = None) -> Tensor:
    """Boolean ``(t_query, t_key)`` mask, ``True`` where a query may attend to a key.

    The queries are the *last* ``t_query`` of ``t_key`` positions (the earlier ones come from a
    cache); with ``t_query == t_key`` this is the lower triangle, diagonal included.
    """
    if not 1 <= t_query <= t_key:
        raise ValueError(f"need 1 <= t_query <= t_key, got t_query={t_query}, t_key={t_key}")
    ones = torch.ones(t_query, t_key, dtype=torch.bool, device=device)
    return ones.tril(diagonal=t_key - t_query)  # (t_query, t_key)


def scaled_dot_product_attention(q: Tensor, k: Tensor, v: Tensor,
                                 mask: Tensor | None = None) -> Tensor:
    """``softmax(q k^T / sqrt(d_k)) v`` for ``q`` ``(..., T_q, d_k)``, ``k`` ``(..., T_k, d_k)``,
    ``v`` ``(..., T_k, d_v)``; ``mask`` (broadcast to ``(..., T_q, T_k)``), ``True`` where a query
    may see a key. A query that may see no key at all gets zeros."""
    _check_sdpa(q, k, v, mask)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., T_q, T_k)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))  # hidden keys -> -inf
    weights = torch.softmax(scores, dim=-1)  # (..., T_q, T_k), rows sum to 1
    if mask is not None:
        weights = weights.nan_to_num(0.0)  # a row with every key hidden: 0/0 -> 0
    return weights @ v  # (..., T_q, d_v)


def _check_sdpa(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> None:
    """A clear error unless ``q``, ``k``, ``v`` and ``mask`` have shapes that fit together."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor) or t.ndim < 2 or not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor of shape (..., T, d)")
    shapes = [tuple(t.shape) for t in (q, k, v)]
    if shapes[0][-1] != shapes[1][-1] or shapes[1][-2] != shapes[2][-2]:
        raise ValueError(f"q {shapes[0]}, k {shapes[1]} and v {shapes[2]} must share d_k (q, k) "
                         "and T_k (k, v)")
    if mask is not None and (not isinstance(mask, Tensor) or mask.dtype != torch.bool):
        raise TypeError("mask must be a boolean tensor, True where a query may see a key")


class KVCache:
    """The keys and values one attention layer has seen, in two ``(B, H, T_max, d_k)`` tensors.

    Allocated once and written in place, so a step costs only the new tokens. For inference
    (``torch.no_grad()``); ``reset()`` starts a new sequence.
    """

    def __init__(self, batch_size: int, n_head: int, max_len: int, head_size: int, *,
                 device: torch.device | str | None = None, dtype: torch.dtype = torch.float32):
        shape = tuple(check_int(v, f"KVCache {name}") for name, v in [
            ("batch_size", batch_size), ("n_head", n_head), ("max_len", max_len),
            ("head_size", head_size)])
        self.k = torch.zeros(shape, device=device, dtype=dtype)  # (B, H, T_max, d_k)
        self.v = torch.zeros(shape, device=device, dtype=dtype)  # (B, H, T_max, d_k)
        self.length = 0  # positions filled so far

    @classmethod
    def for_config(cls, config: GPTConfig, batch_size: int, **kwargs) -> KVCache:
        """An empty cache for one layer of a model with ``config``, ``max_len = block_size``."""
        return cls(batch_size, config.n_head, config.block_size, config.head_size, **kwargs)

    @property
    def max_len(self) -> int:
        return self.k.shape[2]

    def reset(self) -> None:
        self.length = 0  # the storage is kept and overwritten later

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store ``(B, H, T_new, d_k)`` keys and values; return all of them, ``(B, H, T, d_k)``."""
        end = self.length + k.shape[2]
        if end > self.max_len:
            raise ValueError(f"cache holds {self.length} positions; {k.shape[2]} more exceed its "
                             f"max_len={self.max_len} (the context length T_max)")
        self.k[:, :, self.length:end] = k
        self.v[:, :, self.length:end] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]  # (B, H, T, d_k) each


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention, ``(B, T, C) -> (B, T, C)``, with GPT-2's parameters.

    ``fused=True`` computes the weighted sum in one kernel (``fused_attention``), ``False`` by the
    explicit formula. Chapter 12's options, QK-norm and RoPE, enter in ``position_queries_keys``.
    """

    def __init__(self, config: GPTConfig, *, fused: bool = True) -> None:
        super().__init__()
        check_instance(config, GPTConfig, "config")
        self.config = config
        self.n_head = config.n_head
        self.fused = fused
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)  # x -> q|k|v
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)  # heads -> C
        self.attn_dropout = nn.Dropout(config.dropout)  # on the attention weights
        self.resid_dropout = nn.Dropout(config.dropout)  # on the output
        self.add_modern_parts(config)  # chapter 12: QK-norm and RoPE, when the config asks

    def forward(self, x: Tensor, *, cache: KVCache | None = None,
                return_weights: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """Attend causally over ``x`` (after the cached positions, if a cache is given).

        With ``return_weights=True`` also returns the weights ``(B, H, T, T_past + T)``, computed
        on the explicit path (the fused kernel does not expose them).
        """
        check_attention_input(self.config, x, cache)  # a clear error for bad shapes (no sync)
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)  # 3 x (B, T, C)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, H, T, d_k)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, H, T, d_k)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, H, T, d_k)
        q, k = self.position_queries_keys(q, k, past=0 if cache is None else cache.length)
        if cache is not None:
            k, v = cache.append(k, v)  # (B, H, T_all, d_k): the past positions, then these
        if self.fused and not return_weights:
            y = self.fused_attention(q, k, v)  # (B, H, T, d_k), the formula below in one kernel
        else:
            scores = q @ k.transpose(-2, -1) / math.sqrt(k.shape[-1])  # (B, H, T, T_all)
            mask = causal_mask(T, k.shape[2], device=x.device)  # (T, T_all), True = visible
            scores = scores.masked_fill(~mask, float("-inf"))  # future -> -inf
            weights = torch.softmax(scores, dim=-1)  # (B, H, T, T_all), rows sum to 1
            y = self.attn_dropout(weights) @ v  # (B, H, T, d_k)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # heads side by side: (B, T, C)
        y = self.resid_dropout(self.c_proj(y))  # (B, T, C)
        return (y, weights) if return_weights else y

    # --- chapter 12's options and the fused kernel ------------------------------------------------

    def add_modern_parts(self, config: GPTConfig) -> None:
        """QK-norm (one RMSNorm over each head's ``d_k``, shared by the heads, for the queries and
        one for the keys) and rotary positions, each only if ``config`` asks for it."""
        self.qk_norm = config.qk_norm
        if config.qk_norm:
            self.q_norm = nn.RMSNorm(config.head_size, eps=config.norm_eps)
            self.k_norm = nn.RMSNorm(config.head_size, eps=config.norm_eps)
        self.rope = None
        if config.positional == "rope":
            self.rope = RoPE(config.head_size, config.block_size, config.rope_theta)

    def position_queries_keys(self, q: Tensor, k: Tensor, past: int) -> tuple[Tensor, Tensor]:
        """Queries and keys ``(B, H, T, d_k)`` as attention compares them: QK-normed (unit RMS, so
        the scores stay within about ``sqrt(d_k)`` times the gains), then rotated to positions
        ``past .. past + T - 1`` (RoPE). GPT-2's attention uses neither: ``q, k`` unchanged."""
        if self.qk_norm:  # in the norms' dtype: bf16 autocast gives q, k in bf16, the gains are
            # float32, and torch would warn at every step that it cannot fuse the two
            q = self.q_norm(q.to(self.q_norm.weight.dtype))
            k = self.k_norm(k.to(self.k_norm.weight.dtype))
        if self.rope is not None:
            q, k = self.rope(q, past), self.rope(k, past)
        return q, k

    def fused_attention(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """``softmax(q k^T / sqrt(d_k) + causal mask) v`` in PyTorch's fused kernel, ``(B, H, T,
        d_k)``, with the mask that fits: none of the past when no keys are cached, every key for
        one new query, else the causal mask shifted past the cached keys."""
        T, T_all = q.shape[2], k.shape[2]
        p = self.attn_dropout.p if self.training else 0.0
        if T_all == T:  # no past: the standard causal triangle
            return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        if T == 1:  # one new query, the last position: it may see every key
            return F.scaled_dot_product_attention(q, k, v, dropout_p=p)
        mask = causal_mask(T, T_all, device=q.device)  # (T, T_all)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)


def check_attention_input(config: GPTConfig, x: object, cache: KVCache | None) -> None:
    """A clear error unless ``x`` is a float ``(B, T, C)`` tensor that fits ``config`` and
    ``cache``."""
    if not isinstance(x, Tensor):
        raise TypeError(f"x must be a torch.Tensor of shape (B, T, C), got {type(x).__name__}")
    if x.ndim != 3:
        raise ValueError(f"x must have shape (B, T, C), got shape {tuple(x.shape)}"
                         + (" (for one sequence, use x[None])" if x.ndim == 2 else ""))
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating-point tensor, got {x.dtype}")
    B, T, C = x.shape
    if C != config.n_embd:
        raise ValueError(f"x has width C={C} but this layer expects n_embd={config.n_embd}; "
                         f"x must have shape (B, T, {config.n_embd})")
    if T < 1:
        raise ValueError("x must hold at least one position (T >= 1), got T=0")
    past = 0 if cache is None else cache.length
    if past + T > config.block_size:
        where = f"{past} cached + {T} new = {past + T}" if cache is not None else f"T={T}"
        raise ValueError(f"sequence too long: {where} positions, more than block_size="
                         f"{config.block_size} (the context length T_max)")
    if cache is not None and tuple(cache.k.shape[i] for i in (0, 1, 3)) != (
            B, config.n_head, config.head_size):
        raise ValueError(f"x of shape {tuple(x.shape)} does not fit a cache of shape "
                         f"{tuple(cache.k.shape)} (batch, heads and head size must match)")
