"""The package stays one a reader can hold in their head: small modules, no import cycles.

Every module of ``src/tinygpt`` is at most 300 lines and opens with a docstring that says what it
handles; the graph of imports between the package's modules -- counting imports inside functions,
which a cycle can hide in -- has no cycle.
"""

from __future__ import annotations

import ast
import importlib
import json
from pathlib import Path

import pytest
from test_book_map import SRC, imports_in

MAX_LINES = 300


def cycle_in(edges: set[tuple[str, str]]) -> list[str] | None:
    """One cycle of the directed graph ``edges`` as ``[a, b, ..., a]``, or None if it has none."""
    graph: dict[str, list[str]] = {}
    for a, b in sorted(edges):
        graph.setdefault(a, []).append(b)
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in graph.get(node, []):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_cycle_in_finds_cycles_and_only_them():
    assert cycle_in({("a", "b"), ("b", "c")}) is None
    assert cycle_in({("a", "b"), ("b", "c"), ("c", "a")}) == ["a", "b", "c", "a"]
    assert cycle_in({("x", "a"), ("a", "b"), ("b", "a")}) == ["a", "b", "a"]


def test_the_import_graph_has_no_cycle():
    cycle = cycle_in(imports_in(SRC))
    assert cycle is None, f"import cycle: {' -> '.join(cycle or [])}"


@pytest.mark.parametrize("path", sorted(SRC.glob("*.py")), ids=lambda p: p.name)
def test_every_module_is_small_and_says_what_it_is(path: Path):
    text = path.read_text(encoding="utf-8")
    lines = text.count("\n")
    assert lines <= MAX_LINES, f"{path.name} has {lines} lines, more than {MAX_LINES}: split it"
    docstring = ast.get_docstring(ast.parse(text))
    assert docstring and len(docstring.split()) >= 8, f"{path.name} needs a module docstring"


def _imported_names(tree: ast.AST) -> list[tuple[str, str]]:
    return [(node.module, alias.name) for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tinygpt.")
            for alias in node.names]


def _code_of(path: Path) -> str:
    if path.suffix != ".ipynb":
        return path.read_text(encoding="utf-8")
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    lines = [line for c in cells if c["cell_type"] == "code" for line in "".join(c["source"])
             .splitlines() if not line.lstrip().startswith(("%", "!"))]  # no IPython magics
    return "\n".join(lines)


def test_every_class_and_function_is_imported_from_its_own_module():
    """One import path per public name: ``from tinygpt.X import Name`` only where X defines it."""
    root = SRC.parents[1]
    files = [*SRC.glob("*.py"), *(root / "tests").rglob("*.py"),
             *(root / "benchmarks").glob("*.py"), *(root / "chapters").glob("*.ipynb")]
    elsewhere = []
    for path in files:
        for module, name in _imported_names(ast.parse(_code_of(path))):
            home = getattr(getattr(importlib.import_module(module), name, None), "__module__", None)
            if home and home.startswith("tinygpt.") and home != module:
                elsewhere.append(f"{path.name}: {name} from {module}, defined in {home}")
    assert not elsewhere, elsewhere
