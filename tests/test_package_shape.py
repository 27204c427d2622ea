"""The package stays one a reader can hold in their head.

Rules about meaning, each checked over ``src/tinygpt`` and its subpackages, and each with a small
check that its detector does catch what it is meant to catch:

* every module opens with a docstring that says what it handles;
* the imports between modules (dotted names, counting imports inside functions, which a cycle
  can hide in) have no cycle;
* no module uses another module's private names: ``from tinygpt.x import _name``, ``x._name``
  on a tinygpt module, ``getattr(obj, "_name")``, or ``obj._name`` for a private member that only
  another module defines;
* size guides, never limits (code is split by meaning, not by size): a function or class a
  chapter or an Under the hood page displays (``show.source(...)`` in a notebook's code cells)
  of more than ``MAX_SHOWN`` code lines (docstrings, comments and blank lines not counted), a
  module of more than ``MAX_MODULE``, and a top level of more than ``MAX_TOP_LEVEL`` modules,
  give a ``SizeGuide`` warning naming them -- a hint to look, which fails nothing;
* module names are words, not abbreviations (no ``ckpt``, ``utils``, ``cli_``-style prefixes);
* the top level holds the chapters' pieces, and the infrastructure sits in the named
  subpackages (``SUBPACKAGES``), one level deep; the chapters' pieces import none of the layers
  built on top of them (``book``, ``cli``, ``figures``);
* a class, function or constant is imported from the module that defines it, one import path
  per name (a package's ``__init__`` may define names; then they are imported from the package).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import io
import json
import re
import tokenize
import warnings
from pathlib import Path

import pytest
from test_book_map import PLUMBING, ROOT, SRC, dotted_imports, modules_of

MODULES = modules_of(SRC)  # dotted name -> file, subpackages included
MAX_SHOWN = 40  # code lines of a displayed function or class: a guide (a warning past it)
MAX_MODULE = 400  # code lines of a module: a guide (a warning past it)
MAX_TOP_LEVEL = 36  # modules at the top level, besides __init__ and __main__: a guide (15 chapters)



class SizeGuide(UserWarning):
    """A module or a displayed object longer than its guide: a hint to look, not a failure."""


def warn_over_the_guide(what: str, sizes: dict[str, int], guide: int,
                        where_shown: dict[str, list[str]] | None = None, *,
                        unit: tuple[str, str] = ("code lines", "lines"),
                        look: str = "") -> dict[str, int]:
    """Warn (``SizeGuide``) about every entry of ``sizes`` over ``guide`` (counted in ``unit``:
    the guide's words, each entry's), naming it (and where it is shown, and ``look``: what to
    look at); return them."""
    over = {name: n for name, n in sorted(sizes.items()) if n > guide}
    for name, n in over.items():
        shown_in = f", shown in {', '.join(where_shown[name])}" if where_shown else ""
        warnings.warn(f"{what} over the guide of {guide} {unit[0]} (a hint to look, not a "
                      f"limit): {name} ({n} {unit[1]}{shown_in}){look}", SizeGuide,
                      stacklevel=2)
    return over

# The subpackages, each with what it holds; anything else at the top level is a chapter's piece.
SUBPACKAGES: dict[str, str] = {
    "book": "the book's own machinery: its model, the loss ladder, the results cache, showing code",
    "checkpoint": "saving a training run to a folder and loading it back",
    "cli": "the tinygpt command: its parser, options, preflight checks and subcommands",
    "exercises": "graded exercises: the reader's functions checked against the package's own",
    "figures": "the chapters' diagrams and the drawing layer under them",
    "files": "how tinygpt reads and writes its own files: safe reads, atomic writes, locks",
    "prepare": "a corpus into token shards, in worker processes",
}
# Layers built on the chapters' pieces: a piece that imported one would depend on its own users.
ABOVE_THE_PIECES = {"book", "cli", "exercises", "figures"}


def where(path: Path) -> str:
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name


# -- docstrings and cycles ---------------------------------------------------------------------


@pytest.mark.parametrize("module", sorted(MODULES), ids=str)
def test_every_module_says_what_it_is(module: str):
    docstring = ast.get_docstring(ast.parse(MODULES[module].read_text(encoding="utf-8")))
    assert docstring and len(docstring.split()) >= 8, f"{module} needs a module docstring"


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
    assert cycle_in({("tinygpt.cli", "tinygpt.cli.train"), ("tinygpt.cli.train", "tinygpt.cli")})


def test_the_import_graph_has_no_cycle():
    edges = dotted_imports(SRC)
    assert any(a.count(".") == 2 for a, _ in edges)  # subpackage modules are read too
    cycle = cycle_in(edges)
    assert cycle is None, f"import cycle: {' -> '.join(cycle or [])}"


# -- private names -----------------------------------------------------------------------------


def is_private(name: str) -> bool:
    """``_name``; not ``__dunder__`` nor IPython's ``_repr_html_``-style protocol names."""
    return name.startswith("_") and not name.endswith("_")


def _resolve(module: str, node: ast.ImportFrom, path: Path) -> str:
    """The absolute module of ``from ... import``, relative imports included."""
    if not node.level:
        return node.module or ""
    home = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = home[: len(home) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def module_names(tree: ast.AST, module: str, path: Path, modules) -> dict[str, str]:
    """Local name -> the tinygpt module it is bound to by an import statement of ``tree``."""
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules or alias.name.startswith("tinygpt."):
                    if alias.asname:
                        bound[alias.asname] = alias.name
                    else:
                        bound[alias.name.split(".")[0]] = alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(module, node, path)
            for alias in node.names:
                if f"{source}.{alias.name}" in modules:
                    bound[alias.asname or alias.name] = f"{source}.{alias.name}"
    return bound


def _dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for a chain of attributes on a name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def split_module(dotted: str, modules) -> tuple[str, list[str]] | None:
    """``tinygpt.bpe.train_merges.x`` -> (``tinygpt.bpe``, [``train_merges``, ``x``]): the
    longest module prefix and the attributes after it; None if no prefix is a module."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        if ".".join(parts[:cut]) in modules:
            return ".".join(parts[:cut]), parts[cut:]
    return None


def private_members(tree: ast.AST) -> set[str]:
    """The private members a module defines: in class bodies, or as ``self._name = ...``."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    found.add(item.name)
                elif isinstance(item, (ast.Assign, ast.AnnAssign)):
                    targets = item.targets if isinstance(item, ast.Assign) else [item.target]
                    found |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
              and isinstance(node.value, ast.Name) and node.value.id == "self"):
            found.add(node.attr)
    return {name for name in found if is_private(name)}


def private_uses(path: Path, module: str, modules, foreign: set[str]) -> list[str]:
    """Where the file at ``path`` (module ``module``) uses another module's private names.
    ``foreign``: private members defined by other modules of the package, not by this one."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    bound = module_names(tree, module, path, modules)
    found = []
    for node in ast.walk(tree):
        line = f"{where(path)}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.ImportFrom):
            source = _resolve(module, node, path)
            if source == "tinygpt" or source.startswith("tinygpt."):
                found += [f"{line}: from {source} import {a.name}"
                          for a in node.names if is_private(a.name)]
        elif isinstance(node, ast.Attribute) and is_private(node.attr):
            chain = _dotted(node)
            head = chain and chain.split(".")[0]
            if head in bound:
                full = ".".join([bound[head], *chain.split(".")[1:]])
                split = split_module(full, modules)
                if split and split[1] and is_private(split[1][0]):
                    found.append(f"{line}: {chain} (a private name of {split[0]})")
            elif node.attr in foreign and not (
                isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
            ):
                found.append(f"{line}: .{node.attr} (a private member of another module)")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr", "setattr", "delattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and is_private(node.args[1].value)
            and not (isinstance(node.args[0], ast.Name) and node.args[0].id in ("self", "cls"))
        ):
            found.append(f"{line}: {node.func.id}(..., {node.args[1].value!r})")
    return sorted(set(found))


def test_private_uses_finds_each_kind(tmp_path):
    package = tmp_path / "tinygpt"
    (package / "prepare").mkdir(parents=True)
    for name in ("__init__", "bigram", "tokenizer", "prepare/__init__", "prepare/documents"):
        (package / f"{name}.py").write_text("")
    modules = modules_of(package)
    user = package / "ngram.py"
    user.write_text(
        "import tinygpt.bigram\n"
        "from tinygpt.bigram import _draw, draw\n"
        "from tinygpt.prepare import documents as P\n"
        "from tinygpt import tokenizer\n"
        "def f(tok, self):\n"
        "    P._encode(1); P.encode(1); tokenizer._split; tinygpt.bigram._table\n"
        "    getattr(tok, '_split', None); getattr(tok, 'split'); getattr(self, '_own')\n"
        "    tok._cache; tok._mine; self._cache; tok.__class__; tok._repr_html_()\n"
        "class Mine:\n"
        "    def _mine(self): ...\n"
    )
    found = private_uses(user, "tinygpt.ngram", modules, foreign={"_cache"})
    assert {f.split(": ", 1)[1] for f in found} == {
        "from tinygpt.bigram import _draw",
        "P._encode (a private name of tinygpt.prepare.documents)",
        "tokenizer._split (a private name of tinygpt.tokenizer)",
        "tinygpt.bigram._table (a private name of tinygpt.bigram)",
        "getattr(..., '_split')",
        "._cache (a private member of another module)",
    }
    assert private_members(ast.parse(user.read_text())) == {"_mine"}


def test_no_module_uses_another_modules_private_names():
    trees = {m: ast.parse(p.read_text(encoding="utf-8")) for m, p in MODULES.items()}
    members = {m: private_members(tree) for m, tree in trees.items()}
    found = []
    for module, path in MODULES.items():
        foreign = set().union(*(v for k, v in members.items() if k != module)) - members[module]
        found += private_uses(path, module, MODULES, foreign)
    assert not found, (
        "private names used outside their module (make them public, or move the code that "
        "needs them):\n  " + "\n  ".join(found)
    )


# -- code lines: displayed objects and modules -------------------------------------------------


def code_lines(source: str) -> set[int]:
    """The numbers of the lines of ``source`` that hold code: not blank, not only a comment,
    not part of a docstring (of the module, a class or a function)."""
    tree = ast.parse(source)
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                    and isinstance(body[0].value.value, str)):
                docstrings |= set(range(body[0].lineno, body[0].end_lineno + 1))
    lines = set()
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENCODING, tokenize.ENDMARKER}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in skip:
            lines |= set(range(token.start[0], token.end[0] + 1))
    return lines - docstrings


def definition(module: str, qualname: list[str], modules) -> tuple[Path, ast.AST] | None:
    """The ``def`` or ``class`` statement of ``module``'s ``qualname`` (following a name the
    module imports), or None."""
    path = modules[module]
    body = ast.parse(path.read_text(encoding="utf-8")).body
    node = None
    for i, name in enumerate(qualname):
        matches = [n for n in body if isinstance(
            n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == name]
        if not matches and i == 0:
            for n in body:
                if isinstance(n, ast.ImportFrom) and any(
                        (a.asname or a.name) == name for a in n.names):
                    source = _resolve(module, n, path)
                    real = next(a.name for a in n.names if (a.asname or a.name) == name)
                    if source in modules:
                        return definition(source, [real, *qualname[1:]], modules)
        if not matches:
            return None
        node = matches[-1]
        body = node.body
    return path, node


def lines_of(path: Path, node: ast.AST) -> int:
    """The code lines of a ``def`` or ``class`` statement, decorators included."""
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    return len({n for n in code_lines(path.read_text(encoding="utf-8"))
                if first <= n <= node.end_lineno})


def parsed(path: Path) -> ast.Module:
    """A Python file's syntax tree, or a notebook's: its code cells, each parsed on its own
    (IPython's magics and shell lines left out), as one module."""
    if path.suffix == ".py":
        return ast.parse(path.read_text(encoding="utf-8"))
    body = []
    for i, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
        if cell["cell_type"] == "code":
            code = "\n".join(line for line in "".join(cell["source"]).splitlines()
                             if not line.lstrip().startswith(("%", "!")))
            try:
                body += ast.parse(code).body
            except SyntaxError as error:
                raise SyntaxError(f"{path.name}, cell {i}: {error}") from None
    return ast.Module(body=body, type_ignores=[])


def shown(tree: ast.Module, modules) -> tuple[list[tuple[str, list[str]]], list[str]]:
    """What ``show.source(...)`` calls in ``tree`` display, as (module, qualname), with the
    members listed in ``members=`` as objects of their own; and the calls it cannot resolve."""
    bound = {}  # local name -> dotted name of what it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                bound[alias.asname or top] = alias.name if alias.asname else top
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            for alias in node.names:
                bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    found, unresolved = [], []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and _dotted(node.func) == "show.source" and node.args):
            continue
        chain = _dotted(node.args[0])
        head = chain and chain.split(".")[0]
        split = head in bound and split_module(
            ".".join([bound[head], *chain.split(".")[1:]]), modules)
        if not split or not split[1]:
            unresolved.append(ast.unparse(node))
            continue
        members = [k.value for k in node.keywords if k.arg == "members"]
        if members and isinstance(members[0], (ast.List, ast.Tuple)):
            found += [(split[0], [*split[1], m.value]) for m in members[0].elts]
        else:
            found.append(split)
    return found, unresolved


def test_code_lines_count_only_code(tmp_path):
    source = (
        '"""Module docstring."""\n'
        "\n"
        "# a comment\n"
        "@decorator\n"
        "def f(x):\n"
        '    """Docstring,\n'
        '    two lines."""\n'
        "    y = '''a string\n"
        "    that is code'''  # with a comment\n"
        "\n"
        "    return x\n"
    )
    assert code_lines(source) == {4, 5, 8, 9, 11}
    path = tmp_path / "m.py"
    path.write_text(source + "\n\nclass Long:\n" + "    a = 1\n" * 40)
    modules = {"tinygpt.m": path}
    assert lines_of(*definition("tinygpt.m", ["f"], modules)) == 5
    assert lines_of(*definition("tinygpt.m", ["Long"], modules)) == 41
    code = ("from tinygpt import m\nfrom tinygpt.m import Long as L\nimport tinygpt\n"
            "show.source(m.f); show.source(L, members=['a']); show.source(tinygpt.m.f)\n"
            "show.source(model.forward); show.source(m)\n")
    assert shown(ast.parse(code), modules) == (
        [("tinygpt.m", ["f"]), ("tinygpt.m", ["Long", "a"]), ("tinygpt.m", ["f"])],
        ["show.source(model.forward)", "show.source(m)"],
    )


def displayed(notebooks: list[Path] | None = None) -> dict[str, tuple[int, list[str]]]:
    """Dotted name -> (code lines, the notebooks showing it), for every object that the chapters
    and the Under the hood pages show (or the given ``notebooks``)."""
    found: dict[str, tuple[int, list[str]]] = {}
    unresolved = []
    for notebook in notebooks or sorted((ROOT / "chapters").rglob("*.ipynb")):
        objects, missed = shown(parsed(notebook), MODULES)
        unresolved += [f"{notebook.name}: {m}" for m in missed]
        for module, qualname in objects:
            name = ".".join([module, *qualname])
            found_at = definition(module, qualname, MODULES)
            if found_at is None:
                unresolved.append(f"{notebook.name}: {name}")
                continue
            size = lines_of(*found_at)
            found[name] = (size, [*found.get(name, (0, []))[1], notebook.stem])
    assert not unresolved, f"show.source calls this test cannot follow: {unresolved}"
    return found


def test_long_displays_are_named_in_a_warning():
    objects = displayed()
    assert len(objects) >= 60  # every chapter shows code
    chapters = {n for n, (_, where_shown) in objects.items()
                if any(w[:2].isdigit() for w in where_shown)}
    assert {"tinygpt.train.configure_optimizer", "tinygpt.model.GPT.forward"} <= chapters
    assert any(not w[:2].isdigit() for _, ws in objects.values() for w in ws), (
        "Under the hood pages show code too, and their displays are measured as well")
    warn_over_the_guide("displayed object", {n: size for n, (size, _) in objects.items()},
                        MAX_SHOWN, {n: ws for n, (_, ws) in objects.items()})


def test_the_size_guides_warn_and_fail_nothing(tmp_path):
    path = tmp_path / "m.py"
    path.write_text('"""A module."""\n\ndef f(x):\n' + "    x += 1\n" * 6 + "    return x\n")
    sizes = {"tinygpt.m": len(code_lines(path.read_text()))}
    assert sizes == {"tinygpt.m": 8}  # the def, six additions, the return
    with pytest.warns(SizeGuide, match=r"tinygpt\.m \(8 lines, shown in 04_x\)"):
        assert warn_over_the_guide("displayed object", sizes, 7, {"tinygpt.m": ["04_x"]}) == sizes
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # at the guide: no warning at all
        assert warn_over_the_guide("module", sizes, 8) == {}


def test_big_modules_are_named_in_a_warning():
    sizes = {m: len(code_lines(p.read_text(encoding="utf-8"))) for m, p in MODULES.items()}
    assert min(sizes.values()) >= 0 and sizes["tinygpt.model"] > 50  # the sizes are measured
    warn_over_the_guide("module", sizes, MAX_MODULE)


# -- names and places --------------------------------------------------------------------------

# Words that name a grab bag, not a concept; and abbreviations (also found inside run-together
# names such as "ckptio").
GRAB_BAGS = {"util", "utils", "misc", "helper", "helpers", "common", "stuff", "tools", "lib",
             "base", "core", "extra", "extras", "other"}
ABBREVIATIONS = {"io", "ckpt", "cfg", "conf", "mgr", "tmp", "fn", "func", "obj", "ctx", "idx",
                 "msg", "arg", "args", "opt", "opts", "param", "params", "impl", "proc", "prep",
                 "calc", "diag", "diags", "tok", "toks", "enc", "dec", "emb", "attn", "blk",
                 "mdl", "trn", "gen", "num", "val", "str", "img", "fig", "figs", "viz"}
RUN_TOGETHER = ("ckpt", "cfg", "mgr", "util", "misc", "attn")  # never inside a real word
# Words without a vowel that are names, not abbreviations.
TERMS = {"gpt": "GPT is the model's own name (GPT-2, scalar_gpt, gpt_diagrams)"}


def name_problems(module: str, subpackages: set[str]) -> list[str]:
    """Why the dotted module name ``module`` is not made of words (empty if it is)."""
    parts = module.split(".")[1:]
    problems = []
    for i, part in enumerate(parts):
        words = part.split("_")
        for word in words:
            bare = word.rstrip("0123456789")
            if word in GRAB_BAGS:
                problems.append(f"{module}: {word!r} names a grab bag, not what it holds")
            elif bare in ABBREVIATIONS or any(a in word for a in RUN_TOGETHER):
                problems.append(f"{module}: {word!r} is an abbreviation")
            elif bare and not re.search("[aeiouy]", bare) and bare not in TERMS:
                problems.append(f"{module}: {word!r} has no vowel: an abbreviation?")
        if len(words) > 1 and words[0] in subpackages | set(parts[:i]):
            problems.append(f"{module}: {words[0]}_ is a prefix: the module belongs in (or "
                            f"already is in) the subpackage {words[0]}/")
    return problems


def test_name_problems_finds_abbreviations():
    packages = {"cli", "checkpoint"}
    assert name_problems("tinygpt.scalar_gpt", packages) == []
    assert name_problems("tinygpt.gpt2", packages) == []
    assert name_problems("tinygpt.book.results_cache", packages) == []
    assert name_problems("tinygpt.figures.attention_diagrams", packages) == []
    for bad in ("tinygpt.ckptio", "tinygpt.utils", "tinygpt.misc_helpers", "tinygpt.io",
                "tinygpt.cli_options", "tinygpt.cli.cli_sample", "tinygpt.checkpoint.ckpt",
                "tinygpt.tkn", "tinygpt.model_cfg", "tinygpt.diagrams_attn"):
        assert name_problems(bad, packages), bad


def test_module_names_are_words():
    packages = {p.parent.name for p in SRC.glob("*/__init__.py")}
    problems = [p for m in MODULES for p in name_problems(m, packages)]
    assert not problems, problems


def top_level_modules(package: Path) -> list[str]:
    """The modules at the top level of the folder ``package``, besides ``PLUMBING``."""
    return sorted({p.stem for p in package.glob("*.py")} - PLUMBING)


def warn_over_the_top_level_guide(package: Path) -> dict[str, int]:
    """A ``SizeGuide`` warning if the top level of ``package`` holds more than ``MAX_TOP_LEVEL``
    modules, saying what to look at; the count of them (empty if within the guide)."""
    return warn_over_the_guide(
        "top level", {package.name: len(top_level_modules(package))}, MAX_TOP_LEVEL,
        unit=("modules", "modules"),
        look=": is one of them infrastructure rather than a chapter's piece? Then it belongs in "
             "a subpackage. Never split or merge modules to meet the number")


def top_level_problems(package: Path) -> list[str]:
    """Why the folder ``package`` is not a top level of chapter pieces plus the subpackages of
    ``SUBPACKAGES`` (empty if it is). How many modules it holds is a guide, not a problem
    (``warn_over_the_top_level_guide``)."""
    problems = []
    for folder in sorted(p for p in package.iterdir() if p.is_dir() and p.name != "__pycache__"):
        if not (folder / "__init__.py").is_file():
            problems.append(f"{folder.name}/ has no __init__.py")
        elif folder.name not in SUBPACKAGES:
            problems.append(f"{folder.name}/ is not one of the named subpackages "
                            f"{sorted(SUBPACKAGES)}")
        nested = sorted(p.parent.name for p in folder.glob("*/__init__.py"))
        if nested:
            problems.append(f"{folder.name}/ has subpackages {nested}: the infrastructure is "
                            f"one level deep")
    files = modules_of(package)
    for importer, imported in sorted(dotted_imports(package)):
        piece = files[importer].parent == package and files[importer].stem not in PLUMBING
        layer = imported.split(".")[1] if imported.count(".") else None
        if piece and layer in ABOVE_THE_PIECES:
            problems.append(f"the chapter piece {importer} imports {imported}, a layer built on "
                            f"the pieces")
    return problems


def test_top_level_problems_finds_each_kind(tmp_path):
    package = tmp_path / "tinygpt"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for i in range(MAX_TOP_LEVEL):
        (package / f"piece{i}.py").write_text("")
    for folder in ("book", "cli", "cli/deeper"):
        (package / folder).mkdir()
        (package / folder / "__init__.py").write_text("")
    (package / "book" / "show.py").write_text("")
    (package / "model.py").write_text("def f():\n    from tinygpt.book import show\n")
    assert top_level_problems(package) == [  # MAX_TOP_LEVEL + 1 modules: no problem, a guide
        "cli/ has subpackages ['deeper']: the infrastructure is one level deep",
        "the chapter piece tinygpt.model imports tinygpt.book.show, a layer built on the pieces",
    ]
    (package / "utils").mkdir()
    (package / "utils" / "__init__.py").write_text("")
    (package / "loose").mkdir()
    (package / "loose" / "x.py").write_text("")
    problems = top_level_problems(package)
    assert "loose/ has no __init__.py" in problems
    assert any(p.startswith("utils/ is not one of the named subpackages") for p in problems)


def test_the_top_level_holds_the_pieces_and_the_infrastructure_its_subpackages():
    problems = top_level_problems(SRC)
    assert not problems, problems


def test_the_top_level_guide_warns_and_fails_nothing(tmp_path):
    package = tmp_path / "tinygpt"
    package.mkdir()
    for name in ("__init__", "__main__", *(f"piece{i}" for i in range(MAX_TOP_LEVEL))):
        (package / f"{name}.py").write_text("")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # at the guide: no warning at all
        assert warn_over_the_top_level_guide(package) == {}
    (package / "one_more.py").write_text("")
    with pytest.warns(SizeGuide, match=rf"top level over the guide of {MAX_TOP_LEVEL} modules "
                      rf"\(a hint to look, not a limit\): tinygpt \({MAX_TOP_LEVEL + 1} modules\)"
                      rf": is one of them infrastructure"):
        assert warn_over_the_top_level_guide(package) == {"tinygpt": MAX_TOP_LEVEL + 1}
    assert top_level_problems(package) == []  # the count is no structural problem


def test_a_large_top_level_is_named_in_a_warning():
    modules = top_level_modules(SRC)
    assert {"model", "attention", "train"} <= set(modules) and "__init__" not in modules
    warn_over_the_top_level_guide(SRC)


# -- one import path per name ------------------------------------------------------------------


def defined_names(tree: ast.Module) -> set[str]:
    """The names a module defines at its top level (also inside top-level if/try/with blocks),
    not counting the names it imports."""
    names = set()
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            todo += [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", []),
                     *(s for h in getattr(node, "handlers", []) for s in h.body)]
    return names


def imported_elsewhere(path: Path, modules, runtime: bool = True) -> list[str]:
    """The ``from tinygpt.X import Name`` of a file (or notebook) where X does not define Name:
    it does not assign it at its top level (it imports it), or (``runtime``: importing X) the
    class or function bound to it was defined in another module."""
    tree = parsed(path)
    module = next((m for m, p in modules.items() if p == path), "")
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        source = _resolve(module, node, path)
        if source not in modules:
            continue
        defined = defined_names(ast.parse(modules[source].read_text(encoding="utf-8")))
        for alias in node.names:
            if f"{source}.{alias.name}" in modules or alias.name == "*":
                continue
            if alias.name not in defined:
                found.append(f"{where(path)}: {alias.name} from {source}, which does not "
                             f"define it")
                continue
            if not runtime:
                continue
            obj = getattr(importlib.import_module(source), alias.name, None)
            home = getattr(obj, "__module__", None)
            if (inspect.isclass(obj) or inspect.isfunction(obj)) and home != source:
                found.append(f"{where(path)}: {alias.name} from {source}, defined in {home}")
    return found


def test_imported_elsewhere_finds_re_exports(tmp_path):
    package = tmp_path / "tinygpt"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "model.py").write_text("GPT = 1\n")
    (package / "train.py").write_text("from tinygpt.model import GPT\n")
    user = tmp_path / "user.py"
    user.write_text("from tinygpt.train import GPT\nfrom tinygpt.model import GPT\n"
                    "from tinygpt import model\n")
    found = imported_elsewhere(user, modules_of(package), runtime=False)
    assert [f.split(": ", 1)[1] for f in found] == [
        "GPT from tinygpt.train, which does not define it"]


def test_every_name_is_imported_from_its_own_module():
    """One import path per public name: ``from tinygpt.X import Name`` only where X defines it."""
    files = [*MODULES.values(), *(ROOT / "tests").rglob("*.py"),
             *(ROOT / "benchmarks").glob("*.py"), *(ROOT / "chapters").glob("*.ipynb")]
    elsewhere = [f for path in files for f in imported_elsewhere(path, MODULES)]
    assert not elsewhere, elsewhere


def unexplained_type_ignores(source: str) -> list[int]:
    """Lines with a ``# type: ignore`` that no comment explains, on the line after the ignore
    or on the line just above."""
    lines = source.splitlines()
    bare = []
    for number, line in enumerate(lines, 1):
        if "# type: ignore" not in line:
            continue
        after = line.split("# type: ignore", 1)[1]
        explained_after = "#" in after
        explained_above = number > 1 and lines[number - 2].strip().startswith("#")
        if not (explained_after or explained_above):
            bare.append(number)
    return bare


def test_unexplained_type_ignores_finds_bare_ones():
    source = (
        "a = 1  # type: ignore[x]\nb = 2  # type: ignore[x]  # why\n# why\nc = 3  # type: ignore\n"
    )
    assert unexplained_type_ignores(source) == [1]


def test_every_type_ignore_says_why():
    """mypy checks the package (``make test``); where it is silenced, a comment says why."""
    bare = [
        f"{where(path)}:{number}"
        for path in MODULES.values()
        for number in unexplained_type_ignores(path.read_text(encoding="utf-8"))
    ]
    assert not bare, "a # type: ignore without a reason:\n" + "\n".join(bare)
