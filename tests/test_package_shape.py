"""The package stays one a reader can hold in their head: small modules, no import cycles.

Every module of ``src/tinygpt`` is at most 300 lines and opens with a docstring that says what it
handles; the graph of imports between the package's modules -- counting imports inside functions,
which a cycle can hide in -- has no cycle.
"""

from __future__ import annotations

import ast
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
