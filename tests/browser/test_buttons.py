"""The buttons above each page: launch (Colab, Binder, JupyterHub), repository and download.

Every launch and repository link must be the one built from the ``repository`` and
``launch_buttons`` settings of _config.yml, the way sphinx-book-theme builds it, so that a fork
that changes ``repository.url`` gets links to its own notebooks; and the download button must
give the page's own source (for a chapter, its notebook). These tests read the built HTML; that
the buttons load nothing at page load is checked by test_book.py, on every page.
"""

from __future__ import annotations

import html.parser
from urllib.parse import urlencode, urlsplit

import pytest
from browser_support import HTML, REPO, book_config, toc_pages

PAGES = toc_pages()
CHAPTERS = [name for name in PAGES if (REPO / f"{name}.ipynb").is_file()]
LAUNCH_TITLE = "Launch on "


def expected_launch_urls(config: dict, name: str) -> dict[str, str]:
    """The launch button links of notebook page ``name``, from _config.yml alone."""
    repository = config["repository"]
    url = repository["url"].rstrip("/")
    owner, repo = urlsplit(url).path.strip("/").split("/")[:2]
    branch = repository.get("branch") or "master"
    folder = (repository.get("path_to_book") or "").strip("/")
    path = f"{folder}/{name}.ipynb" if folder else f"{name}.ipynb"
    launch = config.get("launch_buttons") or {}
    ui = {"classic": "tree", "jupyterlab": "lab/tree"}[launch.get("notebook_interface", "classic")]

    urls = {}
    if binder := (launch.get("binderhub_url") or "").strip("/"):
        urls["Binder"] = f"{binder}/v2/gh/{owner}/{repo}/{branch}?urlpath={ui}/{path}"
    if hub := (launch.get("jupyterhub_url") or "").strip("/"):
        query = urlencode(
            {"repo": url, "urlpath": f"{ui}/{repo}/{path}", "branch": branch}, safe="/"
        )
        urls["JupyterHub"] = f"{hub}/hub/user-redirect/git-pull?{query}"
    if colab := (launch.get("colab_url") or "").strip("/"):
        urls["Colab"] = f"{colab}/github/{owner}/{repo}/blob/{branch}/{path}"
    return urls


class _Buttons(html.parser.HTMLParser):
    """The links of a page's header buttons: launch links by provider, repository, download."""

    def __init__(self) -> None:
        super().__init__()
        self.launch: dict[str, list[str]] = {}
        self.repository: list[str] = []
        self.download: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag != "a":
            return
        attr = {name: value or "" for name, value in attrs}
        classes = attr.get("class", "").split()
        if "btn" not in classes:
            return
        if attr.get("title", "").startswith(LAUNCH_TITLE):
            provider = attr["title"].removeprefix(LAUNCH_TITLE)
            self.launch.setdefault(provider, []).append(attr["href"])
        elif "btn-source-repository-button" in classes:
            self.repository.append(attr["href"])
        elif "btn-download-source-button" in classes:
            self.download.append(attr["href"])


def buttons(name: str) -> _Buttons:
    parser = _Buttons()
    parser.feed((HTML / f"{name}.html").read_text(encoding="utf-8"))
    return parser


@pytest.fixture(scope="module")
def config() -> dict:
    if not (HTML / "index.html").is_file():
        pytest.fail(
            f"the book is not built ({HTML}/index.html is missing): run `make book`", pytrace=False
        )
    return book_config()


def test_there_are_chapters() -> None:
    assert CHAPTERS, "no chapter notebook in _toc.yml"


@pytest.mark.parametrize("name", CHAPTERS)
def test_chapter_launch_buttons(name: str, config: dict) -> None:
    expected = expected_launch_urls(config, name)
    assert expected, "_config.yml configures no launch button"
    found = buttons(name).launch
    assert found == {provider: [url] for provider, url in expected.items()}


@pytest.mark.parametrize("name", PAGES)
def test_repository_button(name: str, config: dict) -> None:
    assert buttons(name).repository == [config["repository"]["url"]]


@pytest.mark.parametrize("name", [name for name in PAGES if name not in CHAPTERS])
def test_no_launch_buttons_on_pages_without_code(name: str, config: dict) -> None:
    assert buttons(name).launch == {}


@pytest.mark.parametrize("name", PAGES)
def test_download_gives_the_source(name: str, config: dict) -> None:
    """The download button links to a copy of the page's source file: the chapter's notebook."""
    links = buttons(name).download
    assert len(links) == 1, f"download links: {links}"
    target = (HTML / name).parent / links[0]
    source = next(REPO.glob(f"{name}.*"))
    assert target.resolve() == (HTML / "_sources" / source.relative_to(REPO)).resolve()
    assert target.read_bytes() == source.read_bytes(), f"{target} differs from {source}"


def test_expected_urls_follow_the_repository_setting() -> None:
    """A fork's settings give links to the fork (the rule the tests above apply)."""
    config = {
        "repository": {"url": "https://github.com/someone/fork/", "branch": "dev"},
        "launch_buttons": {
            "notebook_interface": "jupyterlab",
            "colab_url": "https://colab.research.google.com",
            "binderhub_url": "https://mybinder.org/",
            "jupyterhub_url": "https://hub.example.edu",
        },
    }
    assert expected_launch_urls(config, "chapters/01_tokens") == {
        "Binder": "https://mybinder.org/v2/gh/someone/fork/dev?urlpath=lab/tree/chapters/01_tokens.ipynb",
        "JupyterHub": "https://hub.example.edu/hub/user-redirect/git-pull?repo=https%3A//github.com"
        "/someone/fork&urlpath=lab/tree/fork/chapters/01_tokens.ipynb&branch=dev",
        "Colab": "https://colab.research.google.com/github/someone/fork/blob/dev/chapters/01_tokens.ipynb",
    }
