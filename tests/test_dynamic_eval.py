"""tinygpt.book.dynamic_eval: every chunk is scored before the model learns from it.

The order is checked from the outside: a spy records, for every forward pass, the chunk it read
and the model's weights at that moment, and every gradient the optimizer is given. Chunk k must
be scored by weights that have learned from exactly the chunks before it. The same check, run on
a loop that trains first, must catch it. With ``lr = 0`` (or a pull back of the whole step,
``decay = 1``) dynamic evaluation is ``tinygpt.book.scoring.score``; with ``lr > 0`` it equals a
plain loop written here.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from tinygpt.book.dynamic_eval import dynamic_score, pull_back, read_and_learn, windows
from tinygpt.book.scoring import score
from tinygpt.config import GPTConfig
from tinygpt.model import GPT


class Spy(nn.Module):
    """A bigram table that records what each forward read and the weights it read with."""

    def __init__(self, V: int) -> None:
        super().__init__()
        self.table = nn.Embedding(V, V)
        self.reads: list[tuple[torch.Tensor, torch.Tensor]] = []  # (input, weights then)
        self.grads: list[torch.Tensor] = []
        self.table.weight.register_hook(lambda g: self.grads.append(g.clone()))

    def forward(self, x):
        self.reads.append((x.clone(), self.table.weight.detach().clone()))
        return self.table(x)  # (B, T, V)


def chunks_of(seed: int, V: int, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(V, (n * 5 + 1,), generator=g)
    return windows(ids, 5, 1)


def check_scored_before_learned(spy: Spy, start: torch.Tensor, chunks, lr: float) -> None:
    """Chunk k's forward is the k-th, and its weights have learned from chunks 0..k-1 only
    (SGD: start - lr × the sum of their gradients)."""
    scoring = [i for i, (x, _) in enumerate(spy.reads)]
    assert len(scoring) == len(chunks)
    for k, ((x, weights), (cx, _)) in enumerate(zip(spy.reads, chunks)):
        assert torch.equal(x, cx), f"forward {k} did not read chunk {k}"
        learned = start - lr * sum((g for g in spy.grads[:k]), torch.zeros_like(start))
        assert torch.allclose(weights, learned, atol=1e-6), f"chunk {k} scored by other weights"


def test_no_chunk_is_scored_after_the_model_has_trained_on_it():
    torch.manual_seed(0)
    spy, chunks, lr = Spy(6), chunks_of(1, 6, 7), 0.7
    start = spy.table.weight.detach().clone()
    events: list[tuple[str, int]] = []
    spy.table.weight.register_hook(lambda g: events.append(("grad", len(spy.reads) - 1)))
    scored = read_and_learn(spy, chunks, torch.optim.SGD(spy.parameters(), lr=lr),
                            on_read=lambda i: events.append(("scored", i)))
    check_scored_before_learned(spy, start, chunks, lr)
    assert events == [e for k in range(7) for e in (("scored", k), ("grad", k))]
    for k, ((x, weights), (_, y)) in enumerate(zip(spy.reads, chunks)):  # scored by those weights
        expected = F.cross_entropy(F.embedding(x, weights).flatten(0, 1), y.flatten(),
                                   reduction="sum")
        assert scored[k] == pytest.approx(expected.item(), rel=1e-5)


def test_read_in_pieces_each_is_scored_at_its_last_positions_before_its_step():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(2)
    pieces = windows(torch.randint(6, (4 * 5 + 1,), generator=g), 5, 1, parts=2)
    assert [tuple(y.shape) for _, y in pieces] == [(1, 2), (1, 3)] * 4  # 5 = round(2.5) + 3
    spy, lr = Spy(6), 0.7
    start = spy.table.weight.detach().clone()
    scored = read_and_learn(spy, pieces, torch.optim.SGD(spy.parameters(), lr=lr))
    check_scored_before_learned(spy, start, pieces, lr)
    for k, ((x, weights), (_, y)) in enumerate(zip(spy.reads, pieces)):  # its last positions
        expected = F.cross_entropy(F.embedding(x[:, -y.shape[1]:], weights).flatten(0, 1),
                                   y.flatten(), reduction="sum")
        assert scored[k] == pytest.approx(expected.item(), rel=1e-5)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(2, 60), block=st.integers(1, 8), per_chunk=st.integers(1, 3),
       parts=st.integers(1, 5))
def test_the_pieces_of_a_chunk_are_its_predictions_once_each_with_the_same_context(
        n, block, per_chunk, parts):
    ids = torch.arange(n) * 7 % 13
    whole = windows(ids, block, per_chunk)
    pieces = iter(windows(ids, block, per_chunk, parts))
    for x, y in whole:
        read = 0
        while read < y.shape[1]:
            px, py = next(pieces)
            end = read + py.shape[1]
            assert py.shape[1] >= 1 and torch.equal(py, y[:, read:end])
            assert torch.equal(px, x[:, :end])  # the window's inputs up to its last prediction
            read = end
    assert next(pieces, None) is None


def test_the_check_catches_a_loop_that_trains_before_it_scores():
    torch.manual_seed(0)
    spy, chunks, lr = Spy(6), chunks_of(1, 6, 4), 0.7
    start = spy.table.weight.detach().clone()
    optimizer = torch.optim.SGD(spy.parameters(), lr=lr)
    for x, y in chunks:  # the cheat: learn from the chunk, then score it
        optimizer.zero_grad()
        F.cross_entropy(spy(x).flatten(0, 1), y.flatten()).backward()
        optimizer.step()
        with torch.no_grad():
            spy(x)
    with pytest.raises(AssertionError):
        check_scored_before_learned(spy, start, chunks, lr)


def logits_of(model, x):
    out = model(x)
    return out[0] if isinstance(out, tuple) else out  # (B, T, V)


def small_gpt(V: int = 11, T: int = 8) -> GPT:
    torch.manual_seed(3)
    return GPT(GPTConfig(vocab_size=V, block_size=T, n_layer=1, n_head=2, n_embd=16, bias=False))


@settings(max_examples=15, deadline=None)
@given(n=st.integers(2, 60), block=st.integers(1, 8), per_chunk=st.integers(1, 4),
       optimizer=st.sampled_from(["sgd", "adam"]), seed=st.integers(0, 100),
       parts=st.integers(1, 4))
def test_with_lr_zero_dynamic_evaluation_is_the_static_score(n, block, per_chunk, optimizer,
                                                             seed, parts):
    model = small_gpt()
    ids = torch.randint(11, (n,), generator=torch.Generator().manual_seed(seed))
    dynamic = dynamic_score(model, ids, block, 0.0, optimizer, per_chunk, parts=parts)
    assert dynamic.loss == pytest.approx(score(model, ids, block), rel=1e-5)
    assert dynamic.predictions == n - 1 and dynamic.parts == parts


@pytest.mark.parametrize("optimizer, momentum, reference", [
    ("sgd", None, lambda p: torch.optim.SGD(p, lr=0.05)),
    ("sgd", 0.9, lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9)),
    ("adam", None, lambda p: torch.optim.Adam(p, lr=0.05)),
    ("adam", 0.0, lambda p: torch.optim.Adam(p, lr=0.05, betas=(0.0, 0.999))),
])
def test_it_equals_a_plain_loop_and_leaves_the_callers_model_alone(optimizer, momentum,
                                                                    reference):
    model = small_gpt()
    before = copy.deepcopy(model.state_dict())
    ids = torch.randint(11, (100,), generator=torch.Generator().manual_seed(0))
    got = dynamic_score(model, ids, 8, 0.05, optimizer, momentum=momentum)
    assert got.momentum == (0.9 if optimizer == "adam" and momentum is None else momentum or 0)
    learner, total = copy.deepcopy(model).eval(), 0.0
    optimizer = reference(learner.parameters())
    for start in range(0, 99, 8):  # windows of 8 predictions, the last one shorter
        x, y = ids[start : min(start + 8, 99)][None], ids[start + 1 : min(start + 9, 100)][None]
        with torch.no_grad():
            total += F.cross_entropy(logits_of(learner, x).flatten(0, 1), y.flatten(),
                                     reduction="sum").item()
        optimizer.zero_grad()
        F.cross_entropy(logits_of(learner, x).flatten(0, 1), y.flatten()).backward()
        optimizer.step()
    assert got.loss == pytest.approx(total / 99, rel=1e-5)
    assert len(got.chunk_losses) == 13
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_in_two_parts_it_equals_a_loop_that_steps_after_each_half_window():
    model = small_gpt()
    ids = torch.randint(11, (100,), generator=torch.Generator().manual_seed(1))
    got = dynamic_score(model, ids, 8, 0.05, "adam", momentum=0.0, parts=2)
    learner, total = copy.deepcopy(model).eval(), 0.0
    optimizer = torch.optim.Adam(learner.parameters(), lr=0.05, betas=(0.0, 0.999))
    for start in range(0, 99, 8):  # windows of 8 predictions, the last one (3) shorter
        size = min(8, 99 - start)
        x, y = ids[start : start + size][None], ids[start + 1 : start + size + 1][None]
        half = round(size / 2)
        for first, end in ((0, half), (half, size)):  # each half: score, then step
            logits = logits_of(learner, x[:, :end])[:, first:end]
            loss = F.cross_entropy(logits.flatten(0, 1), y[:, first:end].flatten(),
                                   reduction="sum")
            total += loss.item()
            optimizer.zero_grad()
            (loss / (end - first)).backward()
            optimizer.step()
    assert got.loss == pytest.approx(total / 99, rel=1e-5)
    assert len(got.chunk_losses) == 26
    one_part = dynamic_score(model, ids, 8, 0.05, "adam", momentum=0.0)
    assert abs(got.loss - one_part.loss) > 1e-4  # the steps in between change the score


@pytest.mark.parametrize("optimizer, parts", [("sgd", 1), ("adam", 1), ("adam", 3)])
def test_a_pull_back_of_the_whole_step_is_the_static_score(optimizer, parts):
    model = small_gpt()
    ids = torch.randint(11, (60,), generator=torch.Generator().manual_seed(4))
    got = dynamic_score(model, ids, 8, 0.05, optimizer, parts=parts, decay=1.0)
    assert got.loss == pytest.approx(score(model, ids, 8), rel=1e-5) and got.decay == 1.0
    moved = dynamic_score(model, ids, 8, 0.05, optimizer, parts=parts)
    assert abs(moved.loss - got.loss) > 1e-3  # without the pull the steps change the score


def test_with_a_decay_it_equals_a_loop_that_pulls_the_weights_back_after_each_step():
    model = small_gpt()
    ids = torch.randint(11, (100,), generator=torch.Generator().manual_seed(5))
    got = dynamic_score(model, ids, 8, 0.05, "adam", momentum=0.0, decay=0.2, beta2=0.99)
    assert (got.decay, got.beta2) == (0.2, 0.99)
    learner, total = copy.deepcopy(model).eval(), 0.0
    trained = [p.detach().clone() for p in learner.parameters()]
    optimizer = torch.optim.Adam(learner.parameters(), lr=0.05, betas=(0.0, 0.99))
    for start in range(0, 99, 8):
        x, y = ids[start : min(start + 8, 99)][None], ids[start + 1 : min(start + 9, 100)][None]
        loss = F.cross_entropy(logits_of(learner, x).flatten(0, 1), y.flatten(),
                               reduction="sum")
        total += loss.item()
        optimizer.zero_grad()
        (loss / y.numel()).backward()
        optimizer.step()
        with torch.no_grad():  # a fifth of the way back to the trained weights
            for p, p0 in zip(learner.parameters(), trained):
                p.copy_(p + 0.2 * (p0 - p))
    assert got.loss == pytest.approx(total / 99, rel=1e-4)  # wrong pulls differ by > 8e-3
    plain = dynamic_score(model, ids, 8, 0.05, "adam", momentum=0.0, beta2=0.99)
    assert abs(plain.loss - got.loss) > 1e-4


def test_pull_back_moves_each_weight_the_fraction_back_after_every_step():
    weight = nn.Parameter(torch.tensor([1.0, -2.0]))
    optimizer = torch.optim.SGD([weight], lr=1.0)
    pull_back(optimizer, 0.25)
    weight.grad = torch.tensor([4.0, 4.0])
    optimizer.step()  # to (-3, -6), then a quarter of the way back to (1, -2)
    assert torch.allclose(weight.detach(), torch.tensor([-2.0, -5.0]))
    optimizer.step()  # to (-6, -9), then back a quarter of the way to (1, -2)
    assert torch.allclose(weight.detach(), torch.tensor([-4.25, -7.25]))
    with pytest.raises(ValueError, match="decay must be in"):
        pull_back(optimizer, 1.5)


def test_on_text_that_repeats_learning_as_it_reads_lowers_the_loss():
    model = small_gpt()
    ids = torch.arange(11).repeat(30)  # the same 11 tokens again and again
    static = score(model, ids, 8)
    dynamic = dynamic_score(model, ids, 8, 1e-2, "adam")
    assert dynamic.loss < static - 0.5
    assert dynamic.chunk_losses[-1] < dynamic.chunk_losses[0]


def test_windows_refuses_a_count_of_pieces_below_one():
    with pytest.raises(ValueError, match="parts must be a positive integer"):
        windows(torch.arange(20), 5, 1, parts=0)


@pytest.mark.parametrize("kwargs, match", [
    (dict(lr=-1.0), "lr"), (dict(optimizer="rmsprop"), "optimizer"),
    (dict(block_size=9), "exceeds the model's context length 8"),
    (dict(windows_per_chunk=0), "windows_per_chunk"), (dict(parts=0), "parts"),
    (dict(momentum=1.0), "momentum"), (dict(momentum=-0.1), "momentum"),
    (dict(decay=-0.1), "decay"), (dict(decay=1.5), "decay"), (dict(beta2=1.0), "beta2"),
    (dict(ids=torch.tensor([3])), "at least 2 tokens"),
    (dict(ids=torch.tensor([3, 11])), "unknown token id 11"),
])
def test_bad_arguments_are_refused_by_name(kwargs, match):
    args = dict(model=small_gpt(), ids=torch.tensor([1, 2, 3]), block_size=8, lr=0.1) | kwargs
    with pytest.raises((ValueError, TypeError), match=match):
        dynamic_score(**args)


def test_the_books_dynamic_evaluation_scores_both_models_and_is_cached(ladder_corpus,
                                                                        monkeypatch):
    from tinygpt.book import evaluations, trained_model

    V = ladder_corpus.tokenizer.vocab_size
    models, calls = {}, []

    class Found:
        def __init__(self, recipe):
            torch.manual_seed(len(models))
            self.model = models.setdefault(recipe.model.n_layer, GPT(GPTConfig(
                vocab_size=V, block_size=recipe.model.block_size, n_layer=1, n_head=2,
                n_embd=8, bias=False)))
            self.val_loss = 2.0

    def book_model(recipe, progress=True):
        calls.append(recipe)
        return Found(recipe)

    monkeypatch.setattr(trained_model, "book_model", book_model)
    first = evaluations.dynamic_evaluation()
    assert [row["rung"] for row in first["rows"]] == ["book_model", "modern_model"]
    val = torch.tensor(ladder_corpus.val)
    for row, recipe in zip(first["rows"], calls):
        model = models[recipe.model.n_layer]
        expected = dynamic_score(model, val, recipe.model.block_size,
                                 **evaluations.DYNAMIC[row["rung"]])
        assert row["dynamic"] == pytest.approx(expected.loss, rel=1e-6)
        assert row["static"] == 2.0 and len(row["tenths"]) <= 10
    assert evaluations.dynamic_evaluation() == first and len(calls) == 2  # read from the cache
