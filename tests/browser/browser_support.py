"""What the browser tests share: where the book is, how Chromium is started, the pages of _toc.yml,
the CI policy for a missing browser (see conftest.py), and a local static host."""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
HTML = REPO / "_build" / "html"
SCREENSHOTS = REPO / "_build" / "screenshots"
CHROMIUM = Path("/usr/bin/chromium")
# No sandbox (the tests may run as root, in a container), no GPU, and none of Chromium's own
# background traffic (updates, sync, safe browsing lists): every request a page makes is the
# page's own.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]


def in_ci() -> bool:
    """Whether the tests run under continuous integration (``CI`` set to a true-ish value)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def unavailable(reason: str) -> None:
    """Skip the calling test for ``reason``, or fail it under CI."""
    if in_ci():
        pytest.fail(f"{reason} (required under CI)", pytrace=False)
    pytest.skip(reason)


def toc_pages() -> list[str]:
    """The document names of every page in _toc.yml, in reading order ("book/intro", ...)."""
    toc = yaml.safe_load((REPO / "_toc.yml").read_text(encoding="utf-8"))
    pages = [toc["root"]]

    def walk(entries: list[dict]) -> None:
        for entry in entries or []:
            if "file" in entry:
                pages.append(entry["file"])
            for key in ("parts", "chapters", "sections"):
                walk(entry.get(key))

    walk(toc.get("parts") or toc.get("chapters") or [])
    return [page.removesuffix(".ipynb").removesuffix(".md") for page in pages]


def book_config() -> dict:
    return yaml.safe_load((REPO / "_config.yml").read_text(encoding="utf-8"))


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args) -> None:
        pass


@contextlib.contextmanager
def served(folder: Path) -> Iterator[str]:
    """The base URL of ``folder`` served on 127.0.0.1 on a free port (a static host, as GitHub
    Pages is), until the block ends."""
    handler = functools.partial(QuietHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, name="static-host", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
