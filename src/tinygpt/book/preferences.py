"""DPO from the book's chat model towards a preference that code computes, measured before and
after; computed once and cached.

Chapter 15 shows it.

``preference_comparison()`` samples several replies of the chat model
(``tinygpt.book.chat_model``) to training prompts, pairs them by ``tinygpt.dpo.metre_distance``
(lines near ten syllables preferred), trains by DPO (``tinygpt.dpo.train_dpo``) by
``PREFERENCE_RECIPE``, and measures the model before and after on held-out prompts: the
syllables off ten a line, the share of lines of ten, whether replies end their turn and stay in
role, the reply loss, and the divergence of the tuned model's replies from the reference's.
Cached JSON, keyed by the recipes and the source of the code.

``dpo_model()`` is the tuned model itself, cached as a checkpoint beside that entry (the folder
``chat-dpo-model-<key>``, the same key; written whole under ``results_cache.lock``), so that the
book's page (``book/_ext/book_web_models.py``) and ``tinygpt chat`` load it without training
it again. ``preference_comparison()`` measures that model.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tinygpt import chat, dpo
from tinygpt.book import results_cache
from tinygpt.book.chat_model import (
    CHAT_RECIPE,
    ChatRecipe,
    chat_model,
    conversations,
    recipe_json,
    share,
)
from tinygpt.checkpoint import load_checkpoint, save_checkpoint
from tinygpt.checkpoint.folder import CheckpointError
from tinygpt.config import TrainConfig
from tinygpt.model import GPT
from tinygpt.runtime import one_thread
from tinygpt.tokenizer import CharTokenizer


@dataclass(frozen=True)
class PreferenceRecipe:
    """DPO from the chat model: ``prompts`` training prompts, ``samples`` replies sampled to
    each at ``temperature`` (seeded by ``sample_seed``), the pairs ``tinygpt.dpo`` makes of
    them, then ``train`` at ``beta``."""

    train: TrainConfig
    beta: float = 0.1
    prompts: int = 600
    samples: int = 4
    temperature: float = 1.0
    sample_seed: int = 1


PREFERENCE_RECIPE = PreferenceRecipe(train=TrainConfig(batch_size=16, max_iters=150,
                                                       learning_rate=1e-4, min_lr=1e-5,
                                                       warmup_iters=10, weight_decay=0.0,
                                                       seed=0))


def measure_metre(model: GPT, tokenizer: CharTokenizer, held_out: list[chat.Conversation],
                  recipe: ChatRecipe) -> tuple[dict[str, Any], list[str]]:
    """The model's replies to the first ``recipe.replies`` held-out prompts and what they are:
    of those that end their turn in role, the mean syllables off ten a line and the share of
    lines of ten; of all, the shares that end their turn and stay in role and the mean length;
    the reply loss on every held-out conversation; the first eight replies."""
    shown = held_out[:recipe.replies]
    replies = chat.sample_replies(model, tokenizer, shown, max_chars=recipe.max_chars,
                                  temperature=recipe.temperature, seed=recipe.sample_seed)
    ended = [r for r in replies if chat.ends_turn(r) and chat.stays_in_role(r)]
    return {"metre_distance": sum(map(dpo.metre_distance, ended)) / max(len(ended), 1),
            "ten_syllable_lines": share([
                dpo.line_syllables(line) == 10 for r in ended
                for line in r.removesuffix(chat.END).split("\n") if line.strip()] or [False]),
            "ends_turn": share([chat.ends_turn(r) for r in replies]),
            "stays_in_role": share([chat.stays_in_role(r) for r in replies]),
            "mean_chars": chat.describe(replies)["mean_chars"],
            "reply_loss": chat.mean_reply_loss(model, tokenizer, held_out),
            "examples": replies[:8]}, replies


@dataclass
class DPOModel:
    """The DPO-tuned chat model and its tokenizer, the recipe, DPO's records
    (``tinygpt.dpo.train_dpo``), the number of prompts and pairs it was trained on and the first
    pair, the seconds sampling and training took (one torch thread), whether this call trained
    it, and the cached checkpoint."""

    model: GPT
    tokenizer: CharTokenizer
    recipe: PreferenceRecipe
    history: list[dict[str, Any]]
    prompts: int
    pairs: int
    example_pair: dict[str, Any] | None
    seconds: float
    trained_now: bool
    path: Path = field(repr=False)

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Save the model as a checkpoint in the folder ``path`` (``tinygpt chat path``), with
        DPO's records and, in the last, what ``dpo_model`` reads back."""
        last = {"prompts": self.prompts, "pairs": self.pairs,
                "example_pair": self.example_pair, "seconds": self.seconds}
        return save_checkpoint(Path(path), self.model, None, self.model.config,
                               self.recipe.train, self.recipe.train.max_iters,
                               tokenizer=self.tokenizer, history=[*self.history, last])


def cache_recipe() -> dict[str, Any]:
    """The recipes the cached DPO model and measurements are keyed by (JSON-able)."""
    return {**recipe_json(CHAT_RECIPE), "preference": dataclasses.asdict(PREFERENCE_RECIPE)}


def dpo_model() -> DPOModel:
    """The chat model tuned by DPO by ``PREFERENCE_RECIPE``: loaded from the cache (the folder
    ``chat-dpo-model-<key>``, keyed as ``preference_comparison``'s entry), or trained and
    cached, whole or not at all (a corrupt cached copy is trained again); a second process that
    asks for it meanwhile waits for the first and loads it."""
    key = results_cache.key("book.preferences", cache_recipe())
    path = results_cache.folder() / f"chat-dpo-model-{key[:20]}"
    with results_cache.lock(path) as locked:
        if path.exists():
            try:
                ckpt = load_checkpoint(path)
                *history, last = ckpt.history or [{}]
                if chat.has_chat_template(ckpt.tokenizer) and "pairs" in last:
                    return DPOModel(ckpt.model.eval(), ckpt.tokenizer, PREFERENCE_RECIPE,
                                    history, int(last["prompts"]), int(last["pairs"]),
                                    last["example_pair"], float(last["seconds"]),
                                    trained_now=False, path=path)
            except (CheckpointError, KeyError, TypeError, ValueError):
                pass  # trained again below
        result = train_dpo_model(PREFERENCE_RECIPE, CHAT_RECIPE, path)
        results_cache.store_folder(path, result.save, "the DPO model", clean=locked)
        return result


def train_dpo_model(recipe: PreferenceRecipe, chat_recipe: ChatRecipe, path: Path) -> DPOModel:
    """DPO from the chat model on pairs of its own replies to training prompts, ranked by
    ``tinygpt.dpo.metre_distance`` (one torch thread); ``path``: where it is to be cached."""
    train, _ = conversations()
    tuned = chat_model(chat_recipe)
    tokenizer = tuned.tokenizer
    policy = copy.deepcopy(tuned.model)
    generator = torch.Generator().manual_seed(recipe.sample_seed)
    prompts = [train[i] for i in torch.randperm(len(train), generator=generator)[
        :recipe.prompts].tolist()]
    with one_thread():
        start = time.perf_counter()
        sampled = [chat.sample_replies(policy, tokenizer, prompts,
                                       max_chars=chat_recipe.max_chars,
                                       temperature=recipe.temperature,
                                       seed=recipe.sample_seed + k)
                   for k in range(recipe.samples)]
        pairs = dpo.preference_pairs(prompts, [list(r) for r in zip(*sampled)])
        _, history = dpo.train_dpo(policy, tokenizer, pairs, recipe.train, recipe.beta)
        seconds = time.perf_counter() - start
    return DPOModel(policy.eval(), tokenizer, recipe, [dict(h) for h in history], len(prompts),
                    len(pairs), dataclasses.asdict(pairs[0]) if pairs else None, seconds,
                    trained_now=True, path=path)


def compute_preference_comparison() -> dict[str, Any]:
    """The chat model before and after DPO (``dpo_model``) on held-out prompts, and the
    divergence of the tuned model's replies from the reference's (nats per reply)."""
    _, held_out = conversations()
    tuned = dpo_model()
    reference = chat_model(CHAT_RECIPE).model
    tokenizer = tuned.tokenizer
    with one_thread():
        before, _ = measure_metre(reference, tokenizer, held_out, CHAT_RECIPE)
        after, replies = measure_metre(tuned.model, tokenizer, held_out, CHAT_RECIPE)
    shown = held_out[:CHAT_RECIPE.replies]
    return {"pairs": tuned.pairs, "prompts": tuned.prompts, "example_pair": tuned.example_pair,
            "history": tuned.history, "seconds": tuned.seconds, "before": before,
            "after": after,
            "divergence": dpo.divergence(tuned.model, reference, tokenizer, shown, replies),
            "held_out_prompts": [chat.prompt(c.speaker, c.speech, c.replier)
                                 for c in shown[:8]]}


def preference_comparison() -> dict[str, Any]:
    """``compute_preference_comparison()``, from the cache or computed and cached."""
    return results_cache.cached("chat-dpo", "book.preferences", cache_recipe(),
                                compute_preference_comparison)
