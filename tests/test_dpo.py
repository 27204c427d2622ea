"""DPO (``tinygpt.dpo``), checked against direct computations.

The loss against a float64 formula written with ``math`` for random log-probabilities; ``log 2``
when the policy is the reference; its gradient on a tiny GPT against central finite differences
(float64). Sequence log-probabilities against a loop over the reply's tokens. The syllable rule
on words whose count it gets right, and the pairs it makes.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from tinygpt import chat, dpo
from tinygpt.chat import END, Conversation
from tinygpt.config import GPTConfig, TrainConfig
from tinygpt.model import GPT
from tinygpt.tokenizer import CharTokenizer

TOKENIZER = chat.chat_tokenizer(CharTokenizer.from_text(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ ,.!?':\n"))
CONVERSATION = Conversation("KING", "Speak!", "FOOL", "")
VERSE = "I speak, my lord, and tell the truth to you."  # ten syllables
PAIRS = [dpo.Pair(CONVERSATION, VERSE + END, "No." + END),
         dpo.Pair(Conversation("A", "b", "C", ""), "ab" + END, "a\nb" + END)]


def tiny_model(seed: int = 0, dtype: torch.dtype = torch.float32) -> GPT:
    torch.manual_seed(seed)
    config = GPTConfig(vocab_size=TOKENIZER.vocab_size, block_size=96, n_layer=1, n_head=2,
                       n_embd=8)
    return GPT(config).to(dtype)


def test_the_loss_is_the_direct_formula():
    g = torch.Generator().manual_seed(0)
    values = [torch.randn(6, generator=g, dtype=torch.float64) * 5 for _ in range(4)]
    beta = 0.3
    got = dpo.dpo_loss(*values, beta=beta)
    expected = 0.0
    for pc, pr, rc, rr in zip(*(v.tolist() for v in values)):
        margin = (pc - rc) - (pr - rr)
        expected += -math.log(1 / (1 + math.exp(-beta * margin)))
    assert math.isclose(got.item(), expected / 6, rel_tol=1e-12)


def test_the_loss_is_log_2_when_the_policy_is_the_reference():
    model = tiny_model()
    chosen, rejected = dpo.pair_log_probs(model, TOKENIZER, PAIRS, 96)
    loss = dpo.dpo_loss(chosen, rejected, chosen.detach(), rejected.detach(), beta=0.1)
    assert math.isclose(loss.item(), math.log(2), rel_tol=1e-6)


def test_the_gradient_matches_finite_differences():
    policy, reference = tiny_model(1, torch.float64), tiny_model(2, torch.float64)
    with torch.no_grad():
        ref = dpo.pair_log_probs(reference, TOKENIZER, PAIRS, 96)

    def loss() -> torch.Tensor:
        return dpo.dpo_loss(*dpo.pair_log_probs(policy, TOKENIZER, PAIRS, 96), *ref, beta=0.5)

    weight = policy.transformer.h[0].mlp.c_fc.weight
    grad = torch.autograd.grad(loss(), weight)[0]
    eps = 1e-6
    for index in [(0, 0), (3, 5), (17, 2), (31, 7)]:
        with torch.no_grad():
            weight[index] += eps
            up = loss().item()
            weight[index] -= 2 * eps
            down = loss().item()
            weight[index] += eps
        assert math.isclose(grad[index].item(), (up - down) / (2 * eps), rel_tol=1e-5,
                            abs_tol=1e-9)


def test_sequence_log_probs_sum_the_reply_tokens():
    model = tiny_model(3)
    head = chat.prompt("KING", "Speak!", "FOOL")
    reply = "Nay." + END
    got = dpo.reply_log_probs(model, TOKENIZER, [CONVERSATION], [reply], 96)
    ids = TOKENIZER.encode(head + reply)
    with torch.no_grad():
        log_probs = model(torch.tensor([ids[:-1]]))[0].log_softmax(-1)
    start = len(TOKENIZER.encode(head))
    expected = sum(log_probs[t - 1, ids[t]].item() for t in range(start, len(ids)))
    assert math.isclose(got.item(), expected, rel_tol=1e-5)


def test_the_loss_checks_its_inputs():
    x = torch.zeros(3)
    with pytest.raises(ValueError, match="one shape"):
        dpo.dpo_loss(x, x, x, torch.zeros(4), beta=0.1)
    with pytest.raises(ValueError):
        dpo.dpo_loss(x, x, x, x, beta=0.0)


@pytest.mark.parametrize(("word", "count"), [("the", 1), ("speak", 1), ("lord", 1),
                                             ("truth", 1), ("noble", 2), ("tomorrow", 3),
                                             ("bite", 1), ("agree", 2), ("y", 1), ("'tis", 1),
                                             ("", 0), ("--", 0)])
def test_syllables(word, count):
    assert dpo.syllables(word) == count


def test_the_metre_distance_and_the_pairs():
    assert dpo.line_syllables("But soft, what light through yonder window breaks?") == 10
    assert dpo.metre_distance(VERSE + END) == 0
    assert dpo.metre_distance("No.\n" + VERSE) == 4.5
    assert dpo.metre_distance("!" + END) == 10.0
    replies = [["No." + END, VERSE + END, "Ay, sir"],
               ["a" + END], ["x" + END, "y" + END]]  # one ended reply; a tie
    conversations = [CONVERSATION] * 3
    assert dpo.preference_pairs(conversations, replies) == [
        dpo.Pair(CONVERSATION, VERSE + END, "No." + END)]


# Pairs of replies of many lengths: a batch of a few of them is padded to another length than
# all of them together (the book's chat model, unlike these tiny ones, rounds a reply's
# log-probability differently then, by about 1e-6: ties split at random)
VARIED_PAIRS = [dpo.Pair(Conversation("A", "b" * k, "C", ""), "ab" * k + END, "a\nb" * (k % 5)
                         + END) for k in range(1, 13)]


def test_a_tie_counts_half_and_the_reference_scores_one_half():
    margins = torch.tensor([2.0, -1.0, 0.0, 0.0, 1e-30, -1e-30])
    assert dpo.pair_accuracy(margins) == (1 + 0 + 0.5 + 0.5 + 1 + 0) / 6
    assert dpo.pair_accuracy(torch.zeros(16)) == 0.5
    with pytest.raises(ValueError, match="shape"):
        dpo.pair_accuracy(torch.zeros(0))


@pytest.mark.parametrize("seed", range(4))
def test_step_0_is_recorded_before_any_update_every_margin_a_tie(seed):
    """The reference and the untouched policy give one number to each reply, so step 0 is a
    loss of log 2, a mean margin of exactly 0 and an accuracy of one half (ties counted half)."""
    config = TrainConfig(batch_size=3, max_iters=1, learning_rate=1e-2, warmup_iters=1,
                         weight_decay=0.0, seed=seed)
    _, history = dpo.train_dpo(tiny_model(seed), TOKENIZER, VARIED_PAIRS, config, beta=0.5)
    first = history[0]
    assert first["margin"] == 0.0 and first["accuracy"] == 0.5
    assert first["loss"] == pytest.approx(math.log(2), rel=1e-7)


def test_each_record_is_of_the_policy_before_that_steps_update():
    """Step 1's record is the batch under the policy after one update (a run of one step gives
    it), not after two: computed here from that policy and the reference directly."""
    config = TrainConfig(batch_size=3, max_iters=2, learning_rate=1e-2, warmup_iters=1,
                         lr_decay_iters=10, weight_decay=0.0, seed=5)
    _, history = dpo.train_dpo(tiny_model(1), TOKENIZER, VARIED_PAIRS, config, beta=0.5)
    after_one = tiny_model(1)
    reference, _ = dpo.train_dpo(after_one, TOKENIZER, VARIED_PAIRS,
                                 replace(config, max_iters=1), beta=0.5)
    draws = torch.Generator().manual_seed(config.seed)
    torch.randint(len(VARIED_PAIRS), (3,), generator=draws)  # step 0's batch
    batch = [VARIED_PAIRS[i] for i in torch.randint(len(VARIED_PAIRS), (3,),
                                                    generator=draws).tolist()]
    with torch.no_grad():
        policy_chosen, policy_rejected = dpo.pair_log_probs(after_one.eval(), TOKENIZER, batch, 96)
        reference_chosen, reference_rejected = dpo.pair_log_probs(reference, TOKENIZER, batch, 96)
    margin = (policy_chosen - reference_chosen) - (policy_rejected - reference_rejected)
    assert margin.abs().max() > 1e-3  # one update moved the policy: a record that can differ
    assert history[1]["margin"] == pytest.approx(margin.mean().item(), rel=1e-4)
    assert history[1]["accuracy"] == dpo.pair_accuracy(margin)
    loss = dpo.dpo_loss(policy_chosen, policy_rejected, reference_chosen, reference_rejected, 0.5)
    assert history[1]["loss"] == pytest.approx(loss.item(), rel=1e-5)


def test_dpo_raises_the_chosen_margin_and_leaves_the_reference():
    policy = tiny_model(4)
    config = TrainConfig(batch_size=2, max_iters=30, learning_rate=1e-2, warmup_iters=1,
                         weight_decay=0.0, seed=0)
    reference, history = dpo.train_dpo(policy, TOKENIZER, PAIRS, config, beta=0.5)
    assert math.isclose(history[0]["loss"], math.log(2), rel_tol=1e-5)
    assert history[-1]["loss"] < 0.3 and history[-1]["accuracy"] == 1.0
    assert not any(p.requires_grad for p in reference.parameters())
    conversations = [p.conversation for p in PAIRS]
    chosen = [p.chosen for p in PAIRS]
    assert dpo.divergence(reference, reference, TOKENIZER, conversations, chosen) == 0.0
    assert dpo.divergence(policy, reference, TOKENIZER, conversations, chosen) > 0
    with pytest.raises(ValueError, match="no preference pairs"):
        dpo.train_dpo(policy, TOKENIZER, [], config, beta=0.5)
