"""The exercises of chapters 8 and 9: one AdamW step and the learning-rate schedule; top-k and
top-p (nucleus) filtering. AdamW is graded against ``torch.optim.AdamW`` itself, the schedule
and top-p against the package's functions, top-k against nanoGPT's rule.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from tinygpt import sample, train
from tinygpt.config import TrainConfig
from tinygpt.exercises.grading import Case, Exercise, Mistake
from tinygpt.exercises.inputs import DTYPES, Draw

# -- chapter 8 ---------------------------------------------------------------------------------

ADAMW_ARGS = ("param", "grad", "m", "v", "t", "lr", "beta1", "beta2", "eps", "weight_decay")


def adamw_cases() -> list[Case]:
    draw = Draw(801)
    cases = []
    for i in range(24):
        shape, dtype = (draw.integer(1, 4), draw.integer(1, 4)), draw.choice(DTYPES)
        t = draw.choice([1, 1, 2, 3, 10, 1000])
        grad_scale = 1e-8 if i % 6 == 5 else draw.choice([0.1, 1.0, 10.0])
        first = t == 1 and draw.integer(0, 1) == 0  # a fresh state: m = v = 0
        m = torch.zeros(shape, dtype=dtype) if first else draw.normal(*shape, dtype=dtype,
                                                                      scale=grad_scale)
        v = torch.zeros(shape, dtype=dtype) if first else draw.uniform(
            *shape, dtype=dtype, high=grad_scale ** 2)
        lr, wd = draw.choice([1e-3, 0.01, 0.1]), draw.choice([0.0, 0.1, 0.5])
        eps = 1e-8 if grad_scale == 1e-8 else draw.choice([1e-8, 1e-6])
        cases.append(Case((draw.normal(*shape, dtype=dtype),
                           draw.normal(*shape, dtype=dtype, scale=grad_scale), m, v, t, lr,
                           draw.choice([0.9, 0.8]), draw.choice([0.999, 0.95]), eps, wd),
                          note=f"t={t}, lr={lr}, weight_decay={wd}, gradients about "
                               f"{grad_scale:g}, {dtype}"))
    return cases


def adamw_reference(param: Tensor, grad: Tensor, m: Tensor, v: Tensor, t: int, lr: float,
                    beta1: float, beta2: float, eps: float, weight_decay: float
                    ) -> tuple[Tensor, Tensor, Tensor]:
    """One step of ``torch.optim.AdamW`` from the state ``(m, v)`` after ``t - 1`` steps."""
    p = param.clone().requires_grad_(True)
    optimizer = torch.optim.AdamW([p], lr=lr, betas=(beta1, beta2), eps=eps,
                                  weight_decay=weight_decay, foreach=False)
    optimizer.state[p] = {"step": torch.tensor(float(t - 1)), "exp_avg": m.clone(),
                          "exp_avg_sq": v.clone()}
    p.grad = grad.clone()
    optimizer.step()
    state = optimizer.state[p]
    return p.detach(), state["exp_avg"], state["exp_avg_sq"]


def adamw_with(param: Tensor, grad: Tensor, m: Tensor, v: Tensor, t: int, lr: float,
               beta1: float, beta2: float, eps: float, weight_decay: float, *,
               correct: bool = True, l2: bool = False, eps_inside: bool = False,
               t_shift: int = 0, decay_after: bool = False, swap_betas: bool = False,
               plain_v: bool = False, decay_lr: bool = True, hats: bool = False
               ) -> tuple[Tensor, Tensor, Tensor]:
    """AdamW with one knob turned."""
    if l2:
        grad = grad + weight_decay * param
    elif not decay_after:
        param = param * (1 - (lr if decay_lr else 1.0) * weight_decay)
    m = beta1 * grad + (1 - beta1) * m if swap_betas else beta1 * m + (1 - beta1) * grad
    v = beta2 * v + (1 - beta2) * (grad if plain_v else grad * grad)
    step = t + t_shift
    m_hat = m / (1 - beta1 ** step) if correct else m
    v_hat = v / (1 - beta2 ** step) if correct else v
    denominator = (v_hat + eps).sqrt() if eps_inside else v_hat.sqrt() + eps
    param = param - lr * m_hat / denominator
    if decay_after and not l2:
        param = param * (1 - lr * weight_decay)
    return (param, m_hat, v_hat) if hats else (param, m, v)


def adamw_mistake(**knob: Any):
    def step(*args):
        return adamw_with(*args, **knob)
    return step


def lr_cases() -> list[Case]:
    cases = []
    for warmup, max_iters in [(10, 100), (0, 50), (100, 2000), (1, 3)]:
        for step in sorted({0, 1, warmup - 1, warmup, warmup + 1, (warmup + max_iters) // 2,
                            max_iters - 1, max_iters, max_iters + 5}):
            if step >= 0:
                cases.append(Case((step, 1e-3, 1e-4, warmup, max_iters),
                                  note=f"step {step} of {max_iters}, warm-up {warmup}"))
    return cases


def lr_reference(step: int, learning_rate: float, min_lr: float, warmup_iters: int,
                 max_iters: int) -> float:
    config = TrainConfig(learning_rate=learning_rate, min_lr=min_lr, warmup_iters=warmup_iters,
                         max_iters=max_iters)
    return train.lr_at(step, config)


def lr_with(step: int, lr: float, min_lr: float, warmup: int, max_iters: int, *,
            from_zero: bool = False, floor: float | None = None, whole_run: bool = False,
            clamp: bool = True, through: bool = False) -> float:
    """The schedule with one knob turned."""
    if step < warmup or (through and step <= warmup):
        return lr * (step if from_zero else step + 1) / warmup
    if step >= max_iters and clamp:
        return min_lr
    low = min_lr if floor is None else floor
    ratio = step / max_iters if whole_run else (step - warmup) / (max_iters - warmup)
    return low + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - low)


def lr_mistake(**knob: Any):
    def schedule(step: int, lr: float, min_lr: float, warmup: int, max_iters: int) -> float:
        return lr_with(step, lr, min_lr, warmup, max_iters, **knob)
    return schedule


# -- chapter 9 ---------------------------------------------------------------------------------


def filter_cases(seed: int, params: list) -> list[Case]:
    """Logits with ties and -inf among them, and random ones, each with one of ``params``."""
    cases = []
    for dtype in DTYPES:
        cases += [Case((torch.tensor([[1.0, 3.0, 2.0, 0.5, 2.5]], dtype=dtype), params[0]),
                       note=f"one row, {dtype}"),
                  Case((torch.tensor([1.0, 2.0, 2.0, 2.0, 0.0], dtype=dtype), params[1]),
                       note=f"ties, {dtype}"),
                  Case((torch.tensor([[0.0, float("-inf"), 4.0, 1.0]], dtype=dtype),
                        params[0]), note=f"a -inf logit, {dtype}"),
                  Case((torch.tensor([[7.0]], dtype=dtype), params[-1]),
                       note=f"a vocabulary of 1, {dtype}")]
    draw = Draw(seed)
    for _ in range(30):
        V, dtype = draw.integer(2, 9), draw.choice(DTYPES)
        shape = (*draw.batch_shape(), V)
        cases.append(Case((draw.normal(*shape, dtype=dtype, scale=draw.choice([1.0, 3.0])),
                           draw.choice(params)), note=f"random, shape {shape}, {dtype}"))
    return cases


def top_k_cases() -> list[Case]:
    cases = [c for c in filter_cases(901, [2, 2, 3, 1]) if c.args[1] <= c.args[0].shape[-1]]
    cases += [Case((torch.tensor([[3.0, 1.0, 2.0]]), 3), note="k = V")]
    return cases


def top_k_reference(logits: Tensor, k: int) -> Tensor:
    """nanoGPT's rule: -inf below the k-th largest value; ties with it are kept."""
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]  # (..., 1)
    return logits.masked_fill(logits < kth, float("-inf"))


def top_k_with(logits: Tensor, k: int, shift: int = 0, fill: float = float("-inf"),
               largest: bool = True, strict: bool = False) -> Tensor:
    """Top-k with one knob turned."""
    kk = min(max(k + shift, 1), logits.shape[-1])
    kth = torch.topk(logits, kk, dim=-1, largest=largest).values[..., -1:]
    drop = (logits <= kth if strict else logits < kth) if largest else logits > kth
    return logits.masked_fill(drop, fill)


def top_k_exact(logits: Tensor, k: int) -> Tensor:
    values, indices = torch.topk(logits, k, dim=-1)
    return torch.full_like(logits, float("-inf")).scatter(-1, indices, values)


def top_p_cases() -> list[Case]:
    cases = filter_cases(902, [0.5, 0.9, 0.7, 0.3])
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64)
    cases += [Case((probs.log(), 0.6), note="p = 0.6: 0.5 + 0.3 crosses it"),
              Case((probs.log()[[2, 0, 3, 1]], 0.6), note="the same, in another order"),
              Case((probs.log(), 0.3), note="p below the top probability"),
              Case((probs.log(), 1.0), note="p = 1: keep everything")]
    return cases


def top_p_with(logits: Tensor, p: float, *, crossing: bool = True, ascending: bool = False,
               on_logits: bool = False, scatter: bool = True, fill: float = float("-inf")
               ) -> Tensor:
    """Top-p with one knob turned."""
    weights = logits if on_logits else torch.softmax(logits, dim=-1)
    ordered, order = torch.sort(weights, dim=-1, descending=not ascending)
    total = torch.cumsum(ordered, dim=-1)
    keep = (total - ordered < p) if crossing else (total <= p)
    if not scatter:
        return torch.sort(logits, dim=-1, descending=True).values.masked_fill(~keep, fill)
    keep = torch.zeros_like(keep).scatter(-1, order, keep)
    return logits.masked_fill(~keep, fill)


EXERCISES = [
    Exercise(
        "adamw_step", 8, "adamw_step",
        "adamw_step(param, grad, m, v, t, lr, beta1, beta2, eps, weight_decay) -> (param, m, v)",
        "one step of torch.optim.AdamW's rule, t counted from 1 (tensors: param, grad, m, v)",
        adamw_reference, adamw_cases, names=ADAMW_ARGS, parts=("param", "m", "v"),
        may_change=("param", "m", "v"), mistakes=(
            Mistake("bias correction is missing: divide m by 1 - beta1**t and v by 1 - "
                    "beta2**t", adamw_mistake(correct=False)),
            Mistake("AdamW's decay is decoupled: param -= lr * weight_decay * param, not "
                    "weight_decay * param added to the gradient (that is Adam with L2)",
                    adamw_mistake(l2=True)),
            Mistake("eps is added after the square root: m_hat / (sqrt(v_hat) + eps)",
                    adamw_mistake(eps_inside=True)),
            Mistake("t is already counted from 1: use beta1**t, not beta1**(t + 1)",
                    adamw_mistake(t_shift=1)),
            Mistake("t is counted from 1: the first step uses beta1**1 (yours divides by 1 - "
                    "beta1**0 = 0)", adamw_mistake(t_shift=-1)),
            Mistake("decay the parameter before the Adam update, as torch does: param * (1 - "
                    "lr * weight_decay), then the step", adamw_mistake(decay_after=True)),
            Mistake("m = beta1 * m + (1 - beta1) * grad: beta1 weighs the old average",
                    adamw_mistake(swap_betas=True)),
            Mistake("v averages the squared gradient, grad * grad", adamw_mistake(plain_v=True)),
            Mistake("the decay is scaled by the learning rate: param * (1 - lr * weight_decay), "
                    "not (1 - weight_decay)", adamw_mistake(decay_lr=False)),
            Mistake("the state to return is m and v themselves: m_hat and v_hat are corrected "
                    "for this step only (the next step corrects m again)",
                    adamw_mistake(hats=True)),
        )),
    Exercise(
        "lr_at", 8, "lr_at",
        "lr_at(step: int, learning_rate: float, min_lr: float, warmup_iters: int, max_iters: "
        "int) -> float",
        "linear warm-up, then a cosine from learning_rate down to min_lr at max_iters",
        lr_reference, lr_cases,
        names=("step", "learning_rate", "min_lr", "warmup_iters", "max_iters"), mistakes=(
            Mistake("step 0 already gets learning_rate / warmup_iters: (step + 1) / "
                    "warmup_iters", lr_mistake(from_zero=True)),
            Mistake("the cosine ends at min_lr, not 0: min_lr + 0.5 (1 + cos(pi r)) (lr - "
                    "min_lr)", lr_mistake(floor=0.0)),
            Mistake("the cosine's progress starts after the warm-up: r = (step - warmup) / "
                    "(max_iters - warmup)", lr_mistake(whole_run=True)),
            Mistake("from max_iters on the rate stays at min_lr (the cosine would climb back)",
                    lr_mistake(clamp=False)),
            Mistake("the warm-up is the steps below warmup_iters: step < warmup_iters, not <= "
                    "(step warmup_iters already starts the cosine, at learning_rate)",
                    lr_mistake(through=True)),
        )),
    Exercise(
        "top_k", 9, "top_k",
        "top_k(logits: Tensor (..., V), k: int) -> Tensor (..., V)",
        "-inf below the k-th largest logit of each row (ties with it kept)",
        top_k_reference, top_k_cases, names=("logits", "k"), mistakes=(
            Mistake("the k-th largest logit itself is kept: drop the logits < the k-th "
                    "largest, not <=", lambda x, k: top_k_with(x, k, strict=True)),
            Mistake("ties with the k-th largest logit are kept (nanoGPT's rule): torch.topk's "
                    "indices keep exactly k", top_k_exact),
            Mistake("off by one: the threshold is the k-th largest, topk(logits, k).values[..., "
                    "-1]", lambda x, k: top_k_with(x, k, shift=1)),
            Mistake("off by one: the threshold is the k-th largest, not the (k-1)-th",
                    lambda x, k: top_k_with(x, k, shift=-1)),
            Mistake("filtered logits must be -inf (probability 0 after softmax), not 0",
                    lambda x, k: top_k_with(x, k, fill=0.0)),
            Mistake("keep the largest logits, not the smallest",
                    lambda x, k: top_k_with(x, k, largest=False)),
        )),
    Exercise(
        "top_p_filter", 9, "top_p",
        "top_p(logits: Tensor (..., V), p: float) -> Tensor (..., V)",
        "keep the smallest set of likeliest tokens whose probability reaches p; -inf elsewhere",
        sample.top_p_filter, top_p_cases, names=("logits", "p"), mistakes=(
            Mistake("the token whose probability crosses p is dropped: keep a token while the "
                    "mass of the tokens before it is below p", lambda x, p: top_p_with(
                        x, p, crossing=False)),
            Mistake("sort the probabilities in descending order: the likeliest are kept",
                    lambda x, p: top_p_with(x, p, ascending=True)),
            Mistake("accumulate probabilities (softmax of the logits), not the logits",
                    lambda x, p: top_p_with(x, p, on_logits=True)),
            Mistake("put the kept logits back in the tokens' order (scatter with the sort's "
                    "indices)", lambda x, p: top_p_with(x, p, scatter=False)),
            Mistake("filtered logits must be -inf (probability 0 after softmax), not 0",
                    lambda x, p: top_p_with(x, p, fill=0.0)),
        )),
]
