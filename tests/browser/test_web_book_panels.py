"""The panels of the built book, opened from disk (``file://``) with every request to a site
blocked, run the book's real models as PyTorch does.

A reader samples greedily from the modern book model in chapter 9 and gets ``generate``'s text;
sees the attention of their own text in chapters 5 and 7, the weights those of the book model's
attention modules; and talks with the chat model in chapter 15 at temperature 0, getting
``ChatSession``'s reply, and sees one speech answered before and after DPO side by side (from
disk and served), each reply ``ChatSession``'s with its model. The models come from the
results cache, as the build exported them.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from browser_support import HTML, served
from test_web_panel import check_row, open_page, torch_attention, wait_until_finished

from tinygpt.book.chat_model import chat_model
from tinygpt.book.preferences import dpo_model
from tinygpt.book.trained_model import BOOK_RECIPE, MODERN_RECIPE, book_model
from tinygpt.chat import ChatSession
from tinygpt.sample import generate


def open_chapter(browser, chapter: str):
    path = HTML / "chapters" / f"{chapter}.html"
    if not path.is_file():
        pytest.fail(f"the book is not built ({path} is missing): run `make book`", pytrace=False)
    return open_page(browser, path)


def test_chapter_9_samples_the_modern_model_greedily(browser):
    run = book_model(MODERN_RECIPE, progress=False)
    page, errors = open_chapter(browser, "09_sampling")
    panel = page.locator("div.tinygpt-panel")
    panel.locator("select[name=model]").select_option("modern")
    prompt = "KING HENRY:\n"
    panel.locator("textarea[name=prompt]").fill(prompt)
    panel.locator("input[name=temperature]").fill("0")
    panel.locator("input[name=length]").fill("80")
    panel.locator("button[type=submit]").click()
    wait_until_finished(page)
    assert panel.get_attribute("data-state") == "done", panel.inner_text()
    out = generate(run.model, torch.tensor([run.tokenizer.encode(prompt)]), 80, temperature=0.0)
    assert panel.locator("pre.tinygpt-output").inner_text() == run.tokenizer.decode(
        out[0].tolist())
    assert errors == []
    page.close()


@pytest.mark.parametrize("chapter", ["05_attention", "07_gpt"])
def test_chapters_5_and_7_show_the_book_model_s_attention(browser, chapter):
    run = book_model(BOOK_RECIPE, progress=False)
    page, errors = open_chapter(browser, chapter)
    panel = page.locator("div.tinygpt-attention")
    text = "HAMLET:\nTo be, or not to be"
    panel.locator("textarea[name=text]").fill(text)
    panel.locator("button[type=submit]").click()
    wait_until_finished(page, "div.tinygpt-attention", ("ready", "error"))
    assert panel.get_attribute("data-state") == "ready", panel.inner_text()
    weights = torch_attention(run.model.eval(), run.tokenizer.encode(text))
    panel.locator("select[name=layer]").select_option("1")
    panel.locator("select[name=head]").select_option("3")
    panel.locator("span.tinygpt-token").nth(20).hover()
    check_row(panel, weights, 1, 3, 20)
    assert errors == []
    page.close()


def test_chapter_15_chats_with_the_chat_model(browser):
    chat = chat_model()
    page, errors = open_chapter(browser, "15_chat")
    panel = page.locator("div.tinygpt-chat")
    panel.locator("input[name=temperature]").fill("0")
    speech = "What news from the court?"
    panel.locator("textarea[name=speech]").fill(speech)
    panel.locator("button[type=submit]").click()
    wait_until_finished(page, "div.tinygpt-chat")
    assert panel.get_attribute("data-state") == "done", panel.inner_text()
    reply = ChatSession(chat.model, chat.tokenizer, temperature=0.0).reply(speech)
    assert panel.locator("pre.tinygpt-output").inner_text() == f"HAMLET:\n{speech}\n\n{reply}"
    assert errors == []
    page.close()


@pytest.mark.parametrize("where", ["disk", "served"])
def test_chapter_15_answers_one_speech_before_and_after_dpo(browser, where):
    """Before and after DPO, at temperature 0: the chat model's reply and the DPO model's
    (``preferences.dpo_model``), each ``ChatSession``'s; the DPO model is loaded only at the
    click (served: its .json and .bin fetched then, and nothing else)."""
    models = {"chat": chat_model(), "dpo": dpo_model()}
    speech = "What news from the court?"
    with contextlib.ExitStack() as stack:
        if where == "disk":
            page, errors = open_chapter(browser, "15_chat")
            asked: list[str] = []
        else:
            open_chapter(browser, "15_chat")[0].close()  # a clear failure if not built
            base = stack.enter_context(served(HTML))
            page = browser.new_page()
            errors, asked = [], []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("request", lambda r: asked.append(r.url.removeprefix(base)))
            page.route("**/*", lambda route: route.continue_()
                       if route.request.url.startswith(base) else route.abort("blockedbyclient"))
            page.goto(base + "/chapters/15_chat.html")
        panel = page.locator("div.tinygpt-chat")
        panel.locator("input[name=temperature]").fill("0")
        panel.locator("textarea[name=speech]").fill(speech)
        assert not [u for u in asked if "/models/" in u]
        panel.locator("button[name=compare]").click()
        wait_until_finished(page, "div.tinygpt-chat")
        assert panel.get_attribute("data-state") == "done", panel.inner_text()
        columns = panel.locator("pre.tinygpt-compare-output")
        shown = {columns.nth(i).get_attribute("data-model"): columns.nth(i).inner_text()
                 for i in range(columns.count())}
        page.close()
    want = {name: f"HAMLET:\n{speech}\n\n" + ChatSession(run.model, run.tokenizer,
                                                         temperature=0.0).reply(speech)
            for name, run in models.items()}
    assert shown == want
    assert want["chat"] != want["dpo"]  # DPO changed what the model says
    if where == "served":
        assert sorted(u for u in asked if "/models/" in u) == [
            f"/_static/models/{n}.{ext}" for n in ("chat", "dpo") for ext in ("bin", "json")]
    assert errors == []
