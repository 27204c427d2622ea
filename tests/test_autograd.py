"""Tests of tinygpt.autograd: the scalar engine against torch.autograd and finite differences.

References: every operation and random expression trees (hypothesis) are mirrored in float64
torch, whose values and gradients must agree to 1e-6 relative; the same trees are checked by
central finite differences; repeated backward() calls are compared with torch's
``retain_graph=True`` behaviour.
"""

import gc
import math
import operator
import re
import sys

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tinygpt.autograd import Value, gc_paused, topological_order, zero_grad

FAST = settings(max_examples=150, deadline=None)


def close(a: float, b: float, rel: float = 1e-6, abs_: float = 1e-9) -> bool:
    return abs(a - b) <= rel * max(abs(a), abs(b)) + abs_


# --- each operation, against torch -------------------------------------------------------------
# (name, function of two arguments a, b, in which either may be a Value/tensor or a float)
BINARY = [
    ("add", operator.add),
    ("sub", operator.sub),
    ("mul", operator.mul),
    ("truediv", operator.truediv),
]
UNARY = [
    ("neg", lambda v: -v),
    ("exp", lambda v: v.exp()),
    ("log", lambda v: v.log()),
    ("tanh", lambda v: v.tanh()),
    ("relu", lambda v: v.relu()),
    ("square", lambda v: v**2),
    ("cube", lambda v: v**3),
    ("inverse", lambda v: v**-1),
    ("sqrt", lambda v: v**0.5),
    ("rsqrt", lambda v: v**-0.5),
    ("pow0", lambda v: v**0),
]


@pytest.mark.parametrize("name,fn", BINARY, ids=[n for n, _ in BINARY])
@pytest.mark.parametrize("left,right", [(1.7, -0.6), (-2.5, 3.0), (0.3, 0.9)])
@pytest.mark.parametrize("kind", ["value-value", "value-float", "float-value"])
def test_binary_ops_match_torch(name, fn, left, right, kind):
    a, b = Value(left), Value(right)
    ta = torch.tensor(left, dtype=torch.float64, requires_grad=True)
    tb = torch.tensor(right, dtype=torch.float64, requires_grad=True)
    if kind == "value-value":
        out, ref = fn(a, b), fn(ta, tb)
    elif kind == "value-float":
        out, ref = fn(a, right), fn(ta, right)
    else:
        out, ref = fn(left, b), fn(left, tb)
    out.backward()
    ref.backward()
    assert close(out.data, ref.item())
    for v, t in [(a, ta), (b, tb)]:
        assert close(v.grad, 0.0 if t.grad is None else t.grad.item())


@pytest.mark.parametrize("name,fn", UNARY, ids=[n for n, _ in UNARY])
@pytest.mark.parametrize("x", [0.7, 2.3, -1.2, 0.0])
def test_unary_ops_match_torch(name, fn, x):
    if (name in ("log", "sqrt", "rsqrt") and x <= 0) or (name == "inverse" and x == 0):
        return  # outside the domain: the error tests below cover these
    v = Value(x)
    t = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    out, ref = fn(v), fn(t)
    out.backward()
    ref.backward()
    assert close(out.data, ref.item())
    assert close(v.grad, t.grad.item())


def test_relu_gradient_at_zero_is_zero_like_torch():
    v, t = Value(0.0), torch.tensor(0.0, dtype=torch.float64, requires_grad=True)
    v.relu().backward()
    t.relu().backward()
    assert v.grad == t.grad.item() == 0.0


# --- random expression trees (hypothesis), against torch and finite differences --------------
N_LEAVES = 3


STEP = {  # op name -> function of (a, b, c): two earlier nodes and a constant
    "add": lambda a, b, c: a + b,
    "sub": lambda a, b, c: a - b,
    "mul": lambda a, b, c: a * b,
    "div": lambda a, b, c: a / b,
    "cadd": lambda a, b, c: c + a,
    "rsub": lambda a, b, c: c - a,
    "cmul": lambda a, b, c: c * a,
    "rdiv": lambda a, b, c: c / a,
    "neg": lambda a, b, c: -a,
    "exp": lambda a, b, c: a.exp(),
    "log": lambda a, b, c: a.log(),
    "tanh": lambda a, b, c: a.tanh(),
    "relu": lambda a, b, c: a.relu(),
    "pow2": lambda a, b, c: a**2,
    "pow3": lambda a, b, c: a**3,
    "powm1": lambda a, b, c: a**-1,
    "sqrt": lambda a, b, c: a**0.5,
}


@st.composite
def programs(draw, smooth: bool = False):
    """Leaf values and a list of steps (op, i, j, const) over earlier nodes: reuse is common."""
    leaves = draw(st.lists(st.floats(-2.0, 2.0), min_size=N_LEAVES, max_size=N_LEAVES))
    ops = sorted(op for op in STEP if not (smooth and op == "relu"))
    steps = []
    for k in range(draw(st.integers(1, 12))):
        n_nodes = N_LEAVES + k
        steps.append(
            (
                draw(st.sampled_from(ops)),
                draw(st.integers(0, n_nodes - 1)),
                draw(st.integers(0, n_nodes - 1)),
                draw(st.floats(-3.0, 3.0)),
            )
        )
    return leaves, steps


def run(program, leaves, check=False):
    """Evaluate a program on ``leaves`` (Values or tensors); the output is the sum of all nodes.

    With ``check``, steps outside an operation's domain, or far from it, are rejected.
    """
    values, steps = list(leaves), program
    for op, i, j, c in steps:
        a, b = values[i], values[j]
        if check:  # only Values are checked
            x, y = a.data, b.data
            assume(not (op == "div" and abs(y) < 0.1) and not (op == "rdiv" and abs(x) < 0.1))
            assume(not (op in ("log", "sqrt") and x < 0.1) and not (op == "powm1" and abs(x) < 0.1))
            assume(not (op == "exp" and x > 5) and not (op == "relu" and abs(x) < 1e-3))
        out = STEP[op](a, b, c)
        if check:
            assume(abs(out.data) < 1e4)
        values.append(out)
    return sum(values[1:], values[0])


@FAST
@given(programs())
def test_random_expressions_match_torch(prog):
    leaf_values, steps = prog
    xs = [Value(v) for v in leaf_values]
    out = run(steps, xs, check=True)
    ts = [torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in leaf_values]
    ref = run(steps, ts)
    out.backward()
    ref.backward()
    assert close(out.data, ref.item())
    scale = max([1.0] + [abs(t.grad.item()) for t in ts])
    for x, t in zip(xs, ts):
        assert close(x.grad, t.grad.item(), abs_=1e-9 * scale), (x.grad, t.grad.item())


@FAST
@given(programs(smooth=True))
def test_random_expressions_match_finite_differences(prog):
    leaf_values, steps = prog
    xs = [Value(v) for v in leaf_values]
    out = run(steps, xs, check=True)
    out.backward()
    eps = 1e-6
    for k in range(N_LEAVES):
        plus = [v + eps * (i == k) for i, v in enumerate(leaf_values)]
        minus = [v - eps * (i == k) for i, v in enumerate(leaf_values)]
        numeric = (
            run(steps, [Value(v) for v in plus]).data - run(steps, [Value(v) for v in minus]).data
        ) / (2 * eps)
        assert abs(numeric - xs[k].grad) <= 1e-4 * max(1.0, abs(numeric)), (k, numeric, xs[k].grad)


# --- reuse, repeated backward, zero_grad ---------------------------------------------------------
def test_a_node_used_twice_accumulates():
    x = Value(3.0)
    (x * x).backward()
    assert x.grad == 6.0  # d(x^2)/dx = 2x, one x from each use
    x, y = Value(1.5), Value(-0.5)
    a = x + y
    b = a * a
    b.backward()
    assert x.grad == y.grad == 2 * a.data and a.grad == 2 * a.data


def test_backward_twice_accumulates_leaves_like_torch_retain_graph():
    def build(lib_x, lib_y):
        a = lib_x * lib_y + lib_x  # interior nodes used twice below
        b = a * a + a.tanh()
        return a, b

    x, y = Value(0.8), Value(-1.3)
    a, b = build(x, y)
    b.backward()
    once = (x.grad, y.grad, a.grad)
    b.backward()
    tx = torch.tensor(0.8, dtype=torch.float64, requires_grad=True)
    ty = torch.tensor(-1.3, dtype=torch.float64, requires_grad=True)
    _, tb = build(tx, ty)
    tb.backward(retain_graph=True)
    tb.backward()
    assert close(x.grad, tx.grad.item()) and close(y.grad, ty.grad.item())
    assert close(x.grad, 2 * once[0]) and close(y.grad, 2 * once[1])
    assert a.grad == once[2]  # an interior node holds the latest call's gradient, not the sum


def test_zero_grad_resets_and_next_backward_is_fresh():
    x, y = Value(2.0), Value(3.0)
    out = x * y + x
    out.backward()
    out.backward()
    zero_grad([x, y])
    assert x.grad == y.grad == 0.0
    out.backward()
    assert (x.grad, y.grad) == (4.0, 2.0)
    with pytest.raises(TypeError, match="zero_grad takes Values"):
        zero_grad([x, 1.0])


def test_backward_on_a_leaf_and_on_a_subexpression():
    x = Value(5.0)
    x.backward()
    assert x.grad == 1.0
    y = Value(2.0)
    a = y * y
    b = a * 3
    b.backward()
    assert y.grad == 12.0
    a.backward()  # a is the root now: its grad restarts at 1, y adds 2y
    assert a.grad == 1.0 and y.grad == 16.0


def test_deep_chain_does_not_hit_the_recursion_limit():
    n = 100_000
    assert n > sys.getrecursionlimit()
    x = Value(0.5)
    s = x
    for _ in range(n):
        s = s + x
    s.backward()
    assert x.grad == n + 1
    assert len(topological_order(s)) == n + 1


def test_topological_order_puts_children_first_and_lists_each_node_once():
    x, y = Value(1.0), Value(2.0)
    a = x * y
    b = a + x
    c = b * a - y.exp()
    order = topological_order(c)
    position = {id(v): i for i, v in enumerate(order)}
    assert len(order) == len(position) == 7  # x, y, a, b, b*a, exp(y), c
    for node in order:
        for child in node.children:
            assert position[id(child)] < position[id(node)]
    assert order[-1] is c


# --- plain numbers on either side, sum, slots --------------------------------------------------
def test_plain_numbers_on_either_side_and_sum():
    v = Value(4.0)
    results = [2 * v, v * 2, v + 1, 1 + v, v - 1, 1 - v, v / 2, 1 / v, -v, v**2]
    assert [r.data for r in results] == [8.0, 8.0, 5.0, 5.0, 3.0, -3.0, 2.0, 0.25, -4.0, 16.0]
    total = sum(results)  # starts from the int 0
    total.backward()
    assert close(v.grad, 2 + 2 + 1 + 1 + 1 - 1 + 0.5 - 1 / 16 - 1 + 8)
    assert all(len(r.children) == 1 for r in results)  # a constant is not a node of the graph


def test_value_uses_slots():
    v = Value(1.0)
    assert not hasattr(v, "__dict__")
    with pytest.raises(AttributeError):
        v.label = "x"


# --- clear errors ------------------------------------------------------------------------------
def test_clear_errors():
    with pytest.raises(ValueError, match=re.escape("log needs a positive value, got 0.0")):
        Value(0.0).log()
    with pytest.raises(ValueError, match=re.escape("log needs a positive value, got -1.0")):
        Value(-1.0).log()
    with pytest.raises(ZeroDivisionError, match="equal to zero"):
        Value(1.0) / Value(0.0)
    with pytest.raises(ZeroDivisionError, match="by zero"):
        Value(1.0) / 0
    with pytest.raises(ZeroDivisionError, match="equal to zero"):
        1 / Value(0.0)
    with pytest.raises(ZeroDivisionError, match="negative power"):
        Value(0.0) ** -1
    with pytest.raises(ValueError, match="negative base needs an integer exponent"):
        Value(-8.0) ** (1 / 3)
    with pytest.raises(TypeError, match="exponent must be a constant"):
        Value(2.0) ** Value(3.0)
    with pytest.raises(TypeError, match="exponent must be a constant"):
        2 ** Value(3.0)
    with pytest.raises(TypeError, match="real number"):
        Value("3")
    with pytest.raises(TypeError, match="real number"):
        Value(1.0) + "a"
    with pytest.raises(TypeError, match="real number"):
        Value(True)
    with pytest.raises(ValueError, match="one local derivative per child"):
        Value(1.0, (Value(2.0),), ())
    with pytest.raises(OverflowError, match="too large"):
        Value(1000.0).exp()


def test_integer_and_negative_powers_of_negative_bases_match_math():
    for x, n in [(-2.0, 3), (-2.0, 2), (-0.5, -1), (-3.0, -2)]:
        v = Value(x)
        (v**n).backward()
        assert close((v**n).data, x**n) and close(v.grad, n * x ** (n - 1))
    assert math.isclose((Value(9.0) ** 0.5).data, 3.0)


def test_gc_paused_restores_the_collector_and_graphs_have_no_cycles():
    assert gc.isenabled()
    with pytest.raises(RuntimeError), gc_paused():
        assert not gc.isenabled()
        raise RuntimeError
    assert gc.isenabled()
    gc.collect()
    with gc_paused():
        xs = [Value(float(i)) for i in range(50)]
        loss = sum(x * x.tanh() + (x - 1).relu() for x in xs) / 50
        loss.backward()
        del loss
        assert gc.collect() == 0  # nothing was left for the cycle collector: no cycles
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()  # a collector that was off stays off
    finally:
        gc.enable()
