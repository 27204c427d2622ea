"""The book_web_models extension (book/_ext/book_web_models.py): which pages get the panel's
scripts, where the models go, and that BOOK_WEB_MODELS=off exports nothing (no model is loaded
or trained here: the export itself is tests/test_web_engine.py's)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "book" / "_ext"))

import book_web_models  # noqa: E402


class FakeApp:
    def __init__(self, outdir: Path) -> None:
        self.js: list[str] = []
        self.outdir = outdir
        self.builder = SimpleNamespace(format="html")

    def add_js_file(self, name: str) -> None:
        self.js.append(name)


def test_only_pages_with_a_panel_load_the_engine(tmp_path):
    app = FakeApp(tmp_path)
    book_web_models.add_panel_scripts(app, "chapters/01_tokens", "page.html",
                                      {"body": "<p>no panel</p>"}, None)
    assert app.js == []
    book_web_models.add_panel_scripts(
        app, "chapters/09_sampling", "page.html",
        {"body": '<div class="tinygpt-panel" data-models="book">'}, None)
    assert app.js == ["tinygpt/engine.js", "tinygpt/models.js", "tinygpt/panel.js"]
    app.js.clear()
    book_web_models.add_panel_scripts(
        app, "chapters/15_chat", "page.html",
        {"body": '<div class="tinygpt-chat" data-model="chat"></div>'
                 '<div class="tinygpt-attention" data-model="book"></div>'}, None)
    assert app.js == ["tinygpt/engine.js", "tinygpt/models.js", "tinygpt/attention_panel.js",
                      "tinygpt/chat.js", "tinygpt/chat_panel.js"]
    every = {s for scripts in book_web_models.PANELS.values() for s in scripts}
    assert all((ROOT / "book" / "_static" / s).is_file()
               for s in {*book_web_models.COMMON, *every})


def test_off_exports_nothing_and_a_failed_build_neither(tmp_path, monkeypatch):
    app = FakeApp(tmp_path)
    monkeypatch.setenv("BOOK_WEB_MODELS", "off")
    book_web_models.export_models(app, None)
    monkeypatch.delenv("BOOK_WEB_MODELS")
    book_web_models.export_models(app, RuntimeError("the build failed"))
    assert list(tmp_path.iterdir()) == []


def test_registered_and_the_chapters_hold_panels():
    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
    assert config["sphinx"]["local_extensions"]["book_web_models"] == "book/_ext"
    for chapter, kind, models in (("08_training", "panel", 'data-models="book"'),
                                  ("09_sampling", "panel", 'data-models="book modern"'),
                                  ("05_attention", "attention", 'data-model="book"'),
                                  ("07_gpt", "attention", 'data-model="book"'),
                                  ("15_chat", "chat", 'data-model="chat" data-compare="dpo"')):
        cells = json.loads((ROOT / "chapters" / f"{chapter}.ipynb").read_text())["cells"]
        panels = ["".join(c["source"]) for c in cells if c["cell_type"] == "markdown"
                  and f'class="tinygpt-{kind}"' in "".join(c["source"])]
        assert len(panels) == 1 and models in panels[0], chapter
