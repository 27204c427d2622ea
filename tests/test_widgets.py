"""Tests for tinygpt.book.widgets: a click gives exactly what ``generate`` gives with the same
settings and seed, bad settings show the library's message, and a missing ipywidgets is a clear
ImportError."""

from __future__ import annotations

import html
import sys

import pytest
import torch

pytest.importorskip("ipywidgets")  # the `book` extra; the import error itself is tested below

from tinygpt.book.widgets import sampling_widget
from tinygpt.config import GPTConfig
from tinygpt.model import GPT
from tinygpt.sample import generate
from tinygpt.tokenizer import CharTokenizer

TOK = CharTokenizer(list("\n abcdefghij!"))
CONFIG = GPTConfig(vocab_size=TOK.vocab_size, block_size=16, n_layer=1, n_head=2, n_embd=16)


@pytest.fixture(scope="module")
def model() -> GPT:
    torch.manual_seed(0)
    m = GPT(CONFIG)
    with torch.no_grad():  # sharper logits than at initialisation: varied, seed-dependent text
        for p in m.parameters():
            p.mul_(6.0)
    return m


def reference(model: GPT, prompt: str, n: int, temperature: float, top_k, top_p, seed: int):
    idx = torch.tensor([TOK.encode(prompt)])
    out = generate(model, idx, n, temperature=temperature, top_k=top_k, top_p=top_p,
                   generator=torch.Generator().manual_seed(seed))
    return TOK.decode(out[0].tolist())


@pytest.mark.parametrize("temperature,top_k,top_p,seed", [
    (1.0, 0, 1.0, 3), (0.7, 5, 1.0, 11), (1.3, 0, 0.8, 5), (1.5, 4, 0.9, 0), (0.0, 0, 1.0, 1),
])
def test_click_gives_what_generate_gives(model, temperature, top_k, top_p, seed):
    w = sampling_widget(model, TOK, "abc", max_new_tokens=20)
    w.prompt.value = "bad cafe"
    w.temperature.value, w.top_k.value, w.top_p.value = temperature, top_k, top_p
    w.length.value, w.seed.value = 40, seed
    w.button.click()  # runs the button's handler, as a click in JupyterLab does
    expected = reference(model, "bad cafe", 40, temperature, top_k or None,
                         None if top_p == 1.0 else top_p, seed)
    assert not w.error
    assert w.text == expected and len(expected) == len("bad cafe") + 40
    shown = html.unescape(w.output.value)
    assert "bad cafe" in shown and expected[len("bad cafe"):] in shown
    assert not w.button.disabled


def test_same_seed_same_text_other_seed_other_text(model):
    w = sampling_widget(model, TOK, "a", temperature=1.5, max_new_tokens=60, seed=2)
    first = w.run()
    assert w.run() == first
    w.seed.value = 3
    assert w.run() != first


def test_starting_values_are_the_keyword_arguments(model):
    w = sampling_widget(model, TOK, "hi", temperature=0.5, top_k=7, top_p=0.9,
                        max_new_tokens=12, seed=4)
    assert w.settings() == {"max_new_tokens": 12, "temperature": 0.5, "top_k": 7, "top_p": 0.9}
    assert w.run() == reference(model, "hi", 12, 0.5, 7, 0.9, 4)


@pytest.mark.parametrize("setting,value,message", [
    ("top_p", 0.0, r"top_p must be in (0, 1], got 0.0"),
    ("prompt", "", "the prompt is empty"),
    ("prompt", "head?", "character '?' at position 4 is not in the vocabulary"),
])
def test_bad_settings_show_the_library_message(model, setting, value, message):
    w = sampling_widget(model, TOK, "abc", max_new_tokens=20)
    getattr(w, setting).value = value
    w.button.click()  # must not raise
    assert w.error and message in w.text
    assert message in html.unescape(w.output.value)
    w.top_p.value, w.prompt.value = 1.0, "abc"  # a good setting clears the error
    w.button.click()
    assert not w.error and w.text.startswith("abc")


def test_bad_model_or_tokenizer(model):
    with pytest.raises(TypeError, match="tinygpt GPT"):
        sampling_widget(torch.nn.Linear(2, 2), TOK)
    with pytest.raises(TypeError, match="encode and decode"):
        sampling_widget(model, "abc")


def test_without_ipywidgets_the_error_says_how_to_install(model, monkeypatch):
    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # makes `import ipywidgets` fail
    with pytest.raises(ImportError, match="pip install ipywidgets"):
        sampling_widget(model, TOK)
