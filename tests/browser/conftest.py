"""Fixtures for the browser tests: the built book served locally, and headless Chromium.

These tests use the book as a reader does: they open every page of ``_build/html`` in Chromium,
driven by Playwright, and run a chapter in JupyterLab. They need

* the built book (``make book``): without it every test fails and says so;
* the ``playwright`` Python package (the ``browser`` extra) and the system's Chromium at
  ``/usr/bin/chromium`` (``apt-get install chromium``; Playwright's own browser download is not
  used). Without either the tests are skipped with the reason -- unless the ``CI`` environment
  variable is set (and not to 0/false/no): under CI they fail, since CI must not pass by
  skipping.

Run them with ``make test-browser`` or ``pytest tests/browser`` (``pytest tests/`` leaves them
out: see ``norecursedirs`` in pyproject.toml).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from browser_support import CHROMIUM, CHROMIUM_ARGS, HTML, served, unavailable


@pytest.fixture(scope="session")
def site() -> Iterator[str]:
    """The base URL of ``_build/html``, served on 127.0.0.1 on a free port for the session."""
    if not (HTML / "index.html").is_file():
        pytest.fail(
            f"the book is not built ({HTML}/index.html is missing): run `make book`", pytrace=False
        )
    with served(HTML) as base:
        yield base


@pytest.fixture(scope="session")
def browser():
    """Headless Chromium (/usr/bin/chromium), shared by the session's tests."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        unavailable("the playwright package is not installed: pip install -e '.[browser]'")
    if not CHROMIUM.is_file():
        unavailable(f"{CHROMIUM} is not installed: apt-get install chromium")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True
        )
        try:
            yield chromium
        finally:
            chromium.close()
