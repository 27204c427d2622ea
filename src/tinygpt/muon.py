"""Muon, written out: momentum, then the update orthogonalised by a Newton-Schulz iteration.

Chapter 12 builds it.

It handles ``newton_schulz`` (the quintic iteration that maps a matrix ``G = U S V^T`` to about
``U V^T``, in bfloat16 by default, with the coefficients of Keller Jordan's Muon),
``fast_ns_dtype`` (the dtype the iteration runs fastest in on a device: bfloat16 on CUDA; on a CPU
measured once, since bfloat16 is native on some CPUs and emulated, several times slower than
float32, on others), ``adjusted_lr`` (the two
shape scalings ``torch.optim.Muon`` offers), ``adamw_step`` (torch's AdamW update, one tensor),
``Muon``, an optimizer whose parameter groups each use Muon (2-D matrices) or AdamW (anything),
``configure_muon`` (the usual split: Muon for the blocks' weight matrices, AdamW for embeddings,
the output layer, norms and biases) and ``clip_grad_norm`` (scaling every gradient so that their
global norm is at most a bound, as ``torch.nn.utils.clip_grad_norm_`` does). A ``Muon`` whose
groups all use Muon, with the defaults, takes the steps of ``torch.optim.Muon``. It does not pick
the learning rate (``tinygpt.train.lr_at``) or run the training loop.
"""

from __future__ import annotations

import functools
import math
import os
import time
from collections.abc import Iterable

import torch
from torch import Tensor, nn

from tinygpt.checks import check_float, check_instance, check_int

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # (a, b, c): steep at 0, as in Keller Jordan's Muon
NS_STEPS = 5
NS_EPS = 1e-7
ADJUST_LR = (None, "original", "match_rms_adamw")
#: The dtypes Newton-Schulz may run in, by name (``Muon``'s ``ns_dtype``).
NS_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
#: Environment variable that forces the dtype wherever ``ns_dtype`` is left to be chosen (None):
#: ``TINYGPT_NS_DTYPE=float32`` (or ``bfloat16``) skips the measurement.
NS_DTYPE_ENV = "TINYGPT_NS_DTYPE"
#: The matrix ``fast_ns_dtype`` times: the speedrun's MLP weight (width 128, hidden 512).
NS_PROBE_SHAPE = (128, 512)


def newton_schulz(G: Tensor, steps: int = NS_STEPS,
                  coefficients: tuple[float, float, float] = NS_COEFFICIENTS,
                  eps: float = NS_EPS, dtype: torch.dtype = torch.bfloat16) -> Tensor:
    """About ``U V^T`` for the 2-D ``G = U S V^T``, in ``dtype``: ``steps`` rounds of
    ``X <- a X + (b A + c A^2) X`` with ``A = X X^T``, which push every singular value of ``X``
    (scaled to norm 1 first) towards 1 (to roughly 0.7 .. 1.2: fast, not exact)."""
    a, b, c = coefficients
    X = G.to(dtype)  # (m, n); bfloat16 by default, as in torch.optim.Muon
    tall = G.size(0) > G.size(1)
    if tall:  # work on the wide side: A is then the smaller Gram matrix
        X = X.T  # (n, m)
    X = X / X.norm().clamp(min=eps)  # Frobenius norm 1: every singular value <= 1
    for _ in range(steps):
        A = X @ X.T  # (rows, rows)
        B = torch.addmm(A, A, A, beta=b, alpha=c)  # b A + c A A, rounded once to dtype
        X = torch.addmm(X, B, X, beta=a)  # a X + B X: singular values s -> a s + b s^3 + c s^5
    return X.T if tall else X  # (m, n)


def ns_dtype_by_name(name: str | torch.dtype) -> torch.dtype:
    """The dtype of a name in :data:`NS_DTYPES` (or one of those dtypes itself)."""
    if isinstance(name, torch.dtype) and name in NS_DTYPES.values():
        return name
    if isinstance(name, str) and name in NS_DTYPES:
        return NS_DTYPES[name]
    raise ValueError(f"the Newton-Schulz dtype must be one of {sorted(NS_DTYPES)} (or None: "
                     f"chosen by fast_ns_dtype), got {name!r}")


def ns_seconds(dtype: torch.dtype, device: torch.device, shape: tuple[int, int] = NS_PROBE_SHAPE,
               repeats: int = 3) -> float:
    """The best wall time of ``repeats`` calls of ``newton_schulz`` (one step) in ``dtype`` on a
    ``shape`` matrix on ``device``, after one call to warm up."""
    G = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(device)
    best = math.inf
    for i in range(repeats + 1):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        newton_schulz(G, steps=1, dtype=dtype)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i:  # the first call warms up
            best = min(best, time.perf_counter() - start)
    return best


@functools.cache
def measured_ns_dtype(device: torch.device) -> torch.dtype:
    """bfloat16 if ``newton_schulz`` measures faster in it than in float32 on ``device`` (a CPU),
    else float32; measured once per device and process (a few milliseconds where bfloat16 is
    native, about a tenth of a second where it is emulated)."""
    fast = ns_seconds(torch.bfloat16, device) < ns_seconds(torch.float32, device)
    return torch.bfloat16 if fast else torch.float32


def fast_ns_dtype(device: torch.device | str) -> torch.dtype:
    """The dtype Newton-Schulz runs in on ``device`` when the user did not choose one: the
    environment's ``TINYGPT_NS_DTYPE`` if set; bfloat16 on CUDA (Muon's choice: tensor cores);
    on a CPU whichever of bfloat16 and float32 measures faster (``measured_ns_dtype``: native
    bfloat16, e.g. AVX-512 BF16 or AMX, is faster; emulated, e.g. on AVX2 only, about 6x slower);
    float32 on other devices."""
    forced = os.environ.get(NS_DTYPE_ENV)
    if forced:
        return ns_dtype_by_name(forced)
    device = torch.device(device)
    if device.type == "cuda":
        return torch.bfloat16
    if device.type == "cpu":
        return measured_ns_dtype(torch.device("cpu"))
    return torch.float32


def adjusted_lr(lr: float, shape: torch.Size, adjust_lr_fn: str | None) -> float:
    """``torch.optim.Muon``'s scalings: ``None``/``"original"`` (Keller Jordan's)
    ``lr * sqrt(max(1, rows / cols))``; ``"match_rms_adamw"`` (Moonshot's)
    ``lr * 0.2 * sqrt(max(rows, cols))``, which gives the update AdamW's RMS, so that AdamW's
    learning rate and weight decay carry over."""
    rows, cols = shape[:2]
    if adjust_lr_fn == "match_rms_adamw":
        return lr * 0.2 * math.sqrt(max(rows, cols))
    return lr * math.sqrt(max(1, rows / cols))


def adamw_step(p: Tensor, grad: Tensor, state: dict, lr: float, betas: tuple[float, float],
               eps: float, weight_decay: float) -> None:
    """One AdamW update of ``p`` in place, the arithmetic of torch's single-tensor AdamW."""
    if not state:
        state.update(step=torch.tensor(0.0), exp_avg=torch.zeros_like(p),
                     exp_avg_sq=torch.zeros_like(p))
    beta1, beta2 = betas
    state["step"] += 1
    step = state["step"].item()
    p.mul_(1 - lr * weight_decay)  # decoupled weight decay
    state["exp_avg"].lerp_(grad, 1 - beta1)  # m <- beta1 m + (1 - beta1) g
    state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)  # v <- ... g^2
    denom = (state["exp_avg_sq"].sqrt() / math.sqrt(1 - beta2**step)).add_(eps)
    p.addcdiv_(state["exp_avg"], denom, value=-lr / (1 - beta1**step))


class Muon(torch.optim.Optimizer):
    """Muon for the groups with ``use_muon=True`` (the default; 2-D parameters only), AdamW
    (``betas``, ``adam_eps``) for the others; ``weight_decay`` is decoupled in both.

    A Muon step: ``buf <- mu buf + (1 - mu) g``; ``u = (1 - mu) g + mu buf`` (Nesterov) or
    ``buf``; ``p <- p (1 - lr wd) - adjusted_lr(lr) newton_schulz(u)``. The defaults are
    ``torch.optim.Muon``'s, but for ``ns_dtype``, the dtype Newton-Schulz runs in:
    ``"bfloat16"`` (``torch.optim.Muon``'s), ``"float32"``, or None (the default): chosen for
    each parameter's device by ``fast_ns_dtype`` (bfloat16 on CUDA and on CPUs with native
    bfloat16, float32 where bfloat16 is emulated; ``TINYGPT_NS_DTYPE`` forces it).
    """

    def __init__(self, params: Iterable, lr: float = 1e-3, weight_decay: float = 0.1,
                 momentum: float = 0.95, nesterov: bool = True,
                 ns_coefficients: tuple[float, float, float] = NS_COEFFICIENTS,
                 eps: float = NS_EPS, ns_steps: int = NS_STEPS, adjust_lr_fn: str | None = None,
                 use_muon: bool = True, betas: tuple[float, float] = (0.9, 0.999),
                 adam_eps: float = 1e-8, ns_dtype: str | torch.dtype | None = None) -> None:
        check_float(lr, "lr", 0.0)
        if ns_dtype is not None:  # kept by name: a checkpoint saves the groups as JSON
            ns_dtype = str(ns_dtype_by_name(ns_dtype)).removeprefix("torch.")
        check_float(weight_decay, "weight_decay", 0.0)
        check_float(momentum, "momentum", 0.0, 1.0, high_open=True)
        check_int(ns_steps, "ns_steps", 0, 99)
        if adjust_lr_fn not in ADJUST_LR:
            raise ValueError(f"adjust_lr_fn must be one of {list(ADJUST_LR)}, got "
                             f"{adjust_lr_fn!r}")
        defaults = {"lr": lr, "weight_decay": weight_decay, "momentum": momentum,
                    "nesterov": nesterov, "ns_coefficients": ns_coefficients, "eps": eps,
                    "ns_steps": ns_steps, "adjust_lr_fn": adjust_lr_fn, "use_muon": use_muon,
                    "betas": betas, "adam_eps": adam_eps, "ns_dtype": ns_dtype}
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                if group["use_muon"] and p.ndim != 2:
                    raise ValueError(f"Muon updates 2-D matrices only, got a parameter of shape "
                                     f"{tuple(p.shape)}; give it a group with use_muon=False "
                                     "(AdamW)")

    @torch.no_grad()
    def step(self, closure=None):  # torch.optim.Optimizer's signature
        """One update of every parameter that has a gradient."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, wd = group["lr"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if not group["use_muon"]:
                    adamw_step(p, p.grad, self.state[p], lr, tuple(group["betas"]),
                               group["adam_eps"], wd)
                    continue
                self._muon_step(p, p.grad, group)
        return loss

    def _muon_step(self, p: Tensor, g: Tensor, group: dict) -> None:
        state, mu = self.state[p], group["momentum"]
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(g)
        buf = state["momentum_buffer"]
        buf.lerp_(g, 1 - mu)  # (m, n): buf <- mu buf + (1 - mu) g
        u = g.lerp(buf, mu) if group["nesterov"] else buf  # look one momentum step ahead
        name = group.get("ns_dtype")  # absent from a group saved before it existed
        dtype = fast_ns_dtype(p.device) if name is None else ns_dtype_by_name(name)
        ortho = newton_schulz(u, group["ns_steps"], tuple(group["ns_coefficients"]), group["eps"],
                              dtype)
        p.mul_(1 - group["lr"] * group["weight_decay"])  # decoupled weight decay
        p.add_(ortho, alpha=-adjusted_lr(group["lr"], p.shape, group["adjust_lr_fn"]))


def configure_muon(model: nn.Module, lr: float, weight_decay: float,
                   betas: tuple[float, float], ns_dtype: str | torch.dtype | None = None,
                   adamw_lr_scale: float = 1.0) -> Muon:
    """The usual split of a ``GPT``: Muon (``adjust_lr_fn="match_rms_adamw"``, so one learning
    rate serves both) for the 2-D weights of the blocks (``transformer.h``), AdamW for the rest:
    embeddings and an untied ``lm_head`` with ``weight_decay``, norms and biases without.
    ``ns_dtype``: ``Muon``'s (None: the fast one for the device). ``adamw_lr_scale``: each
    AdamW group's ``lr_scale`` (the training loop sets a group's rate to the schedule's times
    its ``lr_scale``) and its starting rate ``lr * adamw_lr_scale``."""
    check_instance(model, nn.Module, "model")
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]  # tied: once
    matrices = [p for n, p in named if n.startswith("transformer.h.") and p.ndim == 2]
    chosen = {id(p) for p in matrices}
    rest = [p for _, p in named if id(p) not in chosen]
    check_float(adamw_lr_scale, "adamw_lr_scale", 0.0, low_open=True)
    adamw = {"use_muon": False, "lr_scale": adamw_lr_scale, "lr": lr * adamw_lr_scale}
    groups = [{"params": matrices, "use_muon": True, "lr_scale": 1.0},
              {"params": [p for p in rest if p.ndim >= 2], **adamw},
              {"params": [p for p in rest if p.ndim < 2], **adamw, "weight_decay": 0.0}]
    return Muon(groups, lr=lr, weight_decay=weight_decay, adjust_lr_fn="match_rms_adamw",
                betas=betas, ns_dtype=ns_dtype)


def clip_grad_norm(parameters: Iterable[Tensor], max_norm: float) -> Tensor:
    """Scale the gradients of ``parameters`` in place so that their global L2 norm (the norm of
    all of them as one vector) is at most ``max_norm``; return the norm before clipping."""
    check_float(max_norm, "max_norm", 0.0, low_open=True)
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.tensor(0.0)
    norms = torch.stack([torch.linalg.vector_norm(g) for g in grads])  # one per tensor
    total = torch.linalg.vector_norm(norms)  # sqrt of the sum of their squares
    scale = (max_norm / (total + 1e-6)).clamp(max=1.0)  # 1: nothing to clip
    for g in grads:
        g.mul_(scale)
    return total
