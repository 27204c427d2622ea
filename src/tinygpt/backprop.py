"""Backpropagation written out by hand for a two-layer MLP on torch tensors.

Chapter 3's, beside the scalar engine of ``tinygpt.autograd``.

The network maps a batch of inputs to a distribution over ``V`` classes (next tokens)::

    x (B, D_in) --linear W1, b1--> a (B, D_h) --tanh or relu--> h (B, D_h)
                --linear W2, b2--> logits (B, V) --softmax + cross-entropy with targets (B,)--> loss

``mlp_forward`` computes every intermediate and keeps what the backward pass needs;
``mlp_backward`` then applies the chain rule layer by layer, from the loss back to ``W1``, with
one small function per layer (``cross_entropy_backward``, ``linear_backward``,
``tanh_backward``, ``relu_backward``). No autograd is involved: the formulas are the whole
story, and the tests check them against ``torch.autograd``.

It does not handle deeper networks, other losses or optimisers (``torch.autograd`` and
``torch.optim`` do that for the rest of the book), nor a sequence dimension ``T``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from tinygpt.checks import check_choice, check_ids, check_int, choices

HiddenActivation = Literal["tanh", "relu"]
HIDDEN_ACTIVATIONS = choices(HiddenActivation)


@dataclass(frozen=True)
class TwoLayerMLPConfig:
    """The sizes: D_in inputs, D_h hidden units (``hidden``), V classes, and the activation."""

    d_in: int
    hidden: int
    vocab_size: int
    activation: HiddenActivation = "tanh"

    def __post_init__(self) -> None:
        for name in ("d_in", "hidden", "vocab_size"):
            check_int(getattr(self, name), name)
        check_choice(self.activation, "activation", HIDDEN_ACTIVATIONS)


@dataclass
class TwoLayerMLP:
    """The parameters of the MLP; ``W`` is (inputs, outputs), so a layer computes ``x @ W + b``."""

    config: TwoLayerMLPConfig
    W1: Tensor  # (D_in, D_h)
    b1: Tensor  # (D_h,)
    W2: Tensor  # (D_h, V)
    b2: Tensor  # (V,)

    def params(self) -> dict[str, Tensor]:
        """The four parameter tensors by name, in the order ``W1, b1, W2, b2``."""
        return {"W1": self.W1, "b1": self.b1, "W2": self.W2, "b2": self.b2}


@dataclass
class Forward:
    """The intermediates of one forward pass that the backward pass reads."""

    x: Tensor  # (B, D_in) input
    a: Tensor  # (B, D_h) pre-activation, x @ W1 + b1
    h: Tensor  # (B, D_h) activation(a)
    logits: Tensor  # (B, V)
    probs: Tensor  # (B, V) softmax(logits)
    targets: Tensor  # (B,) class ids
    loss: Tensor  # () mean cross-entropy


def init_mlp(
    config: TwoLayerMLPConfig,
    *,
    generator: torch.Generator | None = None,
    dtype: torch.dtype = torch.float64,
) -> TwoLayerMLP:
    """Random weights: ``W1`` with variance 1/D_in, ``W2`` ten times smaller, zero biases.

    The small output layer makes every logit close to 0 at the start, so every class has
    probability close to 1/V and the initial loss is close to ln V.
    """
    c = config
    W1 = torch.randn(c.d_in, c.hidden, generator=generator, dtype=dtype) / math.sqrt(c.d_in)
    W2 = torch.randn(c.hidden, c.vocab_size, generator=generator, dtype=dtype)
    W2 *= 0.1 / math.sqrt(c.hidden)
    b1, b2 = torch.zeros(c.hidden, dtype=dtype), torch.zeros(c.vocab_size, dtype=dtype)
    return TwoLayerMLP(c, W1, b1, W2, b2)


def cross_entropy(logits: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
    """Mean of -ln softmax(logits)[b, targets[b]] over the batch, and the probabilities (B, V)."""
    shifted = logits - logits.max(dim=1, keepdim=True).values  # (B, V); changes no probability
    log_norm = shifted.exp().sum(dim=1, keepdim=True).log()  # (B, 1)
    log_probs = shifted - log_norm  # (B, V)
    loss = -log_probs[torch.arange(len(targets)), targets].mean()  # ()
    return loss, log_probs.exp()


def cross_entropy_backward(probs: Tensor, targets: Tensor) -> Tensor:
    """d loss / d logits for the mean cross-entropy: (probs - one_hot(targets)) / B, (B, V)."""
    B = probs.shape[0]
    dlogits = probs.clone()  # (B, V)
    dlogits[torch.arange(B), targets] -= 1.0
    return dlogits / B


def linear_backward(dout: Tensor, x: Tensor, W: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """For out = x @ W + b, with dout (B, N_out): dx (B, N_in), dW (N_in, N_out), db (N_out,)."""
    dx = dout @ W.T  # (B, N_out) @ (N_out, N_in) -> (B, N_in)
    dW = x.T @ dout  # (N_in, B) @ (B, N_out) -> (N_in, N_out): a sum of outer products
    db = dout.sum(dim=0)  # (N_out,): the bias is added to every row
    return dx, dW, db


def tanh_backward(dh: Tensor, h: Tensor) -> Tensor:
    """For h = tanh(a): da = dh * (1 - h^2), elementwise, any shape."""
    return dh * (1.0 - h * h)


def relu_backward(dh: Tensor, a: Tensor) -> Tensor:
    """For h = relu(a): da = dh where a > 0, else 0 (also at a = 0, as torch does)."""
    return dh * (a > 0).to(dh.dtype)


def _check_batch(mlp: TwoLayerMLP, x: Tensor, targets: Tensor) -> None:
    c = mlp.config
    if not isinstance(x, Tensor) or x.ndim != 2 or x.shape[1] != c.d_in:
        shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"x must be a tensor of shape (B, {c.d_in}), got {shape}")
    if x.dtype != mlp.W1.dtype:
        raise ValueError(f"x has dtype {x.dtype}, the parameters {mlp.W1.dtype}")
    B = x.shape[0]
    if not isinstance(targets, Tensor) or targets.shape != (B,) or targets.is_floating_point():
        raise ValueError(f"targets must be an integer tensor of shape ({B},), got {targets!r}")
    if x.shape[0] == 0:
        raise ValueError("the batch is empty (B = 0)")
    check_ids(targets, c.vocab_size, name="target")


def mlp_forward(mlp: TwoLayerMLP, x: Tensor, targets: Tensor) -> Forward:
    """The forward pass on a batch: x (B, D_in), integer targets (B,) in [0, V). Plain tensor
    operations, so ``torch.autograd`` can differentiate it too (how the tests check ours)."""
    _check_batch(mlp, x, targets)
    a = x @ mlp.W1 + mlp.b1  # (B, D_in) @ (D_in, D_h) + (D_h,) -> (B, D_h)
    h = a.tanh() if mlp.config.activation == "tanh" else a.relu()  # (B, D_h)
    logits = h @ mlp.W2 + mlp.b2  # (B, D_h) @ (D_h, V) + (V,) -> (B, V)
    loss, probs = cross_entropy(logits, targets)  # (), (B, V)
    return Forward(x, a, h, logits, probs, targets, loss)


def mlp_backward(mlp: TwoLayerMLP, fwd: Forward) -> dict[str, Tensor]:
    """d loss / d parameter for every parameter, named as in ``TwoLayerMLP.params()``, by hand."""
    with torch.no_grad():  # nothing here is recorded for autograd, even if the inputs require grad
        dlogits = cross_entropy_backward(fwd.probs, fwd.targets)  # (B, V)
        dh, dW2, db2 = linear_backward(dlogits, fwd.h, mlp.W2)  # (B, D_h), (D_h, V), (V,)
        if mlp.config.activation == "tanh":
            da = tanh_backward(dh, fwd.h)  # (B, D_h)
        else:
            da = relu_backward(dh, fwd.a)  # (B, D_h)
        _, dW1, db1 = linear_backward(da, fwd.x, mlp.W1)  # dx unused; (D_in, D_h), (D_h,)
    return {"W1": dW1, "b1": db1, "W2": dW2, "b2": db2}
