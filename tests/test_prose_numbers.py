"""Every number in a chapter's prose comes from a cell that ran.

The book promises that the numbers on its pages were computed, not typed. This test reads the
markdown cells of every chapter and finds each numeric literal in the prose. A number passes when

* it is one of the chapter's outputs: some number printed by a code cell of the same chapter,
  taken at the prose's precision (the prose "2.16" matches an output 2.1634; "46 %" matches
  0.46; "4.8 M" and "4.8 million" match 4,813,216), or
* it is glued: ``{glue:text}`name` `` roles are removed before scanning, and their values are
  outputs of the chapter anyway, or
* it is on the allow-list ``tests/prose_numbers_allow.txt``: numbers that are not results of the
  book's code (years, constants quoted from a cited paper, the seeds' own numbers quoted in
  order to correct them). Each entry names its chapter and says why.

What is not prose is not scanned: code (fenced blocks and inline ``code``), link targets,
labels, directive options and cross-reference or citation roles. Math is scanned like the
prose around it ($1.2 \\times 10^{-7}$ is the number 1.2e-7), and the bodies of exercises and
solutions are prose too. Integers
from 0 to 10 are words more often than results ("two heads", "step 1", "chapter 7") and are
exempt, and so is a number glued to a name (``GPT-2``, ``float32``, ``AVX-512``, ``2D``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "chapters").glob("[0-9][0-9]_*.ipynb"))
ALLOW_FILE = ROOT / "tests" / "prose_numbers_allow.txt"

# A number in prose: 1,234,567 or 1234 or 3.14 or 1e-9 or 2.5e+03 (a leading minus sign is
# ignored; magnitudes are compared). Not when glued to a word before it (GPT-2, x86, float32,
# AVX-512) or after it by a letter that makes it a name (2D, 3rd).
NUMBER = re.compile(
    r"(?<![\w.\-/#^+])(?<![A-Za-z][\-–])(?<!\^\{)(?<!\\times )(?<!\\times)(?<!× )"
    r"(?<!\d,)(?P<num>\d{1,3}(?:,\d{3})+(?!\d|,\d)|\d+)(?P<frac>\.\d+)?(?P<exp>[eE][-+−]?\d+)?"
    r"(?![\d.,]\d|[A-Za-z_\d]|-[A-Za-z])")
# Units after a number that scale it: "4.8 M characters", "3 thousand", "46 %".
SCALE = re.compile(r"\s?(%|k\b|K\b|M\b|B\b|thousand|million|billion)")
POWER = re.compile(r"\s*(?:\\times|\\cdot|×)\s*10\^\{?([-−]?\d+)\}?")
SCALES = {"%": 0.01, "k": 1e3, "K": 1e3, "M": 1e6, "B": 1e9,
          "thousand": 1e3, "million": 1e6, "billion": 1e9}

# Parts of a markdown cell that are not prose.
NOT_PROSE = [
    re.compile(r"^\s*:[\w-]+:.*$", re.MULTILINE),  # directive options (:label:, :width: 80%)
    re.compile(r"^\([\w-]+\)=\s*$", re.MULTILINE),  # labels
    re.compile(r"\{(?:cite|cite:p|cite:t|numref|ref|doc|eq|glue|glue:text|glue:any|glue:md|"
               r"download|label)\}`[^`]*`"),  # roles whose content is a key, not prose
    re.compile(r"`[^`\n]+`"),  # inline code
    re.compile(r"\]\([^)]*\)"),  # link targets
    re.compile(r"https?://\S+"),  # bare URLs
    re.compile(r"<[^>\n]+>"),  # HTML tags
    re.compile(r"\\(?:label|ref|eqref)\{[^}]*\}"),
]


def _value(match: re.Match) -> tuple[float, int, int]:
    """The number's mantissa, its decimals (its precision) and its power of ten."""
    mantissa = float(match.group("num").replace(",", "") + (match.group("frac") or ""))
    decimals = len(match.group("frac")) - 1 if match.group("frac") else 0
    exponent = int((match.group("exp") or "e0")[1:].replace("−", "-"))
    return mantissa, decimals, exponent


FENCE = re.compile(r"^\s*(`{3,}|~{3,})\s*(.*)$")


def without_code(markdown: str) -> str:
    """The markdown with its code blocks and fence lines removed.

    A fence whose info string is a role-like ``{name}`` opens a directive (an exercise, a
    solution, an admonition), whose body is prose; any other fence opens a code block, which runs
    to the next fence of the same kind and length.
    """
    kept, directives, code_fence = [], [], None
    for line in markdown.splitlines():
        fence = FENCE.match(line)
        if code_fence is not None:
            if fence and fence.group(1) == code_fence and not fence.group(2):
                code_fence = None
            continue
        if not fence:
            kept.append(line)
        elif directives and fence.group(1) == directives[-1] and not fence.group(2):
            directives.pop()
        elif fence.group(2).startswith("{"):
            directives.append(fence.group(1))
        else:
            code_fence = fence.group(1)
    return "\n".join(kept)


def prose(cell_source: str) -> str:
    """The prose of a markdown cell, with thousands written as in LaTeX ($16{,}384$) made plain."""
    cell_source = without_code(cell_source)
    cell_source = re.sub(r"(?<=\d)(?:\{,\}|\\,)(?=\d{3})", ",", cell_source)
    for pattern in NOT_PROSE:
        cell_source = pattern.sub(" ", cell_source)
    return cell_source


def prose_numbers(text: str) -> list[tuple[str, float, int, float]]:
    """(as written, mantissa, decimals, scale) for every number in a piece of prose.

    The scale is what the written mantissa must be multiplied by: 1e-9 for "3e-9", 1e6 for
    "4.8 M" or "4.8 million", 0.01 for "46 %".
    """
    found = []
    for match in NUMBER.finditer(text):
        mantissa, decimals, exponent = _value(match)
        unit = SCALE.match(text, match.end())
        power = POWER.match(text, match.end())
        scale = (SCALES[unit.group(1)] if unit else 1.0) * 10.0 ** exponent
        if power:  # $1.2 \times 10^{-7}$
            scale *= 10.0 ** int(power.group(1).replace("−", "-"))
        found.append((match.group(0), mantissa, decimals, scale))
    return found


OUTPUT_NUMBER = re.compile(r"\d+(?:,\d{3})*(?:\.\d+)?(?:[eE][-+]?\d+)?")


def output_values(notebook: dict) -> list[float]:
    """Every number printed by a code cell: streams, results, displays (glued values too)."""
    values = []
    for cell in notebook["cells"]:
        if cell["cell_type"] != "code":
            continue
        for output in cell.get("outputs", []):
            texts = [output.get("text", "")]
            for mime, data in output.get("data", {}).items():
                if mime.startswith(("text/", "application/papermill.record/text")):
                    texts.append(data)
            for text in texts:
                text = "".join(text) if isinstance(text, list) else str(text)
                for token in OUTPUT_NUMBER.findall(text):
                    values.append(float(token.replace(",", "")))
    return values


def matches(mantissa: float, decimals: int, scale: float, outputs: list[float]) -> bool:
    """Is the prose's number some output, shown at the prose's precision and scale?

    "2.16" matches an output 2.1634; "46 %" an output 0.46 or 46.0; "4.8 M" an output 4,813,216.
    """
    for o in outputs:
        candidates = (o / scale, o) if scale == 0.01 else (o / scale,)
        for c in candidates:
            if abs(round(c, decimals) - mantissa) <= 1e-9 * max(1.0, mantissa):
                return True
    return False


def load_allow_list() -> dict[str, set[str]]:
    """chapter stem (or *) -> the numbers allowed in its prose, as written."""
    allowed: dict[str, set[str]] = {}
    for line in ALLOW_FILE.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        chapter, *numbers = line.split()
        allowed.setdefault(chapter, set()).update(numbers)
    return allowed


def unlisted_numbers(path: Path, allowed: dict[str, set[str]]) -> list[str]:
    notebook = json.loads(path.read_text(encoding="utf-8"))
    outputs = output_values(notebook)
    ok = allowed.get(path.stem, set()) | allowed.get("*", set())
    problems = []
    for index, cell in enumerate(notebook["cells"]):
        if cell["cell_type"] != "markdown":
            continue
        text = prose("".join(cell["source"]))
        for written, value, decimals, scale in prose_numbers(text):
            if decimals == 0 and value <= 10 and scale == 1.0:
                continue
            if written in ok or matches(value, decimals, scale, outputs):
                continue
            line = next((ln for ln in text.splitlines() if written in ln), "").strip()
            problems.append(f"cell {index}: {written!r} in: {line[:110]}")
    return problems


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_every_number_in_the_prose_comes_from_a_cell(path: Path) -> None:
    problems = unlisted_numbers(path, load_allow_list())
    assert not problems, (
        f"{path.name}: numbers in the prose that no output of the chapter shows, that are not "
        f"glued and not on {ALLOW_FILE.name}:\n  " + "\n  ".join(problems))


def test_the_allow_list_is_short_and_every_entry_is_used() -> None:
    allowed = load_allow_list()
    chapters = {p.stem: p for p in CHAPTERS}
    assert set(allowed) <= set(chapters) | {"*"}, set(allowed) - set(chapters)
    entries = sum(len(v) for v in allowed.values())
    assert entries <= 30, f"{entries} allowed numbers: glue or print them instead"
    for stem, numbers in allowed.items():  # an entry no prose needs any more is stale
        paths = CHAPTERS if stem == "*" else [chapters[stem]]
        written = {w for path in paths
                   for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]
                   if cell["cell_type"] == "markdown"
                   for w, *_ in prose_numbers(prose("".join(cell["source"])))}
        assert numbers <= written, f"{stem}: {sorted(numbers - written)} no longer in its prose"


def test_the_scanner_reads_directives_and_skips_code_blocks() -> None:
    cell = ("```{exercise}\n:label: ex-1\n\nWhat is 123 plus one?\n```\n\n"
            "```{solution} ex-1\n:class: dropdown\n\n124, and in code:\n\n"
            "````python\nprint(999)\n````\n\nstill 125.\n```\n\n"
            "```bash\ntinygpt train --max-iters 4000\n```\n\nAfter the code: 126.")
    assert [w for w, *_ in prose_numbers(prose(cell))] == ["123", "124", "125", "126"]


def test_the_scanner_finds_typed_numbers_and_accepts_printed_ones() -> None:
    cell = ("The loss fell to 2.163 after 400 steps (`--max-iters 4000` in code is not prose), "
            "see {numref}`fig-12`; GPT-2 and float32 are names; 46 % were words; 4.8 M chars; "
            "$16{,}384$ weights, sizes 512, 1,024, 2,048; an error of $1.2 \\times 10^{-7}$.")
    found = {w for w, *_ in prose_numbers(prose(cell))}
    assert found == {"2.163", "400", "46", "4.8", "16,384", "512", "1,024", "2,048", "1.2"}
    outputs = [2.1634, 400.0, 0.46, 4_813_216.0, 16384.0, 512, 1024, 2048, 1.19e-07]
    for written, value, decimals, scale in prose_numbers(prose(cell)):
        assert matches(value, decimals, scale, outputs), written
        assert not matches(value, decimals, scale, [7.0]), written
