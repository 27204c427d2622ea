"""Where and how the model runs: the device, bf16 autocast, the threads and the CPU allocator.

It handles the settings that training and sampling share and that do not change the maths:

* ``resolve_device(name)``: ``"cpu"``, ``"cuda"``, ``"cuda:N"``, ``"mps"`` or ``"auto"`` as a
  ``torch.device``, with a clear error when the hardware is missing (``device_problem(name)``
  says what is missing; which names are devices is ``tinygpt.config.is_device_name``'s rule);
* ``autocast(device, dtype)``: the context the forward pass runs in (bf16 autocast or none);
* ``keep_freed_memory()``: on Linux with glibc, let ``malloc`` reuse freed activations instead of
  page-faulting fresh memory at every step;
* ``one_thread()``: run a block on one torch thread (the book's small models; it seeds nothing);
* ``free_threads()``: run a block on as many torch threads as this process's cores that are
  free now (``cores_free``), so that a busy machine is not oversubscribed.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext

import torch

from tinygpt.checks import ArgumentValueError
from tinygpt.config import DEVICES, is_device_name


def device_problem(name: str) -> str | None:
    """What is wrong with running on device ``name`` on this machine, or None: a name tinygpt
    does not know (``config.is_device_name``, the rule ``TrainConfig`` checks too), CUDA or a
    CUDA index this machine lacks, or MPS where it is not available."""
    if not is_device_name(name):
        return f"not a device tinygpt runs on (it runs on {DEVICES})"
    if name.startswith("cuda"):
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if int(name[5:] or 0) >= count:
            have = f"{count} CUDA device(s), cuda:0..cuda:{count - 1}" if count else "no CUDA"
            return f"was asked for, but this machine has {have}: it is not available here"
    if name == "mps" and not torch.backends.mps.is_available():
        return "was asked for, but Apple's Metal (MPS) backend is not available here"
    return None


def resolve_device(name: str) -> torch.device:
    """The torch device for ``TrainConfig.device`` (``"auto"``: CUDA if available, else CPU);
    ``ArgumentValueError`` (a ValueError) if this machine cannot run on it."""
    problem = device_problem(name)
    if problem is not None:
        raise ArgumentValueError(f"device {name!r} {problem}; use device='cpu' or 'auto'",
                                 "device")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def autocast(device: torch.device, dtype: str) -> AbstractContextManager[object]:
    """The context the forward pass runs in: ``torch.autocast`` for ``"bfloat16"``, else none."""
    if dtype == "float32":
        return nullcontext()
    # including_emulation=False: by default torch also counts GPUs (before Ampere) that only
    # emulate bfloat16, slowly
    if device.type == "cuda" and not torch.cuda.is_bf16_supported(including_emulation=False):
        raise ValueError(f"dtype='bfloat16' was asked for, but {torch.cuda.get_device_name(device)}"
                         " has no native bfloat16 (it needs compute capability 8.0, Ampere, or "
                         "newer); use dtype='float32'")
    try:
        return torch.autocast(device.type, dtype=torch.bfloat16)
    except RuntimeError as err:
        raise ValueError(f"dtype='bfloat16': autocast is not available on {device} ({err}); use "
                         "dtype='float32'") from None


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt() parameters (<malloc.h>)
_KEEP_BELOW = 32 * 2**20  # glibc's largest mmap threshold on 64-bit systems: 32 MiB


def keep_freed_memory() -> bool:
    """Let glibc's ``malloc`` keep freed blocks of up to 32 MiB for reuse; True if it could.

    Every training step frees the activations of the last and allocates the same sizes again.
    By default glibc serves large blocks straight from the kernel (``mmap``) and hands freed
    memory back, so the next step gets fresh pages, and each fresh page is a page fault that
    zeroes 4 KiB: for nanoGPT's baby GPT about a thousand faults per step, some 5% of its time
    on 2 cores. Raising the mmap and trim thresholds keeps that memory in the process (its
    resident size stays at its peak) and a step makes almost no faults. This changes the whole
    process, once; where the C library is not glibc (macOS, Windows, musl) nothing changes and
    the answer is False. ``train`` calls it when it trains on the CPU.
    """
    import ctypes
    import ctypes.util
    import platform

    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, _KEEP_BELOW)
                    and libc.mallopt(_M_TRIM_THRESHOLD, 2 * _KEEP_BELOW))
    except (OSError, AttributeError):  # no loadable C library, or one without mallopt
        return False


@contextmanager
def one_thread() -> Iterator[None]:
    """Run torch on one thread inside the block, and on as many as before after it (an error
    too). The book's small models train about as fast on one thread as on two, and their times
    then mean the same on a busy machine as on an idle one: on a shared machine two threads
    wait on each other."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


CpuTimes = Mapping[int, tuple[int, int]]  # CPU number -> (idle, total) clock ticks since boot


def cpu_times(stat: str = "/proc/stat") -> CpuTimes | None:
    """Each CPU's idle and total clock ticks since boot, from Linux's ``/proc/stat`` (idle counts
    ``idle`` and ``iowait``); None where it cannot be read (macOS, Windows, a sandbox)."""
    try:
        with open(stat, encoding="ascii") as f:
            lines = f.read(1 << 20).splitlines()
    except (OSError, ValueError):
        return None
    times = {}
    for line in lines:
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and len(fields) >= 5:
            try:
                ticks = [int(v) for v in fields[:8]]
            except ValueError:
                return None
            times[int(name[3:])] = (ticks[3] + ticks[4], sum(ticks))
    return times or None


def cores_free(before: CpuTimes, after: CpuTimes, cpus: set[int]) -> int:
    """How many of the CPUs ``cpus`` were free between two ``cpu_times`` readings: the sum of
    their idle shares, rounded (a core busy 30% of the time counts as free, one busy 70% does
    not), at least 1 and at most ``len(cpus)``. A CPU without both readings, or without ticks
    between them, counts as free."""
    idle = 0.0
    for cpu in cpus:
        if cpu not in before or cpu not in after or after[cpu][1] <= before[cpu][1]:
            idle += 1.0
            continue
        share = (after[cpu][0] - before[cpu][0]) / (after[cpu][1] - before[cpu][1])
        idle += min(max(share, 0.0), 1.0)
    return max(1, min(len(cpus), int(idle + 0.5)))


def usable_cpus() -> set[int]:
    """The CPUs this process may run on (its affinity where the system says, else all)."""
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS, Windows
        return set(range(os.cpu_count() or 1))


def threads_free(window: float = 0.3) -> int:
    """How many torch threads this process can use without waiting on other work: its CPUs'
    free cores over the next ``window`` seconds (``cores_free``). Where the CPUs' load cannot
    be read, torch's own count (``torch.get_num_threads()``, capped by the usable CPUs)."""
    cpus = usable_cpus()
    before = cpu_times()
    if before is None:
        return max(1, min(torch.get_num_threads(), len(cpus)))
    time.sleep(window)
    after = cpu_times()
    return cores_free(before, after, cpus) if after is not None else len(cpus)


@contextmanager
def free_threads(window: float = 0.3) -> Iterator[int]:
    """Run torch on ``threads_free(window)`` threads inside the block (the count is yielded), and
    on as many as before after it (an error too).

    With more threads than free cores, each of torch's parallel loops waits at its barrier for
    the thread whose core another process holds: on 2 cores with one taken, two threads make a
    small model's step several times slower than one. The count is chosen once, when the block
    starts. Floating-point sums may be split differently with another count, so a run is
    bit-exact only against a run on as many threads."""
    threads = torch.get_num_threads()
    chosen = threads_free(window)
    torch.set_num_threads(chosen)
    try:
        yield chosen
    finally:
        torch.set_num_threads(threads)
