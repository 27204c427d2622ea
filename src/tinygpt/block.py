"""The transformer block and the layers only a block uses.

Chapter 6 builds it; chapter 12 adds ``relu2`` and ``swiglu`` and uses ``RMSNorm``.

``LayerNorm`` and ``RMSNorm`` (each with a fused ``forward`` and an ``explicit`` formula),
``make_norm(config)``, the activations ``relu``, ``gelu``, ``gelu_tanh``, ``relu2`` and the gated
``swiglu`` (which halves its input's width), the module ``ActivationLayer``, the ``MLP``, and
``Block``: attention and the MLP in residual connections, norms placed before (GPT-2) or after
(GPT-1) each. Embeddings, the stack of blocks, the final norm and GPT-2's initialisation belong to
the model; attention to ``tinygpt.attention``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tinygpt.attention import CausalSelfAttention, KVCache
from tinygpt.checks import (
    check_bool,
    check_choice,
    check_float,
    check_instance,
    check_int,
)
from tinygpt.config import ACTIVATIONS, Activation, GPTConfig


def check_width(norm: LayerNorm | RMSNorm, x: object) -> None:
    """A clear error unless ``x`` is a tensor of shape ``(..., C)``."""
    who = type(norm).__name__
    if not isinstance(x, Tensor):
        raise TypeError(f"{who} expects a torch.Tensor, got {type(x).__name__}")
    if x.ndim == 0 or x.shape[-1] != norm.n_embd:
        raise ValueError(f"{who} normalises vectors of width {norm.n_embd}: the input's last "
                         f"dimension must be {norm.n_embd}, got shape {tuple(x.shape)}")


class LayerNorm(nn.Module):
    """``(x - mean) / sqrt(var + eps) * weight + bias`` over the last dimension, ``(..., C)``."""

    def __init__(self, n_embd: int, eps: float = 1e-5, bias: bool = True) -> None:
        super().__init__()
        self.n_embd = check_int(n_embd, "n_embd")
        self.eps = check_float(eps, "eps", 0.0, low_open=True)
        self.weight = nn.Parameter(torch.ones(n_embd))  # (C,) scale, gamma
        self.bias = nn.Parameter(torch.zeros(n_embd)) if bias else None  # (C,) shift, beta

    def forward(self, x: Tensor) -> Tensor:
        check_width(self, x)  # a clear error for a wrong width (shapes only: no sync, no cost)
        return F.layer_norm(x, (self.n_embd,), self.weight, self.bias, self.eps)  # (..., C)

    def explicit(self, x: Tensor) -> Tensor:
        """The formula, step by step: what the fused ``F.layer_norm`` of ``forward`` computes."""
        check_width(self, x)
        mean = x.mean(dim=-1, keepdim=True)  # (..., 1)
        centred = x - mean  # (..., C), mean 0
        var = (centred * centred).mean(dim=-1, keepdim=True)  # (..., 1), two-pass: no cancellation
        y = centred * torch.rsqrt(var + self.eps) * self.weight  # (..., C)
        return y + self.bias if self.bias is not None else y

    def extra_repr(self) -> str:
        return f"{self.n_embd}, eps={self.eps}, bias={self.bias is not None}"


class RMSNorm(nn.Module):
    """``x / sqrt(mean(x**2) + eps) * weight`` over the last dimension: no mean, no shift."""

    def __init__(self, n_embd: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.n_embd = check_int(n_embd, "n_embd")
        self.eps = check_float(eps, "eps", 0.0, low_open=True)
        self.weight = nn.Parameter(torch.ones(n_embd))  # (C,) scale

    def forward(self, x: Tensor) -> Tensor:
        check_width(self, x)  # a clear error for a wrong width (shapes only: no sync, no cost)
        return F.rms_norm(x, (self.n_embd,), self.weight, self.eps)  # (..., C)

    def explicit(self, x: Tensor) -> Tensor:
        """The formula, step by step: what the fused ``F.rms_norm`` of ``forward`` computes."""
        check_width(self, x)
        mean_square = (x * x).mean(dim=-1, keepdim=True)  # (..., 1)
        return x * torch.rsqrt(mean_square + self.eps) * self.weight  # (..., C)

    def extra_repr(self) -> str:
        return f"{self.n_embd}, eps={self.eps}"


def make_norm(config: GPTConfig) -> LayerNorm | RMSNorm:
    """The norm ``config.norm`` names; LayerNorm has a bias when ``config.bias`` is true."""
    if config.norm == "layernorm":
        return LayerNorm(config.n_embd, config.norm_eps, bias=config.bias)
    return RMSNorm(config.n_embd, config.norm_eps)  # GPTConfig allows only these two


def relu(x: Tensor) -> Tensor:
    """``max(x, 0)``, element-wise (NaN stays NaN; the slope at 0 is taken as 0)."""
    return torch.where(x <= 0, torch.zeros_like(x), x)


def gelu(x: Tensor) -> Tensor:
    """Exact GELU: ``x * Phi(x)``, ``Phi`` the standard normal CDF, ``(1 + erf(x/sqrt 2))/2``."""
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def gelu_tanh(x: Tensor) -> Tensor:
    """GPT-2's GELU: ``Phi(x)`` replaced by ``(1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) / 2``."""
    inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)
    return 0.5 * x * (1.0 + torch.tanh(inner))


def relu2(x: Tensor) -> Tensor:
    """ReLU squared, ``max(x, 0)^2`` (So et al.'s Primer; modded-nanogpt's MLP)."""
    r = relu(x)
    return r * r


def swiglu(x: Tensor) -> Tensor:
    """The gated unit of Llama's MLP: ``x`` ``(..., 2F)`` is ``[gate | up]``; returns
    ``silu(gate) * up`` ``(..., F)``, with ``silu(g) = g * sigmoid(g)``."""
    gate, up = x.chunk(2, dim=-1)  # (..., F) each
    return gate * torch.sigmoid(gate) * up  # (..., F)


def _fast_swiglu(x: Tensor) -> Tensor:
    gate, up = x.chunk(2, dim=-1)  # (..., F) each
    return F.silu(gate) * up  # (..., F)


# One entry per value of ``tinygpt.config.Activation``, in the order of ``ACTIVATIONS``.
ACTIVATION_FUNCTIONS: dict[Activation, Callable[[Tensor], Tensor]] = {
    "gelu_tanh": gelu_tanh, "gelu": gelu, "relu": relu, "swiglu": swiglu,
    "relu2": relu2}  # the formulas above
FAST_ACTIVATIONS: dict[Activation, Callable[[Tensor], Tensor]] = {
    "gelu_tanh": functools.partial(F.gelu, approximate="tanh"), "gelu": F.gelu,
    "relu": F.relu, "swiglu": _fast_swiglu,
    "relu2": lambda x: F.relu(x).square()}  # torch's kernels: the same values, fewer operations
GATED = {"swiglu"}  # activations that take 2F inputs to F outputs: c_fc makes both halves


class ActivationLayer(nn.Module):
    """The nonlinearity ``name`` as a module: torch's kernel, or with ``explicit=True`` the
    formula written out above (``gelu_tanh``, ...); both give the same values."""

    def __init__(self, name: Activation, *, explicit: bool = False) -> None:
        super().__init__()
        self.name = check_choice(name, "activation", ACTIVATIONS)
        self.explicit = check_bool(explicit, "explicit")
        self.fn = (ACTIVATION_FUNCTIONS if explicit else FAST_ACTIVATIONS)[name]

    def forward(self, x: Tensor) -> Tensor:
        return self.fn(x)

    def extra_repr(self) -> str:
        return repr(self.name) + (", explicit=True" if self.explicit else "")


class MLP(nn.Module):
    """Position-wise feed-forward layer, ``(B, T, C) -> (B, T, C)``: expand, activate, contract."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        check_instance(config, GPTConfig, "config")
        hidden = config.mlp_width * (2 if config.activation in GATED else 1)  # gate | up
        self.c_fc = nn.Linear(config.n_embd, hidden, bias=config.bias)  # C -> 4C (or 2 x 4C)
        self.act = ActivationLayer(config.activation)  # swiglu: (B, T, 2F) -> (B, T, F)
        self.c_proj = nn.Linear(config.mlp_width, config.n_embd, bias=config.bias)  # 4C -> C
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        h = self.act(self.c_fc(x))  # (B, T, 4C)
        return self.dropout(self.c_proj(h))  # (B, T, C)


class Block(nn.Module):
    """One transformer block, ``(B, T, C) -> (B, T, C)``: attention, then the MLP, each in a
    residual connection, with the norms before (``norm_position="pre"``) or after (``"post"``)."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        check_instance(config, GPTConfig, "config")
        self.pre_norm = config.norm_position == "pre"
        self.ln_1 = make_norm(config)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = make_norm(config)
        self.mlp = MLP(config)

    def forward(self, x: Tensor, cache: KVCache | None = None) -> Tensor:
        if self.pre_norm:  # GPT-2
            x = x + self.attn(self.ln_1(x), cache=cache)  # (B, T, C)
            x = x + self.mlp(self.ln_2(x))  # (B, T, C)
        else:  # GPT-1, the 2017 transformer
            x = self.ln_1(x + self.attn(x, cache=cache))  # (B, T, C)
            x = self.ln_2(x + self.mlp(x))  # (B, T, C)
        return x

    def extra_repr(self) -> str:
        return f"norm_position={'pre' if self.pre_norm else 'post'!r}"
