"""The sampling panel (book/_static/tinygpt/panel.js) driven in Chromium as a reader would.

The whole book is too slow to build for this, so each test writes a small page with the built
book's layout into a temporary folder: ``page.html`` beside ``_static/tinygpt/`` (the engine and
the panel, copied from book/_static) and ``_static/models/book.js`` (a small random model written
by tinygpt.book.web_export), and opens it from disk (``file://``), with every request to a site
blocked. The reader types a prompt, sets temperature 0, presses Generate and reads the text,
which must be the package's greedy ``generate``; with a seed, the text of
``generate(..., rng=PCG32(seed))``. Without the engine, or without the model's file, the panel
says why in one line.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from browser_support import REPO

from tinygpt.book.web_export import export_model
from tinygpt.config import GPTConfig
from tinygpt.model import GPT
from tinygpt.sample import PCG32, generate
from tinygpt.tokenizer import CharTokenizer

CHARS = list("\n !',.:;?ABCDEGHIKMNORSTWabcdeghilmnorstuwy")
PAGE = """<!DOCTYPE html><html><head><meta charset="utf-8"><title>panel</title></head><body>
<div class="tinygpt-panel" data-models="book"><p>(no panel: JavaScript is off)</p></div>
{scripts}</body></html>"""


def small_model() -> GPT:
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=len(CHARS), block_size=32, n_layer=2, n_head=2, n_embd=16,
                          bias=False, activation="gelu")).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(15.0)  # std 0.3: peaked logits
    return model


def write_page(folder: Path, model: GPT | None, engine: bool = True) -> Path:
    static = folder / "_static"
    (static / "tinygpt").mkdir(parents=True)
    names = (["engine.js"] if engine else []) + ["panel.js"]
    for name in names:
        shutil.copy(REPO / "book" / "_static" / "tinygpt" / name, static / "tinygpt" / name)
    if model is not None:
        export_model(model, CharTokenizer(CHARS), static / "models", "book")
    scripts = "".join(f'<script src="_static/tinygpt/{n}"></script>\n' for n in names)
    page = folder / "page.html"
    page.write_text(PAGE.format(scripts=scripts), encoding="utf-8")
    return page


def open_page(browser, page_path: Path):
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.route("http*://**/*", lambda route: route.abort("blockedbyclient"))
    page.goto(page_path.as_uri())
    return page, errors


def wait_until_finished(page) -> None:
    """Until the panel's run is done or has failed (the click set its state to loading)."""
    page.wait_for_function("['done', 'error'].includes(document.querySelector("
                           "'div.tinygpt-panel').dataset.state)", timeout=60_000)


def generate_in_page(page, prompt: str, n: int, temperature: str, seed: str = "0",
                     top_k: str = "", top_p: str = "") -> str:
    panel = page.locator("div.tinygpt-panel")
    panel.locator("textarea[name=prompt]").fill(prompt)
    for name, value in [("temperature", temperature), ("top_k", top_k), ("top_p", top_p),
                        ("seed", seed), ("length", str(n))]:
        panel.locator(f"input[name={name}]").fill(value)
    panel.locator("button[type=submit]").click()
    wait_until_finished(page)
    assert panel.get_attribute("data-state") == "done", panel.locator(
        ".tinygpt-status").inner_text()
    return panel.locator("pre.tinygpt-output").inner_text()


def python_text(model: GPT, prompt: str, n: int, **settings) -> str:
    tok = CharTokenizer(CHARS)
    out = generate(model, torch.tensor([tok.encode(prompt)]), n, **settings)
    return tok.decode(out[0].tolist())


def test_greedy_and_seeded_text_are_the_package_s(browser, tmp_path):
    model = small_model()
    page, errors = open_page(browser, write_page(tmp_path, model))
    prompt = "ROMEO:\nWhat is"
    shown = generate_in_page(page, prompt, 100, "0")
    assert shown == python_text(model, prompt, 100, temperature=0.0)
    shown = generate_in_page(page, prompt, 80, "0.9", seed="7", top_k="12", top_p="0.95")
    assert shown == python_text(model, prompt, 80, temperature=0.9, top_k=12, top_p=0.95,
                                rng=PCG32(7))
    assert "characters" in page.locator(".tinygpt-status").inner_text()
    assert errors == []
    page.close()


def test_bad_settings_and_unknown_characters_are_one_line_errors(browser, tmp_path):
    page, _ = open_page(browser, write_page(tmp_path, small_model()))
    panel = page.locator("div.tinygpt-panel")
    panel.locator("textarea[name=prompt]").fill("ROMEO: ¿")
    panel.locator("button[type=submit]").click()
    wait_until_finished(page)
    assert panel.get_attribute("data-state") == "error"
    assert '"¿" is not in' in panel.locator(".tinygpt-status").inner_text()
    page.close()


@pytest.mark.parametrize("missing", ["engine", "model"])
def test_without_the_engine_or_the_model_the_panel_says_why(browser, tmp_path, missing):
    model = None if missing == "model" else small_model()
    page, _ = open_page(browser, write_page(tmp_path, model, engine=missing != "engine"))
    panel = page.locator("div.tinygpt-panel")
    if missing == "engine":
        assert "could not start (the engine (engine.js) did not load)" in panel.inner_text()
        return
    panel.locator("button[type=submit]").click()
    wait_until_finished(page)
    assert panel.get_attribute("data-state") == "error"
    assert "could not load" in panel.locator(".tinygpt-status").inner_text()
    page.close()


def test_with_javascript_off_the_page_keeps_its_line(browser, tmp_path):
    context = browser.new_context(java_script_enabled=False)
    page = context.new_page()
    page.goto(write_page(tmp_path, small_model()).as_uri())
    assert page.locator("div.tinygpt-panel").inner_text() == "(no panel: JavaScript is off)"
    context.close()
