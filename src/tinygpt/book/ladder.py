"""The book's loss ladder: every model the book builds, scored on the same validation text.

A *rung* is one model of the book, from a uniform guess to the modern GPT of chapter 12. ``RUNGS``
lists them in order, with the chapter that builds each and what it buys over the one before.
``rung_loss(key)`` is a rung's loss in nats per character over *every* prediction of the validation
split of ``trained_model.book_data()`` (the last 10% of the complete plays): the counting models by
exact counting, the networks by ``tinygpt.book.scoring.score``. Each result is cached
(``tinygpt.book.results_cache``, keyed by the rung's recipe and the source of the code), so chapter
8 lists the ladder (``ladder(through=8)``) without training anything again. ``train_rung(key)``
trains a network rung by its fixed, seeded recipe and returns the model, so that the chapter that
builds a rung shows the very model the ladder scores (its weights are cached with its loss: the
chapters and the multiple-choice ladder load it, never train it twice). The three small networks
share one budget, ``RUNG_TRAIN`` (the same steps and batches), at the sizes their chapters give
them, not at equal parameter counts: the ladder shows what each model as built buys, not what
more training buys.

The book's model and the modern one are trained and cached by ``tinygpt.book.trained_model``; this
module only reads their losses. Drawing the table is the chapter's job.

Beside the rungs stand standard compressors (``COMPRESSORS``, measured by
``tinygpt.book.compression``): ``compression_ladder()`` gives each one's conditional code length of
the same validation split given the training split, in nats and bits per character, cached the
same way: keyed by the compressors' settings, the SHA-256 of both texts and the source of
``tinygpt.book.compression`` (not of this module: a change to the training code does not measure
the compressors again).
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import math
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tinygpt.book import results_cache, trained_model
from tinygpt.book.compression import Compressor, code_length
from tinygpt.book.scoring import score
from tinygpt.checks import check_instance, check_int
from tinygpt.config import GPTConfig, TrainConfig
from tinygpt.model import GPT
from tinygpt.ngram import NGramModel
from tinygpt.runtime import one_thread
from tinygpt.small_models import AttentionOnly, ContextMLP
from tinygpt.train import configure_optimizer, get_batch, lr_at

# Counting rungs: (n, add-k smoothing) of the n-gram model; n = 0 is the uniform guess.
COUNTING = {"uniform": (0, 0.0), "unigram": (1, 0.0), "bigram": (2, 1.0), "ngram": (5, 0.01)}
# The networks of chapters 4-6, each trained with the same budget on windows of BLOCK_SIZE.
TRAINED = ("context_mlp", "attention_only", "one_block")
BLOCK_SIZE = 64
MLP_SIZES = {"context": 8, "n_embd": 24, "hidden": 256}  # ContextMLP(V, **MLP_SIZES)
SMALL_GPT = GPTConfig(vocab_size=70, block_size=BLOCK_SIZE, n_layer=1, n_head=4, n_embd=64,
                      bias=False)  # attention_only and one_block: the same sizes
RUNG_TRAIN = TrainConfig(batch_size=32, max_iters=800, learning_rate=1e-2, min_lr=1e-3,
                         warmup_iters=50)


@dataclass(frozen=True)
class Rung:
    """One step of the ladder: its key, the chapter that builds it, a short title, and a
    sentence saying what the step buys."""

    key: str
    chapter: int
    title: str
    buys: str


RUNGS: tuple[Rung, ...] = (
    Rung("uniform", 2, "uniform guess",
         "Nothing learned: every character equally likely, a loss of ln V whatever the text."),
    Rung("unigram", 2, "unigram",
         "How frequent each character is, ignoring what came before."),
    Rung("bigram", 2, "bigram",
         "One character of context: the next character counted after the one before it."),
    Rung("ngram", 2, f"{COUNTING['ngram'][0]}-gram",
         f"The previous {COUNTING['ngram'][0] - 1} characters as context, counted: the best n, "
         "as longer contexts are too rare in the training text to count well."),
    Rung("context_mlp", 4, f"MLP on {MLP_SIZES['context']} characters",
         "Learned embeddings: contexts that are alike share what is learned about them."),
    Rung("attention_only", 5, "attention only",
         f"A context of {BLOCK_SIZE} characters, gathered by content; but nothing computes on "
         "what it gathers."),
    Rung("one_block", 6, "one transformer block",
         "An MLP after the attention: each position computes on what it gathered."),
    Rung("gpt_init", 7, "the book's GPT, untrained",
         "The whole architecture before training: its knowledge is in the weights, not the shape."),
    Rung("book_model", 8, "the book's GPT, trained",
         f"A GPT of {trained_model.BOOK_RECIPE.model.n_layer} blocks, a context of "
         f"{trained_model.BOOK_RECIPE.model.block_size} and minutes of training: "
         "the book's model."),
    Rung("modern_model", 12, "the modern GPT, trained",
         f"Chapter 12's changes and {trained_model.MODERN_RECIPE.model.n_layer} blocks in the same "
         "budget of about three minutes on 2 cores."),
)
KEYS = tuple(r.key for r in RUNGS)


@dataclass
class TrainedRung:
    """A network rung trained by ``train_rung``: the model (in eval mode), its loss on the
    validation split, the training loss of every step, and the seconds training took."""

    key: str
    model: nn.Module
    loss: float
    train_losses: list[float]
    train_s: float


def _check_key(key: object, among: tuple[str, ...] = KEYS) -> str:
    if not isinstance(key, str) or key not in among:
        raise ValueError(f"unknown rung {key!r}: choose one of {', '.join(among)}")
    return key


def recipe(key: str) -> dict[str, Any]:
    """Everything that fixes rung ``key``'s loss, as JSON: the key of its cache entry."""
    _check_key(key)
    out: dict[str, Any] = {"rung": key, "corpus": trained_model.BOOK_RECIPE.corpus}
    if key in COUNTING:
        out["n"], out["smoothing"] = COUNTING[key]
    elif key in TRAINED:
        out["train"], out["block_size"] = dataclasses.asdict(RUNG_TRAIN), BLOCK_SIZE
        out["model"] = MLP_SIZES if key == "context_mlp" else dataclasses.asdict(SMALL_GPT)
    elif key == "gpt_init":
        out["model"] = dataclasses.asdict(trained_model.BOOK_RECIPE.model)
        out["seed"] = trained_model.BOOK_RECIPE.train.seed
    else:  # book_model, modern_model: cached by tinygpt.book.trained_model under their recipes
        out["recipe"] = dataclasses.asdict(trained_recipe(key))
    return out


def _counting_loss(n: int, smoothing: float, train_ids: torch.Tensor, val_ids: torch.Tensor,
                  vocab_size: int) -> float:
    """The mean loss of an add-k n-gram model fitted on ``train_ids`` over every prediction of
    ``val_ids`` (``len - 1`` of them). A prediction with fewer than ``n - 1`` characters before it
    in ``val_ids`` uses the model of the longest context it has, as a network reading the split
    in windows does. ``n = 0`` is the uniform guess, ``ln V``."""
    if n == 0:
        return math.log(vocab_size)
    if n == 1:  # no context: every token after the first
        return NGramModel(1, vocab_size, smoothing).fit(train_ids).loss(val_ids[1:])
    N = len(val_ids)
    total = NGramModel(n, vocab_size, smoothing).fit(train_ids).loss(val_ids) * (N - n + 1)
    for t in range(1, n - 1):  # target t has only t tokens before it: the (t+1)-gram model
        short = NGramModel(t + 1, vocab_size, smoothing).fit(train_ids)
        total += short.loss(val_ids[: t + 1])  # one prediction: val_ids[t] after val_ids[:t]
    return total / (N - 1)


def fit(model: nn.Module, train_ids: torch.Tensor, block_size: int,
        config: TrainConfig) -> list[float]:
    """Train ``model`` in place on random windows of ``train_ids`` for ``config.max_iters`` steps
    of AdamW (warm-up, then cosine decay, gradients clipped to ``config.grad_clip``), seeded by
    ``config.seed``; return the training loss of every step. It is chapter 8's loop without
    evaluation, saving or logging, so that it trains the small models of chapters 4-6 too."""
    check_instance(config, TrainConfig, "config")
    batches = torch.Generator().manual_seed(config.seed)
    optimizer = configure_optimizer(model, config)
    model.train()
    losses = []
    for step in range(config.max_iters):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, config)
        x, y = get_batch(train_ids, config.batch_size, block_size, batches)  # (B, T) each
        _, loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if config.grad_clip:
            nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        losses.append(loss.item())
    return losses


def _build(key: str, vocab_size: int) -> nn.Module:
    """Rung ``key``'s network, untrained, with ``vocab_size`` (the corpus's) output classes."""
    if key == "context_mlp":
        return ContextMLP(vocab_size, **MLP_SIZES)
    config = dataclasses.replace(SMALL_GPT, vocab_size=vocab_size)
    return AttentionOnly(config) if key == "attention_only" else GPT(config)


def _path(key: str) -> Path:
    digest = results_cache.key("book.ladder", recipe(key))[:20]
    return results_cache.folder() / f"ladder-{key}-{digest}.json"


def _state_json(model: nn.Module) -> dict[str, Any]:
    """``model``'s weights as JSON, exactly: each tensor's shape and its float32 bytes
    (little-endian), base64-coded."""
    return {name: {"shape": list(t.shape), "float32": base64.b64encode(
                t.detach().to(torch.float32).contiguous().numpy().astype("<f4").tobytes()
            ).decode("ascii")} for name, t in model.state_dict().items()}


def _load_state(model: nn.Module, found: Any) -> bool:
    """Load ``_state_json``'s weights into ``model``; False (``model`` unchanged) unless they are
    exactly its tensors, by name and shape."""
    own = model.state_dict()
    if not isinstance(found, dict) or set(found) != set(own):
        return False
    state = {}
    for name, t in own.items():
        entry = found[name]
        try:
            raw = base64.b64decode(entry["float32"], validate=True)
            shape = tuple(entry["shape"])
        except (TypeError, KeyError, ValueError):
            return False
        if shape != tuple(t.shape) or len(raw) != 4 * t.numel():
            return False
        state[name] = torch.frombuffer(bytearray(raw), dtype=torch.float32).view(shape).to(t.dtype)
    model.load_state_dict(state)
    return True


def _cached_rung(key: str, vocab_size: int) -> TrainedRung | None:
    """The trained rung ``key`` that ``train_rung`` cached with its loss, or None (not cached,
    cached by an earlier version without its weights, or weights that do not fit)."""
    found = results_cache.read_json(_path(key))
    if not isinstance(found, dict) or found.get("rung") != key or "state" not in found:
        return None
    loss, train_losses, train_s = found.get("loss"), found.get("train_losses"), found.get("train_s")
    if not (type(loss) is float and math.isfinite(loss) and type(train_s) is float
            and isinstance(train_losses, list) and all(type(v) is float for v in train_losses)):
        return None
    with torch.random.fork_rng(devices=[]):  # building draws initial weights: the caller's
        model = _build(key, vocab_size)  # random state is kept
    if not _load_state(model, found["state"]):
        warnings.warn(f"ignoring the weights in the cache entry {_path(key)}: they do not fit "
                      f"the rung {key!r}; training it again", stacklevel=3)
        return None
    return TrainedRung(key, model.eval(), loss, train_losses, train_s)


def train_rung(key: str) -> TrainedRung:
    """Network rung ``key`` (``context_mlp``, ``attention_only`` or ``one_block``) trained by its
    recipe: seeded by ``RUNG_TRAIN.seed``, on the book's training split, ``RUNG_TRAIN``'s budget,
    one thread, and scored on the validation split. The model, its loss, its training losses
    and seconds are cached together (the weights exactly, in the entry ``rung_loss`` reads), so
    a second call, in this process or another, loads what the first one trained instead of
    training it again."""
    _check_key(key, TRAINED)
    tok, train_ids, val_ids = trained_model.book_data(trained_model.BOOK_RECIPE.corpus)
    found = _cached_rung(key, tok.vocab_size)
    if found is not None:
        return found
    with torch.random.fork_rng(devices=[]), one_thread():  # the caller's random state is kept
        torch.manual_seed(RUNG_TRAIN.seed)
        model = _build(key, tok.vocab_size)
        start = time.perf_counter()
        train_losses = fit(model, train_ids, BLOCK_SIZE, RUNG_TRAIN)
        train_s = time.perf_counter() - start
        loss = score(model.eval(), val_ids, BLOCK_SIZE)
    results_cache.write_json(_path(key), {"rung": key, "loss": loss, "train_losses": train_losses,
                                          "train_s": train_s, "state": _state_json(model)})
    return TrainedRung(key, model, loss, train_losses, train_s)


def trained_recipe(key: str) -> trained_model.Recipe:
    """The recipe of the rung ``key`` that ``tinygpt.book.trained_model`` trains and caches."""
    recipes = {"book_model": trained_model.BOOK_RECIPE,
               "modern_model": trained_model.MODERN_RECIPE}
    return recipes[_check_key(key, tuple(recipes))]


def _compute(key: str) -> float:
    if key in ("book_model", "modern_model"):
        return trained_model.book_model(trained_recipe(key)).val_loss
    if key in TRAINED:
        return train_rung(key).loss
    tok, train_ids, val_ids = trained_model.book_data(trained_model.BOOK_RECIPE.corpus)
    if key in COUNTING:
        n, k = COUNTING[key]
        return _counting_loss(n, k, train_ids, val_ids, tok.vocab_size)
    model_config, seed = trained_model.BOOK_RECIPE.model, trained_model.BOOK_RECIPE.train.seed
    with torch.random.fork_rng(devices=[]):  # gpt_init: the book's model before its first step
        torch.manual_seed(seed)
        model = GPT(model_config)
    return score(model, val_ids, model_config.block_size)


def rung_loss(key: str) -> float:
    """Rung ``key``'s loss (nats per character) over every prediction of the book's validation
    split: from the cache, or computed (a network rung is trained) and cached."""
    _check_key(key)
    if key in ("book_model", "modern_model"):  # trained_model caches the model and its loss
        return _compute(key)
    path = _path(key)
    found = results_cache.read_json(path)  # None if missing or corrupt
    loss = found.get("loss") if isinstance(found, dict) and found.get("rung") == key else None
    if type(loss) is float and math.isfinite(loss) and loss >= 0:  # NaN, inf: not a loss
        return loss
    if found is not None:
        warnings.warn(f"ignoring the cache entry {path}: {loss!r} is not a loss; computing it "
                      "again", stacklevel=2)
    loss = _compute(key)
    if key not in TRAINED:  # train_rung has written its entry
        results_cache.write_json(path, {"rung": key, "loss": loss})
    return loss


def ladder(through: int | None = None) -> list[tuple[Rung, float]]:
    """Every rung in order with its loss, computing (and caching) those not cached yet;
    ``through``: only the rungs built by that chapter and the ones before it."""
    if through is not None:
        check_int(through, "through")
    return [(rung, rung_loss(rung.key)) for rung in RUNGS
            if through is None or rung.chapter <= through]


@dataclass(frozen=True)
class CompressorRung:
    """A standard compressor beside the ladder: its key, the compressor, whether it reads the
    training text first (``given_train``: its conditional code length of the validation text) or
    the validation text alone, and a sentence saying what it models."""

    key: str
    compressor: Compressor
    given_train: bool
    models: str

    @property
    def title(self) -> str:
        return self.compressor.title + ("" if self.given_train else ", validation text alone")


COMPRESSORS: tuple[CompressorRung, ...] = (
    CompressorRung("gzip", Compressor("gzip"), True,
                   "Repeats of up to 258 bytes within the last 32 KiB read: of the training text "
                   "it remembers only its end."),
    CompressorRung("bzip2", Compressor("bzip2"), True,
                   "Sorts blocks of 900 kB by what follows each byte (Burrows-Wheeler): a "
                   "context model without probabilities."),
    CompressorRung("xz", Compressor("xz"), True,
                   "Repeats anywhere in an 8 MiB window (the whole training text), with "
                   "probabilities for what is coded."),
    CompressorRung("ppmd3", Compressor("ppmd", 3), True,
                   "Counts of what followed each context of up to 3 bytes: a 4-gram model that "
                   "keeps counting as it reads."),
    CompressorRung("ppmd8", Compressor("ppmd", 8), True,
                   "The same with contexts of up to 8 bytes, falling back to shorter ones for "
                   "what a long context has not seen."),
    CompressorRung("ppmd8_alone", Compressor("ppmd", 8), False,
                   "PPMd order 8 with no training text: all it knows it learns while it reads "
                   "the validation text."),
)


def book_texts(corpus: str = trained_model.BOOK_RECIPE.corpus) -> tuple[str, str]:
    """The book's training and validation text: the split of ``trained_model.book_data`` (the
    first 90% and the last 10% of the characters), decoded back to text."""
    tok, train_ids, val_ids = trained_model.book_data(corpus)
    return tok.decode(train_ids.tolist()), tok.decode(val_ids.tolist())


def compression_recipe() -> dict[str, Any]:
    """Everything that fixes ``compression_ladder()``'s numbers, as JSON: the key of its cache
    entry (the texts by their SHA-256)."""
    train_text, val_text = book_texts()
    return {"corpus": trained_model.BOOK_RECIPE.corpus,
            "train_sha256": hashlib.sha256(train_text.encode("utf-8")).hexdigest(),
            "val_sha256": hashlib.sha256(val_text.encode("utf-8")).hexdigest(),
            "compressors": [{"key": c.key, "given_train": c.given_train, **c.compressor.recipe()}
                            for c in COMPRESSORS]}


def compute_compression_ladder() -> list[dict[str, Any]]:
    """Every compressor of ``COMPRESSORS`` measured afresh on the book's split (about a minute
    and a half on one core: xz is the slowest): one ``CodeLength.to_json()`` each, with its key."""
    train_text, val_text = book_texts()
    return [{"key": c.key, **code_length(c.compressor, val_text,
                                         train_text if c.given_train else "").to_json()}
            for c in COMPRESSORS]


def compression_ladder() -> list[tuple[CompressorRung, dict[str, Any]]]:
    """Every compressor beside the ladder with its measurement (``nats_per_char``,
    ``bits_per_char``, ``bits``, ``chars``, ...): from the cache, or measured and cached."""
    found = results_cache.cached("compression-ladder", "book.compression", compression_recipe(),
                                 compute_compression_ladder)
    by_key = {row["key"]: row for row in found}
    return [(c, by_key[c.key]) for c in COMPRESSORS]
