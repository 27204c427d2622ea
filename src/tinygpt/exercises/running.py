"""Running the reader's function once, so that nothing it does can stop or fool the checker.

``run(fn, args, kwargs)`` calls ``fn`` on copies of the inputs and returns a ``Run``: what it
returned, or the exception it raised (as ``Raised``, with the line of the reader's code), which
inputs it changed in place, and which functions of torch, the package or the standard library it
replaced. Four things are guarded against:

* an exception, ``sys.exit()`` included, is reported, never propagated (Ctrl-C still stops);
* a call that takes longer than ``TIME_LIMIT`` seconds is stopped (``TookTooLong``): by
  ``SIGALRM`` on the main thread, or else by waiting for a worker thread, which is then left
  behind since Python cannot stop a thread;
* a public function of the watched namespaces (``torch``, ``torch.nn.functional``,
  ``torch.Tensor``, the ``tinygpt`` modules, ``math``, ``builtins`` ...) that the reader's code
  replaced is put
  back after the call and named in ``Run.replaced``; ``restore()`` puts back what was replaced
  before (by the reader's file or notebook) since this module was imported;
* an object whose ``repr`` or ``str`` raises is written as ``<a Foo object>`` (``safe_repr``).

It does not sandbox: the reader's code may still write files or call ``os._exit``.
"""

from __future__ import annotations

import builtins
import collections
import copy
import functools
import inspect
import itertools
import math
import operator
import signal
import sys
import threading
import time
import traceback
import types
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

TIME_LIMIT = 10.0  # seconds for one call of the reader's function


class TookTooLong(BaseException):
    """Raised into the reader's code when its call passes the time limit (a ``BaseException``,
    so that ``except Exception`` in their code does not swallow it)."""


class Raised(Exception):
    """The reader's function raised ``error``; ``where`` is the line of their code."""

    def __init__(self, error: BaseException, where: str) -> None:
        super().__init__(safe_str(error))
        self.error = error
        self.where = where

    @property
    def kind(self) -> str:
        return type(self.error).__name__


@dataclass(frozen=True)
class Run:
    """One call: ``value`` (or a ``Raised``), the names of the inputs it changed in place, and
    the watched functions it replaced (``torch.softmax``, ...), which are back in place."""

    value: Any
    changed: tuple[str, ...] = ()
    replaced: tuple[str, ...] = ()


def safe_repr(value: Any) -> str:
    """``repr(value)``, or ``<a Foo object>`` when its ``repr`` raises."""
    try:
        text = repr(value)
        if isinstance(text, str):
            return text
    except Exception:  # the reader's object: its repr may do anything
        pass
    return f"<a {type(value).__name__} object>"


def safe_str(error: BaseException) -> str:
    """``str(error)``, or a placeholder when its ``__str__`` raises."""
    try:
        text = str(error)
        if isinstance(text, str):
            return text
    except Exception:  # the reader's exception class
        pass
    return f"<a {type(error).__name__} whose message cannot be written>"


# -- the watched namespaces --------------------------------------------------------------------

STANDARD = (builtins, math, copy, functools, itertools, operator, collections, np,
            torch, F, torch.linalg, torch.special, torch.nn, torch.nn.init, torch.optim)


HOST_BUILTINS = frozenset({"input", "get_ipython", "display", "exit", "quit", "help"})
# builtins a Jupyter kernel sets again before every cell (ipykernel's ``input`` forwards the
# reader's typing to the page): the host's, not the reader's, and no reference calls them


def namespaces() -> dict[str, Any]:
    """The modules and classes watched, by name: the standard ones, torch.optim's and the
    tinygpt modules loaded now, and torch.Tensor and the optimizers (classes gain no
    attributes legitimately)."""
    found: dict[str, Any] = {m.__name__: m for m in STANDARD}
    for name, module in list(sys.modules.items()):
        if isinstance(module, types.ModuleType) and (
                name == "tinygpt" or name.startswith(("tinygpt.", "torch.optim."))):
            found[name] = module
    found["torch.Tensor"] = torch.Tensor
    for cls in (torch.optim.Optimizer, torch.optim.Adam, torch.optim.AdamW):
        found[f"torch.optim.{cls.__name__}"] = cls
    return found


def watched(value: Any) -> bool:
    """Whether a module attribute is watched: a function, class or module, not data (a
    module's flag or cache may change legitimately)."""
    return callable(value) or inspect.ismodule(value)


@dataclass(frozen=True)
class Watch:
    """A namespace and its watched attributes as they were: all of a class's; a module's
    functions, classes and modules. ``current`` reads them all again, in one C call."""

    space: Any
    pristine: dict[str, Any]
    values: tuple[Any, ...]
    current: Callable[[Any], Any]

    @classmethod
    def of(cls, space: Any) -> Watch:
        hosts = HOST_BUILTINS if space is builtins else frozenset()
        pristine = {key: value for key, value in vars(space).items() if isinstance(space, type)
                    or (watched(value) and not key.startswith("_") and key not in hosts)}
        # a module's private names may change as it works (a test runner's hooks, lazy imports)
        return cls.holding(space, pristine)

    @classmethod
    def holding(cls, space: Any, pristine: dict[str, Any]) -> Watch:
        keys = [*pristine]
        getter = operator.itemgetter(*keys) if len(keys) > 1 else (
            lambda now: tuple(now[key] for key in keys))  # itemgetter of one key: no tuple
        return cls(space, pristine, tuple(pristine.values()), getter)

    def unchanged(self) -> bool:
        """The quick test: every attribute is still the same object (``is``, never ``==``,
        which the reader's object may answer as it likes), and a class has gained none."""
        now = vars(self.space)
        try:
            current = self.current(now)
        except KeyError:  # one was deleted
            return False
        return (len(current) == len(self.values) and all(map(operator.is_, current, self.values))
                and not (isinstance(self.space, type) and len(now) != len(self.pristine)))


def torch_wraps(new: Any, old: Any) -> bool:
    """Whether ``new`` is torch's own wrapper of ``old`` (``functools.wraps`` in a file of
    torch's, as torch._dynamo wraps torch.manual_seed on its import): not the reader's."""
    code = getattr(new, "__code__", None)
    return (code is not None and old is not MISSING and inspect.unwrap(new) is inspect.unwrap(old)
            and Path(code.co_filename).is_relative_to(Path(torch.__file__).parent))


MISSING = object()
PYTHON_CACHES = frozenset({"__slotnames__"})  # what copyreg stores on a class it first copies
PRISTINE = {name: Watch.of(space) for name, space in namespaces().items()}
# as at import, before the reader's file or notebook cell ran


def changes() -> list[tuple[str, Any, str, Any]]:
    """``(name, namespace, attribute, original)`` for each watched attribute replaced, deleted
    or (on a class) added since ``PRISTINE``; ``original`` is ``MISSING`` for an added one."""
    found = []
    for name, watch in list(PRISTINE.items()):
        if watch.unchanged():
            continue
        now, space = vars(watch.space), watch.space
        replaced = [(key, value) for key, value in watch.pristine.items()
                    if now.get(key, MISSING) is not value]
        wrapped = {key: now[key] for key, value in replaced if torch_wraps(now.get(key), value)}
        if wrapped:  # torch's own lazy wrappers (torch.manual_seed, an optimizer's step)
            PRISTINE[name] = watch = Watch.holding(space, {**watch.pristine, **wrapped})
        found += [(name, space, key, value) for key, value in replaced if key not in wrapped]
        if isinstance(space, type):
            added = {key: now[key] for key in now if key not in watch.pristine}
            inherited = {key: next((vars(c)[key] for c in space.__mro__[1:] if key in vars(c)),
                                   MISSING) for key in added}
            lazy = {key: value for key, value in added.items()
                    if torch_wraps(value, inherited[key])  # AdamW.step, on its first use
                    or key in PYTHON_CACHES}
            if lazy:
                PRISTINE[name] = Watch.holding(space, {**PRISTINE[name].pristine, **lazy})
            found += [(name, space, key, MISSING) for key in added if key not in lazy]
    return found


def put_back(found: list[tuple[str, Any, str, Any]]) -> tuple[str, ...]:
    """Undo ``changes``; the dotted names of what had been changed."""
    for _, space, key, original in found:
        try:
            if original is MISSING:
                delattr(space, key)
            else:
                setattr(space, key, original)
        except (AttributeError, TypeError):  # an attribute that cannot be reset: named anyway
            pass
    return tuple(sorted({f"{name}.{key}" for name, _, key, _ in found}))


def restore() -> tuple[str, ...]:
    """Put back every watched function replaced since this module was imported (and watch the
    tinygpt modules imported since); the names of those put back."""
    for name, space in namespaces().items():
        if name not in PRISTINE:
            PRISTINE[name] = Watch.of(space)
    return put_back(changes())


# -- one call ----------------------------------------------------------------------------------


def run(fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any],
        names: tuple[str, ...] = (), time_limit: float | None = None) -> Run:
    """``fn(*args, **kwargs)`` on copies, guarded (see the module's docstring); ``names``
    labels the positional inputs, ``time_limit`` (seconds) defaults to ``TIME_LIMIT``."""
    given_args, given_kwargs = copy.deepcopy(args), copy.deepcopy(kwargs)
    limit = TIME_LIMIT if time_limit is None else time_limit
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            value = within(limit, fn, given_args, given_kwargs)
    except KeyboardInterrupt:
        raise
    except BaseException as error:  # the reader's code: any exception is part of the report
        value = Raised(error, raised_where(error))
    replaced = put_back(changes())
    labels = [names[i] if i < len(names) else f"argument {i + 1}" for i in range(len(args))]
    changed = [label for label, old, new in zip(labels, args, given_args) if not same(old, new)]
    changed += [key for key in kwargs if not same(kwargs[key], given_kwargs[key])]
    return Run(value, tuple(changed), replaced)


def within(limit: float, fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> Any:
    """``fn(*args, **kwargs)``, stopped with ``TookTooLong`` after ``limit`` seconds."""
    if threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer"):
        def stop(signum: int, frame: Any) -> None:
            raise TookTooLong(f"took longer than {limit:g} s")

        previous = signal.signal(signal.SIGALRM, stop)
        start = time.monotonic()  # an alarm set before (a test runner's) is set again after
        pending, _ = signal.setitimer(signal.ITIMER_REAL, limit, 0.05)  # again if swallowed
        try:
            return fn(*args, **kwargs)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
            if pending:
                signal.setitimer(signal.ITIMER_REAL,
                                 max(pending - (time.monotonic() - start), 1e-3))
    outcome: dict[str, Any] = {}

    def work() -> None:
        try:
            outcome["value"] = fn(*args, **kwargs)
        except BaseException as error:  # carried back to the calling thread
            outcome["error"] = error

    worker = threading.Thread(target=work, daemon=True, name="tinygpt-exercise")
    worker.start()
    worker.join(limit)
    if worker.is_alive():
        raise TookTooLong(f"took longer than {limit:g} s (it may still be running)")
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def same(old: Any, new: Any) -> bool:
    """Whether an input is as it was: equal tensors (nan equal to nan), lists, dicts ..."""
    if isinstance(old, torch.Tensor):
        return (isinstance(new, torch.Tensor) and old.shape == new.shape
                and old.dtype == new.dtype and bool(torch.equal(old, new) or (
                    old.is_floating_point() and torch.isclose(old, new, rtol=0, atol=0,
                                                              equal_nan=True).all())))
    if isinstance(old, (list, tuple)):
        return (type(new) is type(old) and len(old) == len(new)
                and all(same(a, b) for a, b in zip(old, new)))
    if isinstance(old, dict):
        return (isinstance(new, dict) and old.keys() == new.keys()
                and all(same(old[k], new[k]) for k in old))
    try:
        return bool(old == new) or (isinstance(old, float) and math.isnan(old)
                                    and isinstance(new, float) and math.isnan(new))
    except Exception:  # an input the reader replaced by an object that cannot be compared
        return False


def raised_where(error: BaseException) -> str:
    """``file:line, in name`` of the last frame of the traceback outside torch and this
    checker: the reader's line that raised, or called what raised."""
    frames = traceback.extract_tb(error.__traceback__)
    here = Path(__file__).parent
    torch_dir = Path(torch.__file__).parent
    own = [f for f in frames if not Path(f.filename).is_relative_to(torch_dir)
           and not Path(f.filename).is_relative_to(here)]
    if not own:
        return ""
    frame = own[-1]
    return f"{Path(frame.filename).name}:{frame.lineno}, in {frame.name}"
