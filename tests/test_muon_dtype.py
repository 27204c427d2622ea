"""The dtype Newton-Schulz runs in: chosen by what measures faster on the device, cached, and
forced when the user asks; float32 and bfloat16 agree with a float64 reference."""

from __future__ import annotations

import pytest
import torch

from tinygpt import muon
from tinygpt.muon import NS_DTYPE_ENV, Muon, fast_ns_dtype, measured_ns_dtype, newton_schulz


@pytest.fixture(autouse=True)
def fresh_choice(monkeypatch):
    """No forced dtype from the environment, and no choice cached from another test."""
    monkeypatch.delenv(NS_DTYPE_ENV, raising=False)
    measured_ns_dtype.cache_clear()
    yield
    measured_ns_dtype.cache_clear()


def fake_timer(seconds: dict[torch.dtype, float], calls: list):
    def ns_seconds(dtype, device, *args, **kwargs):
        calls.append((dtype, device))
        return seconds[dtype]
    return ns_seconds


@pytest.mark.parametrize(("bf16_s", "f32_s", "expected"), [
    (6.0, 1.0, torch.float32),   # emulated bfloat16 (an AVX2-only CPU)
    (0.5, 1.0, torch.bfloat16),  # native bfloat16 (AVX-512 BF16, AMX)
])
def test_the_cpu_choice_is_what_measures_faster_and_is_measured_once(monkeypatch, bf16_s, f32_s,
                                                                    expected):
    calls: list = []
    monkeypatch.setattr(muon, "ns_seconds",
                        fake_timer({torch.bfloat16: bf16_s, torch.float32: f32_s}, calls))
    assert [fast_ns_dtype("cpu") for _ in range(3)] == [expected] * 3
    assert fast_ns_dtype(torch.device("cpu")) == expected
    assert sorted(str(dtype) for dtype, _ in calls) == ["torch.bfloat16", "torch.float32"]


def test_cuda_keeps_bfloat16_without_measuring(monkeypatch):
    calls: list = []
    monkeypatch.setattr(muon, "ns_seconds", fake_timer({}, calls))
    assert fast_ns_dtype("cuda") == torch.bfloat16 and fast_ns_dtype("cuda:1") == torch.bfloat16
    assert calls == []


def test_the_environment_forces_the_dtype(monkeypatch):
    calls: list = []
    monkeypatch.setattr(muon, "ns_seconds",
                        fake_timer({torch.bfloat16: 0.5, torch.float32: 1.0}, calls))
    monkeypatch.setenv(NS_DTYPE_ENV, "float32")
    assert fast_ns_dtype("cpu") == torch.float32 and fast_ns_dtype("cuda") == torch.float32
    assert calls == []
    monkeypatch.setenv(NS_DTYPE_ENV, "float16")
    with pytest.raises(ValueError, match=r"one of \['bfloat16', 'float32'\].*'float16'"):
        fast_ns_dtype("cpu")


def test_the_real_measurement_returns_one_of_the_two():
    assert measured_ns_dtype(torch.device("cpu")) in (torch.bfloat16, torch.float32)


@pytest.mark.parametrize("shape", [(128, 512), (512, 128), (64, 64), (16, 6)])
def test_newton_schulz_in_float32_and_bfloat16_agree_with_float64(shape):
    G = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    reference = newton_schulz(G.double(), dtype=torch.float64)
    f32, bf16 = newton_schulz(G, dtype=torch.float32), newton_schulz(G)
    assert f32.dtype == torch.float32 and bf16.dtype == torch.bfloat16
    # float32: rounding only (seen: about 1e-6); bfloat16: 8 bits of mantissa (seen: <= 0.026)
    torch.testing.assert_close(f32.double(), reference, atol=1e-5, rtol=0)
    torch.testing.assert_close(bf16.double(), reference, atol=4e-2, rtol=0)
    torch.testing.assert_close(f32, bf16.float(), atol=4e-2, rtol=0)
    assert not torch.equal(f32, bf16.float())  # two dtypes really ran


@pytest.mark.parametrize(("ns_dtype", "chosen", "expected"), [
    ("float32", torch.bfloat16, torch.float32),
    ("bfloat16", torch.float32, torch.bfloat16),
    (torch.float32, torch.bfloat16, torch.float32),
    (None, torch.float32, torch.float32),
    (None, torch.bfloat16, torch.bfloat16),
])
def test_muon_honours_a_forced_dtype_and_else_asks_the_chooser(monkeypatch, ns_dtype, chosen,
                                                                expected):
    seen: list = []
    real = muon.newton_schulz

    def spy(G, steps, coefficients, eps, dtype):
        seen.append(dtype)
        return real(G, steps, coefficients, eps, dtype)

    monkeypatch.setattr(muon, "newton_schulz", spy)
    monkeypatch.setattr(muon, "fast_ns_dtype", lambda device: chosen)
    p = torch.nn.Parameter(torch.randn(6, 4, generator=torch.Generator().manual_seed(2)))
    before = p.detach().clone()
    opt = Muon([p], lr=0.02, ns_dtype=ns_dtype)
    p.grad = torch.ones_like(p)
    opt.step()
    assert seen == [expected]
    assert not torch.equal(p.detach(), before)


def test_muon_refuses_an_unknown_dtype():
    with pytest.raises(ValueError, match=r"one of \['bfloat16', 'float32'\].*'float16'"):
        Muon([torch.nn.Parameter(torch.zeros(3, 3))], ns_dtype="float16")
