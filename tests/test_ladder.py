"""The loss ladder: each rung's value, where it comes from, and its cache.

The rungs are computed on a small corpus put in place of the book's and a cache folder of the
test's own (the ``ladder_corpus`` fixture of ``conftest.py``), so that every test is fast and never
reads or writes the user's cache. The counting rungs are compared with references
computed independently: a loop over the validation text, and PyTorch's cross-entropy.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tinygpt.book import ladder, trained_model
from tinygpt.book.scoring import score
from tinygpt.small_models import AttentionOnly, ContextMLP

CHAPTERS = Path(__file__).resolve().parent.parent / "chapters"
# The chapters whose notebooks glue their rungs; chapters 7 and 8 glue theirs in another branch.
GLUED_CHAPTERS = (2, 4, 5, 6, 7, 8, 12)


def ngram_reference(train: list[int], val: list[int], n: int, k: float, V: int) -> float:
    """Mean -ln P over every prediction of ``val``, by loops: target t is predicted from the up
    to n - 1 tokens before it in ``val``, with add-k counts of the training text."""
    total = 0.0
    for t in range(1, len(val)):
        context = tuple(val[max(0, t - n + 1) : t])
        m = len(context)
        grams = Counter(tuple(train[s : s + m + 1]) for s in range(len(train) - m))
        seen = sum(c for g, c in grams.items() if g[:m] == context)
        total -= math.log((grams[(*context, val[t])] + k) / (seen + k * V))
    return total / (len(val) - 1)


def test_the_counting_rungs_equal_independent_references(ladder_corpus):
    tok, train, val, _ = ladder_corpus
    V = tok.vocab_size
    assert ladder.rung_loss("uniform") == pytest.approx(math.log(V), rel=1e-12)
    # unigram: PyTorch's cross-entropy of the frequencies, for every token after the first
    freq = torch.bincount(torch.tensor(train), minlength=V).double()
    logits = (freq / freq.sum()).log().expand(len(val) - 1, V)
    unigram = F.cross_entropy(logits, torch.tensor(val[1:])).item()
    assert ladder.rung_loss("unigram") == pytest.approx(unigram, rel=1e-9)
    for key in ("bigram", "ngram"):
        n, k = ladder.COUNTING[key]
        assert ladder.rung_loss(key) == pytest.approx(ngram_reference(train, val, n, k, V),
                                                      rel=1e-9), key


class TableModel(nn.Module):
    """A bigram model as a network: logits = log-probabilities of the row of the current token."""

    def __init__(self, probs: torch.Tensor) -> None:
        super().__init__()
        self.log_probs = probs.log()  # (V, V)

    def forward(self, idx):
        return self.log_probs[idx]  # (B, T, V)


def test_the_bigram_rung_equals_score_of_the_same_model_as_a_network(ladder_corpus):
    tok, train, val, _ = ladder_corpus
    from tinygpt.bigram import bigram_counts, bigram_probs

    k = ladder.COUNTING["bigram"][1]
    probs = bigram_probs(bigram_counts(train, tok.vocab_size), smoothing=k)
    scored = score(TableModel(probs), torch.tensor(val), block_size=16)
    assert ladder.rung_loss("bigram") == pytest.approx(scored, rel=1e-6)


def test_every_rung_is_scored_on_book_datas_validation_split(ladder_corpus, monkeypatch):
    _, train, val, calls = ladder_corpus
    scored, fitted = [], []
    fit = ladder.fit

    def recording_fit(model, train_ids, block_size, config):
        fitted.append(train_ids)
        return fit(model, train_ids, block_size, config)

    def recording_score(model, ids, block_size, batch_size=32):
        scored.append((type(model).__name__, ids, block_size))
        return score(model, ids, block_size, batch_size)

    monkeypatch.setattr(ladder, "score", recording_score)
    monkeypatch.setattr(ladder, "fit", recording_fit)
    monkeypatch.setattr(trained_model, "book_model", lambda *a, **k: pytest.fail("not this one"))
    losses = {key: ladder.rung_loss(key) for key in ladder.KEYS
              if key not in ("book_model", "modern_model")}
    assert set(calls) == {"shakespeare"}  # the book's corpus, nothing else
    names = {name for name, _, _ in scored}
    assert names == {"ContextMLP", "AttentionOnly", "GPT"}
    assert len(scored) == 4  # three trained rungs and the untrained GPT
    for _, ids, block_size in scored:
        assert ids.tolist() == val  # the whole validation split, not a sample
        assert block_size in (ladder.BLOCK_SIZE, trained_model.BOOK_RECIPE.model.block_size)
    assert len(fitted) == 3 and all(ids.tolist() == train for ids in fitted)  # trained on train
    assert all(math.isfinite(v) and v > 0 for v in losses.values())


def test_the_book_model_rung_is_the_book_models_whole_split_loss(ladder_corpus, monkeypatch):
    class Found:
        val_loss = 1.2345

    monkeypatch.setattr(trained_model, "book_model", lambda *a, **k: Found())
    assert ladder.rung_loss("book_model") == 1.2345
    assert [loss for rung, loss in ladder.ladder() if rung.key == "book_model"] == [1.2345]


def test_the_modern_rung_is_the_modern_recipes_model_and_comes_after_chapter_8(ladder_corpus,
                                                                                monkeypatch):
    asked = []

    def book_model(recipe=trained_model.BOOK_RECIPE, **_):
        asked.append(recipe)
        return type("Found", (), {"val_loss": 1.25 if recipe is trained_model.MODERN_RECIPE
                                  else 1.5})()

    monkeypatch.setattr(trained_model, "book_model", book_model)
    assert ladder.rung_loss("modern_model") == 1.25
    assert asked == [trained_model.MODERN_RECIPE]
    assert ladder.recipe("modern_model")["recipe"]["train"]["optimizer"] == "muon"
    assert [r.key for r, _ in ladder.ladder(through=8)][-1] == "book_model"
    assert [r.key for r, _ in ladder.ladder()][-2:] == ["book_model", "modern_model"]
    with pytest.raises(TypeError, match="through"):
        ladder.ladder(through="8")


def counting(monkeypatch, name):
    """Wrap ``ladder.<name>`` so that its calls are counted."""
    calls = []
    original = getattr(ladder, name)

    def counted(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs)

    monkeypatch.setattr(ladder, name, counted)
    return calls


def test_a_second_call_reads_the_cache(ladder_corpus, monkeypatch):
    calls = counting(monkeypatch, "_counting_loss")
    first = ladder.rung_loss("bigram")
    assert ladder.rung_loss("bigram") == first and len(calls) == 1
    fits = counting(monkeypatch, "fit")
    trained = ladder.train_rung("one_block")
    assert ladder.rung_loss("one_block") == trained.loss and len(fits) == 1


def test_a_corrupt_cache_entry_is_computed_again(ladder_corpus, monkeypatch):
    calls = counting(monkeypatch, "_counting_loss")
    first = ladder.rung_loss("unigram")
    path = ladder._path("unigram")
    path.write_text(path.read_text()[:-20])  # cut short
    with pytest.warns(UserWarning, match="corrupt"):
        assert ladder.rung_loss("unigram") == first
    assert len(calls) == 2
    assert ladder.rung_loss("unigram") == first and len(calls) == 2  # rewritten whole
    # a valid file that does not hold this rung's loss is not used either
    from tinygpt.book import results_cache

    results_cache.write_json(path, {"rung": "unigram", "loss": "3.0"})
    assert ladder.rung_loss("unigram") == first and len(calls) == 3
    assert json.loads(path.read_text())["content"]["loss"] == first


def test_a_changed_recipe_is_computed_again(ladder_corpus, monkeypatch):
    before = ladder.rung_loss("ngram")
    monkeypatch.setitem(ladder.COUNTING, "ngram", (3, 0.01))
    calls = counting(monkeypatch, "_counting_loss")
    after = ladder.rung_loss("ngram")
    assert len(calls) == 1 and after != before


def test_train_rung_returns_the_model_it_scored(ladder_corpus):
    _, _, val, _ = ladder_corpus
    trained = ladder.train_rung("attention_only")
    assert len(trained.train_losses) == ladder.RUNG_TRAIN.max_iters
    assert score(trained.model, torch.tensor(val), ladder.BLOCK_SIZE) == trained.loss
    again = ladder.train_rung("attention_only")  # seeded: the same model again
    assert again.loss == trained.loss


@pytest.mark.parametrize("key", ladder.TRAINED)
def test_a_trained_rung_is_cached_with_its_weights_and_loaded_not_trained_again(
        ladder_corpus, monkeypatch, key):
    _, _, val, _ = ladder_corpus
    fits = counting(monkeypatch, "fit")
    trained = ladder.train_rung(key)
    again = ladder.train_rung(key)  # read from the cache: no second training
    assert len(fits) == 1
    assert again.model is not trained.model
    first, second = trained.model.state_dict(), again.model.state_dict()
    assert set(first) == set(second)
    for name in first:
        assert torch.equal(first[name], second[name]), name  # the weights exactly
    assert (again.loss, again.train_losses, again.train_s) == (
        trained.loss, trained.train_losses, trained.train_s)
    assert score(again.model, torch.tensor(val), ladder.BLOCK_SIZE) == trained.loss
    assert not again.model.training


def test_cached_weights_that_do_not_fit_are_trained_again(ladder_corpus, monkeypatch):
    from tinygpt.book import results_cache

    trained = ladder.train_rung("one_block")
    path = ladder._path("one_block")
    content = json.loads(path.read_text())["content"]
    name = next(iter(content["state"]))
    content["state"][name]["shape"] = [1, *content["state"][name]["shape"]]
    results_cache.write_json(path, content)  # a valid entry whose weights have another shape
    fits = counting(monkeypatch, "fit")
    with pytest.warns(UserWarning, match="do not fit"):
        again = ladder.train_rung("one_block")
    assert len(fits) == 1 and again.loss == trained.loss
    del content["state"]  # no weights at all (an entry of rung_loss alone): trained again
    results_cache.write_json(path, content)
    ladder.train_rung("one_block")
    assert len(fits) == 2
    ladder.train_rung("one_block")  # and written whole again
    assert len(fits) == 2


def test_train_rung_keeps_the_callers_random_state(ladder_corpus):
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    ladder.train_rung("context_mlp")
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize("call, bad", [
    (ladder.rung_loss, "trigram"), (ladder.rung_loss, 3), (ladder.recipe, "Bigram"),
    (ladder.train_rung, "bigram"), (ladder.train_rung, "book_model"),
])
def test_unknown_keys_raise_a_clear_error(call, bad):
    with pytest.raises(ValueError, match="unknown rung") as err:
        call(bad)
    assert "uniform" in str(err.value) or "context_mlp" in str(err.value)


def test_the_rungs_are_in_the_books_order():
    assert ladder.KEYS == ("uniform", "unigram", "bigram", "ngram", "context_mlp",
                           "attention_only", "one_block", "gpt_init", "book_model",
                           "modern_model")
    chapters = [r.chapter for r in ladder.RUNGS]
    assert chapters == sorted(chapters)
    assert all(r.title and r.buys.endswith(".") for r in ladder.RUNGS)


def glued(notebook: Path) -> dict[str, str]:
    """The names glued in a committed notebook's outputs, with their plain-text values."""
    out = {}
    for cell in json.loads(notebook.read_text(encoding="utf-8"))["cells"]:
        for output in cell.get("outputs", []):
            name = output.get("metadata", {}).get("scrapbook", {}).get("name")
            if name:
                out[name] = output["data"].get("application/papermill.record/text/plain", "")
    return out


@pytest.mark.parametrize("rung", [r for r in ladder.RUNGS if r.chapter in GLUED_CHAPTERS],
                         ids=lambda r: r.key)
def test_each_rung_is_glued_by_the_chapter_that_builds_it(rung):
    by_chapter = {int(nb.name[:2]): glued(nb) for nb in CHAPTERS.glob("[0-9][0-9]_*.ipynb")}
    name = f"ladder_{rung.key}"
    assert name in by_chapter[rung.chapter], f"chapter {rung.chapter} does not glue {name}"
    value = float(by_chapter[rung.chapter][name])
    assert 0 < value < 5, f"{name} = {value} is not a loss in nats per character"
    elsewhere = [n for n, names in by_chapter.items() if name in names and n != rung.chapter]
    assert not elsewhere, f"{name} is glued in chapters {elsewhere} too"


@pytest.mark.parametrize("make", [lambda: ContextMLP(7, context=3, n_embd=4, hidden=8),
                                  lambda: AttentionOnly(dataclasses.replace(
                                      ladder.SMALL_GPT, vocab_size=7, block_size=8))],
                         ids=["context_mlp", "attention_only"])
def test_the_rung_models_map_ids_to_logits_and_reject_bad_input(make):
    torch.manual_seed(0)
    model = make()
    idx = torch.randint(7, (2, 5))
    logits, loss = model(idx, idx)
    assert logits.shape == (2, 5, 7)
    assert loss.item() == pytest.approx(F.cross_entropy(logits.flatten(0, 1), idx.flatten()).item())
    # a position's logits do not depend on the tokens after it
    changed = idx.clone()
    changed[:, 3:] = (changed[:, 3:] + 1) % 7
    assert torch.allclose(model(changed)[:, :3], logits[:, :3], atol=1e-6)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model(idx, idx + 7)  # targets out of range
    with pytest.raises(ValueError, match="shape"):
        model(idx, idx[:, :4])
    with pytest.raises((ValueError, TypeError)):
        model(idx.float())


@pytest.mark.parametrize("rung", [r for r in ladder.RUNGS if r.chapter <= 8], ids=lambda r: r.key)
def test_chapter_8s_ladder_shows_the_value_the_building_chapter_printed(rung):
    """Chapter 8's table (glued ladder8_<key>) is each rung's value from its own chapter."""
    by_chapter = {int(nb.name[:2]): glued(nb) for nb in CHAPTERS.glob("[0-9][0-9]_*.ipynb")}
    shown = float(by_chapter[8][f"ladder8_{rung.key}"])
    built = float(by_chapter[rung.chapter][f"ladder_{rung.key}"])
    assert shown == pytest.approx(built, abs=1e-9), (rung.key, shown, built)


def rung_loss_within(key: str, seconds: float = 60) -> float:
    """``ladder.rung_loss(key)``, failing (not hanging the suite) if it blocks."""
    import threading

    from tinygpt.book import ladder

    result: list = []
    thread = threading.Thread(target=lambda: result.append(ladder.rung_loss(key)), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"rung_loss({key!r}) blocked"
    assert result, "rung_loss raised"
    return result[0]


def test_a_ladder_cache_entry_that_is_a_fifo_does_not_block(ladder_corpus):
    import math
    import os

    from tinygpt.book import ladder

    path = ladder._path("uniform")
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    with pytest.warns(UserWarning, match="not a regular file"):
        loss = rung_loss_within("uniform")  # was: blocked for ever opening the FIFO
    assert loss == pytest.approx(math.log(ladder_corpus.tokenizer.vocab_size))


def test_a_ladder_cache_entry_that_is_a_folder_does_not_raise(ladder_corpus):
    import math

    from tinygpt.book import ladder

    path = ladder._path("uniform")
    path.mkdir(parents=True)
    with pytest.warns(UserWarning, match="cannot cache"):
        loss = ladder.rung_loss("uniform")  # was: IsADirectoryError
    assert loss == pytest.approx(math.log(ladder_corpus.tokenizer.vocab_size))
    assert path.is_dir()  # left alone


@pytest.mark.parametrize("hostile", [float("nan"), float("inf"), -1.0])
def test_a_ladder_cache_entry_with_a_hostile_loss_is_computed_again(ladder_corpus, hostile):
    import math

    from tinygpt.book import ladder, results_cache

    results_cache.write_json(ladder._path("uniform"), {"rung": "uniform", "loss": hostile})
    with pytest.warns(UserWarning, match="is not a loss"):
        loss = ladder.rung_loss("uniform")  # was: nan returned
    assert loss == pytest.approx(math.log(ladder_corpus.tokenizer.vocab_size))
