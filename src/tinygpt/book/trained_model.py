"""The book's model: the best character-level GPT that trains in about three minutes on 2 CPU cores.

:func:`book_model` trains it by a fixed, seeded recipe (:data:`BOOK_RECIPE`) on the complete plays,
once: the result is cached (see :mod:`tinygpt.book.results_cache`) as a checkpoint, with its
training history, the text it wrote at several steps and its loss over the whole validation split.
Chapter 8 trains it; chapters 9 and later load it. A second call loads it instead of training; a
changed recipe, tinygpt version or source of the code that trains it trains again; a corrupt cached
copy is reported and trained again, never used.

The cached copy is the folder ``book-model-<key>`` in :func:`tinygpt.book.results_cache.folder`, a
checkpoint (``tinygpt.checkpoint``: every file checked against the checksums of a checksummed
manifest when it is loaded). It is saved into a temporary folder beside it and renamed into place,
so it is there whole or not at all. Its lock (``results_cache.lock``: ``.book-model-<key>.lock``
beside it) makes a second process that asks for the same model wait for the first one and load
what it stored. Where the cache cannot be written, the model is trained and returned, with a
warning.

While it trains (under the lock), the run is checkpointed every :data:`SAVE_EVERY` steps into its
work folder ``.book-model-<key>.work`` beside the entry (``train``'s ``out_dir``). A training that
was interrupted (a killed build, a closed laptop) is resumed from there by the next call, bit for
bit (``train(..., resume=True)``), not started again; the work folder is removed once the entry is
stored. It trains on as many threads as there are free cores (``runtime.free_threads``): a resumed
run is bit-identical to an uninterrupted one on as many threads.
"""

from __future__ import annotations

import dataclasses
import os
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tinygpt import data
from tinygpt.book import results_cache
from tinygpt.book.scoring import score
from tinygpt.checkpoint import load_checkpoint, save_checkpoint
from tinygpt.checkpoint.folder import MANIFEST, CheckpointError
from tinygpt.checks import check_bool, check_float, check_instance, check_int
from tinygpt.config import GPTConfig, TrainConfig
from tinygpt.model import GPT
from tinygpt.runtime import free_threads
from tinygpt.sample import generate
from tinygpt.tokenizer import CharTokenizer
from tinygpt.train import Record, train


@dataclass(frozen=True)
class Recipe:
    """Everything that decides the book's model: the model, its training, the corpus, and the
    samples taken on the way (at the steps ``sample_at`` -- 0 is the untrained model -- and the
    last one: ``sample_chars`` characters after ``prompt`` at ``temperature``, from a generator
    seeded with ``sample_seed``). Checked when created."""

    model: GPTConfig
    train: TrainConfig
    corpus: str = "shakespeare"
    sample_at: tuple[int, ...] = (0, 100, 300, 1000)
    prompt: str = "\n"
    sample_chars: int = 400
    temperature: float = 0.8
    sample_seed: int = 0

    def __post_init__(self) -> None:
        check_instance(self.model, GPTConfig, "recipe.model")
        check_instance(self.train, TrainConfig, "recipe.train")
        check_instance(self.corpus, str, "recipe.corpus")
        check_instance(self.sample_at, tuple, "recipe.sample_at")
        for step in self.sample_at:
            check_int(step, "each step of recipe.sample_at", 0, self.train.max_iters)
        check_instance(self.prompt, str, "recipe.prompt")
        if not self.prompt:
            raise ValueError("recipe.prompt must hold at least one character")
        check_int(self.sample_chars, "recipe.sample_chars")
        check_float(self.temperature, "recipe.temperature", 0, low_open=True)
        check_int(self.sample_seed, "recipe.sample_seed", 0)


# Two blocks, not four: on 2 CPU cores a block costs time that, spent on more steps of a shallower
# model, buys more (whole-split validation loss after about three minutes on 2 cores: 4 blocks,
# 2,200 steps 1.653; 3 blocks, 2,800 steps 1.631; 2 blocks of width 160, 2,900 steps 1.609;
# 2 blocks, context 256, 3,500 steps 1.634; this recipe 1.598; each one seeded run, one thread).
BOOK_RECIPE = Recipe(
    model=GPTConfig(vocab_size=70, block_size=128, n_layer=2, n_head=4, n_embd=128, bias=False,
                    activation="gelu"),
    train=TrainConfig(batch_size=16, max_iters=4200, learning_rate=4e-3, min_lr=0.0,
                      warmup_iters=100, eval_interval=300, eval_iters=8, log_interval=10),
    sample_at=(0, 150, 600, 2000),
)

# Chapter 12's changes (RoPE, ReLU², QK-norm, zero-initialised projections, RMSNorm, Muon), given
# the book model's budget: the steps that about three minutes of 2 CPU cores buy at this shape
# (72.5 ms a step: benchmarks/results/modern_book_timings.json). Shape, learning rate and the
# untied head were chosen by benchmarks/modern_book.py, 38 candidates trained for their budget on a
# GPU (benchmarks/results/modern_book_search.json): 3 blocks beat 2 or 4 at this budget, and of
# the settings tried this one scored best (1.494 there, one seed).
MODERN_RECIPE = Recipe(
    model=GPTConfig(vocab_size=70, block_size=128, n_layer=3, n_head=4, n_embd=128, bias=False,
                    activation="relu2", positional="rope", qk_norm=True, zero_init_proj=True,
                    norm="rmsnorm", tie_weights=False),
    train=TrainConfig(batch_size=16, max_iters=2484, learning_rate=5e-3, min_lr=0.0,
                      warmup_iters=100, eval_interval=300, eval_iters=8, log_interval=10,
                      optimizer="muon"),
    sample_at=(0, 150, 600, 2000),
)


@dataclass
class BookModel:
    """A trained book model and what was recorded while it trained.

    ``history``: one record per step (as ``train`` returns it); ``samples``: step -> the text
    written at that step; ``val_loss``: the mean loss over the whole validation split (see
    :func:`tinygpt.book.scoring.score`); ``train_s``: seconds the training took on the machine that
    trained it (``machine``); ``trained_now``: trained by this call rather than loaded;
    ``path``: the cached copy (absent if the cache could not be written).
    """

    model: GPT
    tokenizer: CharTokenizer
    recipe: Recipe
    history: list[Record]
    samples: dict[int, str]
    val_loss: float
    train_s: float
    machine: str
    trained_now: bool
    path: Path = field(repr=False)


def book_data(corpus: str = "shakespeare") -> tuple[CharTokenizer, torch.Tensor, torch.Tensor]:
    """The book's one corpus and split: its character tokenizer and its training and validation
    token ids (the first 90% and the last 10% of the text, ``data.split_train_val``)."""
    text = data.load_text(corpus)
    tok = CharTokenizer.from_text(text)
    train_ids, val_ids = data.split_train_val(torch.tensor(tok.encode(text)))
    return tok, train_ids, val_ids


def _recipe_json(recipe: Recipe) -> dict[str, Any]:
    return dataclasses.asdict(recipe)


def book_model(recipe: Recipe = BOOK_RECIPE, *, progress: bool = True) -> BookModel:
    """The book's model, trained by ``recipe``: loaded from the cache, or trained and cached.

    ``progress``: show training's progress bar and log. A corrupt cached copy is reported (a
    warning) and replaced by a freshly trained model; a cache that cannot be written is reported
    and the model trained is returned all the same.
    """
    if not isinstance(recipe, Recipe):
        raise TypeError(f"recipe must be a tinygpt.book.trained_model.Recipe, got "
                        f"{type(recipe).__name__}")
    check_bool(progress, "progress")
    key = results_cache.key("book.trained_model", _recipe_json(recipe))
    path = results_cache.folder() / f"book-model-{key[:20]}"
    waiting = f"another process is making the book model {path.name}: waiting for it"
    with results_cache.lock(path, waiting if progress else None) as locked:
        if path.exists() or path.is_symlink():
            try:
                return _load(path, recipe)
            except CheckpointError as err:
                warnings.warn(f"the cached book model is corrupt ({err}); training it again",
                              stacklevel=2)
        work = work_folder(path) if locked else None  # unlocked: another process may train it
        result = _train(recipe, path, progress, work)
        _store(result, path, clean=locked)
        if work is not None:
            results_cache.remove_entry(work)
        return result


SAVE_EVERY = 300  # steps between the checkpoints of a cached model's training


def work_folder(path: Path) -> Path:
    """Where the training of the cache entry ``path`` is checkpointed: ``.<name>.work`` beside
    it."""
    return path.with_name(f".{path.name}.work")


def _load(path: Path, recipe: Recipe) -> BookModel:
    ckpt = load_checkpoint(path)
    if ckpt.model_config != recipe.model or ckpt.train_config != recipe.train:
        raise CheckpointError(f"{path}: holds a model of another recipe")
    if not isinstance(ckpt.tokenizer, CharTokenizer) or not ckpt.history:
        raise CheckpointError(f"{path}: has no character tokenizer or no history")
    last = ckpt.history[-1]
    try:
        samples = {int(r["step"]): str(r["sample"]) for r in ckpt.history if "sample" in r}
        val_loss, train_s, machine = float(last["whole_val_loss"]), float(last["train_s"]), \
            str(last["machine"])
    except (KeyError, TypeError, ValueError) as err:
        raise CheckpointError(f"{path}: incomplete record ({err})") from None
    if set(samples) != {*recipe.sample_at, recipe.train.max_iters}:
        raise CheckpointError(f"{path}: holds samples at steps {sorted(samples)}, not the "
                              "recipe's")
    return BookModel(ckpt.model, ckpt.tokenizer, recipe, ckpt.history, samples, val_loss,
                     train_s, machine, trained_now=False, path=path)


def _train(recipe: Recipe, path: Path, progress: bool, work: Path | None) -> BookModel:
    """Train ``recipe``'s model; with a ``work`` folder, checkpointed there every ``SAVE_EVERY``
    steps and resumed from the checkpoint found there (one that cannot be resumed is reported
    and the training starts again)."""
    tok, train_ids, val_ids = book_data(recipe.corpus)
    if tok.vocab_size != recipe.model.vocab_size:
        raise ValueError(f"the recipe's vocab_size is {recipe.model.vocab_size}, but the corpus "
                         f"{recipe.corpus!r} has {tok.vocab_size} characters")
    prompt = torch.tensor([tok.encode(recipe.prompt)])  # (1, T0); an unknown character: error

    def write(model: GPT) -> str:  # the same seeded sample at every step it is taken
        gen = torch.Generator().manual_seed(recipe.sample_seed)
        out = generate(model, prompt, recipe.sample_chars, temperature=recipe.temperature,
                       generator=gen)
        return tok.decode(out[0, prompt.shape[1]:].tolist())

    start = time.perf_counter()
    spent = [0.0]  # seconds the run this call resumes had trained until its checkpoint

    def at_step(record: Record, model: GPT) -> None:  # runs before the step's checkpoint
        step = record["step"]
        if step in recipe.sample_at or step == recipe.train.max_iters:
            record["sample"] = write(model)
        if step % SAVE_EVERY == 0 or step == recipe.train.max_iters:  # saved with the step
            record["elapsed_s"] = spent[0] + time.perf_counter() - start

    torch.manual_seed(recipe.train.seed)
    model = GPT(recipe.model)
    first_sample = write(model) if 0 in recipe.sample_at else None  # untrained: step 0
    with free_threads():
        history = _train_resumably(recipe, model, train_ids, val_ids, tok, work, progress,
                                   at_step, spent)
    train_s = spent[0] + time.perf_counter() - start
    if first_sample is not None:
        history[0]["sample"] = first_sample
    last = history[-1]
    last["whole_val_loss"] = score(model, val_ids, recipe.model.block_size)
    last["train_s"] = train_s
    last["machine"] = f"{os.cpu_count()} CPU cores, torch {torch.__version__}"
    samples = {int(r["step"]): r["sample"] for r in history if "sample" in r}
    return BookModel(model.eval(), tok, recipe, history, samples, last["whole_val_loss"],
                     train_s, last["machine"], trained_now=True, path=path)


def _train_resumably(recipe: Recipe, model: GPT, train_ids: torch.Tensor, val_ids: torch.Tensor,
                     tok: CharTokenizer, work: Path | None, progress: bool, at_step: Any,
                     spent: list[float]) -> list[Record]:
    """``train`` the seeded ``model`` in place: resumed from ``work``'s checkpoint if it holds
    one (``spent[0]``: the seconds its run had trained), else from the start, checkpointed into
    ``work`` (emptied first)."""
    if work is None:
        return train(recipe.model, recipe.train, train_ids, val_ids, model=model,
                     progress=progress, callback=at_step)
    config = dataclasses.replace(recipe.train, save_every=SAVE_EVERY)  # the same steps
    if (work / MANIFEST).is_file() and not work.is_symlink():
        try:
            spent[0] = float(load_checkpoint(work).history[-1].get("elapsed_s", 0.0))
            return train(recipe.model, config, train_ids, val_ids, out_dir=work, tokenizer=tok,
                         resume=True, model=model, progress=progress, callback=at_step)
        except (CheckpointError, ValueError, IndexError, TypeError) as err:
            warnings.warn(f"cannot resume the interrupted training in {work} ({err}); training "
                          "from the start", stacklevel=4)
            spent[0] = 0.0
            torch.manual_seed(recipe.train.seed)
            model.load_state_dict(GPT(recipe.model).state_dict())  # the seeded start again
    results_cache.remove_entry(work)  # what a run killed before its first checkpoint left
    return train(recipe.model, config, train_ids, val_ids, out_dir=work, tokenizer=tok,
                 model=model, progress=progress, callback=at_step)


def _store(result: BookModel, path: Path, clean: bool) -> None:
    """Save the model as the entry ``path`` (``results_cache.store_folder``: whole or not at all,
    a failure only warns; ``clean``, the lock held: killed saves' leftovers removed first, and
    older entries of the name pruned after)."""
    def save(tmp: Path) -> None:
        save_checkpoint(tmp, result.model, None, result.recipe.model, result.recipe.train,
                        result.recipe.train.max_iters, tokenizer=result.tokenizer,
                        history=result.history)

    results_cache.store_folder(path, save, "the book model", clean=clean)
