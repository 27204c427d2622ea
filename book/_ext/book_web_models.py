"""Sphinx extension: the book's models in the reader's page, exported when the book is built.

A page whose HTML holds one of the panels (a markdown cell's ``<div>``) gets the engine, the
model loader and that panel's scripts, from ``_static/tinygpt/`` (``PANELS``): the sampling
panel ``<div class="tinygpt-panel">`` (chapters 8 and 9), the attention panel
``<div class="tinygpt-attention">`` (chapters 5 and 7), the chat panel
``<div class="tinygpt-chat">`` (chapter 15); no other page loads them. When the HTML build has
finished, the book's model and the modern book model (``tinygpt.book.trained_model.book_model``
with ``BOOK_RECIPE`` and ``MODERN_RECIPE``), the chat model
(``tinygpt.book.chat_model.chat_model``) and the chat model tuned by DPO
(``tinygpt.book.preferences.dpo_model``, which chapter 15's panel loads only when the reader asks
for the comparison) are written by ``tinygpt.book.web_export`` into
``_build/html/_static/models/`` as ``book.*``, ``modern.*``, ``chat.*`` and ``dpo.*``: from the
results cache, where chapters 8, 12 and 15 (or ``make models``) stored them earlier (each call
trains only a model missing from the cache, once). Nothing is committed: the weights exist only
in the built book.

``BOOK_WEB_MODELS=off`` in the environment skips the export (the panels then say, when asked
to generate, that the model could not be loaded). Registered as ``book_web_models: book/_ext``
under ``sphinx.local_extensions`` in _config.yml.
"""

from __future__ import annotations

import os
from pathlib import Path

from sphinx.application import Sphinx
from sphinx.util import logging

LOGGER = logging.getLogger(__name__)
COMMON = ("tinygpt/engine.js", "tinygpt/models.js")  # in book/_static, loaded first
PANELS = {  # a panel's marker in the page's HTML -> its scripts, after COMMON, in this order
    'class="tinygpt-panel"': ("tinygpt/panel.js",),
    'class="tinygpt-attention"': ("tinygpt/attention_panel.js",),
    'class="tinygpt-chat"': ("tinygpt/chat.js", "tinygpt/chat_panel.js"),
}


def add_panel_scripts(app: Sphinx, pagename: str, templatename: str, context: dict,
                      doctree: object) -> None:
    """The engine, the loader and each panel's scripts, on the pages that have that panel."""
    body = context.get("body", "")
    wanted = [s for marker, scripts in PANELS.items() if marker in body for s in scripts]
    for script in (*COMMON, *wanted) if wanted else ():
        app.add_js_file(script)


def export_models(app: Sphinx, exception: Exception | None) -> None:
    if exception is not None or app.builder.format != "html":
        return
    if os.environ.get("BOOK_WEB_MODELS", "").strip().lower() == "off":
        LOGGER.info("book_web_models: BOOK_WEB_MODELS=off, the page's models are not exported")
        return
    from tinygpt.book.chat_model import chat_model
    from tinygpt.book.preferences import dpo_model
    from tinygpt.book.trained_model import BOOK_RECIPE, MODERN_RECIPE, book_model
    from tinygpt.book.web_export import export_model

    folder = Path(app.outdir) / "_static" / "models"
    for name, make in (("book", lambda: book_model(BOOK_RECIPE, progress=False)),
                       ("modern", lambda: book_model(MODERN_RECIPE, progress=False)),
                       ("chat", chat_model), ("dpo", dpo_model)):
        run = make()
        sizes = export_model(run.model, run.tokenizer, folder, name)
        LOGGER.info(f"book_web_models: {name} -> {folder} ({sizes})")


def setup(app: Sphinx) -> dict:
    app.connect("html-page-context", add_panel_scripts)
    app.connect("build-finished", export_models)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
