"""The built book in a browser: every page of _toc.yml, then search and the dark theme.

For each page: it loads without a console error, a failed request or a request to any host but
the local server (such requests are blocked and reported: the book must work offline); its math
is typeset by MathJax and no TeX delimiter is left in its text; every image has loaded; every
link to a page of the book points to a file that exists and, with a ``#fragment``, to an element
with that id. A full-page screenshot of each page is saved in ``_build/screenshots/``.
"""

from __future__ import annotations

import html.parser
import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from browser_support import HTML, REPO, SCREENSHOTS, toc_pages

PAGES = toc_pages()
TIMEOUT_MS = 60_000
# TeX left as text means MathJax did not typeset it.
RAW_TEX = re.compile(r"\$\$|\\\[|\\\]|\\\(|\\\)|\\begin\{")


class PageLog:
    """What a page did while it loaded: errors, failed requests, requests leaving the machine."""

    def __init__(self, page, host: str) -> None:
        self.console_errors: list[str] = []
        self.page_errors: list[str] = []
        self.failed_requests: list[str] = []
        self.external_requests: list[str] = []
        self._host = host
        page.on("console", self._on_console)
        page.on("pageerror", lambda error: self.page_errors.append(str(error)))
        page.on("requestfailed", self._on_request_failed)
        page.on("response", self._on_response)
        page.route("**/*", self._route)

    def _route(self, route) -> None:
        url = urlsplit(route.request.url)
        if url.scheme in ("http", "https", "ws", "wss") and url.netloc != self._host:
            self.external_requests.append(route.request.url)
            route.abort("blockedbyclient")
        else:
            route.continue_()

    def _on_console(self, message) -> None:
        if message.type == "error":
            where = message.location.get("url", "")
            self.console_errors.append(f"{message.text} ({where})" if where else message.text)

    def _on_request_failed(self, request) -> None:
        if request.url not in self.external_requests:
            self.failed_requests.append(f"{request.url}: {request.failure}")

    def _on_response(self, response) -> None:
        if response.status >= 400:
            self.failed_requests.append(f"{response.url}: HTTP {response.status}")

    def problems(self) -> list[str]:
        """Each problem once (an image that failed is reported again when decoded)."""
        problems = (
            [f"console error: {text}" for text in self.console_errors]
            + [f"uncaught exception: {text}" for text in self.page_errors]
            + [f"failed request: {text}" for text in self.failed_requests]
            + [f"request to another host (blocked): {url}" for url in self.external_requests]
        )
        return list(dict.fromkeys(problems))


class _Anchors(html.parser.HTMLParser):
    """The ids (and ``<a name>``s) of an HTML file: the targets a ``#fragment`` can name."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value and (name == "id" or (tag == "a" and name == "name")):
                self.ids.add(value)


_anchor_cache: dict[Path, set[str]] = {}


def anchors(path: Path) -> set[str]:
    if path not in _anchor_cache:
        parser = _Anchors()
        parser.feed(path.read_text(encoding="utf-8"))
        _anchor_cache[path] = parser.ids
    return _anchor_cache[path]


def broken_links(hrefs: list[str], site: str) -> list[str]:
    """The links among ``hrefs`` (absolute URLs) into the book that do not resolve."""
    host = urlsplit(site).netloc
    broken = []
    for href in sorted(set(hrefs)):
        url = urlsplit(href)
        if url.scheme not in ("http", "https") or url.netloc != host:
            continue  # another site, mailto:, javascript:
        path = unquote(url.path)
        target = HTML / path.lstrip("/")
        if path.endswith("/"):
            target = target / "index.html"
        if not target.is_file():
            broken.append(f"{href}: no file {target.relative_to(HTML)}")
        elif (
            url.fragment
            and target.suffix == ".html"
            and unquote(url.fragment) not in anchors(target)
        ):
            broken.append(f"{href}: no element with id {unquote(url.fragment)!r}")
    return broken


MATHJAX_DONE = """async () => {
    if (!(window.MathJax && MathJax.startup && MathJax.startup.promise)) return false;
    await MathJax.startup.promise;
    return true;
}"""

# Math elements that Sphinx wrote and MathJax left without output.
UNTYPESET_MATH = """() => Array.from(document.querySelectorAll('.math'))
    .filter(el => !el.querySelector('mjx-container'))
    .map(el => el.textContent.trim().slice(0, 80))"""

# The page's prose: its text without code, scripts and the typeset math itself.
PROSE = """() => {
    const body = document.body.cloneNode(true);
    body.querySelectorAll('pre, code, script, style, textarea, mjx-container, .highlight')
        .forEach(el => el.remove());
    return body.textContent;
}"""

UNLOADED_IMAGES = """async () => {
    const images = Array.from(document.images);
    for (const img of images) img.loading = 'eager';
    await Promise.all(images.map(img => img.decode().catch(() => null)));
    return images.filter(img => !(img.complete && img.naturalWidth > 0))
        .map(img => img.getAttribute('src'));
}"""


# Code cells that do not fit the width the theme gives them (a horizontal scroll bar): their
# first line, for the message. Hidden cells (the collapsed set-up cell) have no width to check.
WIDE_CODE = """() => Array.from(document.querySelectorAll('div.cell_input pre'))
    .filter(pre => pre.clientWidth > 0 && pre.scrollWidth > pre.clientWidth + 1)
    .map(pre => pre.textContent.split('\\n')[0].slice(0, 60))"""


@pytest.fixture
def context(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 900}, color_scheme="light")
    context.set_default_timeout(TIMEOUT_MS)
    yield context
    context.close()


@pytest.mark.parametrize("name", PAGES)
def test_page(name: str, site: str, context) -> None:
    assert (HTML / f"{name}.html").is_file(), f"{name}.html was not built"
    page = context.new_page()
    log = PageLog(page, urlsplit(site).netloc)
    page.goto(f"{site}/{name}.html", wait_until="networkidle")

    problems = []
    has_math = page.locator(".math").count() > 0
    if has_math:
        if not page.evaluate(MATHJAX_DONE):
            problems.append("the page has math but MathJax did not start")
        elif page.locator("mjx-container").count() == 0:
            problems.append("the page has math but MathJax produced no output")
        problems += [f"math not typeset: {tex!r}" for tex in page.evaluate(UNTYPESET_MATH)]
    for match in RAW_TEX.finditer(page.evaluate(PROSE)):
        text = match.string[max(0, match.start() - 40) : match.end() + 40]
        problems.append(f"TeX left in the text: {' '.join(text.split())!r}")
    problems += [f"image not loaded: {src}" for src in page.evaluate(UNLOADED_IMAGES)]
    problems += [f"code cell wider than the page: {line!r}" for line in page.evaluate(WIDE_CODE)]
    hrefs = page.eval_on_selector_all("a[href]", "links => links.map(a => a.href)")
    problems += [f"broken link: {text}" for text in broken_links(hrefs, site)]

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(
        path=SCREENSHOTS / f"{name.replace('/', '__')}.png", full_page=True, timeout=120_000
    )
    page.wait_for_timeout(500)  # for whatever the checks and the screenshot made the page fetch
    problems += log.problems()
    problems = list(dict.fromkeys(problems))
    assert not problems, f"{name}.html:\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("width", [1024, 1920])
def test_code_cells_fit_other_screen_widths(width: int, site: str, browser) -> None:
    """88 columns of code fit a code cell at every laptop or desktop width (book/_static/book.css
    sizes the font to the cell; test_page checks the default 1280 pixels)."""
    context = browser.new_context(viewport={"width": width, "height": 900})
    try:
        page = context.new_page()
        wide = {}
        for name in (p for p in PAGES if p.startswith("chapters/")):
            page.goto(f"{site}/{name}.html", wait_until="load")
            if found := page.evaluate(WIDE_CODE):
                wide[name] = found
        assert not wide, f"code cells wider than the page at {width} px: {wide}"
    finally:
        context.close()


def test_every_chapter_is_in_the_toc() -> None:
    """A chapter notebook left out of _toc.yml would be neither built nor tested."""
    chapters = {f"chapters/{path.stem}" for path in (REPO / "chapters").glob("*.ipynb")}
    missing = sorted(chapters - set(PAGES))
    assert not missing, f"chapters missing from _toc.yml: {missing}"


def test_search_finds_a_chapter(site: str, context) -> None:
    page = context.new_page()
    log = PageLog(page, urlsplit(site).netloc)
    page.goto(f"{site}/search.html?q=tokenizer", wait_until="networkidle")
    hit = page.locator('#search-results ul.search li a[href*="chapters/01_tokens.html"]')
    hit.first.wait_for(state="attached")
    assert hit.count() >= 1
    assert not log.problems(), "\n".join(log.problems())


def test_dark_mode_toggle(site: str, context) -> None:
    page = context.new_page()
    log = PageLog(page, urlsplit(site).netloc)
    page.goto(f"{site}/{PAGES[0]}.html", wait_until="networkidle")
    html = page.locator("html")

    def theme() -> tuple[str | None, str]:
        background = page.evaluate("getComputedStyle(document.body).backgroundColor")
        return html.get_attribute("data-theme"), background

    seen = [theme()]
    button = page.locator("button.theme-switch-button").first
    for _ in range(3):  # the switch cycles through auto, light and dark
        button.click()
        seen.append(theme())
    themes = {name for name, _ in seen}
    assert {"light", "dark"} <= themes, f"data-theme went through {seen}"
    backgrounds = dict(seen)
    assert backgrounds["light"] != backgrounds["dark"], f"same background in both themes: {seen}"
    while theme()[0] != "dark":
        button.click()
    # The reader's choice is kept from page to page.
    page.goto(f"{site}/{PAGES[-1]}.html", wait_until="networkidle")
    assert theme() == ("dark", backgrounds["dark"])
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=SCREENSHOTS / "dark-mode.png")
    assert not log.problems(), "\n".join(log.problems())
