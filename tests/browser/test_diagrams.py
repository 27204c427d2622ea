"""The chapters' diagrams in the built book: each loads, has its alt text, a numbered caption, and
shows in both themes.

A diagram is a code cell whose metadata names a figure (``mystnb.figure.name``, ``fig-...``): its
SVG output becomes an ``<img>`` inside a numbered ``<figure>``, its ``mystnb.image.alt`` the image's
alt text. For every such cell of every chapter, the page is opened in the light and the dark theme
and the figure is checked: the image is an SVG that loaded, its alt text is the cell's, its caption
is numbered, every ``{numref}`` to it resolves, and the image visibly changes the pixels it covers
(a figure drawn in the page's own colour would vanish in one theme). The text of every diagram is
dark ink on light fills (tests/test_diagrams.py checks the colours); a screenshot of each figure in
each theme is saved in ``_build/screenshots/diagrams/`` for a person to look at.
"""

from __future__ import annotations

import io
import json

import pytest
from browser_support import HTML, REPO, SCREENSHOTS


def figure_cells() -> list[tuple[str, str, str]]:
    """(page, figure name, alt text) of every diagram cell of every chapter."""
    found = []
    for path in sorted((REPO / "chapters").glob("[0-9][0-9]_*.ipynb")):
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            meta = cell.get("metadata", {}).get("mystnb", {})
            name = meta.get("figure", {}).get("name", "")
            if cell["cell_type"] == "code" and name.startswith("fig-"):
                found.append((f"chapters/{path.stem}", name, meta.get("image", {}).get("alt", "")))
    return found


FIGURES = figure_cells()

# Pixels of the figure's box that differ between the page with the image and with it hidden.
COVERAGE = """async (figure) => {
    const img = figure.querySelector('img');
    await img.decode();
    return {src: img.getAttribute('src'), alt: img.getAttribute('alt'),
            loaded: img.complete && img.naturalWidth > 0,
            caption: (figure.querySelector('figcaption') || {}).textContent || ''};
}"""


def _pixels(png: bytes):
    from matplotlib import image

    return image.imread(io.BytesIO(png), format="png")[..., :3]


def test_the_chapters_have_diagrams():
    names = [name for _, name, _ in FIGURES]
    assert len(names) >= 13 and len(set(names)) == len(names), names
    assert all(len(alt.split()) >= 10 for *_, alt in FIGURES), "every diagram needs alt text"


@pytest.mark.parametrize("theme", ["light", "dark"])
@pytest.mark.parametrize(("page_name", "name", "alt"), FIGURES, ids=[n for _, n, _ in FIGURES])
def test_diagram(page_name, name, alt, theme, site, browser):
    assert (HTML / f"{page_name}.html").is_file(), f"{page_name}.html was not built"
    context = browser.new_context(viewport={"width": 1280, "height": 900}, color_scheme=theme)
    try:
        page = context.new_page()
        page.goto(f"{site}/{page_name}.html", wait_until="networkidle")
        page.evaluate(f"document.documentElement.dataset.theme = '{theme}'")
        figure = page.locator(f"figure#{name}, #{name}").first
        figure.scroll_into_view_if_needed()
        info = figure.evaluate(COVERAGE)
        assert info["loaded"], f"{name}: the image did not load ({info['src']})"
        assert info["src"].endswith(".svg"), f"{name}: not an SVG: {info['src']}"
        assert info["alt"] == alt, f"{name}: alt text {info['alt']!r}"
        assert info["caption"].strip().startswith("Fig"), f"{name}: caption {info['caption']!r}"
        refs = page.locator(f"a[href$='#{name}']:not(.headerlink)")
        assert refs.count() >= 1, f"{name}: the text never refers to it"
        assert all("Fig" in refs.nth(i).inner_text() for i in range(refs.count()))
        image = figure.locator("img")
        image.scroll_into_view_if_needed()
        box = image.bounding_box()  # in the viewport, which does not scroll from here on
        shown = _pixels(page.screenshot(clip=box))
        image.evaluate("img => img.style.visibility = 'hidden'")
        hidden = _pixels(page.screenshot(clip=box))
        changed = (abs(shown - hidden).max(axis=-1) > 0.08).mean()
        assert changed > 0.03, f"{name}: the image barely shows in the {theme} theme ({changed})"
        image.evaluate("img => img.style.visibility = ''")
        (SCREENSHOTS / "diagrams").mkdir(parents=True, exist_ok=True)
        figure.screenshot(path=SCREENSHOTS / "diagrams" / f"{name}-{theme}.png")
    finally:
        context.close()
