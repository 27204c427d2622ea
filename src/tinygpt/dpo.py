"""Direct preference optimisation (DPO), written out, with a preference that code computes.

Chapter 15 builds it; ``tinygpt.book.preferences`` and ``tinygpt finetune`` run it.

DPO fine-tunes a *policy* on pairs of replies to one prompt, one *chosen* and one *rejected*,
against a frozen copy of the model it starts from, the *reference*. With ``log π(y|x)`` the
summed log-probability of the reply's tokens under the policy and ``log π_ref(y|x)`` under the
reference, the loss of a pair is::

    -log σ(β [(log π(chosen) - log π_ref(chosen)) - (log π(rejected) - log π_ref(rejected))])

It is ``log 2`` while the policy is the reference; it falls as the policy raises the chosen
reply's probability relative to the reference more than the rejected one's. ``β`` sets how far
the policy may move from the reference for a given preference: a small ``β`` needs a larger
change of log-probabilities to reach the same loss.

The preference here is not a person's judgement but a rule a reader can check: *a reply whose
lines come closer to ten syllables is preferred* (``metre_distance``), the blank verse most of
the plays are written in. Syllables are counted by a rough rule (``syllables``: groups of
vowels, a final silent ``e`` dropped), right for most words and wrong for some ("poem",
"Ophelia"). What DPO learns is to please that rule, nothing more.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tinygpt.chat import (
    END,
    IGNORE,
    Conversation,
    batch_replies,
    ends_turn,
    has_chat_template,
    prompt,
    stays_in_role,
)
from tinygpt.checks import check_float, check_instance
from tinygpt.config import TrainConfig
from tinygpt.model import GPT
from tinygpt.tokenizer import CharTokenizer
from tinygpt.train import configure_optimizer, lr_at

_WORD = re.compile(r"[a-z']+")
_VOWELS = re.compile(r"[aeiouy]+")


def syllables(word: str) -> int:
    """A rough count of a word's syllables: its groups of vowels (``y`` counts), less a final
    silent ``e`` (not in ``-le`` or ``-ee``); at least 1 for a word with a letter."""
    check_instance(word, str, "word")
    word = word.lower().strip("'")
    if not re.search("[a-z]", word):
        return 0
    count = len(_VOWELS.findall(word))
    if word.endswith("e") and not word.endswith(("le", "ee")) and count > 1:
        count -= 1
    return max(count, 1)


def line_syllables(line: str) -> int:
    """The syllables of the words of one line."""
    return sum(syllables(w) for w in _WORD.findall(line.lower()))


def metre_distance(reply: str) -> float:
    """How far the reply's lines are from ten syllables: the mean over its non-empty lines of
    ``|syllables - 10|`` (``END`` ignored); 10.0 for a reply with no words."""
    check_instance(reply, str, "reply")
    lines = [line for line in reply.removesuffix(END).split("\n") if _WORD.search(line.lower())]
    if not lines:
        return 10.0
    return sum(abs(line_syllables(line) - 10) for line in lines) / len(lines)


# --- the loss ----------------------------------------------------------------------------------

def sequence_log_probs(model: nn.Module, inputs: Tensor, targets: Tensor) -> Tensor:
    """``(B,)``: for each row, the sum of ``log p(target)`` over its targets that are not
    ``IGNORE`` (the reply's tokens, ``tinygpt.chat.batch``)."""
    logits = model(inputs)  # (B, T, V)
    kept = targets != IGNORE
    picked = logits.log_softmax(-1).gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return (picked * kept).sum(-1)  # (B,)


def dpo_loss(policy_chosen: Tensor, policy_rejected: Tensor, reference_chosen: Tensor,
             reference_rejected: Tensor, beta: float) -> Tensor:
    """The mean DPO loss of a batch of pairs, from their sequence log-probabilities ``(B,)``
    under the policy and the reference: ``-log σ(β (Δ_chosen - Δ_rejected))`` with ``Δ`` the
    policy's log-probability minus the reference's."""
    check_float(beta, "beta", 0, low_open=True)
    shapes = {tuple(t.shape) for t in (policy_chosen, policy_rejected, reference_chosen,
                                       reference_rejected)}
    if len(shapes) != 1 or len(next(iter(shapes))) != 1:
        raise ValueError(f"the four log-probabilities must be tensors of one shape (B,), got "
                         f"shapes {sorted(shapes)}")
    margin = (policy_chosen - reference_chosen) - (policy_rejected - reference_rejected)
    return -F.logsigmoid(beta * margin).mean()


# --- pairs, training, measuring ---------------------------------------------------------------

@dataclass(frozen=True)
class Pair:
    """Two replies the model wrote to one conversation's prompt: the one the preference chose
    and the one it rejected (each ending with ``■``)."""

    conversation: Conversation
    chosen: str
    rejected: str


def preference_pairs(conversations: Sequence[Conversation],
                     replies: Sequence[Sequence[str]]) -> list[Pair]:
    """For each conversation, from its replies (several sampled to its prompt) that end their
    turn and stay in role (``tinygpt.chat.stays_in_role``): the one closest to ten syllables
    a line (chosen) and the farthest (rejected), if they differ in ``metre_distance``."""
    if len(conversations) != len(replies):
        raise ValueError(f"{len(conversations)} conversations but {len(replies)} lists of "
                         "replies")
    pairs = []
    for conversation, written in zip(conversations, replies):
        ended = sorted((r for r in written if ends_turn(r) and stays_in_role(r)),
                       key=metre_distance)
        if len(ended) >= 2 and metre_distance(ended[0]) < metre_distance(ended[-1]):
            pairs.append(Pair(conversation, ended[0], ended[-1]))
    return pairs


def reply_log_probs(model: nn.Module, tokenizer: CharTokenizer,
                    conversations: Sequence[Conversation], replies: Sequence[str],
                    block_size: int) -> Tensor:
    """``(B,)``: the log-probability of each reply (as written, with its ``■`` if any) after
    its conversation's prompt."""
    prompts = [prompt(c.speaker, c.speech, c.replier) for c in conversations]
    return sequence_log_probs(model, *batch_replies(tokenizer, prompts, replies, block_size))


def pair_log_probs(model: nn.Module, tokenizer: CharTokenizer, pairs: Sequence[Pair],
                   block_size: int) -> tuple[Tensor, Tensor]:
    """The sequence log-probabilities ``(B,)`` of the chosen and of the rejected replies."""
    conversations = [p.conversation for p in pairs]
    return (reply_log_probs(model, tokenizer, conversations, [p.chosen for p in pairs],
                            block_size),
            reply_log_probs(model, tokenizer, conversations, [p.rejected for p in pairs],
                            block_size))


def pair_accuracy(margins: Tensor) -> float:
    """The share of pairs the policy ranks right: those whose margin (``β`` aside, the chosen
    reply's gain in log-probability over the reference less the rejected one's) is positive,
    a tie (a margin of exactly 0) counting ½: a policy that prefers neither reply is right
    half the time, as ``σ(0) = ½`` says. So the reference itself, every margin 0, scores ½."""
    if margins.dim() != 1 or margins.numel() == 0:
        raise ValueError(f"margins must be a non-empty tensor of shape (B,), got shape "
                         f"{tuple(margins.shape)}")
    return ((margins > 0).double() + 0.5 * (margins == 0).double()).mean().item()


def train_dpo(policy: GPT, tokenizer: CharTokenizer, pairs: Sequence[Pair], config: TrainConfig,
              beta: float, callback: Callable[[dict[str, float]], object] | None = None
              ) -> tuple[GPT, list[dict[str, float]]]:
    """DPO from ``policy`` (changed in place; a frozen copy of it is the reference):
    ``config.max_iters`` AdamW steps on batches of ``config.batch_size`` pairs drawn at random
    (seeded by ``config.seed``). Returns the reference and one record per step, of the step's
    batch under the policy as it was *before* the step's update: ``loss``, ``accuracy``
    (``pair_accuracy``: the share of the batch's pairs whose margin is positive, a tie counting
    ½) and ``margin`` (the batch's mean). So step 0 records the reference itself: a loss of
    ``log 2``, every margin exactly 0 and an accuracy of ½ (the reference's log-probabilities are
    computed on the same batch, padded alike, as the policy's: computed once on all the pairs,
    padded longer, they were rounded otherwise, and margins of about 1e-6 split the ties).
    ``callback`` is given each record (a progress bar)."""
    check_instance(policy, GPT, "policy")
    if not has_chat_template(tokenizer):
        raise ValueError("the tokenizer has no chat template")
    if not pairs:
        raise ValueError("no preference pairs to train on")
    check_float(beta, "beta", 0, low_open=True)
    reference = copy.deepcopy(policy).eval().requires_grad_(False)
    T = policy.config.block_size
    generator = torch.Generator().manual_seed(config.seed)
    optimizer = configure_optimizer(policy, config)
    history = []
    policy.eval()  # no dropout: the policy's log-probabilities are compared with the reference's
    for step in range(config.max_iters):
        lr = lr_at(step, config)
        for group in optimizer.param_groups:
            group["lr"] = lr
        chosen = torch.randint(len(pairs), (config.batch_size,), generator=generator)
        batch = [pairs[i] for i in chosen.tolist()]
        with torch.no_grad():
            ref_chosen, ref_rejected = pair_log_probs(reference, tokenizer, batch, T)
        pol_chosen, pol_rejected = pair_log_probs(policy, tokenizer, batch, T)
        loss = dpo_loss(pol_chosen, pol_rejected, ref_chosen, ref_rejected, beta)
        margin = (pol_chosen - ref_chosen).detach() - (pol_rejected - ref_rejected).detach()
        history.append({"step": step, "lr": lr, "loss": loss.item(),  # before the update
                        "accuracy": pair_accuracy(margin), "margin": margin.mean().item()})
        if callback is not None:
            callback(history[-1])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if config.grad_clip > 0:
            nn.utils.clip_grad_norm_(policy.parameters(), config.grad_clip)
        optimizer.step()
    return reference, history


@torch.no_grad()
def divergence(policy: GPT, reference: GPT, tokenizer: CharTokenizer,
               conversations: Sequence[Conversation], replies: Sequence[str]) -> float:
    """The mean over ``replies`` (sampled from ``policy``, one per conversation) of
    ``log π(reply) - log π_ref(reply)``: a Monte Carlo estimate, in nats, of the KL divergence
    of the policy's replies from the reference's."""
    if not replies or len(conversations) != len(replies):
        raise ValueError(f"{len(conversations)} conversations and {len(replies)} replies: give "
                         "one reply per conversation, at least one")
    was = policy.training, reference.training
    policy.eval(), reference.eval()
    try:
        T = policy.config.block_size
        gap = (reply_log_probs(policy, tokenizer, conversations, replies, T)
               - reply_log_probs(reference, tokenizer, conversations, replies, T))
    finally:
        policy.train(was[0]), reference.train(was[1])
    return gap.mean().item()
