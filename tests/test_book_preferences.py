"""The DPO model of the book (``tinygpt.book.preferences.dpo_model``): cached as a checkpoint
beside ``preference_comparison``'s entry, trained once, loaded after without training, trained
again when the cached copy is corrupt.

The training itself (``train_dpo_model``) is replaced by a small model here: what is checked is
the cache; the real model is chapter 15's (and tests/test_web_real_models.py's).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tinygpt import chat
from tinygpt.book import preferences, results_cache
from tinygpt.config import GPTConfig
from tinygpt.model import GPT
from tinygpt.tokenizer import CharTokenizer


@pytest.fixture
def fake_training(tmp_path, monkeypatch):
    """A fresh results cache and a ``train_dpo_model`` that makes a small model (calls
    counted)."""
    monkeypatch.setenv("TINYGPT_CACHE", str(tmp_path / "cache"))
    calls: list[Path] = []

    def train(recipe, chat_recipe, path):
        calls.append(path)
        tokenizer = chat.chat_tokenizer(CharTokenizer(list("\n abc:ABC")))
        torch.manual_seed(len(calls))
        model = GPT(GPTConfig(vocab_size=tokenizer.vocab_size, block_size=16, n_layer=1,
                              n_head=2, n_embd=8)).eval()
        history = [{"step": 0, "lr": 1e-4, "loss": 0.69, "accuracy": 0.5, "margin": 0.0}]
        pair = {"prompt": "a", "chosen": "b", "rejected": "c"}
        return preferences.DPOModel(model, tokenizer, recipe, history, 3, 2, pair, 1.5,
                                    trained_now=True, path=path)

    monkeypatch.setattr(preferences, "train_dpo_model", train)
    return calls


def test_trained_once_then_loaded_as_it_was(fake_training):
    first = preferences.dpo_model()
    assert first.trained_now and first.path.is_dir()
    key = results_cache.key("book.preferences", preferences.cache_recipe())
    assert first.path.name == f"chat-dpo-model-{key[:20]}"  # the key of the JSON entry
    again = preferences.dpo_model()
    assert len(fake_training) == 1 and not again.trained_now
    for (name, a), (_, b) in zip(first.model.state_dict().items(),
                                 again.model.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    assert again.tokenizer.chars == first.tokenizer.chars
    assert (again.history, again.prompts, again.pairs, again.example_pair, again.seconds) == \
        (first.history, first.prompts, first.pairs, first.example_pair, first.seconds)
    assert not again.model.training


def test_a_corrupt_cached_model_is_trained_again(fake_training):
    path = preferences.dpo_model().path
    for f in path.rglob("*.safetensors"):
        f.write_bytes(b"not a tensor file")
    assert preferences.dpo_model().trained_now
    assert len(fake_training) == 2
    assert not preferences.dpo_model().trained_now  # the new copy is whole
    leftovers = [p.name for p in path.parent.iterdir() if p.name.startswith(f".{path.name}.")
                 and not p.name.endswith(".lock")]
    assert leftovers == []
