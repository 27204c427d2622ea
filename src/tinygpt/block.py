"""The transformer block: normalisation, the MLP, and attention, joined by residual connections.

It handles one block of a GPT and the layers only a block uses:

* ``LayerNorm(n_embd, eps, bias)`` and ``RMSNorm(n_embd, eps)``: each position's vector is
  normalised on its own -- LayerNorm removes its mean and divides by its standard deviation,
  RMSNorm only divides by its root mean square -- then scaled (and, for LayerNorm, shifted) by
  learned per-channel parameters. ``explicit(x)`` computes them from their formulas; ``forward``
  gives the same numbers through torch's one-kernel ``F.layer_norm`` / ``F.rms_norm`` (fewer
  operations, so faster on small CPU models); both equal ``torch.nn.LayerNorm`` and
  ``torch.nn.RMSNorm``. ``make_norm(config)`` picks one from ``config.norm``.
* ``relu``, ``gelu`` (exact, ``x * Phi(x)``) and ``gelu_tanh`` (GPT-2's tanh approximation),
  written from their formulas, and ``Activation(name)``, the module that applies one of them
  (through the equal torch kernel, ``F.gelu``/``F.relu``, unless ``explicit=True``).
* ``MLP(config)``: expand each position's vector from ``C`` to ``config.mlp_width`` (``4C`` by
  default), apply the activation, contract back to ``C``.
* ``Block(config)``: attention and the MLP, each wrapped in a residual connection, with the norms
  placed by ``config.norm_position``: ``"pre"`` (GPT-2) normalises each sub-layer's input,
  ``"post"`` (GPT-1, the 2017 transformer) normalises after each residual addition.

It does not build the embeddings, the stack of blocks, the final norm or the output layer (the
model does), nor initialise weights the GPT-2 way (the model does; PyTorch's defaults apply here).
Attention itself lives in ``tinygpt.attention``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tinygpt.attention import CausalSelfAttention, KVCache
from tinygpt.config import GPTConfig


def _check_norm_args(n_embd: object, eps: object) -> None:
    if isinstance(n_embd, bool) or not isinstance(n_embd, int) or n_embd < 1:
        raise ValueError(f"n_embd must be a positive integer, got {n_embd!r}")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
        raise ValueError(f"eps must be a positive number, got {eps!r}")


def _check_width(x: object, n_embd: int, who: str) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"{who} expects a torch.Tensor, got {type(x).__name__}")
    if x.ndim == 0 or x.shape[-1] != n_embd:
        raise ValueError(f"{who} normalises vectors of width {n_embd}: the input's last dimension "
                         f"must be {n_embd}, got shape {tuple(x.shape)}")


class LayerNorm(nn.Module):
    """``y = (x - mean) / sqrt(var + eps) * weight + bias`` over the last dimension, ``(..., C)``.

    ``mean`` and ``var`` are those of each vector's ``C`` entries (the biased variance, divided
    by ``C``). ``weight`` starts at ones and ``bias`` at zeros, so a new layer only normalises;
    ``bias=False`` drops the shift.
    """

    def __init__(self, n_embd: int, eps: float = 1e-5, bias: bool = True) -> None:
        super().__init__()
        _check_norm_args(n_embd, eps)
        self.n_embd = n_embd
        self.eps = float(eps)
        self.weight = nn.Parameter(torch.ones(n_embd))  # (C,) scale, gamma
        self.bias = nn.Parameter(torch.zeros(n_embd)) if bias else None  # (C,) shift, beta

    def forward(self, x: Tensor) -> Tensor:
        """Normalise each vector of ``x``, shape ``(..., C)``; returns the same shape.

        One fused kernel, ``F.layer_norm``; it computes what ``explicit`` writes out.
        """
        _check_width(x, self.n_embd, "LayerNorm")
        return F.layer_norm(x, (self.n_embd,), self.weight, self.bias, self.eps)  # (..., C)

    def explicit(self, x: Tensor) -> Tensor:
        """The formula, step by step: the same result as ``forward``, with more operations."""
        _check_width(x, self.n_embd, "LayerNorm")
        mean = x.mean(dim=-1, keepdim=True)  # (..., 1)
        centred = x - mean  # (..., C), mean 0
        var = (centred * centred).mean(dim=-1, keepdim=True)  # (..., 1), two passes: no cancellation
        y = centred * torch.rsqrt(var + self.eps) * self.weight  # (..., C)
        return y + self.bias if self.bias is not None else y

    def extra_repr(self) -> str:
        return f"{self.n_embd}, eps={self.eps}, bias={self.bias is not None}"


class RMSNorm(nn.Module):
    """``y = x / sqrt(mean(x**2) + eps) * weight`` over the last dimension, ``(..., C)``.

    No mean is removed and there is no shift: only each vector's scale is normalised
    (Zhang and Sennrich, 2019). ``weight`` starts at ones.
    """

    def __init__(self, n_embd: int, eps: float = 1e-5) -> None:
        super().__init__()
        _check_norm_args(n_embd, eps)
        self.n_embd = n_embd
        self.eps = float(eps)
        self.weight = nn.Parameter(torch.ones(n_embd))  # (C,) scale

    def forward(self, x: Tensor) -> Tensor:
        """Divide each vector of ``x``, shape ``(..., C)``, by its RMS; returns the same shape.

        One fused kernel, ``F.rms_norm``; it computes what ``explicit`` writes out.
        """
        _check_width(x, self.n_embd, "RMSNorm")
        return F.rms_norm(x, (self.n_embd,), self.weight, self.eps)  # (..., C)

    def explicit(self, x: Tensor) -> Tensor:
        """The formula, step by step: the same result as ``forward``, with more operations."""
        _check_width(x, self.n_embd, "RMSNorm")
        mean_square = (x * x).mean(dim=-1, keepdim=True)  # (..., 1)
        return x * torch.rsqrt(mean_square + self.eps) * self.weight  # (..., C)

    def extra_repr(self) -> str:
        return f"{self.n_embd}, eps={self.eps}"


def make_norm(config: GPTConfig) -> LayerNorm | RMSNorm:
    """The normalisation ``config.norm`` names, of width ``n_embd``, with ``config.norm_eps``.

    LayerNorm gets a bias when ``config.bias`` is true; RMSNorm never has one.
    """
    if config.norm == "layernorm":
        return LayerNorm(config.n_embd, config.norm_eps, bias=config.bias)
    return RMSNorm(config.n_embd, config.norm_eps)  # GPTConfig allows only these two


def relu(x: Tensor) -> Tensor:
    """``max(x, 0)``, element-wise (NaN stays NaN; the slope at 0 is taken as 0)."""
    return torch.where(x <= 0, torch.zeros_like(x), x)


def gelu(x: Tensor) -> Tensor:
    """Exact GELU: ``x * Phi(x)``, with ``Phi`` the standard normal CDF, ``(1 + erf(x/sqrt 2))/2``."""
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def gelu_tanh(x: Tensor) -> Tensor:
    """GPT-2's GELU: ``Phi(x)`` replaced by ``(1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) / 2``."""
    inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)
    return 0.5 * x * (1.0 + torch.tanh(inner))


ACTIVATION_FUNCTIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "gelu_tanh": gelu_tanh,
    "gelu": gelu,
    "relu": relu,
}  # the same names, in the same order, as ``tinygpt.config.ACTIVATIONS``

FAST_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "gelu_tanh": functools.partial(F.gelu, approximate="tanh"),
    "gelu": F.gelu,
    "relu": F.relu,
}  # torch's one-kernel versions of the functions above: the same values, fewer operations


class Activation(nn.Module):
    """The element-wise nonlinearity called ``name``: ``"gelu_tanh"``, ``"gelu"`` or ``"relu"``.

    ``explicit=False`` (the default) applies torch's kernel for it (``F.gelu``, ``F.relu``);
    ``explicit=True`` the formula written out above (``gelu_tanh``, ...): the same values.
    """

    def __init__(self, name: str, *, explicit: bool = False) -> None:
        super().__init__()
        if name not in ACTIVATION_FUNCTIONS:
            raise ValueError(f"activation must be one of {list(ACTIVATION_FUNCTIONS)}, got {name!r}")
        if not isinstance(explicit, bool):
            raise TypeError(f"explicit must be True or False, got {explicit!r}")
        self.name = name
        self.explicit = explicit
        self.fn = (ACTIVATION_FUNCTIONS if explicit else FAST_ACTIVATIONS)[name]

    def forward(self, x: Tensor) -> Tensor:
        return self.fn(x)

    def extra_repr(self) -> str:
        return repr(self.name) + (", explicit=True" if self.explicit else "")


class MLP(nn.Module):
    """Position-wise feed-forward layer: ``(B, T, C) -> (B, T, C)``.

    ``c_fc`` expands to ``config.mlp_width`` (``4C`` by default), ``act`` applies the activation,
    ``c_proj`` contracts back to ``C``, then dropout. Every position is transformed on its own,
    with the same weights; no information moves between positions here.
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise TypeError(f"config must be a GPTConfig, got {type(config).__name__}")
        C, hidden = config.n_embd, config.mlp_width
        self.c_fc = nn.Linear(C, hidden, bias=config.bias)  # expand: C -> 4C
        self.act = Activation(config.activation)
        self.c_proj = nn.Linear(hidden, C, bias=config.bias)  # contract: 4C -> C
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        """``x``: ``(B, T, C)`` (any leading dimensions). Returns the same shape."""
        h = self.act(self.c_fc(x))  # (B, T, 4C)
        return self.dropout(self.c_proj(h))  # (B, T, C)


class Block(nn.Module):
    """One transformer block, ``(B, T, C) -> (B, T, C)``.

    Submodules (GPT-2 names): ``ln_1``, ``attn`` (``CausalSelfAttention``), ``ln_2``, ``mlp``.
    With ``config.norm_position == "pre"``::

        x = x + attn(ln_1(x))
        x = x + mlp(ln_2(x))

    and with ``"post"``::

        x = ln_1(x + attn(x))
        x = ln_2(x + mlp(x))

    The residual branches end in ``attn.c_proj`` and ``mlp.c_proj``: with both zero, a pre-norm
    block is the identity.
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise TypeError(f"config must be a GPTConfig, got {type(config).__name__}")
        self.config = config
        self.pre_norm = config.norm_position == "pre"
        self.ln_1 = make_norm(config)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = make_norm(config)
        self.mlp = MLP(config)

    def forward(self, x: Tensor, cache: KVCache | None = None) -> Tensor:
        """``x``: ``(B, T, C)``. ``cache``: this block's ``KVCache``, passed on to attention."""
        if self.pre_norm:
            x = x + self.attn(self.ln_1(x), cache=cache)  # (B, T, C)
            x = x + self.mlp(self.ln_2(x))  # (B, T, C)
        else:
            x = self.ln_1(x + self.attn(x, cache=cache))  # (B, T, C)
            x = self.ln_2(x + self.mlp(x))  # (B, T, C)
        return x

    def extra_repr(self) -> str:
        return f"norm_position={self.config.norm_position!r}"
