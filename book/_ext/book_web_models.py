"""Sphinx extension: the book's models in the reader's page, exported when the book is built.

Pages whose HTML holds a ``<div class="tinygpt-panel">`` (a markdown cell of chapters 8 and 9)
get the engine and the panel scripts (``_static/tinygpt/engine.js``, ``panel.js``); no other
page loads them. When the HTML build has finished, the book's model and the modern book model
(``tinygpt.book.trained_model.book_model`` with ``BOOK_RECIPE`` and ``MODERN_RECIPE``) are
written by ``tinygpt.book.web_export`` into ``_build/html/_static/models/`` as ``book.*`` and
``modern.*``: from the results cache, where chapters 8 and 12 stored them earlier in the same
build (``book_model`` trains only a model missing from the cache, once: a second call loads it).
Nothing is committed: the weights exist only in the built book.

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
SCRIPTS = ("tinygpt/engine.js", "tinygpt/panel.js")  # in book/_static, in this order
PANEL = 'class="tinygpt-panel"'


def add_panel_scripts(app: Sphinx, pagename: str, templatename: str, context: dict,
                      doctree: object) -> None:
    """The engine and the panel, on the pages that have a panel."""
    if PANEL in context.get("body", ""):
        for script in SCRIPTS:
            app.add_js_file(script)


def export_models(app: Sphinx, exception: Exception | None) -> None:
    if exception is not None or app.builder.format != "html":
        return
    if os.environ.get("BOOK_WEB_MODELS", "").strip().lower() == "off":
        LOGGER.info("book_web_models: BOOK_WEB_MODELS=off, the page's models are not exported")
        return
    from tinygpt.book.trained_model import BOOK_RECIPE, MODERN_RECIPE, book_model
    from tinygpt.book.web_export import export_model

    folder = Path(app.outdir) / "_static" / "models"
    for name, recipe in (("book", BOOK_RECIPE), ("modern", MODERN_RECIPE)):
        run = book_model(recipe, progress=False)
        sizes = export_model(run.model, run.tokenizer, folder, name)
        LOGGER.info(f"book_web_models: {name} -> {folder} ({sizes})")


def setup(app: Sphinx) -> dict:
    app.connect("html-page-context", add_panel_scripts)
    app.connect("build-finished", export_models)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
