"""The argument checks of tinygpt's public entry points, written once.

Public functions, constructors and forwards call these in a visible line before any work (a
``GPT``'s ``forward`` begins with ``self.check_inputs(...)``, ``top_k_filter`` with
``check_sampling(...)``), so that bad input gets a clear one-line error; there is no hook, no
decorator and no switch that turns a check off, so what a chapter displays is all that runs.
The rule every check follows: ``TypeError`` when a value has the wrong type (a string or a float
where an integer belongs, a bool where a number belongs), ``ValueError`` when it has the right type
but a wrong value (out of range, not one of the choices). Each message names the argument and says
what it must be and what it got.

It does not check files (``tinygpt.checkpoint.folder``, ``tinygpt.checkpoint.verify``) or
command-line flags (``tinygpt.cli.preflight``, which words its messages for the command line).
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Iterable, Sized
from typing import Any, get_args


class ArgumentValueError(ValueError):
    """A ``ValueError`` about one argument: ``field`` is its name, so that a caller (the command
    line) can name its own option for it without reading the message. An error about how two
    arguments fit together names both: ``fields`` holds ``field`` and the others."""

    def __init__(self, message: str, field: str, *others: str) -> None:
        super().__init__(message)
        self.field = field
        self.fields = (field, *others)


class ArgumentTypeError(TypeError):
    """A ``TypeError`` about one argument: ``field`` is its name (as ``ArgumentValueError``)."""

    def __init__(self, message: str, field: str, *others: str) -> None:
        super().__init__(message)
        self.field = field
        self.fields = (field, *others)


def choices(literal: Any) -> tuple[str, ...]:
    """The values of a ``Literal[...]`` type, in order: ``choices(Norm) == ("layernorm", ...)``."""
    return get_args(literal)


def check_instance(value: object, cls: type | tuple[type, ...], name: str) -> None:
    """``TypeError`` unless ``value`` is an instance of ``cls``."""
    if not isinstance(value, cls):
        names = " or ".join(c.__name__ for c in (cls if isinstance(cls, tuple) else (cls,)))
        raise ArgumentTypeError(f"{name} must be a {names}, got {type(value).__name__}", name)


def check_int(value: object, name: str, low: int = 1, high: int | None = None) -> int:
    """``value`` if it is an ``int`` (not a bool) in ``[low, high]``; else a clear error."""
    in_words = "a positive integer" if low == 1 and high is None else (
        f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]")
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentTypeError(f"{name} must be {in_words}, got {value!r}", name)
    if value < low or (high is not None and value > high):
        raise ArgumentValueError(f"{name} must be {in_words}, got {value!r}", name)
    return value


def check_float(value: object, name: str, low: float = -math.inf, high: float = math.inf, *,
                low_open: bool = False, high_open: bool = False) -> float:
    """``value`` as a float if it is a finite number (not a bool) in the interval; else an error.

    ``low_open``/``high_open`` exclude that end: ``check_float(p, "dropout", 0, 1,
    high_open=True)`` accepts ``[0, 1)``.
    """
    interval = (f"{'(' if low_open or low == -math.inf else '['}{low:g}, "
                f"{high:g}{')' if high_open or high == math.inf else ']'}")  # inf is not allowed
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ArgumentTypeError(f"{name} must be a number in {interval}, got {value!r}", name)
    too_low = value <= low if low_open else value < low
    too_high = value >= high if high_open else value > high
    if not math.isfinite(value) or too_low or too_high:
        raise ArgumentValueError(f"{name} must be in {interval}, got {value!r}", name)
    return float(value)


def check_bool(value: object, name: str) -> bool:
    """``value`` if it is ``True`` or ``False`` (not 0, 1 or a string); else ``TypeError``."""
    if not isinstance(value, bool):
        raise ArgumentTypeError(f"{name} must be True or False, got {value!r}", name)
    return value


def check_choice(value: object, name: str, valid: tuple[str, ...]) -> str:
    """``value`` if it is one of the strings ``valid``; else an error that lists them."""
    if not isinstance(value, str):
        raise ArgumentTypeError(f"{name} must be one of {list(valid)}, got {value!r}", name)
    if value not in valid:
        raise ArgumentValueError(f"{name} must be one of {list(valid)}, got {value!r}", name)
    return value


def check_token_ids(idx: object, vocab_size: int, block_size: int | None = None,
                    name: str = "token ids") -> None:
    """Raise a clear error unless ``idx`` is a ``(B, T)`` integer tensor of ids in ``[0, V)``.

    With ``block_size`` given, ``T`` must also be at most ``block_size`` (the context length
    ``T_max``). ``TypeError`` for a non-tensor or a non-integer dtype; ``ValueError`` naming the
    offending shape, length or id otherwise.
    """
    import torch  # here, so that the command line can check its flags without importing torch

    if not isinstance(idx, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape (B, T), got {type(idx).__name__}")
    if idx.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{name} must be an integer tensor (torch.long or torch.int32), got "
                        f"{idx.dtype}; convert with .long()")
    if idx.ndim != 2:
        hint = " (for one sequence, use idx[None])" if idx.ndim == 1 else ""
        raise ValueError(f"{name} must have shape (B, T), got shape {tuple(idx.shape)}{hint}")
    T = idx.shape[1]
    if block_size is not None and T > block_size:
        raise ValueError(f"sequence length T={T} exceeds the context length T_max={block_size}; "
                         f"crop the input to its last {block_size} tokens")
    if idx.numel() == 0:
        return
    low, high = int(idx.min()), int(idx.max())
    for bad in (low, high):
        if not 0 <= bad < vocab_size:
            b, t = (idx == bad).nonzero()[0].tolist()
            raise ValueError(f"token id {bad} at position (b={b}, t={t}) is outside the "
                             f"vocabulary: ids must be in [0, {vocab_size - 1}] for V={vocab_size}")


def check_ids(ids: object, vocab_size: int, min_len: int = 0, name: str = "token") -> None:
    """Raise a clear error unless ``ids`` is a 1-D sequence of at least ``min_len`` integer ids
    in ``[0, vocab_size)``: a list or tuple of ints, or a 1-D integer numpy array or tensor.

    ``TypeError`` for text, floats or bools; ``ValueError`` naming the shape, the length or the
    first unknown id (``"unknown token id 7: valid ids are 0..4"``).
    """
    if isinstance(ids, (str, bytes)):
        raise TypeError(f"{name} ids must be integers, not a {type(ids).__name__}: "
                        "encode the text with a tokenizer first")
    if hasattr(ids, "ndim") and hasattr(ids, "dtype"):  # a numpy array or a torch tensor
        array: Any = ids  # either kind: what is used below, both have
        if array.ndim != 1:
            raise ValueError(f"{name} ids must be a 1-D sequence, got shape {tuple(array.shape)}")
        if "int" not in str(array.dtype):  # int8..int64, uint8..: not bool, not float
            raise TypeError(f"{name} ids must be integers, got dtype {array.dtype}")
        out_of_range = (array < 0) | (array >= vocab_size)
        bad = [int(array[out_of_range][0])] if bool(out_of_range.any()) else []
        length = len(array)
    else:
        if not isinstance(ids, Iterable) or not isinstance(ids, Sized):
            raise TypeError(f"{name} ids must be a sequence of ints, got {type(ids).__name__}")
        for i in ids:
            if isinstance(i, bool) or not isinstance(i, numbers.Integral):
                if hasattr(i, "__len__"):
                    raise ValueError(f"{name} ids must be a 1-D sequence of ints, found {i!r}")
                raise TypeError(f"{name} ids must be integers, found {i!r}")
        bad = [i for i in ids if not 0 <= i < vocab_size][:1]
        length = len(ids)
    if length < min_len:
        raise ValueError(f"need at least {min_len} {name} ids, got {length}")
    if bad:
        raise ValueError(f"unknown {name} id {bad[0]}: valid ids are 0..{vocab_size - 1}")


def check_text(text: object, name: str = "text") -> str:
    """``text`` if it is a str that UTF-8 can encode; ``TypeError`` for a non-str, ``ValueError``
    naming the first lone surrogate (U+D800..U+DFFF: half of a UTF-16 pair, not text)."""
    if not isinstance(text, str):
        raise TypeError(f"{name} must be a str, not {type(text).__name__}")
    bad = re.search("[\ud800-\udfff]", text)
    if bad:
        raise ValueError(f"character U+{ord(bad.group()):04X} at position {bad.start()} is a "
                         "lone surrogate, which is not text: UTF-8 cannot encode it")
    return text
