"""The book's chat model: the modern book model fine-tuned on conversations from the plays, and
measured against the model it started from; computed once and cached.

Chapter 15 shows both.

``chat_model()`` widens the book's best base model, chapter 12's modern one (``BASE_RECIPE``,
``tinygpt.book.trained_model.book_model``), by the chat template's three tokens and fine-tunes
it (``tinygpt.chat.fine_tune``) by ``CHAT_RECIPE`` on the conversations of the plays wholly in
the book's training text; the held-out conversations come from the plays wholly in its
validation text (``tinygpt.chat.split_titles``).
It is cached as a checkpoint (the folder ``chat-model-<key>`` of the results cache, keyed by
the recipe and the source of the code, as the book's model is), with its training history and
its seconds (one torch thread); a second process that asks for it meanwhile waits for the first
(``results_cache.lock``) and loads it. ``save(path)`` copies it where ``tinygpt chat`` can load it.

``sft_comparison()`` measures the widened base model and the fine-tuned one on the held-out
conversations: the loss on the replies, and of the replies each one writes, the share that end
their turn and that stay in role (cached JSON: ``results_cache.cached``).
``tinygpt.book.preferences`` goes on from the fine-tuned model with DPO.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tinygpt import chat
from tinygpt.book import results_cache, trained_model
from tinygpt.checkpoint import load_checkpoint, save_checkpoint
from tinygpt.checkpoint.folder import CheckpointError
from tinygpt.checks import check_instance, check_int
from tinygpt.config import TrainConfig
from tinygpt.model import GPT
from tinygpt.multiple_choice import wilson_interval
from tinygpt.runtime import one_thread
from tinygpt.shakespeare import plays
from tinygpt.tokenizer import CharTokenizer


@dataclass(frozen=True)
class ChatRecipe:
    """How the chat model is fine-tuned (``train``), how often its loss on ``held_out_eval``
    held-out conversations is recorded (``eval_every`` steps), and how replies are sampled to
    measure it (``replies`` held-out prompts, at most ``max_chars`` characters at
    ``temperature``, seeded by ``sample_seed``)."""

    train: TrainConfig
    eval_every: int = 50
    held_out_eval: int = 400
    replies: int = 400
    max_chars: int = 52  # a prompt of at most 75 tokens, a reply and its ■: 128
    temperature: float = 0.8
    sample_seed: int = 0

    def __post_init__(self) -> None:
        check_instance(self.train, TrainConfig, "recipe.train")
        for name in ("eval_every", "held_out_eval", "replies", "max_chars"):
            check_int(getattr(self, name), f"recipe.{name}")


# The base the chat model is fine-tuned from: the book's best model, chapter 12's modern one.
BASE_RECIPE = trained_model.MODERN_RECIPE

CHAT_RECIPE = ChatRecipe(train=TrainConfig(batch_size=32, max_iters=600, learning_rate=1e-3,
                                           min_lr=1e-4, warmup_iters=30, weight_decay=0.0,
                                           seed=0))


@dataclass
class ChatModel:
    """The fine-tuned model and its tokenizer (with the template), the recipe, the training
    history (``tinygpt.chat.fine_tune``'s records), the seconds it took on ``machine``, whether
    this call trained it, and the cached checkpoint."""

    model: GPT
    tokenizer: CharTokenizer
    recipe: ChatRecipe
    history: list[dict[str, Any]]
    train_s: float
    machine: str
    trained_now: bool
    path: Path = field(repr=False)

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Save the model as a checkpoint in the folder ``path`` (``tinygpt chat path``)."""
        return save_checkpoint(Path(path), self.model, None, self.model.config, self.recipe.train,
                               self.recipe.train.max_iters, tokenizer=self.tokenizer,
                               history=self.history)


def conversations() -> tuple[list[chat.Conversation], list[chat.Conversation]]:
    """The training conversations and the held-out ones (plays wholly in the book's training
    text, and wholly in its validation text)."""
    every = plays()
    train_titles, held_out_titles = chat.split_titles(every)
    return (chat.conversations(p for p in every if p.title in train_titles),
            chat.conversations(p for p in every if p.title in held_out_titles))


def base_model() -> tuple[GPT, CharTokenizer]:
    """The base model (``BASE_RECIPE``) widened by the template's tokens
    (``tinygpt.chat.add_tokens``), not trained on them, and the tokenizer with the template: the
    model before fine-tuning."""
    book = trained_model.book_model(BASE_RECIPE, progress=False)
    return chat.add_tokens(book.model, len(chat.SPECIAL_TOKENS)).eval(), \
        chat.chat_tokenizer(book.tokenizer)


def recipe_json(recipe: Any) -> dict[str, Any]:
    """``recipe`` and the base model's recipe, as JSON-able dicts (a cache key's recipe)."""
    return {"recipe": dataclasses.asdict(recipe),
            "base_model": dataclasses.asdict(BASE_RECIPE)}


def chat_model(recipe: ChatRecipe = CHAT_RECIPE) -> ChatModel:
    """The chat model fine-tuned by ``recipe``: loaded from the cache, or trained and cached
    (a corrupt cached copy is trained again)."""
    check_instance(recipe, ChatRecipe, "recipe")
    key = results_cache.key("book.chat_model", recipe_json(recipe))
    path = results_cache.folder() / f"chat-model-{key[:20]}"
    with results_cache.lock(path) as locked:  # a second process waits, then loads the model
        return _load_or_train(recipe, path, locked)


def _load_or_train(recipe: ChatRecipe, path: Path, locked: bool) -> ChatModel:
    if path.exists():
        try:
            ckpt = load_checkpoint(path)
            if chat.has_chat_template(ckpt.tokenizer) and ckpt.history and \
                    "train_s" in ckpt.history[-1]:
                last = ckpt.history[-1]
                return ChatModel(ckpt.model, ckpt.tokenizer, recipe, ckpt.history,
                                 float(last["train_s"]), str(last["machine"]),
                                 trained_now=False, path=path)
        except (CheckpointError, KeyError, TypeError, ValueError):
            pass  # trained again below
    model, tokenizer = base_model()
    train, held_out = conversations()
    with one_thread():
        start = time.perf_counter()
        history: list[dict[str, Any]] = list(chat.fine_tune(
            model, tokenizer, train, recipe.train, held_out=held_out[:recipe.held_out_eval],
            eval_every=recipe.eval_every))
        train_s = time.perf_counter() - start
    machine = f"{os.cpu_count()} CPU cores, one torch thread, torch {torch.__version__}"
    history[-1].update(train_s=train_s, machine=machine)
    result = ChatModel(model.eval(), tokenizer, recipe, history, train_s, machine,
                       trained_now=True, path=path)
    # whole or not at all, one copy (killed saves' leftovers removed), a failure warns
    results_cache.store_folder(path, result.save, "the chat model", clean=locked)
    return result


# --- measurements ------------------------------------------------------------------------------

def share(values: list[bool]) -> dict[str, float]:
    """The share of true ``values`` with its 95% Wilson interval and their number."""
    low, high = wilson_interval(sum(values), len(values))
    return {"value": sum(values) / len(values), "low": low, "high": high, "n": len(values)}


def measure(model: GPT, tokenizer: CharTokenizer, held_out: list[chat.Conversation],
            recipe: ChatRecipe) -> dict[str, Any]:
    """The reply loss on every held-out conversation (with and without ``■``); of the replies
    written to the first ``recipe.replies`` prompts, the shares that end their turn and stay in
    role (with 95% Wilson intervals), their mean length, and the first eight replies."""
    shown = held_out[:recipe.replies]
    replies = chat.sample_replies(model, tokenizer, shown, max_chars=recipe.max_chars,
                                  temperature=recipe.temperature, seed=recipe.sample_seed)
    return {"reply_loss": chat.mean_reply_loss(model, tokenizer, held_out),
            "text_loss": chat.mean_reply_loss(model, tokenizer, held_out, end=False),
            "ends_turn": share([chat.ends_turn(r) for r in replies]),
            "stays_in_role": share([chat.stays_in_role(r) for r in replies]),
            "mean_chars": chat.describe(replies)["mean_chars"],
            "examples": replies[:8]}


def compute_sft_comparison(recipe: ChatRecipe = CHAT_RECIPE) -> dict[str, Any]:
    """The base model and the fine-tuned one, measured on the held-out conversations."""
    train, held_out = conversations()
    base, tokenizer = base_model()
    tuned = chat_model(recipe)
    with one_thread():
        base_row = measure(base, tokenizer, held_out, recipe)
        tuned_row = measure(tuned.model, tokenizer, held_out, recipe)
    return {"train_conversations": len(train), "held_out_conversations": len(held_out),
            "held_out_titles": sorted({c.title for c in held_out}),
            "prompts": [chat.prompt(c.speaker, c.speech, c.replier)
                        for c in held_out[:8]],
            "true_replies": [c.reply for c in held_out[:8]],
            "base": base_row, "fine_tuned": tuned_row,
            "train_s": tuned.train_s, "machine": tuned.machine}


def sft_comparison() -> dict[str, Any]:
    """``compute_sft_comparison()``, from the cache or computed and cached."""
    return results_cache.cached("chat-sft", "book.chat_model", recipe_json(CHAT_RECIPE),
                                compute_sft_comparison)
