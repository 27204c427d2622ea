"""Command-line options made from the fields of a dataclass (``GPTConfig``, ``TrainConfig``).

It handles the mapping both ways: ``dataclass_options`` adds one option per field (kebab case,
nanoGPT's spelling where ours differs, argparse ``choices`` from a ``Literal`` type, help from
the "Attributes:" section of the docstring), so that a field added to a config is an option with
no change elsewhere; ``name_options`` adds the option names to a config's error message. It does
not parse a command line or run anything (``tinygpt.cli``).
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import types
import typing
from collections.abc import Callable
from typing import Any

from tinygpt.checks import choices

SKIPPED = {"vocab_size"}  # comes from the tokenizer
SPELLINGS = {"learning_rate": ("--lr", "--learning-rate"),  # nanoGPT's name first
             "grad_accum_steps": ("--gradient-accumulation-steps", "--grad-accum-steps")}


def attribute_docs(cls: type) -> dict[str, str]:
    """``{field: text}`` from the "Attributes:" section of ``cls``'s docstring (Google style):
    entries ``name: text`` or ``a, b: text``, continued on more indented lines."""
    _, found, section = inspect.cleandoc(cls.__doc__ or "").partition("Attributes:\n")
    docs: dict[str, str] = {}
    names: list[str] = []
    indent = None
    for line in (section if found else "").splitlines():
        if not line.strip():
            continue
        depth = len(line) - len(line.lstrip())
        indent = depth if indent is None else indent
        if depth < indent:  # the next section
            break
        entry = re.match(r"(\w+(?:, *\w+)*): +(.*)", line.strip())
        if depth == indent and entry:
            names = [n.strip() for n in entry[1].split(",")]
            docs.update(dict.fromkeys(names, entry[2]))
        else:
            docs.update({n: f"{docs[n]} {line.strip()}" for n in names})
    return {name: text.replace("``", "") for name, text in docs.items()}


def option_flags(name: str) -> tuple[str, ...]:
    """The option strings of field ``name``: nanoGPT's spelling where ours differs, else kebab."""
    return SPELLINGS.get(name, ("--" + name.replace("_", "-"),))


def config_fields(cls: type) -> list[str]:
    """The fields of dataclass ``cls`` that are options (init fields but ``SKIPPED``)."""
    return [f.name for f in dataclasses.fields(cls) if f.init and f.name not in SKIPPED]


def parse_hint(hint: Any) -> tuple[Callable[[str], Any] | None, tuple[Any, ...] | None, str]:
    """``(type function, choices, metavar)`` of a type hint; no function means a bool flag."""
    optional = False
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        rest = [a for a in typing.get_args(hint) if a is not type(None)]
        optional = len(rest) < len(typing.get_args(hint))
        hint = rest[0] if len(rest) == 1 else str
    valid = choices(hint) if typing.get_origin(hint) is typing.Literal else None
    hint = type(valid[0]) if valid else hint
    if hint is bool:
        return None, None, ""
    if hint not in (int, float, str):
        raise TypeError(f"no command-line option for a field of type {hint}")
    base = hint

    def convert(text: str) -> Any:
        return None if optional and text.lower() == "none" else base(text)

    name = getattr(base, "__name__", "value")
    convert.__name__ = name + (" or 'none'" if optional else "")  # argparse's "invalid ... value"
    return convert, valid, name.upper() + ("|none" if optional else "")


def dataclass_options(group: Any, cls: type, defaults: dict[str, Any] | None = None) -> None:
    """Add an option for each field of ``config_fields(cls)`` to ``group``.

    An option is absent from the parsed namespace unless given (``argparse.SUPPRESS``), so
    ``--resume`` can tell what was asked for; its help is the docstring's text and the default
    (from ``defaults``, else the field's).
    """
    # get_type_hints resolves the string annotations of ``from __future__ import annotations``
    hints, docs, defaults = typing.get_type_hints(cls), attribute_docs(cls), defaults or {}
    for f in dataclasses.fields(cls):
        if f.name not in config_fields(cls):
            continue
        default = defaults.get(f.name, f.default)
        own = f"; {cls.__name__}'s own: {f.default}" if f.name in defaults else ""
        text = docs.get(f.name, f.name.replace("_", " ")).replace("%", "%%")
        shown = "none" if default is None else default
        kwargs: dict[str, Any] = {"dest": f.name, "default": argparse.SUPPRESS,
                                  "help": f"{text} (default: {shown}{own})"}
        convert, valid, metavar = parse_hint(hints[f.name])
        if convert is None:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs.update(type=convert, choices=valid, metavar=None if valid else metavar)
        group.add_argument(*option_flags(f.name), **kwargs)


def name_options(error: Exception, *classes: type) -> str:
    """``error``'s message, followed by the options of the ``classes``' fields it is about
    (``TrainConfig.learning_rate``: ``--lr``), which a tinygpt check gives as its ``fields``."""
    options = {f"{cls.__name__}.{name}": option_flags(name)[0]
               for cls in classes for name in config_fields(cls)}
    flags = [options[f] for f in getattr(error, "fields", ()) if f in options]
    if not flags:
        return str(error)
    return f"{error} (option{'s' * (len(flags) > 1)} {', '.join(flags)})"
