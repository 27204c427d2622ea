"""The exercises of chapter 15: the targets of a conversation with the prompt masked, and the
DPO loss. Graded against the package's own functions (``tinygpt.chat``, ``tinygpt.dpo``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from tinygpt.chat import IGNORE, reply_targets
from tinygpt.dpo import dpo_loss
from tinygpt.exercises.grading import Case, Exercise, Mistake
from tinygpt.exercises.inputs import DTYPES, Draw

DPO_ARGS = ("policy_chosen", "policy_rejected", "reference_chosen", "reference_rejected",
            "beta")


def targets_cases() -> list[Case]:
    cases = [Case((torch.tensor([5, 6, 7, 8, 9]), 3), note="T = 5, a prompt of 3"),
             Case((torch.tensor([5, 6]), 1), note="a prompt of one token, a reply of one"),
             Case((torch.tensor([1, 2, 3, 4]), 3), note="a reply of one token")]
    draw = Draw(1501)
    for _ in range(20):
        n = draw.integer(2, 40)
        cases.append(Case((torch.tensor(draw.ids(n, 73)), draw.integer(1, n - 1)),
                          note="random"))
    return cases


def targets_reference(ids: Tensor, prompt_length: int) -> Tensor:
    return torch.tensor(reply_targets(ids.tolist(), prompt_length))


def masked(ids: Tensor, prompt_length: int, shift: int = 1, fill: int = IGNORE,
           count: int | None = None) -> Tensor:
    """Targets made with a knob turned: no shift, another fill, another number masked."""
    targets = ids[shift:].clone()
    targets[:prompt_length - 1 if count is None else count] = fill
    return targets


def dpo_cases() -> list[Case]:
    draw = Draw(1502)
    cases = [Case(tuple(torch.zeros(3, dtype=torch.float64) for _ in range(4)) + (0.1,),
                  note="the policy is the reference: log 2"),
             Case((torch.tensor([-200.0, 3.0]), torch.zeros(2), torch.zeros(2), torch.zeros(2),
                   1.0), note="a margin of -200: sigmoid underflows to 0 in float32")]
    for _ in range(20):
        n, dtype = draw.integer(1, 8), draw.choice(DTYPES)
        values = tuple(draw.normal(n, dtype=dtype) * 5 - 30 for _ in range(4))  # log-probs
        cases.append(Case(values + (draw.choice([0.05, 0.1, 0.5, 1.0]),), note=f"B = {n}"))
    return cases


EXERCISES = [
    Exercise(
        "reply_targets", 15, "reply_targets",
        "reply_targets(ids: Tensor (T,), prompt_length: int) -> Tensor (T - 1,)",
        "the next-token targets ids[1:], with the targets still in the prompt set to -100",
        targets_reference, targets_cases, names=("ids", "prompt_length"), mistakes=(
            Mistake("position t predicts ids[t + 1]: the targets are ids[1:], one shorter",
                    lambda ids, p: masked(ids, p, shift=0)),
            Mistake("only prompt_length - 1 targets are prompt: the target at position "
                    "prompt_length - 1 is the reply's first token",
                    lambda ids, p: masked(ids, p, count=p)),
            Mistake("mask with -100 (cross_entropy's ignore_index), not 0: 0 is a token id",
                    lambda ids, p: masked(ids, p, fill=0)),
        )),
    Exercise(
        "dpo_loss", 15, "dpo_loss",
        "dpo_loss(policy_chosen, policy_rejected, reference_chosen, reference_rejected: "
        "Tensor (B,), beta: float) -> Tensor ()",
        "the mean of -log sigmoid(beta ((pc - rc) - (pr - rr))) over the pairs",
        lambda pc, pr, rc, rr, beta: dpo_loss(pc, pr, rc, rr, beta), dpo_cases,
        names=DPO_ARGS, mistakes=(
            Mistake("subtract the reference's log-probabilities: the margin is "
                    "(pc - rc) - (pr - rr)",
                    lambda pc, pr, rc, rr, beta: -F.logsigmoid(beta * (pc - pr)).mean()),
            Mistake("the chosen reply's term comes first: (pc - rc) - (pr - rr)",
                    lambda pc, pr, rc, rr, beta:
                    -F.logsigmoid(beta * ((pr - rr) - (pc - rc))).mean()),
            Mistake("beta multiplies the margin inside the sigmoid",
                    lambda pc, pr, rc, rr, beta:
                    -beta * F.logsigmoid((pc - rc) - (pr - rr)).mean()),
            Mistake("log(sigmoid(x)) underflows for a large negative margin: use "
                    "F.logsigmoid (or -softplus(-x))",
                    lambda pc, pr, rc, rr, beta:
                    -torch.log(torch.sigmoid(beta * ((pc - rc) - (pr - rr)))).mean()),
        )),
]
