"""The chat format and supervised fine-tuning (``tinygpt.chat``), checked against direct
computations.

The loss on the reply only: positions whose target is masked get exactly zero gradient, and the
gradient of the whole model equals that of a loss computed on the reply's slice alone (torch
autograd both ways). The template round-trips through ``parse`` for any names and texts
(hypothesis). A model widened by ``add_tokens`` gives the same logits on the old tokens, and
the new token starts with probability at most 1/V. Conversations come from plays held out
whole. Bad inputs get clear errors.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from tinygpt import chat
from tinygpt.chat import END, IGNORE, REPLY, SPEECH, Conversation
from tinygpt.config import GPTConfig, TrainConfig
from tinygpt.model import GPT
from tinygpt.shakespeare import Play
from tinygpt.tokenizer import CharTokenizer

TEXT = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ ,.!?':\n"
TOKENIZER = chat.chat_tokenizer(CharTokenizer.from_text(TEXT))
CONVERSATIONS = [
    Conversation("HAMLET", "To be, or not to be", "OPHELIA", "Good my lord."),
    Conversation("KING", "Speak!", "FOOL", "Nay, nuncle,\nnot I."),
    Conversation("A", "b", "C", "d"),
]


def tiny_model(vocab_size: int = TOKENIZER.vocab_size, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=vocab_size, block_size=64, n_layer=1, n_head=2, n_embd=16))


# --- the template --------------------------------------------------------------------------

NAMES = st.text(st.characters(codec="utf-8", exclude_characters=":\n" + "".join(
    chat.SPECIAL_TOKENS)), min_size=1, max_size=12).filter(str.strip)
TEXTS = st.text(st.characters(codec="utf-8", exclude_characters="".join(chat.SPECIAL_TOKENS)),
                max_size=40)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(NAMES, TEXTS, NAMES, TEXTS)
def test_the_template_round_trips(speaker, speech, replier, reply):
    conversation = Conversation(speaker, speech, replier, reply)
    text = chat.render(conversation)
    assert chat.parse(text) == conversation
    assert text.startswith(chat.prompt(speaker, speech, replier))
    assert text.count(SPEECH) == text.count(REPLY) == text.count(END) == 1


def test_the_template_is_written_as_documented():
    text = chat.render(CONVERSATIONS[0])
    assert text == f"{SPEECH}HAMLET:\nTo be, or not to be\n{REPLY}OPHELIA:\nGood my lord.{END}"
    assert chat.prompt("HAMLET", "x") == f"{SPEECH}HAMLET:\nx\n{REPLY}"


@pytest.mark.parametrize("bad", ["", "no template", chat.render(CONVERSATIONS[0]) + "x",
                                 chat.render(CONVERSATIONS[0]) * 2])
def test_parse_refuses_what_is_not_one_conversation(bad):
    with pytest.raises(ValueError, match="not one conversation"):
        chat.parse(bad)


def test_user_text_with_a_special_token_is_refused():
    with pytest.raises(ValueError, match="special tokens"):
        chat.prompt("HAMLET", f"a {END} b")
    with pytest.raises(ValueError, match="one line without ':'"):
        chat.prompt("HAM:LET", "a")
    with pytest.raises(ValueError, match="one line without ':'"):
        chat.prompt("HAMLET", "a", replier=" ")
    with pytest.raises(TypeError):
        chat.prompt("HAMLET", 3)  # type: ignore[arg-type]


# --- the tokenizer and the widened model -------------------------------------------------------

def test_the_special_tokens_are_the_new_last_ids():
    base = CharTokenizer.from_text(TEXT)
    assert TOKENIZER.chars[:base.vocab_size] == base.chars
    assert TOKENIZER.chars[base.vocab_size:] == list(chat.SPECIAL_TOKENS)
    assert chat.has_chat_template(TOKENIZER) and not chat.has_chat_template(base)
    with pytest.raises(ValueError, match="already holds"):
        chat.chat_tokenizer(TOKENIZER)
    with pytest.raises(TypeError):
        chat.chat_tokenizer("abc")  # type: ignore[arg-type]


@pytest.mark.parametrize("tie", [True, False])
def test_the_widened_model_gives_the_same_logits_on_the_old_tokens(tie):
    torch.manual_seed(0)
    old = GPT(GPTConfig(vocab_size=20, block_size=16, n_layer=2, n_head=2, n_embd=16,
                        tie_weights=tie))
    new = chat.add_tokens(old, 3)
    assert new.config.vocab_size == 23
    idx = torch.randint(20, (4, 16))
    with torch.no_grad():
        before, after = old(idx), new(idx)
    torch.testing.assert_close(after[..., :20], before, rtol=0, atol=1e-6)
    wte = new.transformer.embed.wte.weight
    torch.testing.assert_close(wte[20:], old.transformer.embed.wte.weight.mean(0).expand(3, -1))
    torch.testing.assert_close(new.lm_head.weight[20:],
                               old.lm_head.weight.mean(0).expand(3, -1))
    assert (new.lm_head.weight is wte) == tie
    # a tied head: the new token's logit is the old logits' mean, so its probability <= 1/V
    if tie:
        torch.testing.assert_close(after[..., 20], before.mean(-1), rtol=1e-5, atol=1e-5)
        assert bool((after.softmax(-1)[..., 20] <= 1 / 20 + 1e-6).all())


def test_add_tokens_refuses_bad_counts():
    with pytest.raises(ValueError):
        chat.add_tokens(tiny_model(), 0)
    with pytest.raises(TypeError):
        chat.add_tokens("model", 1)  # type: ignore[arg-type]


# --- the loss on the reply only --------------------------------------------------------------

def test_reply_targets_mask_the_prompt():
    assert chat.reply_targets([5, 6, 7, 8, 9], 3) == [IGNORE, IGNORE, 8, 9]
    assert chat.reply_targets([5, 6], 1) == [6]
    with pytest.raises(ValueError):
        chat.reply_targets([5, 6, 7], 3)  # no reply token left
    with pytest.raises(ValueError):
        chat.reply_targets([5, 6, 7], 0)


def test_the_batch_targets_are_the_reply_and_its_end():
    inputs, targets = chat.batch(TOKENIZER, CONVERSATIONS, 64)
    for row, c in enumerate(CONVERSATIONS):
        kept = [t for t in targets[row].tolist() if t != IGNORE]
        assert TOKENIZER.decode(kept) == c.reply + END
        n = len(TOKENIZER.encode(chat.render(c))) - 1
        assert TOKENIZER.decode(inputs[row, :n].tolist()) == chat.render(c)[:-1]


def test_masked_positions_get_exactly_zero_gradient():
    model = tiny_model()
    inputs, targets = chat.batch(TOKENIZER, CONVERSATIONS, 64)
    logits = model(inputs).detach().requires_grad_(True)
    loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE)
    loss.backward()
    masked = targets == IGNORE
    assert bool(masked.any()) and bool((~masked).any())
    assert bool((logits.grad[masked] == 0).all())
    assert bool((logits.grad[~masked].abs().sum(-1) > 0).all())


def test_the_masked_loss_is_the_loss_on_the_reply_slice_alone():
    model = tiny_model(seed=1)
    inputs, targets = chat.batch(TOKENIZER, CONVERSATIONS, 64)
    masked_loss = chat.reply_loss(model, inputs, targets)
    masked_grads = torch.autograd.grad(masked_loss, list(model.parameters()))
    # the same loss written another way: each conversation on its own, the reply's slice only
    total, count = 0.0, 0
    for c in CONVERSATIONS:
        ids = TOKENIZER.encode(chat.render(c))
        p = len(TOKENIZER.encode(chat.prompt(c.speaker, c.speech, c.replier)))
        logits = model(torch.tensor([ids[:-1]]))[0]  # (T, V)
        reply = torch.tensor(ids[p:])
        total = total + F.cross_entropy(logits[p - 1:], reply, reduction="sum")
        count += len(reply)
    sliced_loss = total / count
    sliced_grads = torch.autograd.grad(sliced_loss, list(model.parameters()))
    torch.testing.assert_close(masked_loss, sliced_loss)
    for a, b in zip(masked_grads, sliced_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_mean_reply_loss_is_the_reply_loss_of_one_batch():
    model = tiny_model(seed=2)
    inputs, targets = chat.batch(TOKENIZER, CONVERSATIONS, 64)
    with torch.no_grad():
        expected = chat.reply_loss(model.eval(), inputs, targets).item()
    assert math.isclose(chat.mean_reply_loss(model, TOKENIZER, CONVERSATIONS, batch_size=2),
                        expected, rel_tol=1e-5)
    # without ■: the loss on the replies' characters alone, one conversation at a time
    total, count = 0.0, 0
    for c in CONVERSATIONS:
        ids = TOKENIZER.encode(chat.render(c))
        p = len(TOKENIZER.encode(chat.prompt(c.speaker, c.speech, c.replier)))
        with torch.no_grad():
            logits = model(torch.tensor([ids[:-1]]))[0, p - 1:-1]  # the last predicts ■
        total += F.cross_entropy(logits, torch.tensor(ids[p:-1]), reduction="sum").item()
        count += len(ids) - p - 1
    assert math.isclose(chat.mean_reply_loss(model, TOKENIZER, CONVERSATIONS, end=False),
                        total / count, rel_tol=1e-5)


def test_a_conversation_longer_than_the_context_is_refused():
    long = Conversation("A", "b", "C", "d" * 80)
    with pytest.raises(ValueError, match="at most block_size"):
        chat.batch(TOKENIZER, [long], 64)


# --- fine-tuning ---------------------------------------------------------------------------

def test_fine_tuning_lowers_the_reply_loss_and_checks_its_inputs():
    model = tiny_model(seed=3)
    config = TrainConfig(batch_size=3, max_iters=40, learning_rate=1e-2, warmup_iters=1, seed=0)
    before = chat.mean_reply_loss(model, TOKENIZER, CONVERSATIONS)
    history = chat.fine_tune(model, TOKENIZER, CONVERSATIONS, config,
                             held_out=CONVERSATIONS, eval_every=20)
    after = chat.mean_reply_loss(model, TOKENIZER, CONVERSATIONS)
    assert after < before / 2
    assert [r["step"] for r in history if "held_out_loss" in r] == [0, 20, 40]
    with pytest.raises(ValueError, match="no chat template"):
        chat.fine_tune(model, CharTokenizer.from_text(TEXT), CONVERSATIONS, config)
    with pytest.raises(ValueError, match="widen the model"):
        chat.fine_tune(tiny_model(vocab_size=70), TOKENIZER, CONVERSATIONS, config)


def test_replies_are_cut_at_their_end_and_described():
    replies = chat.sample_replies(tiny_model(seed=4), TOKENIZER, CONVERSATIONS, max_chars=20)
    assert len(replies) == 3
    for r in replies:
        assert len(r) <= 20 and (END not in r[:-1])
    assert chat.describe(["ab" + END, "a\n\nB:\nc", "x"]) == {
        "ends_turn": 1 / 3, "stays_in_role": 2 / 3, "mean_chars": (2 + 7 + 1) / 3}
    assert not chat.stays_in_role(f"a{SPEECH}b{END}")


# --- conversations from the plays ----------------------------------------------------------

PLAY = Play("a-play", "comedies", "KING:\nSpeak, fool, I bid thee speak at once and plainly.\n\n"
            "FOOL:\nNay.\n\nFOOL:\nNot I.\n\nKING:\n" + "x" * 60 + "\n")


def test_conversations_pair_speeches_of_two_speakers():
    found = chat.conversations([PLAY], max_speech=20)
    # FOOL to FOOL is one speaker; the last reply is longer than max_reply
    assert found == [Conversation("KING", "at once and plainly.", "FOOL", "Nay.", "a-play")]
    assert chat.last_words("one two three", 8) == "three"
    assert chat.last_words("one two three", 9) == "two three"
    assert chat.last_words("abcdefghij", 5) == ""
    assert all(len(chat.render(c)) <= 129 for c in chat.conversations([PLAY]))


def test_the_held_out_plays_are_wholly_in_the_validation_text():
    plays = [Play(f"p{i}", "comedies", "A:\n" + "x" * 96 + "\n") for i in range(5)]
    # 5 plays of 100 characters and 4 separators: 504; the last 30% is 151 characters, so the
    # training text ends at 353, inside p3 ([303, 403)); p4 is [404, 504)
    assert chat.split_titles(plays, 0.3) == (("p0", "p1", "p2"), ("p4",))
    assert chat.split_titles(plays[:1], 0.3) == ((), ())
