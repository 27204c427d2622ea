"""LoRA (``tinygpt.lora``), checked against the plain computation it stands for.

A ``LoRALinear`` computes ``x (W + (alpha / r) B A)^T + b``: compared with ``F.linear`` on the
merged weight, for any shapes (hypothesis); its gradients against finite differences
(``gradcheck``, float64); at the start it is exactly the layer it wraps. On a GPT, ``add_lora``
leaves only ``A`` and ``B`` trainable (``r (in + out)`` numbers per layer), training changes no
frozen weight, and ``merge_lora`` gives a plain model with the same outputs.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from tinygpt.config import GPTConfig
from tinygpt.lora import LoRALinear, add_lora, merge_lora, trainable_parameters
from tinygpt.model import GPT


def randomised(layer: LoRALinear, seed: int) -> LoRALinear:
    """``layer`` with a random, non-zero ``B`` (it starts at zero)."""
    with torch.no_grad():
        layer.B.copy_(torch.randn(layer.B.shape, generator=torch.Generator().manual_seed(seed)))
    return layer


@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.integers(1, 12), st.integers(1, 12), st.integers(1, 12), st.booleans(),
       st.floats(0.5, 32.0), st.sampled_from([torch.float32, torch.float64]))
def test_the_layer_is_a_linear_layer_with_the_merged_weight(n_in, n_out, rank, bias, alpha,
                                                            dtype):
    rank = min(rank, n_in, n_out)
    torch.manual_seed(0)
    base = nn.Linear(n_in, n_out, bias=bias, dtype=dtype)
    layer = randomised(LoRALinear(base, rank, alpha), 1)
    x = torch.randn(3, 5, n_in, dtype=dtype)
    weight = base.weight + (alpha / rank) * layer.B @ layer.A  # W + (alpha / r) B A
    expected = F.linear(x, weight, base.bias)
    tolerance = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {}
    torch.testing.assert_close(layer(x), expected, **tolerance)
    torch.testing.assert_close(layer.merge()(x), expected, **tolerance)


def test_at_the_start_the_layer_is_the_layer_it_wraps():
    torch.manual_seed(0)
    base = nn.Linear(8, 6)
    layer = LoRALinear(base, 2)
    x = torch.randn(4, 8)
    assert torch.equal(layer(x), base(x))  # B = 0: exactly
    assert layer.A.abs().sum() > 0 and layer.B.abs().sum() == 0
    assert [name for name, p in layer.named_parameters() if p.requires_grad] == ["A", "B"]


def test_the_gradients_match_finite_differences():
    torch.manual_seed(0)
    layer = randomised(LoRALinear(nn.Linear(5, 4, dtype=torch.float64), 2, alpha=3.0), 2)
    x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)

    def f(x, A, B):
        with torch.no_grad():
            layer.A.copy_(A)
            layer.B.copy_(B)
        return x @ layer.base.weight.T + layer.base.bias + 1.5 * x @ A.T @ B.T

    A = layer.A.detach().clone().requires_grad_()
    B = layer.B.detach().clone().requires_grad_()
    assert torch.autograd.gradcheck(f, (x, A, B))
    out = layer(x)
    out.square().sum().backward()
    expected = torch.autograd.grad(f(x, A, B).square().sum(), (A, B))
    torch.testing.assert_close((layer.A.grad, layer.B.grad), expected)


def small_gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=30, block_size=16, n_layer=2, n_head=2, n_embd=16))


def test_on_a_gpt_only_the_low_rank_factors_train_and_merging_keeps_the_outputs():
    model = small_gpt()
    x = torch.randint(0, 30, (4, 16), generator=torch.Generator().manual_seed(1))
    before = model(x)
    before = before[0] if isinstance(before, tuple) else before
    frozen = {name: p.detach().clone() for name, p in model.named_parameters()}
    names = add_lora(model, rank=4, alpha=8)
    assert names == [f"transformer.h.{i}.{part}" for i in range(2)
                     for part in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")]
    expected_count = sum(4 * (m.base.in_features + m.base.out_features)
                         for m in model.modules() if isinstance(m, LoRALinear))
    assert trainable_parameters(model) == expected_count == 2 * 4 * (
        (16 + 48) + (16 + 16) + (16 + 64) + (64 + 16))
    out = model(x)
    torch.testing.assert_close(out[0] if isinstance(out, tuple) else out, before)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(5):
        _, loss = model(x, x)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        lora_out = model(x)
        lora_out = lora_out[0] if isinstance(lora_out, tuple) else lora_out
        assert not torch.allclose(lora_out, before)  # it learned something
        for name, p in model.named_parameters():
            if not p.requires_grad:  # the frozen weights, under their wrapped names
                assert torch.equal(p, frozen[name.replace(".base.", ".")]), name
        merge_lora(model)
        assert not any(isinstance(m, LoRALinear) for m in model.modules())
        merged = model(x)
        merged = merged[0] if isinstance(merged, tuple) else merged
        torch.testing.assert_close(merged, lora_out, rtol=1e-5, atol=1e-5)
    assert set(model.state_dict()) == set(small_gpt().state_dict())  # an ordinary GPT's


def test_bad_arguments_get_a_clear_error():
    with pytest.raises(TypeError, match="base"):
        LoRALinear(nn.Conv1d(3, 3, 1), 1)
    with pytest.raises(ValueError, match="rank"):
        LoRALinear(nn.Linear(4, 3), 0)
    with pytest.raises(ValueError, match="rank"):
        LoRALinear(nn.Linear(4, 3), 4)  # more than min(in, out): not a low rank
    with pytest.raises(ValueError, match="alpha"):
        LoRALinear(nn.Linear(4, 3), 2, alpha=0.0)
    with pytest.raises(ValueError, match=r"no nn\.Linear of the model is named"):
        add_lora(small_gpt(), 2, targets=("q_proj",))
