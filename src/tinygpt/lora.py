"""LoRA: fine-tune a model by learning a small low-rank change to some of its weights.

Chapter 14 builds it; ``tinygpt finetune`` uses it.

Full fine-tuning updates every weight. LoRA (Hu et al., 2021) freezes them and learns, for a
chosen linear layer ``y = x W^T + b`` with ``W`` of shape ``(out, in)``, a change of rank ``r``:

    y = x W^T + b + (alpha / r) * x A^T B^T,    A: (r, in),  B: (out, r)

so the layer's effective weight is ``W + (alpha / r) B A``. Only ``A`` and ``B`` are trained:
``r (in + out)`` numbers instead of ``in * out``. ``B`` starts at zero, so the model starts
exactly where the pre-trained one was; ``A`` starts random (as ``nn.Linear`` initialises its
weight), so the first gradients of ``B`` are not zero. ``alpha / r`` keeps the size of the
change comparable when ``r`` changes.

``LoRALinear`` wraps one ``nn.Linear``; ``add_lora`` wraps the layers of a model whose names
end in one of ``targets`` and freezes everything else; ``merge_lora`` folds every change back
into a plain ``nn.Linear`` (``W + (alpha / r) B A``), so the fine-tuned model runs as fast as
the original and saves as an ordinary state dict.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from tinygpt.checks import check_float, check_instance, check_int

TARGETS = ("c_attn", "c_proj", "c_fc")  # the GPT's linear layers, all but the output layer


class LoRALinear(nn.Module):
    """A frozen ``nn.Linear`` (``base``) plus a trainable change of rank ``rank``, scaled by
    ``alpha / rank`` (``alpha`` defaults to ``rank``: a scale of 1)."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float | None = None) -> None:
        super().__init__()
        check_instance(base, nn.Linear, "base")
        check_int(rank, "rank", 1, min(base.in_features, base.out_features))
        self.rank = rank
        self.alpha = float(rank) if alpha is None else check_float(alpha, "alpha", 0.0,
                                                                   low_open=True)
        self.base = base.requires_grad_(False)
        device, dtype = base.weight.device, base.weight.dtype
        self.A = nn.Parameter(torch.empty(rank, base.in_features, device=device, dtype=dtype))
        self.B = nn.Parameter(torch.zeros(base.out_features, rank, device=device, dtype=dtype))
        nn.init.kaiming_uniform_(self.A, a=math.sqrt(5))  # as nn.Linear initialises a weight

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def forward(self, x: Tensor) -> Tensor:  # A: (r, in), B: (out, r)
        return self.base(x) + (x @ self.A.T @ self.B.T) * self.scale  # (..., out)

    def merged_weight(self) -> Tensor:
        """The effective weight ``W + (alpha / r) B A``, shape ``(out, in)``."""
        return self.base.weight + self.scale * (self.B @ self.A)

    def merge(self) -> nn.Linear:
        """A plain ``nn.Linear`` that computes what this layer computes."""
        merged = nn.Linear(self.base.in_features, self.base.out_features,
                           bias=self.base.bias is not None, device=self.base.weight.device,
                           dtype=self.base.weight.dtype)
        with torch.no_grad():
            merged.weight.copy_(self.merged_weight())
            if self.base.bias is not None:
                merged.bias.copy_(self.base.bias)
        return merged

    def extra_repr(self) -> str:
        return f"rank={self.rank}, alpha={self.alpha:g}"


def add_lora(model: nn.Module, rank: int, alpha: float | None = None,
             targets: tuple[str, ...] = TARGETS) -> list[str]:
    """Freeze every parameter of ``model`` and wrap each ``nn.Linear`` whose name ends in one of
    ``targets`` in a ``LoRALinear`` (in place). Returns the wrapped layers' names; an error if
    there are none."""
    check_instance(model, nn.Module, "model")
    model.requires_grad_(False)
    chosen = [(name, module) for name, module in model.named_modules()
              if isinstance(module, nn.Linear) and name.rsplit(".", 1)[-1] in targets]
    if not chosen:
        raise ValueError(f"no nn.Linear of the model is named {' or '.join(targets)}")
    for name, module in chosen:
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, LoRALinear(module, rank, alpha))
    return [name for name, _ in chosen]


def merge_lora(model: nn.Module) -> nn.Module:
    """Replace every ``LoRALinear`` of ``model`` by its merged ``nn.Linear`` (in place) and
    return ``model``: same outputs, no LoRA left."""
    check_instance(model, nn.Module, "model")
    wrapped = [name for name, module in model.named_modules() if isinstance(module, LoRALinear)]
    for name in wrapped:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        setattr(parent, child, getattr(parent, child).merge())
    return model


def trainable_parameters(model: nn.Module) -> int:
    """How many numbers of ``model`` an optimizer would train (``requires_grad``)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
