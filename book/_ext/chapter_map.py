"""The landing page's chapter map, drawn from the package's own imports.

The figure (book/figures/chapter_map.svg) has one row per chapter, holding the modules of
``src/tinygpt/`` that the chapter builds, and an arrow from a module to every module it imports.
Only the small table ``CHAPTERS`` (chapter -> modules) is written by hand; the arrows come from
parsing the ``import`` statements of ``src/tinygpt/*.py`` with ``ast``, so the map changes when
the code does. Rules:

* every module of the package must be in ``CHAPTERS``, or drawing fails and names it (so a new
  module cannot be left off the map); ``__init__`` and ``__main__`` are the package's plumbing,
  not something a chapter builds, and are left out, as is ``import tinygpt`` (the package as a
  whole) -- ``from tinygpt import data`` counts as an import of ``data``;
* a module in ``CHAPTERS`` whose file does not exist yet is drawn muted (dashed outline, grey
  label), and a chapter whose notebook does not exist yet is labelled "in
  preparation";
* only imports of the package's own modules are drawn, wherever they are in a file (also inside
  a function).

It is both a Sphinx extension and a script. As an extension (``chapter_map: book/_ext`` under
``sphinx.local_extensions`` in _config.yml) it redraws the figure when the builder starts, before
any page is read, and writes the file only when its content changed. As a script,
``python book/_ext/chapter_map.py`` redraws it; the figure is committed as well, so that the
landing page also has it where the book is not built, and ``tests/test_book_map.py`` checks
that the arrows drawn in it are exactly the imports found in ``src/``.

The SVG keeps its text as text and gives each drawn element an id (``module:NAME``,
``edge:IMPORTER:IMPORTED``, ``chapter:N``), which is how the test reads what was drawn.
It does not lay out arbitrary graphs well: the placement is a simple heuristic for about a
dozen rows of up to four modules.
"""

from __future__ import annotations

import ast
import hashlib
import io
import json
import sys
from dataclasses import dataclass
from pathlib import Path

# Chapter number, notebook stem, short title, and the modules the chapter builds, in that order.
CHAPTERS: list[tuple[int, str, str, list[str]]] = [
    (1, "01_tokens", "Text to tokens", ["data", "shakespeare", "show", "bpe", "tokenizer",
                                      "cache"]),
    (2, "02_bigram", "Bigram baseline", ["bigram", "ngram", "scoring"]),
    (3, "03_autograd", "Gradients by hand", ["autograd", "backprop"]),
    (4, "04_embeddings", "Embeddings", ["embedding", "wordvec", "rungs", "drawing",
                                        "diagrams"]),
    (5, "05_attention", "Attention", ["attention", "diagrams_attention"]),
    (6, "06_block", "Transformer block", ["checks", "config", "block"]),
    (7, "07_gpt", "The GPT", ["model", "gpt2", "diagrams_gpt"]),
    (8, "08_training", "Training", ["train", "checkpoint", "cli", "cli_train",
                                    "bookmodel", "ladder"]),
    (9, "09_sampling", "Sampling", ["sample", "widgets", "cli_sample", "cli_options",
                                    "cli_checks"]),
    (10, "10_scaling", "Scaling out", ["runtime", "distributed", "resume", "saving",
                                      "ckptio", "ckptcheck"]),
    (11, "11_micro", "GPT in pure Python", ["scalar_gpt"]),
    (12, "12_modern", "The modern GPT", ["rope", "muon", "llama", "stream"]),
    (13, "13_corpora", "Real corpora", ["prepare", "shardwrite", "shards", "cli_prepare"]),
]
PACKAGE = "tinygpt"
# Files of the package that no chapter builds (see the rules above).
PLUMBING = {"__init__", "__main__"}
FIGURE = Path("book/figures/chapter_map.svg")

# Colours: the figure has its own white background, so it reads the same in the dark theme.
INK = "#1f2937"
MUTED = "#9ca3af"
BOX = "#dbeafe"
BOX_EDGE = "#1d4ed8"
ARROW = "#2563eb"
ROW_SHADE = "#f3f4f6"


@dataclass(frozen=True)
class Map:
    """What the figure shows: modules by chapter, and import edges between existing modules."""

    rows: list[
        tuple[int, str, bool, list[tuple[str, bool]]]
    ]  # (n, title, written, [(mod, exists)])
    edges: list[tuple[str, str]]  # (importer, imported), sorted


def module_imports(src: Path) -> dict[str, set[str]]:
    """Module name -> the package modules it imports, for every ``src/tinygpt/*.py``."""
    package = src / PACKAGE
    names = {p.stem for p in package.glob("*.py")}
    found: dict[str, set[str]] = {}
    for path in sorted(package.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        imported: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    parts = alias.name.split(".")
                    if parts[0] == PACKAGE and len(parts) > 1:
                        imported.add(parts[1])
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # a relative import: `from .x import y`, `from . import x`
                    module = (node.module or "").split(".")[0]
                    targets = [module] if module else [a.name for a in node.names]
                elif node.module and node.module.split(".")[0] == PACKAGE:
                    parts = node.module.split(".")
                    targets = [parts[1]] if len(parts) > 1 else [a.name for a in node.names]
                else:
                    continue
                imported.update(t for t in targets if t in names)
        imported.discard(path.stem)
        found[path.stem] = imported
    return found


def chapter_map(root: Path) -> Map:
    """The chapter map of the repository at ``root``; ValueError if a module has no chapter."""
    imports = module_imports(root / "src")
    modules = set(imports) - PLUMBING
    placed = [m for *_, mods in CHAPTERS for m in mods]
    if len(placed) != len(set(placed)):
        raise ValueError(f"a module is listed under two chapters in CHAPTERS: {placed}")
    unplaced = sorted(modules - set(placed))
    if unplaced:
        raise ValueError(
            f"src/{PACKAGE}/ has modules that no chapter of the map builds: {unplaced}; "
            f"add them to CHAPTERS in {Path(__file__).name}"
        )
    rows = [
        (
            number,
            title,
            (root / "chapters" / f"{stem}.ipynb").is_file(),
            [(m, m in modules) for m in mods],
        )
        for number, stem, title, mods in CHAPTERS
    ]
    edges = sorted(
        (importer, imported)
        for importer in modules
        for imported in imports[importer]
        if imported not in PLUMBING
    )
    return Map(rows, edges)


# Geometry, in the figure's data units: x in inches, y in rows (a row is ROW_IN inches high).
COLUMNS, SLOT, BOX_W, BOX_H = 6, 1.62, 1.45, 0.52
X0 = 2.75 + BOX_W / 2  # the first column's centre; the chapter titles are on its left
ROW_IN = 0.8
FONT = 15


def _x(column: int) -> float:
    return X0 + column * SLOT


def _cost(chart: Map, rows: dict[str, int], cols: dict[str, int]) -> float:
    """How hard the figure is to read with these columns: arrows through boxes (100 each),
    arrows that cross (1 each), arrows within a row between boxes that are not neighbours, and
    slanted arrows (a little, by how far they lean)."""
    import numpy as np

    names = list(cols)
    index = {m: i for i, m in enumerate(names)}
    bx = np.array([_x(cols[m]) for m in names])
    by = np.array([-float(rows[m]) for m in names])
    cost = 0.0
    between = [(a, b) for a, b in chart.edges if rows[a] != rows[b]]
    for a, b in chart.edges:
        if rows[a] == rows[b]:
            gap = abs(cols[a] - cols[b])
            cost += 0 if gap == 1 else 40 + gap
    if not between:
        return cost
    ia = np.array([index[a] for a, _ in between])
    ib = np.array([index[b] for _, b in between])
    # As drawn: from the importer's top (or bottom) edge to the imported's bottom (or top) edge.
    sign = np.sign(by[ib] - by[ia]) * BOX_H / 2
    p1 = np.stack([bx[ia], by[ia] + sign], axis=1)  # (E, 2)
    p2 = np.stack([bx[ib], by[ib] - sign], axis=1)
    cost += 0.3 * np.abs(p1[:, 0] - p2[:, 0]).sum() / SLOT
    # Arrows through boxes: points along each arrow, tested against every box.
    t = np.linspace(0.05, 0.95, 40)[None, :, None]  # (1, S, 1)
    px = p1[:, None, None, 0] + t * (p2[:, None, None, 0] - p1[:, None, None, 0])  # (E, S, 1)
    py = p1[:, None, None, 1] + t * (p2[:, None, None, 1] - p1[:, None, None, 1])
    inside = (np.abs(px - bx) < BOX_W / 2 + 0.1) & (np.abs(py - by) < BOX_H / 2 + 0.1)
    hit = inside.any(axis=1)  # (E, B)
    hit[np.arange(len(between)), ia] = False
    hit[np.arange(len(between)), ib] = False
    cost += 100 * hit.sum()

    # Arrows that cross (those sharing a module are allowed to meet there).
    def turn(p, q, r):  # orientation of r about p->q, for all pairs: (E, E)
        return np.sign(
            (q[:, None, 0] - p[:, None, 0]) * (r[None, :, 1] - p[:, None, 1])
            - (q[:, None, 1] - p[:, None, 1]) * (r[None, :, 0] - p[:, None, 0])
        )

    straddles = turn(p1, p2, p1) * turn(p1, p2, p2) < 0  # [i, j]: j's ends on both sides of i
    cross = straddles & straddles.T
    shared = (ia[:, None] == ia[None, :]) | (ia[:, None] == ib[None, :])
    shared |= (ib[:, None] == ia[None, :]) | (ib[:, None] == ib[None, :])
    cost += np.triu(cross & ~shared, 1).sum()
    return float(cost)


def _layout(chart: Map) -> dict[str, tuple[float, float]]:
    """Centre (x, y) of every module: one row per chapter, and in each row the columns that
    make the arrows easiest to follow. Search: from several starts (the first centres every
    row, the others are shuffled with a fixed seed), sweep the rows, trying every arrangement
    of one row while the others stay put, until no sweep helps; keep the best. Deterministic."""
    import random
    from itertools import permutations

    rows = {m: i for i, (*_, mods) in enumerate(chart.rows) for m, _ in mods}
    groups = [[m for m, _ in mods] for *_, mods in chart.rows]
    rng = random.Random(0)
    best_cols, best = {}, float("inf")
    for start in range(16):
        cols = {}
        for group in groups:
            if start == 0:  # each row centred, in CHAPTERS order
                first = (COLUMNS - len(group)) // 2
                cols.update({m: first + j for j, m in enumerate(group)})
            else:
                cols.update(zip(group, rng.sample(range(COLUMNS), len(group))))
        cost = _cost(chart, rows, cols)
        for _ in range(6):
            improved = False
            for group in groups:
                for choice in permutations(range(COLUMNS), len(group)):
                    trial = {**cols, **dict(zip(group, choice))}
                    c = _cost(chart, rows, trial)
                    if c < cost - 1e-9:
                        cost, cols, improved = c, trial, True
            if not improved:
                break
        if cost < best - 1e-9:
            best, best_cols = cost, cols
    return {m: (_x(c), -float(rows[m])) for m, c in best_cols.items()}


def _clear_bend(start, end, where, ends, bends) -> float:
    """The first bend (matplotlib's arc3 ``rad``) for which the arrow from ``start`` to ``end``
    misses every box but its own two; failing that, the bend that crosses the fewest boxes."""
    import numpy as np

    # arc3 bends in display space, where a row is ROW_IN inches high: a quadratic Bezier
    # curve whose control point is the midpoint moved by rad * (dy, -dx).
    (x0, y0), (x2, y2) = (start[0], start[1] * ROW_IN), (end[0], end[1] * ROW_IN)
    boxes = np.array([(x, y * ROW_IN) for m, (x, y) in where.items() if m not in ends])
    t = np.linspace(0.02, 0.98, 60)[:, None]
    hits = []
    for rad in bends:
        cx, cy = (x0 + x2) / 2 + rad * (y2 - y0), (y0 + y2) / 2 - rad * (x2 - x0)
        px = (1 - t) ** 2 * x0 + 2 * (1 - t) * t * cx + t**2 * x2
        py = (1 - t) ** 2 * y0 + 2 * (1 - t) * t * cy + t**2 * y2
        inside = (np.abs(px - boxes[:, 0]) < BOX_W / 2 + 0.05) & (
            np.abs(py - boxes[:, 1]) < (BOX_H / 2) * ROW_IN + 0.04
        )
        hits.append(int(inside.any(axis=0).sum()))
        if hits[-1] == 0:
            break
    return bends[hits.index(min(hits))]


def draw(chart: Map) -> str:
    """The chapter map as SVG text (deterministic for a given matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    where = _layout(chart)
    width = X0 + (COLUMNS - 1) * SLOT + BOX_W / 2 + 0.15
    top = 1.1  # rows above the first one, for the heading
    height = ROW_IN * (top + len(chart.rows) - 0.6)
    with plt.rc_context(
        {
            "svg.fonttype": "none",
            "svg.hashsalt": "tinygpt-chapter-map",
            "font.size": FONT,
            "font.family": "sans-serif",
        }
    ):
        fig = plt.figure(figsize=(width, height), facecolor="white")
        ax = fig.add_axes((0, 0, 1, 1))
        ax.set_xlim(0, width)
        ax.set_ylim(-len(chart.rows) + 0.6, top)
        ax.axis("off")
        ax.set_facecolor("white")
        ax.text(0.2, 0.62, "chapter", color=INK, weight="bold", va="center")
        ax.text(
            X0 - BOX_W / 2,
            0.62,
            "the modules it builds; an arrow points to a module imported",
            color=INK,
            weight="bold",
            va="center",
        )
        box_w, box_h = BOX_W, BOX_H
        for i, (number, title, written, mods) in enumerate(chart.rows):
            y = -float(i)
            if i % 2 == 0:
                shade = plt.Rectangle(
                    (0.05, y - 0.5),
                    width - 0.1,
                    1.0,
                    color=ROW_SHADE,
                    zorder=0,
                    gid=f"row:{number}",
                )
                ax.add_patch(shade)
            # Title, and under it "in preparation" while the chapter's notebook does not exist.
            label = f"{number}  {title}" + ("" if written else "\n     in preparation")
            text = ax.text(
                0.2, y, label, color=INK if written else MUTED, va="center", linespacing=1.3
            )
            text.set_gid(f"chapter:{number}")
            for m, exists in mods:
                x, _ = where[m]
                box = FancyBboxPatch(
                    (x - box_w / 2, y - box_h / 2),
                    box_w,
                    box_h,
                    boxstyle="round,pad=0.02,rounding_size=0.08",
                    facecolor=BOX if exists else "white",
                    edgecolor=BOX_EDGE if exists else MUTED,
                    linestyle="-" if exists else (0, (3, 2)),
                    linewidth=1.2,
                    zorder=3,
                    gid=f"module:{m}" + ("" if exists else ":planned"),
                )
                ax.add_patch(box)
                ax.text(
                    x,
                    y,
                    m,
                    ha="center",
                    va="center",
                    color=INK if exists else MUTED,
                    zorder=4,
                    # a long name gets a smaller font, so that it stays inside its box
                    fontsize=(FONT - 1) * min(1.0, 12 / len(m)),
                    family="monospace",
                )
        for a, b in chart.edges:
            (xa, ya), (xb, yb) = where[a], where[b]
            style = "arc3,rad=0"
            if ya == yb and abs(xa - xb) < 1.5 * SLOT:  # neighbours: side to side
                sign = 1 if xb > xa else -1
                start, end = (xa + sign * box_w / 2, ya), (xb - sign * box_w / 2, yb)
            elif ya == yb:  # same row, further apart: an arc above it
                start, end = (xa, ya + box_h / 2), (xb, yb + box_h / 2)
                up = -1 if xb > xa else 1
                rad = _clear_bend(start, end, where, (a, b), [up * 0.3, up * 0.5, up * 0.15])
                style = f"arc3,rad={rad}"
            else:  # towards an earlier (up) or a later (down) chapter; bent round boxes
                sign = 1 if yb > ya else -1
                start, end = (xa, ya + sign * box_h / 2), (xb, yb - sign * box_h / 2)
                bends = [0.0, 0.1, -0.1, 0.2, -0.2, 0.3, -0.3, 0.45, -0.45]
                style = f"arc3,rad={_clear_bend(start, end, where, (a, b), bends)}"
            arrow = FancyArrowPatch(
                start,
                end,
                connectionstyle=style,
                arrowstyle="-|>",
                mutation_scale=15,
                color=ARROW,
                alpha=0.8,
                linewidth=1.3,
                # Over the boxes but under their names: an arrow that has to cross a box is
                # seen to pass through it, not to end there.
                zorder=3.5,
                shrinkA=1,
                shrinkB=1,
                gid=f"edge:{a}:{b}",
            )
            ax.add_patch(arrow)
        out = io.StringIO()
        fig.savefig(out, format="svg", facecolor="white", metadata={"Date": None, "Creator": None})
        plt.close(fig)
    return out.getvalue()


def _key(chart: Map) -> str:
    """A hash of what the figure shows and of this file (which decides how it is drawn)."""
    content = json.dumps([chart.rows, chart.edges]) + Path(__file__).read_text(encoding="utf-8")
    return hashlib.sha256(content.encode()).hexdigest()[:16]


def write(root: Path) -> bool:
    """Redraw ``root/book/figures/chapter_map.svg`` unless it is current. True if written.

    The figure carries, in a comment, a hash of the modules, chapters and imports it shows and
    of this file; when they are unchanged it is not drawn again (placing the modules takes a few
    seconds)."""
    chart = chapter_map(root)
    stamp = f"<!-- chapter_map {_key(chart)} -->"
    path = root / FIGURE
    if path.is_file() and stamp in path.read_text(encoding="utf-8"):
        return False
    svg = draw(chart)
    header_end = svg.index("?>") + 2
    svg = svg[:header_end] + "\n" + stamp + svg[header_end:]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(svg, encoding="utf-8")
    return True


def _on_builder_inited(app) -> None:
    from sphinx.util import logging

    if write(Path(app.srcdir)):
        logging.getLogger(__name__).info(f"chapter_map: redrew {FIGURE}")


def setup(app) -> dict:
    app.connect("builder-inited", _on_builder_inited)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


if __name__ == "__main__":
    repo = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[2]
    print(("redrew " if write(repo) else "already current: ") + str(repo / FIGURE))
