"""A scalar automatic-differentiation engine: ``Value``, one number that remembers how it was made.

Chapter 3 builds it; chapter 11's pure-Python GPT (``tinygpt.scalar_gpt``) is made of it.

Arithmetic on ``Value`` objects and plain numbers (``+ - * /``, constant powers, ``exp``, ``log``,
``tanh``, ``relu``) records, for each output, its inputs and its *local derivatives* (for ``a * b``:
``(b, a)``). ``backward()`` then applies the chain rule once per edge, ``child.grad += local *
node.grad``, in a topological order found without recursion (a graph 100,000 operations deep is
fine). As in PyTorch, a leaf's ``grad`` accumulates across calls (``zero_grad`` resets it); an
interior node's is reset by each ``backward()`` that reaches it. ``gc_paused()`` skips Python's
cycle collector, which such graphs (they have no cycles) do not need: a 2-4x speed-up.

It does not handle tensors (``torch``; :mod:`tinygpt.backprop` differentiates a small tensor
network by hand), higher-order derivatives, or a ``Value`` as an exponent.
"""

from __future__ import annotations

import gc
import math
import numbers
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

Number = int | float


def _as_float(data: object) -> float:
    """``data`` as a float, or a TypeError naming what was given."""
    if isinstance(data, bool) or not isinstance(data, numbers.Real):
        raise TypeError(
            f"Value holds a real number (int or float), got {type(data).__name__}: {data!r}"
        )
    return float(data)


def _check_node(children: tuple, local_grads: tuple) -> None:
    if len(children) != len(local_grads):
        raise ValueError(f"a node needs one local derivative per child: {len(children)} "
                         f"children, {len(local_grads)} local derivatives")


def _check_divisor(a: float, b: float, what: str) -> float:
    """``b``, unless it is zero: then a ``ZeroDivisionError`` for ``a / b``."""
    if b == 0.0:
        raise ZeroDivisionError(f"division {what}: {a!r} / {b!r}")
    return b


def _check_power(x: float, exponent: object) -> float:
    """The constant ``exponent`` as a float, if ``x ** exponent`` is a real number."""
    if isinstance(exponent, Value):
        raise TypeError("Value ** Value is not supported: the exponent must be a constant int or "
                        "float (for a variable exponent write (base.log() * exponent).exp())")
    n = _as_float(exponent)
    if x == 0.0 and n < 0:
        raise ZeroDivisionError(f"0.0 ** {exponent!r}: zero cannot be raised to a negative power")
    if x < 0.0 and not n.is_integer():
        raise ValueError(f"{x!r} ** {exponent!r}: a negative base needs an integer exponent")
    return n


class Value:
    """A scalar in a computation graph: its number ``data`` and, after ``backward()``, ``grad``.

    ``Value(data, children, local_grads)`` with the last two given builds a node by hand: an
    operation's output, its inputs and d(output)/d(input) for each of them. That is how new
    operations are added without changing this class (see ``sigmoid`` in chapter 3).
    """

    __slots__ = ("children", "data", "grad", "local_grads", "op")

    def __init__(
        self,
        data: Number,
        children: tuple[Value, ...] = (),
        local_grads: tuple[float, ...] = (),
        op: str = "",
    ) -> None:
        self.data = data if type(data) is float else _as_float(data)
        _check_node(children, local_grads)
        self.grad = 0.0
        self.children = children  # the Values this one was computed from
        self.local_grads = local_grads  # d(self)/d(child), one per child
        self.op = op  # the operation's name, for display

    def __repr__(self) -> str:
        return f"Value(data={self.data:.6g}, grad={self.grad:.6g})"

    # --- sums and differences: local derivatives are +1 or -1 ---------------------------------
    def __add__(self, other: Value | Number) -> Value:
        if isinstance(other, Value):
            return Value(self.data + other.data, (self, other), (1.0, 1.0), "+")
        return Value(self.data + _as_float(other), (self,), (1.0,), "+")

    def __radd__(self, other: Number) -> Value:  # 1 + v, and sum([...]) which starts at 0
        return Value(_as_float(other) + self.data, (self,), (1.0,), "+")

    def __neg__(self) -> Value:
        return Value(-self.data, (self,), (-1.0,), "neg")

    def __sub__(self, other: Value | Number) -> Value:
        if isinstance(other, Value):
            return Value(self.data - other.data, (self, other), (1.0, -1.0), "-")
        return Value(self.data - _as_float(other), (self,), (1.0,), "-")

    def __rsub__(self, other: Number) -> Value:  # 1 - v
        return Value(_as_float(other) - self.data, (self,), (-1.0,), "-")

    # --- products and quotients ---------------------------------------------------------------
    def __mul__(self, other: Value | Number) -> Value:
        if isinstance(other, Value):  # d(ab)/da = b, d(ab)/db = a
            return Value(self.data * other.data, (self, other), (other.data, self.data), "*")
        c = _as_float(other)
        return Value(self.data * c, (self,), (c,), "*")

    def __rmul__(self, other: Number) -> Value:  # 2 * v
        c = _as_float(other)
        return Value(c * self.data, (self,), (c,), "*")

    def __truediv__(self, other: Value | Number) -> Value:
        if isinstance(other, Value):  # d(a/b)/da = 1/b, d(a/b)/db = -a/b^2
            b = _check_divisor(self.data, other.data, "by a Value equal to zero")
            return Value(self.data / b, (self, other), (1.0 / b, -self.data / (b * b)), "/")
        c = _check_divisor(self.data, _as_float(other), "of a Value by zero")
        return Value(self.data / c, (self,), (1.0 / c,), "/")

    def __rtruediv__(self, other: Number) -> Value:  # 1 / v; d(c/v)/dv = -c/v^2
        c = _as_float(other)
        v = _check_divisor(c, self.data, "by a Value equal to zero")
        return Value(c / v, (self,), (-c / (v * v),), "/")

    def __pow__(self, exponent: Number) -> Value:
        """``v ** n`` for a constant ``n``; d(v^n)/dv = n v^(n-1)."""
        x, n = self.data, _check_power(self.data, exponent)
        local = 0.0 if n == 0.0 else n * x ** (n - 1)
        return Value(x**n, (self,), (local,), f"**{exponent!r}")

    def __rpow__(self, base: Number) -> Value:
        raise TypeError(
            f"{base!r} ** Value is not supported: the exponent must be a constant "
            f"(write (value * math.log({base!r})).exp() for a positive base)"
        )

    # --- functions ----------------------------------------------------------------------------
    def exp(self) -> Value:
        """e^v; its derivative is itself."""
        try:
            out = math.exp(self.data)
        except OverflowError:
            raise OverflowError(f"exp({self.data!r}) is too large for a float") from None
        return Value(out, (self,), (out,), "exp")

    def log(self) -> Value:
        """The natural logarithm, for v > 0; d(ln v)/dv = 1/v."""
        if self.data <= 0.0:
            raise ValueError(f"log needs a positive value, got {self.data!r}")
        return Value(math.log(self.data), (self,), (1.0 / self.data,), "log")

    def tanh(self) -> Value:
        """tanh(v); d tanh(v)/dv = 1 - tanh(v)^2."""
        t = math.tanh(self.data)
        return Value(t, (self,), (1.0 - t * t,), "tanh")

    def relu(self) -> Value:
        """max(0, v); its derivative is 1 for v > 0 and 0 otherwise (0 at v = 0, as in torch)."""
        x = self.data
        return Value(max(x, 0.0), (self,), (1.0 if x > 0.0 else 0.0,), "relu")

    # --- backpropagation ----------------------------------------------------------------------
    def backward(self) -> None:
        """Add d(self)/d(leaf) to every leaf's ``grad``; set every interior node's ``grad``.

        Leaves accumulate across calls (reset them with ``zero_grad``); interior nodes are reset
        first, so calling ``backward()`` twice adds each leaf's gradient exactly twice.
        """
        order = topological_order(self)
        for node in order:
            if node.children:  # interior: forget any earlier backward()
                node.grad = 0.0
        self.grad += 1.0  # d(self)/d(self)
        for node in reversed(order):  # outputs before the inputs they were made from
            g = node.grad
            for child, local in zip(node.children, node.local_grads):
                child.grad += local * g  # the chain rule, one edge at a time


def topological_order(root: Value) -> list[Value]:
    """Every node ``root`` depends on, each once, every node after all of its children.

    A depth-first search with an explicit stack instead of recursion, so any depth works. The
    stack holds the current path from ``root``: each entry is a node and an iterator over its
    children still to look at; a node is emitted when its iterator is exhausted.
    """
    order: list[Value] = []
    visited = {root}
    stack = [(root, iter(root.children))]
    while stack:
        node, children = stack[-1]
        for child in children:
            if child not in visited:  # go down to the first child not seen yet
                visited.add(child)
                stack.append((child, iter(child.children)))
                break
        else:  # all children emitted: emit the node, go back up
            stack.pop()
            order.append(node)
    return order


def zero_grad(params: Iterable[Value]) -> None:
    """Set ``grad`` to 0 on each of ``params``, before the next ``backward()``."""
    for p in params:
        if not isinstance(p, Value):
            raise TypeError(f"zero_grad takes Values, got {type(p).__name__}: {p!r}")
        p.grad = 0.0


@contextmanager
def gc_paused() -> Iterator[None]:
    """Turn Python's cycle collector off inside the block; restore its previous state after.

    Safe for graphs of ``Value`` objects, which contain no reference cycles: each one is freed by
    reference counting as soon as the last reference to its output is dropped.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
