"""Sphinx extension: keeps sphinx-thebe's scripts out of the pages while thebe is off.

Jupyter Book loads sphinx-thebe whether or not thebe is used, and sphinx-thebe then writes its
configuration script into every page, twice: the second copy throws "Identifier 'THEBE_JS_URL'
has already been declared" in the reader's browser. The book does not use thebe
(``launch_buttons.thebe: false`` in _config.yml: live code would load thebe from unpkg.com), so
sphinx-thebe's two event handlers are disconnected and its scripts are not written. With
``thebe: true`` this extension does nothing.
"""

from __future__ import annotations

from sphinx.application import Sphinx
from sphinx.config import Config

_THEBE_HANDLERS = ("init_thebe_core", "update_thebe_context")


def drop_thebe(app: Sphinx, config: Config) -> None:
    if (config.html_theme_options.get("launch_buttons") or {}).get("thebe"):
        return
    for listeners in app.events.listeners.values():
        for listener in list(listeners):
            handler = listener.handler
            if (
                getattr(handler, "__module__", "") == "sphinx_thebe"
                and getattr(handler, "__name__", "") in _THEBE_HANDLERS
            ):
                app.disconnect(listener.id)


def setup(app: Sphinx) -> dict:
    app.connect("config-inited", drop_thebe)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
