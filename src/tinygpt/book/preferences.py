"""DPO from the book's chat model towards a preference that code computes, measured before and
after; computed once and cached.

``preference_comparison()`` samples several replies of the chat model
(``tinygpt.book.chat_model``) to training prompts, pairs them by ``tinygpt.dpo.metre_distance``
(lines near ten syllables preferred), trains by DPO (``tinygpt.dpo.train_dpo``) by
``PREFERENCE_RECIPE``, and measures the model before and after on held-out prompts: the
syllables off ten a line, the share of lines of ten, whether replies end their turn and stay in
role, the reply loss, and the divergence of the tuned model's replies from the reference's.
Cached JSON, keyed by the recipes and the source of the code.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from dataclasses import dataclass
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


def compute_preference_comparison(recipe: PreferenceRecipe = PREFERENCE_RECIPE,
                                  chat_recipe: ChatRecipe = CHAT_RECIPE) -> dict[str, Any]:
    """DPO from the chat model on pairs of its own replies to training prompts, ranked by
    ``tinygpt.dpo.metre_distance``; the model before and after on held-out prompts, and the
    divergence of the tuned model's replies from the reference's (nats per reply)."""
    train, held_out = conversations()
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
        reference, history = dpo.train_dpo(policy, tokenizer, pairs, recipe.train, recipe.beta)
        seconds = time.perf_counter() - start
        before, _ = measure_metre(reference, tokenizer, held_out, chat_recipe)
        after, replies = measure_metre(policy, tokenizer, held_out, chat_recipe)
    shown = held_out[:chat_recipe.replies]
    return {"pairs": len(pairs), "prompts": len(prompts),
            "example_pair": dataclasses.asdict(pairs[0]) if pairs else None,
            "history": history, "seconds": seconds, "before": before, "after": after,
            "divergence": dpo.divergence(policy, reference, tokenizer, shown, replies),
            "held_out_prompts": [chat.prompt(c.speaker, c.speech, c.replier)
                                 for c in shown[:8]]}


def preference_comparison() -> dict[str, Any]:
    """``compute_preference_comparison()``, from the cache or computed and cached."""
    recipe = {**recipe_json(CHAT_RECIPE), "preference": dataclasses.asdict(PREFERENCE_RECIPE)}
    return results_cache.cached("chat-dpo", "book.preferences", recipe,
                                compute_preference_comparison)
