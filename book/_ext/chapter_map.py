"""The landing page's chapter map, drawn from the package's own imports.

The figure (book/figures/chapter_map.svg) has one row per chapter, holding the top-level modules
of ``src/tinygpt/`` that the chapter builds, and under the chapters a band for the
infrastructure: one box per subpackage (``book``, ``checkpoint``, ``cli``, ``exercises``,
``figures``, ``prepare``), which no chapter builds but the chapters and the command line use. An
arrow runs from a module to every module it imports. Only the small tables ``CHAPTERS`` (chapter ->
modules) and ``INFRASTRUCTURE`` (subpackage -> its role in a few words) are written by hand; the
arrows come from parsing the ``import`` statements of ``src/tinygpt/**/*.py`` with ``ast``, so
the map changes when the code does. Rules:

* every top-level module must be in ``CHAPTERS`` and every subpackage in ``INFRASTRUCTURE``, or
  drawing fails and names it (so nothing new can be left off the map); ``__init__`` and
  ``__main__`` are the package's plumbing, not something a chapter builds, and are left out, as
  is ``import tinygpt`` (the package as a whole) -- ``from tinygpt import data`` counts as an
  import of ``data``;
* a subpackage is drawn as one box: an import from or of any of its modules is an arrow from or
  to that box, and imports inside one subpackage are not drawn;
* a module in ``CHAPTERS`` whose file does not exist yet is drawn muted (dashed outline, grey
  label), and a chapter whose notebook does not exist yet is labelled "in preparation";
* only imports of the package's own modules are drawn, wherever they are in a file (also inside
  a function).

The layout is fixed, not searched, so drawing takes a second or two: the modules stand in one
column, chapter after chapter in the order of ``CHAPTERS``, and each import is an arc beside the
column (an arc diagram), which never crosses a box. Arcs between chapter modules are on the
right: blue when the imported module is on an earlier row (or the same chapter), amber when it
belongs to a later chapter. Arcs to or from the infrastructure are on the left, in grey.

It is both a Sphinx extension and a script. As an extension (``chapter_map: book/_ext`` under
``sphinx.local_extensions`` in _config.yml) it redraws the figure when the builder starts, before
any page is read, and writes the file only when its content changed. As a script,
``python book/_ext/chapter_map.py`` redraws it; the figure is committed as well, so that the
landing page also has it where the book is not built, and ``tests/test_book_map.py`` checks
that the arrows drawn in it are exactly the imports found in ``src/``.

The SVG keeps its text as text and gives each drawn element an id (``module:NAME``,
``package:NAME``, ``modules:NAME`` for the list of a subpackage's modules,
``edge:IMPORTER:IMPORTED``, ``chapter:N``), which is how the test reads what was drawn. An edge
names a top-level module or a subpackage at each end.
"""

from __future__ import annotations

import ast
import hashlib
import io
import json
import sys
from dataclasses import dataclass
from pathlib import Path

# Chapter number, notebook stem, short title, and the top-level modules the chapter builds, in
# the order they are drawn (within a chapter, a module before the modules that import it). A
# module belongs to a chapter whose code cells run it: import it, or import a module that imports
# it (tests/test_book_map.py checks this from the code, never from the prose).
CHAPTERS: list[tuple[int, str, str, list[str]]] = [
    (1, "01_tokens", "Text to tokens", ["shakespeare", "data", "bpe", "tokenizer"]),
    (2, "02_bigram", "Bigram baseline", ["bigram", "ngram"]),
    (3, "03_autograd", "Gradients by hand", ["autograd", "backprop"]),
    (4, "04_embeddings", "Embeddings", ["checks", "embedding", "wordvec", "small_models"]),
    (5, "05_attention", "Attention", ["config", "attention"]),
    (6, "06_block", "Transformer block", ["block"]),
    (7, "07_gpt", "The GPT", ["model", "gpt2"]),
    (8, "08_training", "Training", ["train"]),
    (9, "09_sampling", "Sampling", ["sample"]),
    (10, "10_scaling", "Scaling out", ["runtime", "distributed"]),
    (11, "11_micro", "GPT in pure Python", ["scalar_gpt"]),
    (12, "12_modern", "The modern GPT", ["rope", "muon", "llama"]),
    (13, "13_corpora", "Real corpora", ["stream", "shards"]),
    (14, "14_finetuning", "Fine-tuning", ["multiple_choice", "significance", "lora", "genre"]),
    (15, "15_chat", "Chat", ["chat", "dpo"]),
]
# The subpackages, in the order they are drawn, each with what it is for (its modules are read
# from its folder) and the colour of its box and of its arcs.
INFRASTRUCTURE: list[tuple[str, str, str]] = [
    ("files", "reading and writing safely", "#0369a1"),
    ("checkpoint", "saving a run, loading it back", "#7c3aed"),
    ("prepare", "a corpus into token shards", "#0d9488"),
    ("cli", "the tinygpt command", "#db2777"),
    ("exercises", "checking the reader's code", "#ea580c"),
    ("figures", "the chapters' diagrams", "#65a30d"),
    ("book", "the book's model, ladder, views", "#6b7280"),
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
EARLIER = "#2563eb"  # an import of a module on an earlier row
LATER = "#d97706"  # an import of a module of a later chapter
INFRA = "#6b7280"  # an import to or from a subpackage (drawn in the subpackage's own colour)
INFRA_SHADE = "#f5f3ff"
ROW_SHADE = "#f3f4f6"


@dataclass(frozen=True)
class Map:
    """What the figure shows: modules by chapter, subpackages, and import edges between them."""

    rows: list[
        tuple[int, str, bool, list[tuple[str, bool]]]
    ]  # (n, title, written, [(mod, exists)])
    packages: list[tuple[str, str, str, list[str]]]  # (name, role, colour, modules but __init__)
    edges: list[tuple[str, str]]  # (importer, imported): module or subpackage names, sorted


def package_files(src: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module of ``src/tinygpt`` (a package's
    ``__init__.py`` is the package itself: ``tinygpt.cli``)."""
    found = {}
    for path in sorted((src / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def module_imports(src: Path) -> dict[str, set[str]]:
    """Dotted module name -> the package's modules it imports, for every module of the package.

    ``from tinygpt.cli import options`` imports ``tinygpt.cli.options`` when that is a module,
    else (a name defined in the package's ``__init__``) ``tinygpt.cli``."""
    files = package_files(src)
    found: dict[str, set[str]] = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        imported: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # relative: `from . import x`, `from ..x import y`
                    base = here[: len(here) - node.level + 1]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                for alias in node.names:
                    full = f"{module}.{alias.name}"
                    imported.add(full if full in files else module)
        found[name] = {m for m in imported if m in files and m != name}
    return found


def node_of(module: str) -> str | None:
    """What a dotted module is drawn as: a top-level module's name, a subpackage's name, or
    None for the package's plumbing (``tinygpt``, ``tinygpt.__main__``)."""
    parts = module.split(".")
    if len(parts) == 1 or parts[1] in PLUMBING:
        return None
    return parts[1]


def chapter_map(root: Path) -> Map:
    """The chapter map of the repository at ``root``; ValueError naming any module or subpackage
    that has no place on it."""
    src = root / "src"
    imports = module_imports(src)
    package = src / PACKAGE
    modules = {p.stem for p in package.glob("*.py")} - PLUMBING
    subpackages = {p.parent.name for p in package.glob("*/__init__.py")}
    placed = [m for *_, mods in CHAPTERS for m in mods]
    if len(placed) != len(set(placed)):
        raise ValueError(f"a module is listed under two chapters in CHAPTERS: {placed}")
    problems = []
    if unplaced := sorted(modules - set(placed)):
        problems.append(f"top-level modules that no chapter builds: {unplaced} (add them to "
                        f"CHAPTERS)")
    if packages_on_rows := sorted(subpackages & set(placed)):
        problems.append(f"subpackages listed under a chapter: {packages_on_rows} (a chapter "
                        f"builds top-level modules; move them to INFRASTRUCTURE)")
    banded = [name for name, *_ in INFRASTRUCTURE]
    if unbanded := sorted(subpackages - set(banded)):
        problems.append(f"subpackages not in the infrastructure band: {unbanded} (add them to "
                        f"INFRASTRUCTURE)")
    if missing := sorted(set(banded) - subpackages):
        problems.append(f"INFRASTRUCTURE lists subpackages that do not exist: {missing}")
    if problems:
        raise ValueError(f"src/{PACKAGE}/ does not fit the chapter map: "
                         + "; ".join(problems) + f" -- in {Path(__file__).name}")
    rows = [
        (
            number,
            title,
            (root / "chapters" / f"{stem}.ipynb").is_file(),
            [(m, m in modules) for m in mods],
        )
        for number, stem, title, mods in CHAPTERS
    ]
    packages = [
        (name, role, colour, sorted(p.stem for p in (package / name).glob("*.py")
                                    if p.stem not in PLUMBING))
        for name, role, colour in INFRASTRUCTURE
    ]
    edges = {
        (node_of(importer), node_of(imported))
        for importer, targets in imports.items()
        for imported in targets
    }
    edges = sorted((a, b) for a, b in edges if a and b and a != b)
    return Map(rows, packages, edges)


# Geometry, in inches; y grows downwards (the axes are flipped).
SLOT = 0.29  # the height of a module's line
BOX_W, BOX_H = 1.5, 0.24
LABELS = 2.35  # chapter titles are left of this
LEFT_ARCS = 1.9  # room for the arcs of the infrastructure, left of the boxes
RIGHT_ARCS = 3.25  # room for the arcs between chapter modules, right of the boxes
BOX_X = LABELS + LEFT_ARCS  # the boxes' left edge
WIDTH = BOX_X + BOX_W + RIGHT_ARCS
PACKAGE_W = WIDTH - 0.15 - BOX_X  # a subpackage's box reaches the right edge
HEAD = 0.8  # the heading and the key
GAP = 0.08  # padding above and below a row's modules
FONT = 11
LIST_FONT = FONT - 2.5  # a subpackage's modules
MONO_EM = 0.6  # a monospace character's width, in ems


def _listing(name: str, mods: list[str]) -> list[str]:
    """A subpackage's modules in lines that fit its box, right of its name."""
    room = PACKAGE_W - 0.3 - MONO_EM * (FONT - 0.5) / 72 * (len(name) + 1)
    per_line = int(room / (MONO_EM * LIST_FONT / 72))
    lines = [""]
    for m in mods:
        if lines[-1] and len(lines[-1]) + 2 + len(m) > per_line:
            lines.append("")
        lines[-1] += ("  " if lines[-1] else "") + m
    return lines


def _places(chart: Map) -> tuple[dict[str, float], dict[str, float], list[tuple[float, float]],
                                 float]:
    """The centre y of every module and subpackage, the height of every subpackage's box, the
    (top, bottom) of every chapter row and of the band (last), and the figure's height."""
    where: dict[str, float] = {}
    tall: dict[str, float] = {}
    spans = []
    y = HEAD
    for *_, mods in chart.rows:
        top = y
        y += GAP
        for m, _ in mods:
            where[m] = y + SLOT / 2
            y += SLOT
        y = max(y, top + GAP + SLOT * 0.8) + GAP  # a chapter with no module yet has a row too
        spans.append((top, y))
    top = y
    y += GAP + SLOT  # the band's heading
    for name, _, _, mods in chart.packages:
        lines = len(_listing(name, mods))
        tall[name] = BOX_H + (lines - 1) * LIST_FONT * 1.25 / 72
        where[name] = y + (tall[name] - BOX_H + SLOT) / 2
        y += SLOT + tall[name] - BOX_H
    spans.append((top, y + GAP))
    return where, tall, spans, y + GAP + 0.05


def _arc(x: float, y0: float, y1: float, side: int, reach: float):
    """An arc from (x, y0) to (x, y1), bulging ``reach`` inches to ``side`` (+1 right, -1 left):
    a cubic Bezier curve that leaves and enters the box horizontally."""
    from matplotlib.path import Path as CurvePath

    c = side * reach / 0.75  # a cubic's control points reach 4/3 further than the curve
    points = [(x, y0), (x + c, y0), (x + c, y1), (x, y1)]
    codes = [CurvePath.MOVETO, CurvePath.CURVE4, CurvePath.CURVE4, CurvePath.CURVE4]
    return CurvePath(points, codes)


def draw(chart: Map) -> str:
    """The chapter map as SVG text (deterministic for a given matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    where, tall, spans, height = _places(chart)
    colour_of = {name: colour for name, _, colour, _ in chart.packages}
    row_of = {m: i for i, (*_, mods) in enumerate(chart.rows) for m, _ in mods}
    with plt.rc_context(
        {
            "svg.fonttype": "none",
            "svg.hashsalt": "tinygpt-chapter-map",
            "font.size": FONT,
            "font.family": "sans-serif",
        }
    ):
        fig = plt.figure(figsize=(WIDTH, height), facecolor="white")
        ax = fig.add_axes((0, 0, 1, 1))
        ax.set_xlim(0, WIDTH)
        ax.set_ylim(height, 0)
        ax.axis("off")

        # Heading and key.
        ax.text(0.15, 0.25, "chapter", color=INK, weight="bold", va="center")
        ax.text(BOX_X + BOX_W / 2, 0.25, "modules", color=INK, weight="bold", va="center",
                ha="center")
        ax.text(BOX_X - 1.95, 0.25, "imports to or from a subpackage", color=INK, va="center",
                fontsize=FONT - 2)
        ax.text(BOX_X + BOX_W + 0.15, 0.25, "imports between the chapters' modules", color=INK,
                va="center", fontsize=FONT - 2)
        key = [
            (BOX_X - 1.95, INFRA, "in the subpackage's colour"),
            (BOX_X + BOX_W + 0.15, EARLIER, "to an earlier row"),
            (BOX_X + BOX_W + 1.7, LATER, "to a later chapter"),
        ]
        for x, colour, words in key:
            ax.plot([x, x + 0.25], [0.52, 0.52], color=colour, lw=2)
            ax.text(x + 0.32, 0.52, words, color=INK, va="center", fontsize=FONT - 2)

        # Rows: shading and chapter titles.
        for i, ((number, title, written, _), (top, bottom)) in enumerate(
            zip(chart.rows, spans)
        ):
            if i % 2 == 0:
                ax.add_patch(plt.Rectangle((0.05, top), WIDTH - 0.1, bottom - top,
                                           color=ROW_SHADE, zorder=0, gid=f"row:{number}"))
            label = f"{number}  {title}" + ("" if written else "  \u00b7  in preparation")
            text = ax.text(0.15, (top + bottom) / 2, label, color=INK if written else MUTED,
                           va="center", fontsize=FONT if written else FONT - 1)
            text.set_gid(f"chapter:{number}")

        # The infrastructure band: a heading, then one wide box per subpackage.
        top, bottom = spans[-1]
        ax.add_patch(plt.Rectangle((0.05, top), WIDTH - 0.1, bottom - top, color=INFRA_SHADE,
                                   zorder=0, gid="band:infrastructure"))
        ax.text(0.15, top + GAP + SLOT / 2, "infrastructure", color=INK, weight="bold",
                va="center")
        ax.text(BOX_X, top + GAP + SLOT / 2, "subpackages: the chapters use them, none builds "
                "them", color=INK, va="center", fontsize=FONT - 2)
        for name, role, colour, mods in chart.packages:
            y, h = where[name], tall[name]
            ax.text(0.15, y, role, color=INK, va="center", fontsize=FONT - 1)
            ax.add_patch(FancyBboxPatch(
                (BOX_X, y - h / 2), PACKAGE_W, h,
                boxstyle="round,pad=0.0,rounding_size=0.06", facecolor="white",
                edgecolor=colour, linewidth=1.4, zorder=3, gid=f"package:{name}"))
            first = y - h / 2 + BOX_H / 2
            ax.text(BOX_X + 0.1, first, f"{name}/", color=colour, va="center",
                    family="monospace", weight="bold", zorder=4, fontsize=FONT - 0.5)
            listed = ax.text(BOX_X + 0.2 + MONO_EM * (FONT - 0.5) / 72 * (len(name) + 1),
                             first, "\n".join(_listing(name, mods)), color=INK, va="top",
                             family="monospace", zorder=4, fontsize=LIST_FONT, linespacing=1.25)
            # va="top" puts the first line's top at ``first``: move it down to centre it there.
            listed.set_y(first - LIST_FONT * 0.6 / 72)
            listed.set_gid(f"modules:{name}")

        # Module boxes.
        for *_, mods in chart.rows:
            for m, exists in mods:
                y = where[m]
                ax.add_patch(FancyBboxPatch(
                    (BOX_X, y - BOX_H / 2), BOX_W, BOX_H,
                    boxstyle="round,pad=0.0,rounding_size=0.06",
                    facecolor=BOX if exists else "white",
                    edgecolor=BOX_EDGE if exists else MUTED,
                    linestyle="-" if exists else (0, (3, 2)),
                    linewidth=1.1, zorder=3,
                    gid=f"module:{m}" + ("" if exists else ":planned")))
                ax.text(BOX_X + BOX_W / 2, y, m, ha="center", va="center",
                        color=INK if exists else MUTED, zorder=4, family="monospace",
                        fontsize=FONT - 0.5)

        # Arcs, longest first so that the short ones stay on top. An arc of a subpackage leaves
        # or enters its box at the height of the box's first line.
        def end(node: str) -> float:
            return where[node] - (tall[node] - BOX_H) / 2 if node in tall else where[node]

        def span(edge: tuple[str, str]) -> float:
            return abs(end(edge[0]) - end(edge[1]))

        left = [e for e in chart.edges if set(e) & set(tall)]
        right = [e for e in chart.edges if not set(e) & set(tall)]
        longest = {-1: max(map(span, left), default=1.0), 1: max(map(span, right), default=1.0)}
        for a, b in sorted(chart.edges, key=lambda e: (-span(e), e)):
            if (a, b) in left:
                side, x = -1, BOX_X
                colour = colour_of[a] if a in colour_of else colour_of[b]
            else:
                side, x = 1, BOX_X + BOX_W
                colour = LATER if row_of[b] > row_of[a] else EARLIER
            room = LEFT_ARCS if side < 0 else RIGHT_ARCS
            reach = 0.12 + (room - 0.3) * span((a, b)) / longest[side]
            ax.add_patch(FancyArrowPatch(
                path=_arc(x, end(a), end(b), side, reach),
                arrowstyle="-|>", mutation_scale=9, color=colour, alpha=0.75, linewidth=1.0,
                zorder=2, shrinkA=0, shrinkB=0, gid=f"edge:{a}:{b}"))

        out = io.StringIO()
        fig.savefig(out, format="svg", facecolor="white", metadata={"Date": None, "Creator": None})
        plt.close(fig)
    return out.getvalue()


def _key(chart: Map) -> str:
    """A hash of what the figure shows and of this file (which decides how it is drawn)."""
    content = json.dumps([chart.rows, chart.packages, chart.edges])
    content += Path(__file__).read_text(encoding="utf-8")
    return hashlib.sha256(content.encode()).hexdigest()[:16]


def write(root: Path) -> bool:
    """Redraw ``root/book/figures/chapter_map.svg`` unless it is current. True if written.

    The figure carries, in a comment, a hash of the modules, chapters and imports it shows and
    of this file; when they are unchanged it is not drawn again."""
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
