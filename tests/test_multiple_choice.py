"""The multiple-choice benchmark (``tinygpt.multiple_choice``): its construction is fixed and
leak-free, and its scores are the direct computations they claim to be.

Construction is checked on a synthetic play and on the book's own split: the same seed gives
the same benchmark (one fingerprint), every question is asked about the validation text only,
never about a line the training text holds, its opening and answer are the speech's own text,
and no distractor equals the answer or another. Scoring is checked against direct
computations: a GPT's log-probabilities against ``F.cross_entropy`` over the whole sequence,
an n-gram model's against its own ``probs``, the Wilson interval against the score test it
inverts (found by bisection), ties against the fraction of a point they earn.
"""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from tinygpt import multiple_choice as mc
from tinygpt.config import GPTConfig
from tinygpt.model import GPT
from tinygpt.ngram import NGramModel
from tinygpt.small_models import AttentionOnly, ContextMLP
from tinygpt.tokenizer import CharTokenizer

WORDS = ("honour", "sweet", "lord", "madam", "nothing", "heaven", "gentle", "father", "speak",
         "night", "crown", "fortune", "thee", "and", "the", "of", "my", "what", "tomorrow")


def play(seed: int, speeches: int) -> str:
    """A synthetic play in the book's format: ``SPEAKER:`` lines, speeches of 1-4 lines."""
    rng = random.Random(seed)
    paragraphs = []
    for _ in range(speeches):
        lines = []
        for _ in range(rng.randint(1, 4)):
            line = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9)))
            lines.append(line[0].upper() + line[1:] + rng.choice([",", ".", "!", ""]))
        paragraphs.append(f"{rng.choice(['KING', 'QUEEN', 'First Lord'])}:\n" + "\n".join(lines))
    return "\n\n".join(paragraphs) + "\n\n"


TRAIN, VAL = play(0, 400), play(1, 300)


@pytest.mark.parametrize("cut", mc.CUTS)
def test_a_question_is_the_speechs_own_text_and_its_distractors_differ(cut):
    questions = mc.build(VAL, TRAIN, cut=cut, size=60, seed=3)
    assert len(questions) == 60
    train_lines = set(TRAIN.split("\n"))
    for q in questions:
        assert q.cut == cut and len(q.choices) == mc.NUM_CHOICES
        assert len(set(q.choices)) == mc.NUM_CHOICES  # no distractor repeats another or the answer
        assert VAL[q.offset:].startswith(q.opening + q.choices[q.answer])  # the speech's own text
        second_start = q.opening.split("\n")[2]
        assert second_line(q) not in train_lines
        assert all(c.endswith("\n") and "\n" not in c[:-1] for c in q.choices)
        if cut == "line":
            assert second_start == ""
        elif cut == "space":
            assert second_start.endswith(" ") and not q.choices[q.answer].startswith(" ")
        else:  # inside a word: letters on both sides of the cut
            assert second_start[-2:].isalpha() and q.choices[q.answer][:2].isalpha()


def test_the_same_seed_gives_the_same_benchmark_and_another_seed_another():
    first = mc.build(VAL, TRAIN, size=40, seed=0)
    assert mc.fingerprint(first) == mc.fingerprint(mc.build(VAL, TRAIN, size=40, seed=0))
    assert mc.fingerprint(first) != mc.fingerprint(mc.build(VAL, TRAIN, size=40, seed=1))
    answers = [q.answer for q in mc.build(VAL, TRAIN, size=200, seed=0)]
    assert min(answers.count(i) for i in range(mc.NUM_CHOICES)) > 0  # every position is used


def second_line(q: mc.Question) -> str:
    return q.opening.split("\n")[2] + q.choices[q.answer][:-1]


def test_a_line_the_training_text_holds_is_never_asked_about():
    before = mc.build(VAL, TRAIN, size=10_000)  # every usable speech
    leaked = second_line(before[0])
    after = mc.build(VAL, TRAIN + f"KING:\n{leaked}\n\n", size=10_000)
    assert {q.offset for q in after} == {q.offset for q in before if second_line(q) != leaked}
    assert len(after) < len(before)


def test_the_book_split_builds_leak_free_questions():
    from tinygpt.book.trained_model import book_data

    tok, train_ids, val_ids = book_data()
    val, train = tok.decode(val_ids.tolist()), tok.decode(train_ids.tolist())
    train_lines = set(train.split("\n"))
    for cut in mc.CUTS:
        questions = mc.build(val, train, cut=cut, size=500)
        assert len(questions) == 500
        for q in questions:
            assert second_line(q) not in train_lines
            assert val[q.offset:].startswith(q.opening + q.choices[q.answer])


def test_the_cut_falls_where_its_kind_says():
    line = "Is this a dagger which I see before me,"
    assert mc.cut_line(line, "line") == 0
    at = mc.cut_line(line, "space")
    assert line[at - 1] == " " and line[at] != " "
    assert abs(at - len(line) // 2) <= min(abs(i + 1 - len(line) // 2)
                                           for i, c in enumerate(line) if c == " ")
    at = mc.cut_line(line, "word")
    assert line[at - 2:at].isalpha() and line[at:at + 2].isalpha()
    assert mc.cut_line("a b c d e f g", "word") is None  # no word of four letters
    with pytest.raises(ValueError, match="cut must be one of"):
        mc.cut_line(line, "sentence")


def test_too_small_a_text_or_bad_arguments_get_a_clear_error():
    with pytest.raises(ValueError, match="too few usable speeches"):
        mc.build(play(1, 3), TRAIN, size=5)
    with pytest.raises(TypeError, match="val_text"):
        mc.build(b"bytes", TRAIN)
    with pytest.raises(ValueError, match="size"):
        mc.build(VAL, TRAIN, size=0)
    with pytest.raises(ValueError, match="at least one question"):
        mc.evaluate(mc.uniform_log_probs(10), CharTokenizer.from_text(VAL), [])


def tiny_gpt(vocab_size: int, block_size: int = 32) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=vocab_size, block_size=block_size, n_layer=1, n_head=2,
                         n_embd=16))


def test_a_networks_log_probs_are_its_cross_entropy_per_position():
    model = tiny_gpt(20)
    ids = torch.randint(0, 20, (30,), generator=torch.Generator().manual_seed(1)).tolist()
    got = mc.network_log_probs(model, 32)(ids)
    out = model(torch.tensor(ids[:-1])[None])
    logits = out[0] if isinstance(out, tuple) else out
    expected = -F.cross_entropy(logits[0], torch.tensor(ids[1:]), reduction="none")
    torch.testing.assert_close(got, expected.double(), rtol=1e-5, atol=1e-5)


def test_a_sequence_longer_than_the_context_is_scored_on_its_last_window():
    model = tiny_gpt(20, block_size=8)
    ids = list(range(20)) * 2
    got = mc.network_log_probs(model, 8)(ids)
    assert torch.isnan(got[:-8]).all() and not torch.isnan(got[-8:]).any()
    window = mc.network_log_probs(model, 8)(ids[-9:])
    torch.testing.assert_close(got[-8:], window)


def one_pass_per_sequence(model, block_size):
    """The straightforward scorer: one forward pass of one row per sequence, on its last
    ``block_size + 1`` ids."""

    def log_probs(ids):
        x = torch.tensor(ids[-(block_size + 1):])  # (T,)
        with torch.no_grad():
            out = model.eval()(x[None, :-1])
        logits = out[0] if isinstance(out, tuple) else out  # (1, T - 1, V)
        chosen = -F.cross_entropy(logits[0], x[1:], reduction="none")
        return torch.cat([torch.full((len(ids) - len(x),), float("nan")), chosen]).double()

    return log_probs


CAUSAL_NETWORKS = {
    "gpt": lambda V, T: tiny_gpt(V, T),
    "modern gpt": lambda V, T: GPT(GPTConfig(vocab_size=V, block_size=T, n_layer=2, n_head=2,
                                             n_embd=16, positional="rope", qk_norm=True,
                                             norm="rmsnorm", activation="relu2")),
    "attention only": lambda V, T: AttentionOnly(GPTConfig(vocab_size=V, block_size=T,
                                                           n_layer=1, n_head=2, n_embd=16)),
    "context mlp": lambda V, T: ContextMLP(V, context=4, n_embd=8, hidden=32),
}


@pytest.mark.parametrize("network", sorted(CAUSAL_NETWORKS))
@pytest.mark.parametrize("block_size", [16, 64])
def test_batched_scoring_equals_one_pass_per_candidate(network, block_size):
    """Every candidate of several questions at once, in padded batches of rows of different
    lengths (some longer than the context when it is 16), gives what one pass per candidate
    gives: the same totals, the same accuracies, the same credits."""
    tok = CharTokenizer.from_text(TRAIN + VAL)
    torch.manual_seed(0)
    model = CAUSAL_NETWORKS[network](tok.vocab_size, block_size)
    questions = [q for cut in mc.CUTS for q in mc.build(VAL, TRAIN, cut=cut, size=6, seed=2)]
    lengths = {len(tok.encode(q.opening + c)) for q in questions for c in q.choices}
    assert len(lengths) > 5  # rows of many lengths share a batch and are padded
    if block_size == 16:
        questions = [dataclasses.replace(q, choices=tuple(c[-14:] for c in q.choices))
                     for q in questions]  # candidates that fit the context, openings that do not
    straight = one_pass_per_sequence(model, block_size)
    for batch_tokens in (1, 50, 300, 100_000):  # one row per pass, a few, all in one pass
        batched = mc.network_log_probs(model, block_size, batch_tokens=batch_tokens)
        got = mc.all_choice_log_probs(batched, tok, questions)
        expected = [[float(straight(tok.encode(q.opening) + tok.encode(c))[
            len(tok.encode(q.opening)) - 1:].sum()) for c in q.choices] for q in questions]
        torch.testing.assert_close(torch.tensor(got), torch.tensor(expected), rtol=1e-5,
                                   atol=1e-5)
    result, reference = mc.evaluate(batched, tok, questions), mc.evaluate(straight, tok, questions)
    assert result.credits == reference.credits and result.raw == reference.raw
    assert result.normalised == reference.normalised
    assert result.answer_nats_per_char == pytest.approx(reference.answer_nats_per_char, rel=1e-5)
    sequences = [list(range(n)) for n in (2, 40, 3, 17, 2)]  # any order, any length from 2
    for one, many in zip([straight(s) for s in sequences], batched.many(sequences)):
        torch.testing.assert_close(many, one, rtol=1e-5, atol=1e-5, equal_nan=True)


@pytest.mark.parametrize("network", ["gpt", "modern gpt", "attention only"])
def test_endings_after_a_shared_prefix_are_scored_as_the_whole_sequences(network):
    """``after``: prefixes of equal and unequal lengths, endings of one id, a group whose
    endings are all one id, and groups too long for the context (read through ``many``)."""
    torch.manual_seed(0)
    model = CAUSAL_NETWORKS[network](20, 16)
    rng = random.Random(4)
    groups = []
    for prefix_length in (1, 5, 5, 9, 9, 9, 14, 20):
        prefix = [rng.randrange(20) for _ in range(prefix_length)]
        lengths = [1, 1] if prefix_length == 9 and not any(
            len(g[0]) == 9 and all(len(e) == 1 for e in g[1]) for g in groups) else \
            [rng.randint(1, 8) for _ in range(rng.randint(1, 4))]
        groups.append((prefix, [[rng.randrange(20) for _ in range(n)] for n in lengths]))
    straight = one_pass_per_sequence(model, 16)
    for batch_tokens in (1, 20, 10_000):
        got = mc.network_log_probs(model, 16, batch_tokens=batch_tokens).after(groups)
        assert [len(each) for each in got] == [len(endings) for _, endings in groups]
        for (prefix, endings), each in zip(groups, got):
            for ending, scores in zip(endings, each):
                expected = straight(prefix + ending)[len(prefix) - 1:]
                torch.testing.assert_close(scores, expected, rtol=1e-5, atol=1e-5,
                                           equal_nan=True)
    with pytest.raises(ValueError, match="at least 1 id"):
        mc.network_log_probs(model, 16).after([([1, 2], [[3], []])])


def test_batched_scoring_refuses_a_sequence_without_a_prediction():
    with pytest.raises(ValueError, match="at least 2 ids"):
        mc.network_log_probs(tiny_gpt(20), 32).many([[1, 2, 3], [4]])
    with pytest.raises(ValueError, match="batch_tokens"):
        mc.network_log_probs(tiny_gpt(20), 32, batch_tokens=0)


def test_an_ngram_models_log_probs_are_its_own_probabilities():
    tok = CharTokenizer.from_text(TRAIN + VAL)
    ids = tok.encode(TRAIN)
    for n in (1, 2, 3):
        model = NGramModel(n, tok.vocab_size, smoothing=0.5).fit(ids)
        sample = tok.encode(VAL[:60])
        got = mc.ngram_log_probs(model)(sample)
        assert len(got) == len(sample) - 1
        for t in range(max(1, n - 1), len(sample)):
            expected = math.log(float(model.probs(sample[:t])[sample[t]]))
            assert got[t - 1].item() == pytest.approx(expected, rel=1e-12)
        assert torch.isnan(got[: max(1, n - 1) - 1]).all()


def test_a_model_that_read_the_validation_text_answers_right_and_the_uniform_guess_is_chance():
    tok = CharTokenizer.from_text(TRAIN + VAL)
    questions = mc.build(VAL, TRAIN, cut="word", size=100)
    oracle = NGramModel(8, tok.vocab_size, smoothing=1e-6).fit(tok.encode(VAL))
    result = mc.evaluate(mc.ngram_log_probs(oracle), tok, questions)
    assert result.raw.value > 0.9 and result.normalised.value > 0.9
    uniform = mc.evaluate(mc.uniform_log_probs(tok.vocab_size), tok, questions)
    assert uniform.normalised.value == pytest.approx(1 / mc.NUM_CHOICES)  # every question tied
    assert uniform.answer_nats_per_char == pytest.approx(math.log(tok.vocab_size))


def test_the_accuracies_are_the_shares_of_right_answers():
    tok = CharTokenizer.from_text(TRAIN + VAL)
    questions = mc.build(VAL, TRAIN, cut="space", size=50)
    lp = mc.ngram_log_probs(NGramModel(3, tok.vocab_size, smoothing=0.1).fit(tok.encode(TRAIN)))
    raw = norm = 0
    nats = chars = 0.0
    each = []
    for q in questions:
        totals = mc.choice_log_probs(lp, tok, q)
        each.append(float(max(range(4), key=lambda i: totals[i]) == q.answer))
        raw += max(range(4), key=lambda i: totals[i]) == q.answer
        norm += max(range(4), key=lambda i: totals[i] / len(q.choices[i])) == q.answer
        nats -= totals[q.answer]
        chars += len(q.choices[q.answer])
    result = mc.evaluate(lp, tok, questions)
    assert result.raw.value == pytest.approx(raw / 50)  # no ties with these probabilities
    assert result.normalised.value == pytest.approx(norm / 50)
    assert result.answer_nats_per_char == pytest.approx(nats / chars)
    assert result.raw.n == 50
    assert result.credits == tuple(each)  # question by question, in order (for paired tests)


def test_a_tie_earns_its_share_of_a_point():
    q = mc.Question("line", "A:\nab\n", ("x\n", "y\n", "z\n", "w\n"), 2, 0)
    tok = CharTokenizer.from_text("A:\nabxyzw")
    scores = {"x": -1.0, "y": -3.0, "z": -1.0, "w": -5.0}

    def lp(ids):
        out = torch.zeros(len(ids) - 1, dtype=torch.float64)
        out[-2] = scores[tok.decode([ids[-2]])]
        return out

    assert mc.evaluate(lp, tok, [q]).raw.value == pytest.approx(0.5)
    scores["z"] = -1.5
    assert mc.evaluate(lp, tok, [q]).raw.value == 0


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.integers(1, 400), st.data())
def test_the_wilson_interval_is_the_score_test_inverted(n, data):
    successes = data.draw(st.integers(0, n))
    low, high = mc.wilson_interval(successes, n)
    z = 1.959963984540054
    p_hat = successes / n

    def rejects(p):  # the score test: |p_hat - p| > z * sqrt(p (1 - p) / n)
        return abs(p_hat - p) > z * math.sqrt(p * (1 - p) / n)

    def boundary(kept, rejected):  # bisection between a p the test keeps and one it rejects
        for _ in range(100):
            middle = (kept + rejected) / 2
            kept, rejected = (kept, middle) if rejects(middle) else (middle, rejected)
        return (kept + rejected) / 2

    expected_low = 0.0 if successes == 0 else boundary(p_hat, 0.0)
    expected_high = 1.0 if successes == n else boundary(p_hat, 1.0)
    assert low == pytest.approx(expected_low, abs=1e-9)
    assert high == pytest.approx(expected_high, abs=1e-9)
    assert low <= p_hat <= high


def test_a_distractor_never_equals_the_answer_when_the_text_repeats_itself():
    refrain = "\n\n".join(f"KING:\nWhat news of {word} tonight my lord?\nAnd so farewell to thee."
                        for word in WORDS)  # every second line the same
    text = refrain + "\n\n" + VAL
    for cut in mc.CUTS:
        for q in mc.build(text, TRAIN, cut=cut, size=10_000):
            assert len(set(q.choices)) == mc.NUM_CHOICES
