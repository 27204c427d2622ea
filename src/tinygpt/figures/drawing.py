"""Drawing primitives for the book's diagrams: boxes, arrows and labels on matplotlib, to SVG.

A ``Canvas`` is a figure whose units are inches, with ``y`` growing downwards (diagrams read top
to bottom); ``box``, ``text`` and ``arrow`` place things on it, and ``finish(alt)`` returns a
``Diagram``: the SVG text (text kept as text, a transparent background, an SVG ``<title>`` and
``aria-label`` carrying the alt text) that a notebook displays as ``image/svg+xml``.

Both of the book's themes show the same SVG (an ``<img>`` does not inherit the page's colours),
so every text is dark ink on a light, opaque fill -- a box, or a small "sticker" behind a free
label -- and lines are a mid grey that reads on white and on the dark theme's near-black.
``contrast`` is WCAG's contrast ratio, which the tests apply to these colours.

It does not lay out graphs: the figures (``embedding_diagrams``, ``attention_diagrams`` and
``gpt_diagrams`` beside it) give every coordinate. Nothing here reads a model; the figures do.
"""

from __future__ import annotations

import html
import io
import re
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.typing import RcKeyType

from tinygpt.checks import check_instance

INK = "#1f2937"  # every text: dark, always on a light fill
LINE = "#7b8794"  # arrows and outlines: readable on white and on the dark theme
STICKER = "#f3f4f6"  # the light patch behind a free label
FILLS = {  # mid-light fills for boxes, one per kind of thing
    "blue": "#bfdbfe", "green": "#bbf7d0", "amber": "#fde68a", "rose": "#fecdd3",
    "violet": "#ddd6fe", "grey": "#e5e7eb", "teal": "#99f6e4", "white": "#f9fafb",
}
BACKGROUNDS = {"light": "#ffffff", "dark": "#121212"}  # the two themes' page colours
FONT = 13
MARK = "<!-- drawn by tinygpt.figures.drawing -->"


def _luminance(colour: str) -> float:
    rgb = [int(colour.lstrip("#")[i:i + 2], 16) / 255 for i in (0, 2, 4)]
    lin = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def contrast(a: str, b: str) -> float:
    """WCAG's contrast ratio of two ``#rrggbb`` colours, from 1 (same) to 21 (black on white)."""
    la, lb = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (la + 0.05) / (lb + 0.05)


@dataclass(frozen=True)
class Diagram:
    """A finished figure: ``svg`` (text) and ``alt`` (what it shows, in words).

    In a notebook it displays as SVG; ``texts()`` lists the strings drawn in it."""

    svg: str
    alt: str

    def _repr_svg_(self) -> str:
        return self.svg

    def __repr__(self) -> str:
        return f"Diagram({self.alt!r})"

    def texts(self) -> list[str]:
        """Every text element's content, in drawing order (labels spanning lines joined)."""
        import xml.etree.ElementTree as ET

        root = ET.fromstring(self.svg.split(MARK)[-1].strip())
        return ["".join(e.itertext()) for e in root.iter("{http://www.w3.org/2000/svg}text")]

    def save(self, path: str | Path) -> Path:
        """Write the SVG to ``path``; an existing file is replaced only if tinygpt drew it."""
        path = Path(path)
        if path.suffix != ".svg":
            raise ValueError(f"a diagram is saved as .svg, got {str(path)!r}")
        if path.exists() and (not path.is_file() or MARK not in path.read_text(errors="replace")):
            raise FileExistsError(f"{path} exists and was not drawn by tinygpt; not replacing it")
        path.write_text(self.svg, encoding="utf-8")
        return path


class Canvas:
    """A ``width`` x ``height`` inch drawing; coordinates in inches, ``y`` pointing down."""

    def __init__(self, width: float, height: float) -> None:
        import matplotlib
        from matplotlib.figure import Figure

        self._rc: dict[RcKeyType, Any] = {
            "svg.fonttype": "none", "svg.hashsalt": "tinygpt", "font.size": FONT,
            "font.family": "sans-serif",
        }
        with matplotlib.rc_context(self._rc):
            self.fig = Figure(figsize=(width, height))
            self.ax = self.fig.add_axes((0, 0, 1, 1))
        self.ax.set_xlim(0, width)
        self.ax.set_ylim(height, 0)
        self.ax.axis("off")
        self.fig.patch.set_alpha(0)
        self.width, self.height = width, height

    def box(self, x: float, y: float, w: float, h: float, text: str = "", *,
            fill: str = "blue", mono: bool = False, size: float = FONT, dashed: bool = False,
            gid: str | None = None, round_: float = 0.06, weight: str = "normal") -> None:
        """A filled box centred at ``(x, y)``, ``w`` x ``h`` inches, with ``text`` in it; a box
        with ``fill="none"`` (an empty slot) holds no text, which would vanish in the dark theme."""
        from matplotlib.patches import FancyBboxPatch

        if text and fill == "none":
            raise ValueError("a box with fill='none' cannot hold text: it would not read on a "
                             "dark page")
        colour = FILLS.get(fill, fill)
        self.ax.add_patch(FancyBboxPatch(
            (x - w / 2, y - h / 2), w, h, boxstyle=f"round,pad=0,rounding_size={round_}",
            facecolor=colour, edgecolor=LINE, linewidth=1.1, zorder=2, gid=gid,
            linestyle=(0, (3, 2)) if dashed else "-"))
        if text:
            self._text(x, y, text, mono=mono, size=size, zorder=3, weight=weight)

    def text(self, x: float, y: float, text: str, *, ha: str = "center", va: str = "center",
             mono: bool = False, size: float = FONT, weight: str = "normal",
             sticker: bool = True, gid: str | None = None) -> None:
        """A free label at ``(x, y)``, on a light sticker so that it reads in both themes
        (``sticker=False`` only for a label drawn over a box's light fill)."""
        bbox = (dict(boxstyle="round,pad=0.18", facecolor=STICKER, edgecolor="none")
                if sticker else None)
        self._text(x, y, text, ha=ha, va=va, mono=mono, size=size, zorder=5, weight=weight,
                   bbox=bbox, gid=gid)

    def _text(self, x, y, text, *, ha="center", va="center", mono=False, size=FONT,
              zorder=3, weight="normal", bbox=None, gid=None) -> None:
        t = self.ax.text(x, y, text, ha=ha, va=va, color=INK, fontsize=size, zorder=zorder,
                         family="monospace" if mono else "sans-serif", weight=weight, bbox=bbox,
                         linespacing=1.25)
        if gid:
            t.set_gid(gid)

    def arrow(self, start: tuple[float, float], end: tuple[float, float], *, rad: float = 0.0,
              label: str | None = None, colour: str = LINE, width: float = 1.4,
              head: bool = True, dashed: bool = False, gid: str | None = None,
              label_at: float = 0.5, label_size: float = FONT - 2) -> None:
        """An arrow from ``start`` to ``end`` (bent by ``rad``), with an optional label."""
        from matplotlib.patches import FancyArrowPatch

        self.ax.add_patch(FancyArrowPatch(
            start, end, arrowstyle="-|>" if head else "-", mutation_scale=13, color=colour,
            linewidth=width, connectionstyle=f"arc3,rad={rad}", shrinkA=0, shrinkB=0,
            zorder=1.5, gid=gid, linestyle=(0, (4, 3)) if dashed else "-"))
        if label:
            t = label_at
            self.text(start[0] + t * (end[0] - start[0]), start[1] + t * (end[1] - start[1]),
                      label, size=label_size)

    def polyline(self, points: list[tuple[float, float]], *, head: bool = True,
                 colour: str = LINE, width: float = 1.4, gid: str | None = None) -> None:
        """Straight segments through ``points``, an arrow head at the last one."""
        for a, b in pairwise(points[:-1]):
            self.arrow(a, b, head=False, colour=colour, width=width)
        self.arrow(points[-2], points[-1], head=head, colour=colour, width=width, gid=gid)

    def finish(self, alt: str) -> Diagram:
        """The SVG of the drawing, with ``alt`` as its title; closes the figure."""
        import matplotlib

        check_instance(alt, str, "alt")
        if len(alt.split()) < 5:
            raise ValueError(f"alt text must say what the figure shows, got {alt!r}")
        out = io.StringIO()
        with matplotlib.rc_context(self._rc):
            self.fig.savefig(out, format="svg", transparent=True,
                             metadata={"Date": None, "Creator": None})
        svg = out.getvalue()
        svg = re.sub(r"<svg ", f'<svg role="img" aria-label="{html.escape(alt)}" ', svg, count=1)
        open_end = svg.index(">", svg.index("<svg ")) + 1
        svg = (svg[:open_end] + f"\n <title>{html.escape(alt, quote=False)}</title>"
               + svg[open_end:])
        header_end = svg.index("?>") + 2
        return Diagram(svg[:header_end] + "\n" + MARK + svg[header_end:], alt)
