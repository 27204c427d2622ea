"""Tests for tinygpt.runtime: bf16 autocast is refused on GPUs that only emulate it (before
Ampere) and accepted on those that have it, and bfloat16 autocast gives no torch warning."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest
import torch

from tinygpt.runtime import autocast


def fake_gpu(monkeypatch, major: int) -> None:
    """Make torch.cuda report one GPU of compute capability ``major``.x that can emulate bf16."""
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device=None: SimpleNamespace(major=major, minor=5))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: f"FakeGPU sm_{major}5")
    monkeypatch.setattr(torch.cuda, "_check_bf16_tensor_supported", lambda device: True,
                        raising=False)


def test_bf16_is_refused_on_a_gpu_that_only_emulates_it(monkeypatch):
    fake_gpu(monkeypatch, major=7)  # Volta/Turing: bf16 tensors work, emulated
    assert torch.cuda.is_bf16_supported()  # torch's default counts the emulation
    assert not torch.cuda.is_bf16_supported(including_emulation=False)
    with pytest.raises(ValueError, match="FakeGPU sm_75 has no native bfloat16"):
        autocast(torch.device("cuda"), "bfloat16")
    autocast(torch.device("cuda"), "float32")  # float32 needs nothing


def test_bf16_is_accepted_on_an_ampere_gpu(monkeypatch):
    fake_gpu(monkeypatch, major=8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a CPU-only torch warns that CUDA autocast is off
        context = autocast(torch.device("cuda"), "bfloat16")
    assert isinstance(context, torch.autocast)


def test_bfloat16_autocast_with_qk_norm_gives_no_torch_warning():
    import warnings

    import torch

    from tinygpt.config import GPTConfig
    from tinygpt.model import GPT

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=32, block_size=8, n_layer=1, n_head=2, n_embd=16,
                          qk_norm=True))
    idx = torch.randint(32, (2, 8))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _, loss = model(idx, idx)
        loss.backward()
    assert not [str(w.message) for w in caught], [str(w.message) for w in caught]
    assert torch.isfinite(loss)
