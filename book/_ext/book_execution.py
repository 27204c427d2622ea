"""Sphinx extension: how the book's chapters are executed, loaded from _config.yml.

It does two things when the configuration is read, before any page is:

* ``BOOK_EXECUTE``, when set in the environment (``force``, ``cache``, ``auto`` or ``off``),
  replaces ``execute.execute_notebooks`` from _config.yml. ``make book`` sets it to ``force``
  under CI, so that CI always runs every chapter afresh.
* In ``cache`` mode it puts the jupyter-cache in ``_build/.jupyter_cache/<key>``, where ``<key>``
  is a hash of every file of the package (``src/``) and of ``pyproject.toml``. jupyter-cache
  reuses a chapter's outputs only while the chapter's code cells are unchanged; it cannot know
  that a chapter imports ``tinygpt``. A change to the package gives a new key, hence an empty
  cache, and, since the key is a configuration value, Sphinx also reads every chapter again: so
  every chapter is run against the changed package. Caches under other keys are removed.

It does not handle data files (they are checked against pinned SHA-256 sums, so their content
cannot change) nor packages installed by hand into the environment outside ``pyproject.toml``.
An explicit ``execute.cache`` path in _config.yml is used as given.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from pathlib import Path

from sphinx.application import Sphinx
from sphinx.config import Config
from sphinx.errors import ConfigError
from sphinx.util import logging

LOGGER = logging.getLogger(__name__)

MODES = ("force", "cache", "auto", "off")
KEY_LENGTH = 16
_KEY = re.compile(rf"[0-9a-f]{{{KEY_LENGTH}}}")


def package_key(root: Path) -> str:
    """A hash of everything under ``root/src`` (bytecode aside) and ``root/pyproject.toml``."""
    files = [root / "pyproject.toml"]
    files += [
        path
        for path in (root / "src").rglob("*")
        if path.is_file()
        and "__pycache__" not in path.parts
        and not any(part.endswith(".egg-info") for part in path.parts)
        and path.suffix not in (".pyc", ".pyo")
    ]
    digest = hashlib.sha256()
    for path in sorted(files):
        if path.is_file():
            digest.update(path.relative_to(root).as_posix().encode() + b"\0")
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:KEY_LENGTH]


def configure_execution(app: Sphinx, config: Config) -> None:
    mode = os.environ.get("BOOK_EXECUTE", "").strip()
    if mode:
        if mode not in MODES:
            raise ConfigError(f"BOOK_EXECUTE={mode!r}: use one of {', '.join(MODES)}")
        config.nb_execution_mode = mode
    if config.nb_execution_mode != "cache" or config.nb_execution_cache_path:
        return

    caches = Path(app.outdir).parent / ".jupyter_cache"
    key = package_key(Path(app.srcdir))
    config.nb_execution_cache_path = str((caches / key).resolve())
    if caches.is_dir():
        for old in caches.iterdir():
            if old.name != key and _KEY.fullmatch(old.name):
                LOGGER.info(f"book_execution: removing the outdated cache {old}")
                shutil.rmtree(old, ignore_errors=True)
    LOGGER.info(f"book_execution: package key {key}")


def setup(app: Sphinx) -> dict:
    app.connect("config-inited", configure_execution)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
