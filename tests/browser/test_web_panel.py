"""The sampling panel (book/_static/tinygpt/panel.js) driven in Chromium as a reader would.

The whole book is too slow to build for this, so each test writes a small page with the built
book's layout into a temporary folder: ``page.html`` beside ``_static/tinygpt/`` (the engine and
the panel, copied from book/_static) and ``_static/models/book.js`` (a small random model written
by tinygpt.book.web_export), and opens it from disk (``file://``), with every request to a site
blocked. The reader types a prompt, sets temperature 0, presses Generate and reads the text,
which must be the package's greedy ``generate``; with a seed, the text of
``generate(..., rng=PCG32(seed))``. The attention panel: the reader types a text, chooses a
layer and a head and points at characters (mouse, click, keyboard); the weights shown must be
those of the model's attention modules. The chat panel: two turns at temperature 0 must show
``tinygpt.chat.ChatSession``'s replies, and Before and after DPO shows the replies of two
models to one speech side by side (fetched, served, only when asked). Without the engine, or
without the model's file, a panel says why in one line.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from browser_support import REPO, served

from tinygpt.book.web_export import export_model, weights_of
from tinygpt.chat import SPECIAL_TOKENS, ChatSession
from tinygpt.config import GPTConfig
from tinygpt.model import GPT
from tinygpt.sample import PCG32, generate
from tinygpt.tokenizer import CharTokenizer

CHARS = list("\n !',.:;?ABCDEGHIKMNORSTWabcdeghilmnorstuwy")
PAGE = """<!DOCTYPE html><html><head><meta charset="utf-8"><title>panel</title></head><body>
{panel}
{scripts}</body></html>"""
SAMPLING = ('<div class="tinygpt-panel" data-models="book"><p>(no panel: JavaScript is off)'
            '</p></div>')



def small_model() -> GPT:
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=len(CHARS), block_size=32, n_layer=2, n_head=2, n_embd=16,
                          bias=False, activation="gelu")).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(15.0)  # std 0.3: peaked logits
    return model


def write_page(folder: Path, model: GPT | None, engine: bool = True, panel: str = SAMPLING,
               panel_scripts: tuple[str, ...] = ("panel.js",), name: str = "book",
               chars: list[str] = CHARS) -> Path:
    """page.html with ``panel`` and its scripts (after the engine and models.js, as
    book/_ext/book_web_models.py adds them), and ``model`` exported as ``name``."""
    static = folder / "_static"
    (static / "tinygpt").mkdir(parents=True)
    names = (["engine.js"] if engine else []) + ["models.js", *panel_scripts]
    for script in names:
        shutil.copy(REPO / "book" / "_static" / "tinygpt" / script, static / "tinygpt" / script)
    if model is not None:
        export_model(model, CharTokenizer(chars), static / "models", name)
    scripts = "".join(f'<script src="_static/tinygpt/{n}"></script>\n' for n in names)
    page = folder / "page.html"
    page.write_text(PAGE.format(panel=panel, scripts=scripts), encoding="utf-8")
    return page


def open_page(browser, page_path: Path):
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.route("http*://**/*", lambda route: route.abort("blockedbyclient"))
    page.goto(page_path.as_uri())
    return page, errors


def wait_until_finished(page, panel: str = "div.tinygpt-panel",
                        states: tuple[str, ...] = ("done", "error")) -> None:
    """Until the panel's run is done or has failed (the click set its state to loading)."""
    page.wait_for_function(f"{list(states)}.includes(document.querySelector("
                           f"'{panel}').dataset.state)", timeout=60_000)


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


@pytest.mark.parametrize("bin_there", [True, False])
def test_a_served_page_fetches_the_float32_weights_else_the_script(browser, tmp_path,
                                                                   bin_there):
    model = small_model()
    write_page(tmp_path, model)
    if not bin_there:  # a host that does not serve the .bin: the page falls back on the .js
        (tmp_path / "_static" / "models" / "book.bin").unlink()
    with served(tmp_path) as base:
        page = browser.new_page()
        asked: list[str] = []
        page.on("request", lambda r: asked.append(r.url.removeprefix(base)))
        page.route("**/*", lambda route: route.continue_() if route.request.url.startswith(base)
                   else route.abort("blockedbyclient"))
        page.goto(base + "/page.html")
        shown = generate_in_page(page, "ROMEO:\nWhat is", 60, "0")
        page.close()
    assert shown == python_text(model, "ROMEO:\nWhat is", 60, temperature=0.0)
    models = sorted(u for u in asked if "/models/" in u)
    assert models == (["/_static/models/book.bin", "/_static/models/book.json"] if bin_there
                      else ["/_static/models/book.bin", "/_static/models/book.js",
                            "/_static/models/book.json"])


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


# --- the attention panel (attention_panel.js) ------------------------------------------------

ATTENTION = ('<div class="tinygpt-attention" data-model="book"><p>(no attention panel: '
             'JavaScript is off)</p></div>')


def torch_attention(model: GPT, ids: list[int]) -> list[torch.Tensor]:
    """Per layer, the weights (H, T, T) of the model's attention modules on ids."""
    out = []
    with torch.no_grad():
        x = model.transformer.embed.wte(torch.tensor([ids])) + \
            model.transformer.embed.positions(len(ids))  # (1, T, C)
        for block in model.transformer.h:
            _, w = block.attn(block.ln_1(x), return_weights=True)  # (1, H, T, T)
            out.append(w[0])
            x = block(x)
    return out


def shown_weights(panel) -> list[float | None]:
    """The weight each character shows (None: after the query, masked)."""
    return panel.locator("span.tinygpt-token").evaluate_all(
        "spans => spans.map(s => s.dataset.weight === undefined ? null : Number(s.dataset.weight))")


def check_row(panel, weights: list[torch.Tensor], layer: int, head: int, t: int) -> None:
    assert panel.get_attribute("data-pointed") == str(t)
    got = shown_weights(panel)
    want = weights[layer][head, t, :t + 1].tolist()
    assert all(g is not None and abs(g - w) <= 6e-5 for g, w in zip(got, want)), (got, want)
    assert got[t + 1:] == [None] * (len(got) - t - 1)  # the future is masked
    assert panel.locator("span.tinygpt-future").count() == len(got) - t - 1


def test_attention_panel_shows_the_model_s_weights_where_the_reader_points(browser, tmp_path):
    model = small_model()
    page, errors = open_page(browser, write_page(tmp_path, model, panel=ATTENTION,
                                                 panel_scripts=("attention_panel.js",)))
    panel = page.locator("div.tinygpt-attention")
    text = "ROMEO:\nWhat is this?"
    panel.locator("textarea[name=text]").fill(text)
    panel.locator("button[type=submit]").click()
    wait_until_finished(page, "div.tinygpt-attention", ("ready", "error"))
    assert panel.get_attribute("data-state") == "ready", panel.inner_text()
    weights = torch_attention(model, CharTokenizer(CHARS).encode(text))
    spans = panel.locator("span.tinygpt-token")
    assert spans.count() == len(text)
    check_row(panel, weights, 0, 0, len(text) - 1)  # at first: the last character, layer 0, head 0
    panel.locator("select[name=layer]").select_option("1")
    panel.locator("select[name=head]").select_option("1")
    check_row(panel, weights, 1, 1, len(text) - 1)
    spans.nth(9).hover()  # pointing with the mouse
    check_row(panel, weights, 1, 1, 9)
    spans.nth(3).click()  # clicking focuses it; then the keyboard moves
    check_row(panel, weights, 1, 1, 3)
    page.keyboard.press("ArrowRight")
    page.keyboard.press("ArrowRight")
    check_row(panel, weights, 1, 1, 5)
    panel.locator("select[name=head]").select_option("0")
    check_row(panel, weights, 1, 0, 5)
    spans.nth(5).focus()
    page.keyboard.press("Home")
    check_row(panel, weights, 1, 0, 0)
    assert shown_weights(panel)[0] == 1.0  # the first position sees only itself
    assert 'position 0 "R" (layer 1, head 0) attends most to position 0 "R" (1.00)' in \
        panel.locator(".tinygpt-status").inner_text()
    assert errors == []
    page.close()


@pytest.mark.parametrize(("text", "message"), [
    ("ROMEO: \u00bf", '"\u00bf" is not in'),
    ("a" * 33, "the text is 33 characters; the model reads at most 32"),
    ("", "the text is empty")])
def test_attention_panel_refuses_bad_text_in_one_line(browser, tmp_path, text, message):
    page, _ = open_page(browser, write_page(tmp_path, small_model(), panel=ATTENTION,
                                            panel_scripts=("attention_panel.js",)))
    panel = page.locator("div.tinygpt-attention")
    panel.locator("textarea[name=text]").fill(text)
    panel.locator("button[type=submit]").click()
    wait_until_finished(page, "div.tinygpt-attention", ("ready", "error"))
    assert panel.get_attribute("data-state") == "error"
    assert message in panel.locator(".tinygpt-status").inner_text()
    assert panel.locator("span.tinygpt-token").count() == 0
    page.close()


# --- the chat panel (chat.js, chat_panel.js) --------------------------------------------------

CHAT = '<div class="tinygpt-chat" data-model="chat"><p>(no chat panel: JavaScript is off)</p></div>'
CHAT_CHARS = [*CHARS, "L", *SPECIAL_TOKENS]


def chat_model(seed: int = 1) -> GPT:
    """A small chat model of the panel's characters, weights scaled up so that replies vary."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=len(CHAT_CHARS), block_size=64, n_layer=2, n_head=2,
                          n_embd=16, bias=False, activation="gelu")).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(15.0)
    return model


def test_chat_panel_replies_as_chat_session_turn_after_turn(browser, tmp_path):
    model = chat_model()
    page, errors = open_page(browser, write_page(
        tmp_path, model, panel=CHAT, panel_scripts=("chat.js", "chat_panel.js"), name="chat",
        chars=CHAT_CHARS))
    panel = page.locator("div.tinygpt-chat")
    session = ChatSession(model, CharTokenizer(CHAT_CHARS), temperature=0.0, max_chars=200)
    panel.locator("input[name=temperature]").fill("0")
    transcript = ""
    for speech in ["What news?", "Is it so, sir? Then go."]:  # the second is cut to fit
        panel.locator("textarea[name=speech]").fill(speech)
        panel.locator("button[type=submit]").click()
        wait_until_finished(page, "div.tinygpt-chat")
        assert panel.get_attribute("data-state") == "done", panel.inner_text()
        reply = session.reply(speech)  # "HORATIO:\n" and the reply
        transcript += ("\n\n" if transcript else "") + "HAMLET:\n" + session.fit(speech) + \
            "\n\n" + reply
        assert panel.locator("pre.tinygpt-output").inner_text() == transcript
    assert session.cut > 0 and f"the first {session.cut} characters" in panel.locator(
        ".tinygpt-status").inner_text()
    panel.locator("button[name=new]").click()
    assert panel.locator("pre.tinygpt-output").inner_text() == ""
    panel.locator("textarea[name=speech]").fill("a \u25b7 b")
    panel.locator("button[type=submit]").click()
    wait_until_finished(page, "div.tinygpt-chat")
    assert "contains \u25b7" in panel.locator(".tinygpt-status").inner_text()
    assert errors == []
    page.close()


@pytest.mark.parametrize(("div", "scripts"), [(ATTENTION, ("attention_panel.js",)),
                                              (CHAT, ("chat.js", "chat_panel.js"))])
def test_without_the_engine_the_other_panels_say_why(browser, tmp_path, div, scripts):
    page, _ = open_page(browser, write_page(tmp_path, None, engine=False, panel=div,
                                            panel_scripts=scripts))
    assert "could not start (the engine (engine.js) did not load)" in page.locator(
        "body").inner_text()
    page.close()


def tuned_chat_model() -> GPT:
    """Another chat model of the same shape: the page's stand-in for the DPO model."""
    return chat_model(seed=2)


COMPARE = ('<div class="tinygpt-chat" data-model="chat" data-compare="dpo"><p>(no chat panel: '
           'JavaScript is off)</p></div>')


def say(panel, page, speech: str, button: str = "button[type=submit]") -> None:
    panel.locator("textarea[name=speech]").fill(speech)
    panel.locator(button).click()
    wait_until_finished(page, "div.tinygpt-chat")
    assert panel.get_attribute("data-state") == "done", panel.inner_text()


def compare_side_by_side(page, models: dict[str, GPT]) -> None:
    """A turn first (the chat model only), then Before and after DPO: each column is
    ChatSession's greedy reply of its model; seeded, the chat model's column is the panel's own
    reply to the same speech in a new conversation by the same settings."""
    panel = page.locator("div.tinygpt-chat")
    assert panel.locator("div.tinygpt-compare").is_hidden()
    panel.locator("input[name=temperature]").fill("0")
    say(panel, page, "What news?")
    assert page.evaluate("Object.keys(window.TINYGPT_MODELS || {})") in ([], ["chat"])
    speech = "Is it so, sir? Then go."  # cut to fit the turn, alike in both
    say(panel, page, speech, "button[name=compare]")
    assert panel.locator("div.tinygpt-compare").is_visible()
    columns = panel.locator("pre.tinygpt-compare-output")
    assert columns.count() == 2
    shown = {}
    for i in range(2):
        name = columns.nth(i).get_attribute("data-model")
        session = ChatSession(models[name], CharTokenizer(CHAT_CHARS), temperature=0.0,
                              max_chars=200)
        reply = session.reply(speech)
        shown[name] = columns.nth(i).inner_text()
        assert shown[name] == "HAMLET:\n" + session.fit(speech) + "\n\n" + reply, name
    assert sorted(shown) == ["chat", "dpo"] and shown["chat"] != shown["dpo"]
    assert "before DPO" in panel.inner_text() and "after DPO" in panel.inner_text()
    panel.locator("input[name=temperature]").fill("1.0")
    panel.locator("input[name=seed]").fill("5")
    say(panel, page, speech, "button[name=compare]")
    seeded = columns.nth(0).inner_text()
    panel.locator("button[name=new]").click()
    say(panel, page, speech)
    assert panel.locator("pre.tinygpt-output").inner_text() == seeded
    assert seeded != shown["chat"]  # sampled, not greedy


def write_compare_page(folder: Path) -> tuple[Path, dict[str, GPT]]:
    models = {"chat": chat_model(), "dpo": tuned_chat_model()}
    page = write_page(folder, models["chat"], panel=COMPARE,
                      panel_scripts=("chat.js", "chat_panel.js"), name="chat", chars=CHAT_CHARS)
    export_model(models["dpo"], CharTokenizer(CHAT_CHARS), folder / "_static" / "models", "dpo")
    return page, models


def test_chat_panel_compares_before_and_after_dpo_from_disk(browser, tmp_path):
    page_path, models = write_compare_page(tmp_path)
    page, errors = open_page(browser, page_path)
    compare_side_by_side(page, models)
    assert sorted(page.evaluate("Object.keys(window.TINYGPT_MODELS)")) == ["chat", "dpo"]
    assert errors == []
    page.close()


def test_a_served_chat_page_fetches_the_dpo_model_only_for_the_comparison(browser, tmp_path):
    """What a served page adds: the chat model's .json and .bin at the first speech, then, at
    the click on Before and after DPO, the DPO model's .json and .bin, once."""
    _, models = write_compare_page(tmp_path)
    folder = tmp_path / "_static" / "models"
    with served(tmp_path) as base:
        page = browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        asked: list[str] = []
        page.on("request", lambda r: asked.append(r.url.removeprefix(base)))
        page.route("**/*", lambda route: route.continue_() if route.request.url.startswith(base)
                   else route.abort("blockedbyclient"))
        page.goto(base + "/page.html")
        panel = page.locator("div.tinygpt-chat")
        assert [u for u in asked if "/models/" in u] == []  # the page alone: no model
        panel.locator("input[name=temperature]").fill("0")
        say(panel, page, "What news?")
        before = sorted(u for u in asked if "/models/" in u)
        compare_side_by_side(page, models)
        page.close()
    assert before == ["/_static/models/chat.bin", "/_static/models/chat.json"]
    after = sorted(u for u in asked if "/models/" in u)
    assert after == [*before, "/_static/models/dpo.bin", "/_static/models/dpo.json"]
    added = sum((folder / f"dpo.{ext}").stat().st_size for ext in ("json", "bin"))
    assert added == (folder / "dpo.json").stat().st_size + 4 * sum(  # float32 weights
        t.numel() for _, t in weights_of(models["dpo"]))
    assert errors == []


def test_without_the_dpo_model_the_comparison_says_why_and_the_chat_goes_on(browser, tmp_path):
    page, errors = open_page(browser, write_page(
        tmp_path, chat_model(), panel=COMPARE, panel_scripts=("chat.js", "chat_panel.js"),
        name="chat", chars=CHAT_CHARS))
    panel = page.locator("div.tinygpt-chat")
    panel.locator("textarea[name=speech]").fill("What news?")
    panel.locator("button[name=compare]").click()
    wait_until_finished(page, "div.tinygpt-chat")
    assert panel.get_attribute("data-state") == "error"
    status = panel.locator(".tinygpt-status").inner_text()
    assert status.startswith("error: could not load") and "dpo.js" in status
    assert "\n" not in status
    say(panel, page, "What news?")  # the chat model still answers
    assert panel.locator("pre.tinygpt-output").inner_text().startswith("HAMLET:\nWhat news?")
    assert errors == []
    page.close()
