"""What a benchmark record says about the CPU it ran on: the model name and the flags that decide
whether bfloat16 is native (AVX-512 BF16, AMX) or emulated, and whether torch's kernels were
held to a smaller instruction set. ``HOLD_AVX2`` holds all three of torch's CPU back-ends to AVX2
(ATen's own kernels, oneDNN and MKL): a CPU with AVX-512 and bfloat16 instructions then runs as
one without them, the kind of CPU most laptops have."""

from __future__ import annotations

import os
import platform
from pathlib import Path

BF16_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
# the environment variables that cap each of torch's CPU back-ends, set to AVX2
HOLD_AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
             "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> tuple[str, list[str]]:
    """The CPU's model name and which of ``BF16_FLAGS`` ``cpuinfo`` lists (Linux); elsewhere
    what ``platform`` knows, and no flags."""
    name, flags = platform.processor() or platform.machine(), []
    try:
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                name = value.strip()
            elif key.strip() == "flags":
                flags = [f for f in value.split() if f in BF16_FLAGS]
                break
    except OSError:
        pass
    return name, flags


def cpu_label() -> str:
    """``"<model> (<flags>)"``: the name runs are paired under. Two CPUs of one model name can
    differ in what decides a run's numbers (an "Intel(R) Xeon(R) Processor" with or without
    AVX-512 BF16), so the flags are part of it."""
    name, flags = cpu_model()
    return f"{name} ({' '.join(flags) or 'no flags listed'})"


def cpu_description() -> str:
    """``"<model>, <n> CPU cores, flags <flags>"``, then ``held: VAR=value ...`` for each of
    ``HOLD_AVX2``'s variables that is set."""
    name, flags = cpu_model()
    text = f"{name}, {os.cpu_count()} CPU cores, flags {' '.join(flags) or 'none listed'}"
    held = [f"{var}={os.environ[var]}" for var in HOLD_AVX2 if os.environ.get(var)]
    return f"{text}, held: {' '.join(held)}" if held else text
