"""The book's model and its cache: trained once, then loaded; trained again whenever what made it
changes; a corrupt or half-written copy is never used.

Every test caches into its own ``tmp_path`` (``TINYGPT_CACHE``) and trains a tiny recipe (one
layer, width 16, 20 steps) on a small corpus patched in for the complete plays, so each training
takes a fraction of a second; ``trains`` counts the calls of ``train``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from conftest import checksum_of

import tinygpt
from tinygpt import data
from tinygpt.book import results_cache, trained_model
from tinygpt.book.scoring import score
from tinygpt.book.trained_model import BOOK_RECIPE, Recipe, book_data, book_model
from tinygpt.checkpoint.folder import MANIFEST, MODEL_FILE
from tinygpt.config import GPTConfig, TrainConfig
from tinygpt.model import GPT
from tinygpt.runtime import one_thread
from tinygpt.sample import generate

LINES = ["ROMEO:\nBut soft, what light through yonder window breaks?\n",
         "JULIET:\nO Romeo, Romeo, wherefore art thou Romeo?\n",
         "HAMLET:\nTo be, or not to be, that is the question.\n",
         "MACBETH:\nTomorrow, and tomorrow, and tomorrow.\n"]
TEXT = "\n".join(LINES[(i * 7) % 4] for i in range(120))  # about 6,000 characters
V = len(set(TEXT))
TINY = Recipe(
    model=GPTConfig(vocab_size=V, block_size=16, n_layer=1, n_head=2, n_embd=16, bias=False),
    train=TrainConfig(batch_size=4, max_iters=20, learning_rate=1e-2, warmup_iters=2,
                      eval_interval=10, eval_iters=2, log_interval=10),
    sample_at=(0, 5, 12), prompt="\n", sample_chars=24)


@pytest.fixture
def trains(tmp_path, monkeypatch) -> list[int]:
    """Cache into ``tmp_path``, read the small corpus, count ``train``'s calls, and train on one
    thread however busy the machine is: the tests compare a run with another bit for bit, which
    holds only on as many threads (``runtime.free_threads`` follows the load)."""
    monkeypatch.setenv("TINYGPT_CACHE", str(tmp_path))
    monkeypatch.setattr(trained_model, "free_threads", lambda: one_thread())
    monkeypatch.setattr(data, "load_text", lambda name: TEXT)
    calls: list[int] = []
    real = trained_model.train

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(trained_model, "train", counted)
    return calls


def weights(model: GPT) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def entries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_a_second_call_loads_what_the_first_trained(trains):
    first = book_model(TINY, progress=False)
    assert first.trained_now and len(trains) == 1 and first.path.is_dir()
    second = book_model(TINY, progress=False)
    assert not second.trained_now and len(trains) == 1
    assert second.path == first.path
    assert same_weights(weights(first.model), weights(second.model))
    assert second.samples == first.samples and second.val_loss == first.val_loss
    assert second.history == first.history
    assert (second.train_s, second.machine) == (first.train_s, first.machine)
    assert second.tokenizer.chars == first.tokenizer.chars and not second.model.training


def test_a_changed_recipe_trains_again_and_both_stay_cached(trains):
    first = book_model(TINY, progress=False)
    other = book_model(dataclasses.replace(TINY, sample_seed=1), progress=False)
    longer = book_model(dataclasses.replace(
        TINY, train=dataclasses.replace(TINY.train, max_iters=21)), progress=False)
    assert other.trained_now and longer.trained_now and len(trains) == 3
    assert len({first.path, other.path, longer.path}) == 3
    assert not book_model(TINY, progress=False).trained_now and len(trains) == 3


def test_a_changed_package_version_trains_again(trains, monkeypatch):
    first = book_model(TINY, progress=False)
    monkeypatch.setattr(tinygpt, "__version__", tinygpt.__version__ + ".post1")
    again = book_model(TINY, progress=False)
    assert again.trained_now and len(trains) == 2 and again.path != first.path


def test_a_changed_source_trains_again(trains, monkeypatch):
    first = book_model(TINY, progress=False)
    real = results_cache.source_digest
    monkeypatch.setattr(results_cache, "source_digest", lambda module: real(module)[::-1])
    again = book_model(TINY, progress=False)
    assert again.trained_now and len(trains) == 2 and again.path != first.path


def _flip_a_byte(path: Path) -> None:
    blob = bytearray((path / _version_folder(path) / MODEL_FILE).read_bytes())
    blob[-3] ^= 0x01  # in the last weight
    (path / _version_folder(path) / MODEL_FILE).write_bytes(bytes(blob))


def _truncate(path: Path) -> None:
    target = path / _version_folder(path) / MODEL_FILE
    target.write_bytes(target.read_bytes()[: target.stat().st_size // 2])


def _edit_the_manifest(path: Path) -> None:
    meta = json.loads((path / MANIFEST).read_text())
    meta["history"][-1]["whole_val_loss"] = 0.5  # a better loss than the model has
    (path / MANIFEST).write_text(json.dumps(meta))


def _nest_the_manifest(path: Path) -> None:
    (path / MANIFEST).write_text("[" * 100_000 + "]" * 100_000)  # json.loads: RecursionError


def _empty_folder(path: Path) -> None:
    for entry in path.iterdir():
        if entry.is_dir():
            for f in entry.iterdir():
                f.unlink()
            entry.rmdir()
        else:
            entry.unlink()


def _version_folder(path: Path) -> str:
    return json.loads((path / MANIFEST).read_text())["folder"]


@pytest.mark.parametrize("corrupt", [_flip_a_byte, _truncate, _edit_the_manifest,
                                     _nest_the_manifest, _empty_folder])
def test_a_corrupt_copy_is_reported_trained_again_and_repaired_never_used(trains, corrupt):
    first = book_model(TINY, progress=False)
    trained = weights(first.model)
    corrupt(first.path)
    with pytest.warns(UserWarning, match="corrupt"):
        again = book_model(TINY, progress=False)
    assert again.trained_now and len(trains) == 2
    assert same_weights(weights(again.model), trained)  # the fresh, seeded model, not the copy
    assert again.val_loss == first.val_loss and again.samples == first.samples
    repaired = book_model(TINY, progress=False)  # no warning: the copy was replaced
    assert not repaired.trained_now and len(trains) == 2
    assert same_weights(weights(repaired.model), trained)
    assert entries(first.path.parent) == [results_cache.lock_path(first.path).name, first.path.name]


def test_a_consistent_copy_missing_a_sample_is_not_used(trains):
    """A manifest rewritten with a valid checksum but without one of the recipe's samples (as an
    older tinygpt might have written it) is refused too: only the recipe's samples are shown."""
    first = book_model(TINY, progress=False)
    meta = json.loads((first.path / MANIFEST).read_text())
    del meta["history"][5]["sample"]  # step 5
    meta["checksum"] = checksum_of(meta)
    (first.path / MANIFEST).write_text(json.dumps(meta))
    with pytest.warns(UserWarning, match="samples at steps"):
        again = book_model(TINY, progress=False)
    assert again.trained_now and again.samples == first.samples and len(trains) == 2


def test_a_failed_save_leaves_no_temporary_folder_and_no_entry(trains, monkeypatch, tmp_path):
    real = trained_model.save_checkpoint

    def fails_after_writing(out, *args, **kwargs):
        real(out, *args, **kwargs)  # a whole checkpoint in the temporary folder...
        raise OSError(28, "No space left on device")  # ...then the disk is full

    monkeypatch.setattr(trained_model, "save_checkpoint", fails_after_writing)
    with pytest.warns(UserWarning, match="could not cache the book model"):
        result = book_model(TINY, progress=False)
    assert result.trained_now and not result.path.exists()
    assert entries(tmp_path / "results") == [results_cache.lock_path(result.path).name]
    monkeypatch.setattr(trained_model, "save_checkpoint", real)
    assert book_model(TINY, progress=False).trained_now and len(trains) == 2  # trained again


def test_an_interrupted_save_leaves_no_temporary_folder(trains, monkeypatch, tmp_path):
    real = trained_model.save_checkpoint

    def interrupted(out, *args, **kwargs):
        real(out, *args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(trained_model, "save_checkpoint", interrupted)
    with pytest.raises(KeyboardInterrupt):
        book_model(TINY, progress=False)
    left = [name for name in entries(tmp_path / "results") if not name.endswith(".lock")]
    assert len(left) == 1 and left[0].endswith(".work")  # the training's last checkpoint only
    monkeypatch.setattr(trained_model, "save_checkpoint", real)
    steps = trained_steps(monkeypatch)
    assert book_model(TINY, progress=False).trained_now and steps == []  # nothing trained again
    assert [name for name in entries(tmp_path / "results") if not name.endswith(".lock")] == [
        name for name in entries(tmp_path / "results") if name.startswith("book-model-")]


def trained_steps(monkeypatch, stop_at: int | None = None) -> list[int]:
    """Record the steps ``train`` takes from now on (through its callback); ``stop_at``: raise
    ``KeyboardInterrupt`` in that step's callback, as a build killed there."""
    steps: list[int] = []
    real = getattr(trained_model.train, "unwatched", trained_model.train)  # no earlier watch

    def watched(*args, callback, **kwargs):
        def step(record, model):
            callback(record, model)
            steps.append(record["step"])
            if record["step"] == stop_at:
                raise KeyboardInterrupt

        return real(*args, callback=step, **kwargs)

    watched.unwatched = real  # type: ignore[attr-defined]
    monkeypatch.setattr(trained_model, "train", watched)
    return steps


@pytest.fixture
def fixed_threads(monkeypatch):
    """One thread however busy the machine is: runs compared bit for bit use as many."""
    monkeypatch.setattr(trained_model, "free_threads", lambda: one_thread())


def test_an_interrupted_training_resumes_from_its_last_checkpoint_bit_for_bit(
        trains, fixed_threads, monkeypatch, tmp_path):
    monkeypatch.setattr(trained_model, "SAVE_EVERY", 4)
    whole = book_model(TINY, progress=False)  # uninterrupted, in another cache folder
    monkeypatch.setenv("TINYGPT_CACHE", str(tmp_path / "second"))
    first = trained_steps(monkeypatch, stop_at=10)
    with pytest.raises(KeyboardInterrupt):
        book_model(TINY, progress=False)
    assert first == list(range(1, 11))
    work = trained_model.work_folder(results_cache.folder() / whole.path.name)
    assert (work / MANIFEST).is_file() and not work.with_name(whole.path.name).exists()
    then = trained_steps(monkeypatch)
    resumed = book_model(TINY, progress=False)
    assert then == list(range(9, 21))  # from the checkpoint of step 8, not from step 1
    assert same_weights(weights(resumed.model), weights(whole.model))
    assert resumed.samples == whole.samples and resumed.val_loss == whole.val_loss
    assert [r.get("loss") for r in resumed.history] == [r.get("loss") for r in whole.history]
    assert resumed.train_s > 0 and not work.exists()  # the work folder goes once it is stored
    assert not book_model(TINY, progress=False).trained_now


def test_a_work_folder_that_cannot_be_resumed_is_reported_and_trained_from_the_start(
        trains, fixed_threads, monkeypatch, tmp_path):
    monkeypatch.setattr(trained_model, "SAVE_EVERY", 4)
    whole = book_model(TINY, progress=False)
    monkeypatch.setenv("TINYGPT_CACHE", str(tmp_path / "second"))
    trained_steps(monkeypatch, stop_at=6)
    with pytest.raises(KeyboardInterrupt):
        book_model(TINY, progress=False)
    work = trained_model.work_folder(results_cache.folder() / whole.path.name)
    [weights_file] = work.glob(f"step-*/{MODEL_FILE}")  # step 4's
    weights_file.write_bytes(b"not weights")  # corrupt: its checksum no longer matches
    steps = trained_steps(monkeypatch)
    with pytest.warns(UserWarning, match="cannot resume the interrupted training"):
        again = book_model(TINY, progress=False)
    assert steps == list(range(1, 21))
    assert same_weights(weights(again.model), weights(whole.model))


def test_what_killed_saves_left_is_removed_and_nothing_else(trains, tmp_path):
    path = book_model(TINY, progress=False).path
    _empty_folder(path)
    path.rmdir()
    left = path.with_name(f".{path.name}.tmp-0123abcd")
    left.mkdir()
    (left / "model.safetensors").write_bytes(b"half")
    mine = path.with_name("notes.txt")
    mine.write_text("a user's file")
    assert book_model(TINY, progress=False).trained_now
    assert not left.exists() and mine.read_text() == "a user's file"


def test_an_unwritable_cache_trains_warns_and_returns_the_model(trains, tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"  # the cache folder's parent is a file: nothing can be made there
    blocker.write_text("not a folder")
    monkeypatch.setenv("TINYGPT_CACHE", str(blocker))
    with pytest.warns(UserWarning, match="could not cache the book model"):
        result = book_model(TINY, progress=False)
    assert result.trained_now and result.val_loss > 0 and blocker.read_text() == "not a folder"


HOLDER = """
import fcntl, sys
lock = open(sys.argv[1], "w")
fcntl.flock(lock, fcntl.LOCK_EX)  # as a process training the book model holds it
print("held", flush=True)
sys.stdin.readline()  # until told to store and let go
"""


def test_a_second_process_waits_for_the_first_and_loads_its_model(trains):
    first = book_model(TINY, progress=False)
    stored = first.path.with_name("stored")
    first.path.rename(stored)  # as if the first process were still training
    lock = str(results_cache.lock_path(first.path))
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, lock],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        got: list[trained_model.BookModel] = []
        waiting = threading.Thread(target=lambda: got.append(book_model(TINY, progress=False)))
        waiting.start()
        time.sleep(0.3)
        assert waiting.is_alive() and len(trains) == 1  # it waits rather than training
        stored.rename(first.path)  # the other process stores its model, then lets go
        holder.communicate("\n", timeout=30)
    finally:
        if holder.poll() is None:
            holder.kill()
    waiting.join(timeout=60)
    assert got and not got[0].trained_now and len(trains) == 1
    assert same_weights(weights(got[0].model), weights(first.model))


def test_samples_are_taken_at_the_recipes_steps_and_the_last(trains):
    result = book_model(TINY, progress=False)
    assert sorted(result.samples) == [0, 5, 12, 20]
    assert all(len(text) == TINY.sample_chars for text in result.samples.values())
    tok = result.tokenizer
    prompt = torch.tensor([tok.encode(TINY.prompt)])

    def sample(model: GPT) -> str:
        gen = torch.Generator().manual_seed(TINY.sample_seed)
        out = generate(model, prompt, TINY.sample_chars, temperature=TINY.temperature,
                       generator=gen)
        return tok.decode(out[0, 1:].tolist())

    torch.manual_seed(TINY.train.seed)
    assert result.samples[0] == sample(GPT(TINY.model))  # the untrained, seeded model
    assert result.samples[20] == sample(result.model)  # the returned, trained one
    steps_with = [r["step"] for r in result.history if "sample" in r]
    assert steps_with == [0, 5, 12, 20]


def test_the_whole_split_loss_is_the_score_of_book_datas_validation_split(trains):
    for result in (book_model(TINY, progress=False), book_model(TINY, progress=False)):
        tok, _, val_ids = book_data()
        assert tok.chars == result.tokenizer.chars
        assert result.val_loss == pytest.approx(
            score(result.model, val_ids, TINY.model.block_size), rel=1e-6)
        assert result.val_loss < math.log(V)  # it learnt something
        last = result.history[-1]
        assert last["whole_val_loss"] == result.val_loss and last["train_s"] == result.train_s


def test_book_data_is_the_complete_plays_split_90_10_with_the_books_vocabulary():
    text = data.load_text("shakespeare")
    tok, train_ids, val_ids = book_data()
    assert tok.vocab_size == BOOK_RECIPE.model.vocab_size == len(set(text))
    assert len(train_ids) + len(val_ids) == len(text)
    assert len(val_ids) == round(len(text) * 0.1)
    assert tok.decode(val_ids[:200].tolist()) == text[len(train_ids):len(train_ids) + 200]


def test_bad_recipes_get_clear_errors(trains):
    with pytest.raises(TypeError, match=r"recipe must be a tinygpt\.book\.trained_model\.Recipe"):
        book_model(dataclasses.asdict(TINY))
    with pytest.raises(TypeError, match="progress"):
        book_model(TINY, progress="yes")
    wrong_v = dataclasses.replace(TINY, model=dataclasses.replace(TINY.model, vocab_size=V + 1))
    with pytest.raises(ValueError, match=f"vocab_size is {V + 1}.*has {V} characters"):
        book_model(wrong_v, progress=False)
    with pytest.raises(ValueError, match="not in the vocabulary"):
        book_model(dataclasses.replace(TINY, prompt="~"), progress=False)
    assert trains == []  # every error came before any training
    with pytest.raises(TypeError, match=r"recipe\.model"):
        Recipe(model=TINY.train, train=TINY.train)
    with pytest.raises(ValueError, match="sample_at"):
        dataclasses.replace(TINY, sample_at=(0, 21))
    with pytest.raises(TypeError, match="sample_at"):
        dataclasses.replace(TINY, sample_at=[0, 5])
    with pytest.raises(ValueError, match="temperature"):
        dataclasses.replace(TINY, temperature=0.0)
    with pytest.raises(ValueError, match="prompt"):
        dataclasses.replace(TINY, prompt="")


def test_the_modern_recipe_is_chapter_12s_changes_in_the_book_models_budget():
    """MODERN_RECIPE's steps are those its shape's timed step buys in 180 s (the record of
    benchmarks/modern_book.py --time), with every change chapter 12 measures switched on."""
    import json
    from pathlib import Path

    from tinygpt.book.trained_model import BOOK_RECIPE, MODERN_RECIPE

    timings = json.loads((Path(__file__).parents[1] / "benchmarks" / "results"
                          / "modern_book_timings.json").read_text())
    m = MODERN_RECIPE.model
    name = f"L{m.n_layer}-C{m.n_embd}-H{m.n_head}-T{m.block_size}-B{MODERN_RECIPE.train.batch_size}"
    assert MODERN_RECIPE.train.max_iters == int(180_000 / timings["shapes"][name]["median_ms"])
    assert (m.positional, m.activation, m.norm, m.qk_norm, m.zero_init_proj) == (
        "rope", "relu2", "rmsnorm", True, True)
    assert MODERN_RECIPE.train.optimizer == "muon"
    assert (MODERN_RECIPE.corpus, MODERN_RECIPE.prompt, MODERN_RECIPE.model.vocab_size) == (
        BOOK_RECIPE.corpus, BOOK_RECIPE.prompt, BOOK_RECIPE.model.vocab_size)
