"""The page's engine on the book's real models: the models the built book serves, not random ones.

The book's model and the modern book model (``tinygpt.book.trained_model.book_model`` with
``BOOK_RECIPE`` and ``MODERN_RECIPE``) and the chat model (``tinygpt.book.chat_model``) are
exported by ``tinygpt.book.web_export`` exactly as ``book/_ext/book_web_models.py`` exports
them when the book is built, and run by book/_static/tinygpt/engine.js in Node. The texts are
windows of the validation split (held-out text, on which nothing was tuned). Checked against
PyTorch: the logits of every position to 1e-4, fed at once and one position at a time through
the cache; greedy decoding of 300 characters equals ``generate(..., temperature=0)``; seeded
sampling equals ``generate(..., rng=PCG32(seed))``; the attention weights of every layer and head
of the book's model equal the softmax of its queries against its keys (``return_weights`` of
its attention modules) to 1e-5; the chat session's greedy replies equal ``ChatSession``'s, with
the chat model and with the chat model tuned by DPO (``tinygpt.book.preferences.dpo_model``).
Served over http(s), a page that loads a model adds at most 3 MB (its scripts, the model's
``.json`` and its float32 ``.bin``); chapter 15's page adds the DPO model only when the reader
asks for the comparison.

The models come from the results cache (a few seconds); on a machine where they are not made yet
``book_model`` trains them, as ``make models`` would just after the unit tests (minutes): hence
``slow``.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
import torch
from test_web_engine import NODE, TOL, run_node

from tinygpt.book import chat_model, preferences
from tinygpt.book.trained_model import BOOK_RECIPE, MODERN_RECIPE, book_data, book_model
from tinygpt.book.web_export import export_model, weights_of
from tinygpt.chat import ChatSession
from tinygpt.sample import PCG32, generate

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(NODE is None, reason="node (Node.js) is not installed")]
RECIPES = {"book": BOOK_RECIPE, "modern": MODERN_RECIPE}
STATIC = Path(__file__).resolve().parents[1] / "book" / "_static"


@pytest.fixture(scope="module")
def val_ids() -> list[int]:
    """The validation split's token ids (the last 10% of the plays)."""
    return book_data()[2].tolist()


@pytest.fixture(scope="module", params=sorted(RECIPES))
def real(request, tmp_path_factory):
    """(name, the cached model, its tokenizer, the path of its exported .js)."""
    run = book_model(RECIPES[request.param], progress=False)
    folder = tmp_path_factory.mktemp(f"real-{request.param}")
    export_model(run.model, run.tokenizer, folder, request.param)
    return request.param, run.model.eval(), run.tokenizer, folder / f"{request.param}.js"


def windows(val_ids: list[int], lengths: tuple[int, ...]) -> list[list[int]]:
    """Windows of the validation ids of the given lengths, spread over the split."""
    step = len(val_ids) // (len(lengths) + 1)
    return [val_ids[(i + 1) * step:(i + 1) * step + n] for i, n in enumerate(lengths)]


@pytest.mark.parametrize("cached", [False, True])
def test_logits_of_the_real_models_match_pytorch(real, val_ids, tmp_path, cached):
    name, model, _, js = real
    prompts = windows(val_ids, (1, 37, model.config.block_size))
    got = run_node(tmp_path, [{"kind": "logits", "ids": p, "cached": cached} for p in prompts],
                   js, name)
    for ids, logits in zip(prompts, got, strict=True):
        with torch.no_grad():
            want = model(torch.tensor([ids]))[0].double().numpy()  # (T, V)
        err = np.abs(np.array(logits) - want).max()
        assert err <= TOL, f"{name}: logits differ by {err:.2e} on {len(ids)} held-out tokens"
        assert np.abs(want).max() > 5.0  # a trained model's logits, not near zero


def python_text(model, ids: list[int], n: int, **settings) -> list[int]:
    out = generate(model, torch.tensor([ids]), n, **settings)
    return out[0, len(ids):].tolist()


def test_greedy_300_characters_of_the_real_models_match_generate(real, val_ids, tmp_path):
    name, model, tok, js = real
    ids = windows(val_ids, (60,))[0]
    want = python_text(model, ids, 300, temperature=0.0)
    got = run_node(tmp_path, [{"kind": "generate", "ids": ids, "n": 300,
                               "settings": {"temperature": 0}}], js, name)[0]
    assert tok.decode(got) == tok.decode(want)
    assert len(set(want)) > 10  # real text, not one character repeated


def test_seeded_sampling_of_the_real_models_matches_the_portable_sampler(real, val_ids,
                                                                         tmp_path):
    name, model, tok, js = real
    ids = tok.encode("ROMEO:\n")
    cases, want = [], []
    for seed, (temperature, top_k, top_p) in enumerate([(0.8, None, None), (1.0, 20, 0.9)]):
        want.append(python_text(model, ids, 200, temperature=temperature, top_k=top_k,
                                top_p=top_p, rng=PCG32(seed)))
        cases.append({"kind": "generate", "ids": ids, "n": 200,
                      "settings": {"temperature": temperature, "topK": top_k, "topP": top_p,
                                   "seed": seed}})
    got = run_node(tmp_path, cases, js, name)
    assert [tok.decode(g) for g in got] == [tok.decode(w) for w in want]
    assert want[0] != want[1]


def test_attention_of_the_book_model_matches_its_modules(val_ids, tmp_path):
    run = book_model(BOOK_RECIPE, progress=False)
    model = run.model.eval()
    export_model(model, run.tokenizer, tmp_path / "models", "book")
    ids = run.tokenizer.encode("ROMEO:\nBut soft, what light through yonder window breaks?")
    got = run_node(tmp_path, [{"kind": "attention", "ids": ids}], tmp_path / "models" / "book.js",
                   "book")[0]  # got[t][layer][head]: weights over 0 .. t
    with torch.no_grad():
        idx = torch.tensor([ids])
        x = model.transformer.embed.wte(idx) + model.transformer.embed.positions(len(ids))
        for layer, block in enumerate(model.transformer.h):
            _, w = block.attn(block.ln_1(x), return_weights=True)  # (1, H, T, T)
            x = block(x)
            for t in range(len(ids)):
                for h in range(model.config.n_head):
                    row = np.array(got[t][layer][h])
                    assert np.abs(row - w[0, h, t, :t + 1].double().numpy()).max() < 1e-5
                    assert abs(row.sum() - 1.0) < 1e-9
        spread = w[0, :, -1, :].max(dim=-1).values  # (H,): a trained model's heads differ
        assert spread.max() - spread.min() > 0.05


CHAT_MODELS = {"chat": chat_model.chat_model, "dpo": preferences.dpo_model}


@pytest.mark.parametrize("name", sorted(CHAT_MODELS))
def test_the_chat_models_in_the_page_reply_as_chat_session(tmp_path, name):
    chat = CHAT_MODELS[name]()
    model = chat.model.eval()
    export_model(model, chat.tokenizer, tmp_path / "models", name)
    speeches = ["What news from the court?", "Speak, good friend: are you well?",
                "Then let us go together, and the night shall hide us both, for I have heard "
                "such things of late as make me fear the morning and the king alike.",
                "Go on.", "And what said he to that, when you had told him all?", "Farewell."]
    session = ChatSession(model, chat.tokenizer, temperature=0.0, max_chars=80)
    want = []
    for speech in speeches:
        want.append({"text": session.reply(speech), "stop": session.stop, "cut": session.cut,
                     "context": len(session.ids)})
    got = run_node(tmp_path, [{"kind": "chat", "speeches": speeches,
                               "settings": {"temperature": 0, "maxChars": 80}}],
                   tmp_path / "models" / f"{name}.js", name)[0]
    assert got == want
    assert any(w["cut"] > 0 for w in want)  # a speech longer than a turn holds was cut
    lengths = [w["context"] for w in want]
    assert any(b < a for a, b in itertools.pairwise(lengths))  # old turns were dropped
    ids = chat.tokenizer.encode("\u25b7HAMLET:\nWhat news?\n\u25b6HORATIO:\n")
    logits = run_node(tmp_path, [{"kind": "logits", "ids": ids, "cached": True}],
                      tmp_path / "models" / f"{name}.js", name)[0]
    with torch.no_grad():
        assert np.abs(np.array(logits) - model(torch.tensor([ids]))[0].double().numpy()
                      ).max() <= TOL


PAGE_LIMIT = 3_000_000  # bytes a page may add (issue #42): the scripts and one model
# Chapter 15's page once the reader asked for the DPO model too: a second model of the chat
# model's size, loaded only on that click, each of the two within the page's limit. (Sent as
# its bits XORed with the chat model's and packed, the DPO model's weights would still be 1.7 MB
# of the modern base's 2.4 MB: DPO moves every weight's low mantissa bytes.)
AFTER_COMPARISON = 2 * PAGE_LIMIT


@pytest.mark.parametrize("name", ["book", "modern", "chat"])
def test_a_served_page_adds_at_most_3_mb(tmp_path, name):
    """Served over http(s), a page loads every script of book/_static/tinygpt (at most: a page
    loads only its panels') and, when the reader asks, one model's .json and float32 .bin."""
    run = chat_model.chat_model() if name == "chat" else book_model(RECIPES[name],
                                                                    progress=False)
    sizes = export_model(run.model, run.tokenizer, tmp_path, name)
    scripts = sum(p.stat().st_size for p in (STATIC / "tinygpt").glob("*.js"))
    added = scripts + sizes[f"{name}.json"] + sizes[f"{name}.bin"]
    assert added <= PAGE_LIMIT, f"{name}: {added:,} bytes"
    assert sizes[f"{name}.bin"] == 4 * sum(t.numel() for _, t in weights_of(run.model))


@pytest.mark.parametrize("name", ["book", "modern", "chat"])
def test_a_page_opened_from_disk_adds_at_most_3_mb(tmp_path, name):
    """Opened from disk (file://), a page loads every script of book/_static/tinygpt (at most)
    and, when the reader asks, one model's .js, its weights packed (base64 of deflated byte
    planes: a plain base64 of the modern model's float32 weights alone is 3.2 MB)."""
    run = chat_model.chat_model() if name == "chat" else book_model(RECIPES[name],
                                                                    progress=False)
    sizes = export_model(run.model, run.tokenizer, tmp_path, name)
    scripts = sum(p.stat().st_size for p in (STATIC / "tinygpt").glob("*.js"))
    added = scripts + sizes[f"{name}.js"]
    assert added <= PAGE_LIMIT, f"{name}: {added:,} bytes"


def test_chapter_15_adds_the_dpo_model_only_after_the_click(tmp_path):
    """Served, chapter 15's page adds its scripts (at most: every script of
    book/_static/tinygpt) and the chat model's .json and .bin when the reader first says
    something: at most 3 MB. Before and after DPO then adds the DPO model's .json and .bin, a
    model of the chat model's size, and nothing else (the chat model is loaded already): at
    most 3 MB more."""
    chat, tuned = chat_model.chat_model(), preferences.dpo_model()
    sizes = {**export_model(chat.model, chat.tokenizer, tmp_path, "chat"),
             **export_model(tuned.model, tuned.tokenizer, tmp_path, "dpo")}
    scripts = sum(p.stat().st_size for p in (STATIC / "tinygpt").glob("*.js"))
    before = scripts + sizes["chat.json"] + sizes["chat.bin"]
    after = before + sizes["dpo.json"] + sizes["dpo.bin"]
    assert before <= PAGE_LIMIT, f"before the click: {before:,} bytes"
    assert sizes["dpo.bin"] == sizes["chat.bin"]  # the same architecture, other weights
    assert after <= AFTER_COMPARISON, f"after the click: {after:,} bytes"
    assert any(not torch.equal(a, b) for (_, a), (_, b) in  # DPO changed the weights
               zip(weights_of(tuned.model), weights_of(chat.model), strict=True))
