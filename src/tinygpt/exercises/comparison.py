"""Comparing a reader's result with the expected one, and writing either briefly.

``difference`` says in one line what differs first: the type, the length, a tensor's shape or
dtype, or its values (how many differ, the first one, and by how much), or None when they match.
Floating-point tensors match within a tolerance set by their dtype (float32's rounding is about
1e-7, float64's 1e-16, and a reader's correct formula may round differently from the
reference's); ``nan`` matches ``nan`` and an infinity only the same infinity. ``brief`` writes a
value in one line: a tensor as its shape, dtype and first values; an object whose ``repr``
raises as ``<a Foo object>``. ``what_differs`` says concretely how a wrong result differs, for a
hint when no known mistake explains it: "shape (2, 3), expected (2, 4)", "every value is 2
times the expected", "largest difference 0.12 at [0, 2]".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from numbers import Integral, Real
from typing import Any

import torch

from tinygpt.exercises.running import safe_repr

# (rtol, atol) by dtype; other dtypes must be equal
TOLERANCE = {torch.float64: (1e-7, 1e-9), torch.float32: (2e-5, 2e-6),
             torch.float16: (1e-2, 1e-3), torch.bfloat16: (2e-2, 1e-2)}


def brief(value: Any, width: int = 6) -> str:
    """``value`` in one line: a tensor as ``tensor (2, 3) float32 [0.1, 0.2, ...]``."""
    if isinstance(value, torch.Tensor):
        dtype = str(value.dtype).removeprefix("torch.")
        flat = value.detach().flatten().tolist()
        shown = ", ".join(number(v) for v in flat[:width]) + (", ..." if len(flat) > width else "")
        return f"tensor {tuple(value.shape)} {dtype} [{shown}]"
    if isinstance(value, (list, tuple)):
        shown = ", ".join(brief(v, 3) for v in value[: 2 * width])
        if len(value) > 2 * width:
            shown += f", ... ({len(value)} items)"
        return f"[{shown}]" if isinstance(value, list) else f"({shown})"
    if isinstance(value, float):
        return number(value)
    if isinstance(value, Mapping):
        items = list(value.items())
        shown = ", ".join(f"{brief(k, 3)}: {brief(v, 3)}" for k, v in items[: 2 * width])
        return "{" + shown + (", ..." if len(items) > 2 * width else "") + "}"
    text = safe_repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def number(v: Any) -> str:
    """A number in at most 6 significant digits."""
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def difference(expected: Any, got: Any, parts: Sequence[str] = (), where: str = "",
               tolerance: Mapping[torch.dtype, tuple[float, float]] | None = None) -> str | None:
    """What differs first between ``expected`` and ``got``, in one line, or None if they match.
    ``parts`` names the items of a tuple; ``where`` says which item is compared; ``tolerance``
    replaces ``TOLERANCE`` for the dtypes it names."""
    at = f"{where}: " if where else ""
    if isinstance(expected, torch.Tensor):
        return tensor_difference(expected, got, at, {**TOLERANCE, **(tolerance or {})})
    if isinstance(expected, (list, tuple)):
        if not isinstance(got, (list, tuple)):
            return f"{at}expected a {type(expected).__name__} of {len(expected)} items, got " \
                   f"{type(got).__name__}"
        if len(got) != len(expected):
            return f"{at}expected {len(expected)} items, got {len(got)}"
        for i, (e, g) in enumerate(zip(expected, got)):
            name = parts[i] if i < len(parts) else f"{where}[{i}]"
            found = difference(e, g, (), name, tolerance)
            if found:
                return found
        return None
    if isinstance(expected, Mapping):
        if not isinstance(got, Mapping):
            return f"{at}expected a dict, got {type(got).__name__}"
        missing, extra = set(expected) - set(got), set(got) - set(expected)
        if missing or extra:
            return (f"{at}keys differ: missing {brief(sorted(missing))}, "
                    f"not expected {brief(sorted(extra))}")
        for key in expected:
            found = difference(expected[key], got[key], (), f"{where}[{key!r}]", tolerance)
            if found:
                return found
        return None
    if isinstance(got, torch.Tensor) and got.numel() == 1:
        got = got.item()  # a one-element tensor for a number is fine
    if isinstance(expected, bool) or not isinstance(expected, Real):
        return None if got == expected else f"{at}expected {brief(expected)}, got {brief(got)}"
    if isinstance(got, bool) or not isinstance(got, Real):
        return f"{at}expected a number, got {type(got).__name__} {brief(got)}"
    if isinstance(expected, Integral):
        if got != expected:
            return f"{at}expected {expected}, got {number(got)}"
        return None
    if math.isnan(expected) and math.isnan(got):
        return None
    if not math.isclose(expected, got, rel_tol=1e-7, abs_tol=1e-12):
        return f"{at}expected {number(float(expected))}, got {number(float(got))}"
    return None


def tensor_difference(expected: torch.Tensor, got: Any, at: str,
                      tolerance: Mapping[torch.dtype, tuple[float, float]]) -> str | None:
    """``difference`` for an expected tensor, within ``tolerance`` (dtype -> rtol, atol)."""
    if not isinstance(got, torch.Tensor):
        return f"{at}expected a tensor, got {type(got).__name__} {brief(got)}"
    if tuple(got.shape) != tuple(expected.shape):
        return f"{at}expected shape {tuple(expected.shape)}, got {tuple(got.shape)}"
    if got.dtype != expected.dtype:
        return f"{at}expected dtype {expected.dtype}, got {got.dtype}"
    got, expected = got.detach().cpu(), expected.detach().cpu()
    if expected.is_floating_point():
        rtol, atol = tolerance.get(expected.dtype, (0.0, 0.0))
        same = torch.isclose(got, expected, rtol=rtol, atol=atol, equal_nan=True)
    else:
        same = got == expected
    if bool(same.all()):
        return None
    bad = (~same).nonzero()
    first = tuple(bad[0].tolist())
    e, g = expected[first].item(), got[first].item()
    index = ", ".join(map(str, first))
    return (f"{at}{len(bad)} of {expected.numel()} values differ; the first at [{index}]: "
            f"expected {number(e)}, got {number(g)}")


def what_differs(expected: Any, got: Any, parts: Sequence[str] = ()) -> str:
    """How ``got`` differs from ``expected``, concretely, in one phrase."""
    if isinstance(expected, (list, tuple)) and parts and isinstance(got, (list, tuple)) \
            and len(got) == len(expected):
        for name, e, g in zip(parts, expected, got):
            if difference(e, g) is not None:
                return f"{name}: {what_differs(e, g)}"
    if isinstance(expected, torch.Tensor) and isinstance(got, torch.Tensor):
        return tensor_differs(expected, got)
    if isinstance(expected, Real) and isinstance(got, Real) and not isinstance(got, bool):
        e, g = float(expected), float(got)
        times = f": {g / e:.4g} times the expected" if e and math.isfinite(g / e) else ""
        return f"expected {number(e)}, got {number(g)}{times}"
    if isinstance(expected, (list, tuple)) and isinstance(got, (list, tuple)):
        first = next((i for i, (e, g) in enumerate(zip(expected, got)) if e != g),
                     min(len(got), len(expected)))
        shown = (f"position {first}: expected {brief(expected[first])}, got "
                 f"{brief(got[first]) if first < len(got) else 'nothing'}"
                 if first < len(expected) else f"position {first}: an item too many")
        size = f"length {len(got)}, expected {len(expected)}; " if len(got) != len(expected) \
            else ""
        return f"{size}the first difference at {shown}"
    return difference(expected, got, parts) or "your result differs from the expected"


def tensor_differs(expected: torch.Tensor, got: torch.Tensor) -> str:
    """``what_differs`` for two tensors: shape, dtype, a non-finite value, a pattern (transposed,
    the opposite sign, a constant factor or offset), or the largest difference and where."""
    if tuple(got.shape) != tuple(expected.shape):
        return (f"shape {tuple(got.shape)}, expected {tuple(expected.shape)}: check which "
                "dimension you reduce or index over, and keepdim=True where the result must "
                "broadcast back")
    if got.dtype != expected.dtype:
        return (f"dtype {got.dtype}, expected {expected.dtype}: keep the input's dtype "
                "(torch.zeros_like(x), dtype=x.dtype), don't convert it")
    e, g = expected.detach().cpu().double(), got.detach().cpu().double()
    if e.dim() == 0:
        return what_differs(e.item(), g.item())
    finite = torch.isfinite(e) & torch.isfinite(g)
    alike = (g == e) | (g.isnan() & e.isnan())  # an infinity matches only itself
    bad = (~finite & ~alike).nonzero()
    if len(bad):
        at = tuple(bad[0].tolist())
        cause = (": a value overflowed, or reached 0 before a log or a division"
                 if torch.isfinite(e[at]) else "")
        return (f"{number(g[at].item())} at {list(at)} where {number(e[at].item())} is "
                f"expected{cause}")
    if e.dim() >= 2 and e.shape[-1] == e.shape[-2] and torch.allclose(
            g, e.transpose(-1, -2), rtol=1e-5, atol=1e-8, equal_nan=True):
        return "your result is the expected one transposed (rows and columns swapped)"
    if finite.all() and torch.allclose(g, -e, rtol=1e-5, atol=1e-8):
        return "your result is the expected one with the opposite sign"
    nonzero = finite & (e.abs() > 1e-12)
    if finite.all() and nonzero.any() and (g[~nonzero].abs() < 1e-12).all():
        ratio = g[nonzero] / e[nonzero]
        if torch.allclose(ratio, ratio[0].expand_as(ratio), rtol=1e-4):
            return f"every value is {number(ratio[0].item())} times the expected"
    if finite.all() and e.numel() > 1:
        offset = (g - e).flatten()
        if torch.allclose(offset, offset[0].expand_as(offset), rtol=1e-4, atol=1e-9):
            return f"every value is off by {number(offset[0].item())}"
    gap = torch.where(finite, (g - e).abs(), 0.0)  # the non-finite ones are alike here
    at = tuple(int(i) for i in torch.unravel_index(gap.argmax(), gap.shape))
    return (f"the largest difference, {number(gap[at].item())}, is at {list(at)}: expected "
            f"{number(e[at].item())}, got {number(g[at].item())}")
