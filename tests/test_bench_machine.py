"""benchmarks/_machine.py: a record names the CPU and whether its bfloat16 is native."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import _machine

CPUINFO = """processor\t: 0
model name\t: Example CPU 9000
flags\t\t: fpu sse2 avx2 avx512f avx512bw avx512_bf16 sha_ni
processor\t: 1
model name\t: Example CPU 9000
flags\t\t: fpu sse2 avx2 avx512f avx512bw avx512_bf16 sha_ni
"""


def test_the_model_name_and_only_the_bfloat16_flags_are_read(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text(CPUINFO)
    assert _machine.cpu_model(info) == ("Example CPU 9000", ["avx2", "avx512f", "avx512_bf16"])


def test_without_cpuinfo_the_platform_names_the_machine(tmp_path):
    name, flags = _machine.cpu_model(tmp_path / "missing")
    assert name and flags == []


def test_a_held_instruction_set_is_said(monkeypatch):
    monkeypatch.setattr(_machine, "cpu_model", lambda: ("Example CPU 9000", ["avx2"]))
    for var in _machine.HOLD_AVX2:
        monkeypatch.delenv(var, raising=False)
    assert _machine.cpu_description().startswith("Example CPU 9000, ")
    assert "flags avx2" in _machine.cpu_description()
    assert "held" not in _machine.cpu_description()
    for var, value in _machine.HOLD_AVX2.items():
        monkeypatch.setenv(var, value)
    assert _machine.cpu_description().endswith(
        ", held: ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2")


def test_two_cpus_of_one_name_with_other_bfloat16_flags_get_other_labels(monkeypatch):
    monkeypatch.setattr(_machine, "cpu_model", lambda: ("Intel(R) Xeon(R) Processor", ["avx2"]))
    without = _machine.cpu_label()
    monkeypatch.setattr(_machine, "cpu_model",
                        lambda: ("Intel(R) Xeon(R) Processor", ["avx2", "avx512_bf16"]))
    assert without == "Intel(R) Xeon(R) Processor (avx2)"
    assert _machine.cpu_label() == "Intel(R) Xeon(R) Processor (avx2 avx512_bf16)"
