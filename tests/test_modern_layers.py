"""Tests for the modern GPT's switches in the model: SwiGLU and ReLU² against torch references
(values and gradients), QK-norm's bounded scores, zero-initialised output projections, and that a
default GPTConfig still builds GPT-2's model, parameter for parameter."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from tinygpt.block import MLP, ActivationLayer, relu2, swiglu
from tinygpt.config import GPTConfig
from tinygpt.model import GPT, num_parameters

SMALL = dict(vocab_size=29, block_size=12, n_layer=2, n_head=2, n_embd=16)


# --- SwiGLU and ReLU² ----------------------------------------------------------------------------

def swiglu_reference(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


@pytest.mark.parametrize("explicit", [False, True])
@pytest.mark.parametrize(("name", "reference"), [
    ("swiglu", swiglu_reference), ("relu2", lambda x: torch.relu(x).pow(2))])
def test_activations_match_torch_references_in_value_and_gradient(name, reference, explicit):
    x = (torch.randn(3, 4, 10, dtype=torch.float64) * 3).requires_grad_()
    ours = ActivationLayer(name, explicit=explicit)(x)
    ref = reference(x)
    torch.testing.assert_close(ours, ref)
    grad_out = torch.randn_like(ref)
    (g_ours,) = torch.autograd.grad(ours, x, grad_out)
    (g_ref,) = torch.autograd.grad(ref, x, grad_out)
    torch.testing.assert_close(g_ours, g_ref)


def test_swiglu_halves_the_width_and_gates_with_the_first_half():
    x = torch.tensor([[0.0, 2.0, 5.0, 7.0]])  # gate (0, 2), up (5, 7)
    out = swiglu(x)
    assert out.shape == (1, 2)
    torch.testing.assert_close(out, torch.tensor([[0.0, 2.0 * torch.sigmoid(torch.tensor(2.0))
                                                  * 7.0]]))
    assert torch.equal(relu2(torch.tensor([-2.0, 0.0, 3.0])), torch.tensor([0.0, 0.0, 9.0]))


def test_a_swiglu_mlp_is_llamas_gate_up_down():
    config = GPTConfig(**SMALL, activation="swiglu", mlp_hidden=24, bias=False)
    mlp = MLP(config)
    gate, up = mlp.c_fc.weight.split(24)  # (F, C) each
    x = torch.randn(2, 5, 16)
    ref = F.linear(F.silu(F.linear(x, gate)) * F.linear(x, up), mlp.c_proj.weight)
    torch.testing.assert_close(mlp(x), ref)


@pytest.mark.parametrize("activation", ["swiglu", "relu2"])
def test_models_with_the_new_activations_count_and_train(activation):
    config = GPTConfig(**SMALL, activation=activation)
    torch.manual_seed(0)
    model = GPT(config)
    assert num_parameters(config) == sum(p.numel() for p in model.parameters())
    idx = torch.randint(0, 29, (4, 12))
    _, loss = model(idx, idx)
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


# --- QK-norm -------------------------------------------------------------------------------------

def scores_of(model: GPT, idx: torch.Tensor) -> torch.Tensor:
    """The first block's attention scores ``q k^T / sqrt(d_k)``, captured from its queries and keys
    after QK-norm (or, without it, recomputed from c_attn)."""
    attn = model.transformer.h[0].attn
    captured = {}
    if attn.qk_norm:
        attn.q_norm.register_forward_hook(lambda m, i, o: captured.__setitem__("q", o))
        attn.k_norm.register_forward_hook(lambda m, i, o: captured.__setitem__("k", o))
    else:
        def grab(module, inputs, output):
            B, T, C = output.shape
            q, k, _ = output.split(C // 3, dim=2)
            captured["q"] = q.view(B, T, attn.n_head, -1).transpose(1, 2)
            captured["k"] = k.view(B, T, attn.n_head, -1).transpose(1, 2)
        attn.c_attn.register_forward_hook(grab)
    with torch.no_grad():
        model(idx)
    q, k = captured["q"], captured["k"]
    return q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5


def test_qk_norm_bounds_the_scores_when_the_weights_grow():
    torch.manual_seed(0)
    idx = torch.randint(0, 29, (2, 12))
    d_k = 8
    for qk_norm in (False, True):
        model = GPT(GPTConfig(**SMALL, qk_norm=qk_norm)).eval()
        with torch.no_grad():
            model.transformer.h[0].attn.c_attn.weight.mul_(100.0)  # queries, keys 100x larger
        biggest = scores_of(model, idx).abs().max().item()
        if qk_norm:  # unit RMS vectors of d_k entries: |q . k| <= d_k, / sqrt(d_k)
            assert biggest <= d_k**0.5 * (1 + 1e-4)
        else:
            assert biggest > 10 * d_k**0.5


def test_qk_norm_adds_two_gains_per_layer_and_is_learned():
    config = GPTConfig(**SMALL, qk_norm=True)
    model = GPT(config)
    names = [n for n, _ in model.named_parameters() if "q_norm" in n or "k_norm" in n]
    assert names == [f"transformer.h.{i}.attn.{w}_norm.weight" for i in range(2) for w in "qk"]
    assert num_parameters(config) == num_parameters(GPTConfig(**SMALL)) + 2 * 2 * 8


# --- zero-initialised projections -----------------------------------------------------------------

def test_zero_init_proj_zeroes_the_branch_ends_and_draws_the_same_random_numbers():
    torch.manual_seed(3)
    plain = GPT(GPTConfig(**SMALL))
    after_plain = torch.get_rng_state()
    torch.manual_seed(3)
    zeroed = GPT(GPTConfig(**SMALL, zero_init_proj=True))
    assert torch.equal(torch.get_rng_state(), after_plain)
    for (name, p), q in zip(zeroed.named_parameters(), plain.parameters(), strict=True):
        if name.endswith("c_proj.weight"):
            assert not p.any() and q.any()
        else:
            assert torch.equal(p, q), name
    # every block starts as the identity: the logits are the embeddings' through ln_f and lm_head
    idx = torch.randint(0, 29, (2, 12))
    embed = zeroed.transformer.embed
    x = embed.wte(idx) + embed.positions(12)
    with torch.no_grad():
        torch.testing.assert_close(zeroed(idx), zeroed.lm_head(zeroed.transformer.ln_f(x)))


# --- the defaults ---------------------------------------------------------------------------------

def gpt2_names(L: int) -> list[str]:
    """GPT-2's parameter names, in the order GPT-2 (and tinygpt) registers them."""
    layer = [f"{part}.{w}" for part in ("ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp.c_fc",
                                       "mlp.c_proj") for w in ("weight", "bias")]
    return (["transformer.embed.wte.weight", "transformer.embed.wpe.weight"]
            + [f"transformer.h.{i}.{n}" for i in range(L) for n in layer]
            + ["transformer.ln_f.weight", "transformer.ln_f.bias", "lm_head.weight"])


def test_the_default_config_builds_gpt2s_parameters_in_gpt2s_order():
    config = GPTConfig()
    assert (config.positional, config.activation, config.norm, config.qk_norm,
            config.zero_init_proj, config.tie_weights, config.bias) == (
        "learned", "gelu_tanh", "layernorm", False, False, True, True)
    model = GPT(config)
    state = model.state_dict()
    assert list(state) == gpt2_names(config.n_layer)
    C, V, T = config.n_embd, config.vocab_size, config.block_size
    shapes = {"wte": (V, C), "wpe": (T, C), "c_attn.weight": (3 * C, C), "c_proj.bias": (C,),
              "c_fc.weight": (4 * C, C), "mlp.c_proj.weight": (C, 4 * C), "lm_head": (V, C)}
    for name, t in state.items():
        for part, shape in shapes.items():
            if part in name:
                assert tuple(t.shape) == shape, name
    assert model.lm_head.weight is model.transformer.embed.wte.weight
    attn = model.transformer.h[0].attn
    assert attn.rope is None and not attn.qk_norm and not hasattr(attn, "q_norm")


@pytest.mark.parametrize("switch", [{"qk_norm": True}, {"zero_init_proj": True},
                                    {"rope_theta": 500.0}])
def test_switches_that_add_no_matrix_leave_the_other_weights_as_the_default_draws_them(switch):
    torch.manual_seed(11)
    default = dict(GPT(GPTConfig(**SMALL)).named_parameters())
    torch.manual_seed(11)
    other = dict(GPT(dataclasses.replace(GPTConfig(**SMALL), **switch)).named_parameters())
    for name, p in default.items():
        if not name.endswith("c_proj.weight") or "zero_init_proj" not in switch:
            assert torch.equal(other[name], p), name


def test_logit_softcap_is_c_tanh_of_the_uncapped_logits_everywhere_they_are_made():
    config = GPTConfig(vocab_size=40, block_size=16, n_layer=2, n_head=2, n_embd=32)
    capped_config = dataclasses.replace(config, logit_softcap=2.0)
    torch.manual_seed(0)
    plain = GPT(config)
    with torch.no_grad():
        plain.lm_head.weight.mul_(20)  # logits large enough that the cap matters
    capped = GPT(capped_config)
    capped.load_state_dict(plain.state_dict())
    idx = torch.randint(0, 40, (3, 16))
    targets = torch.randint(0, 40, (3, 16))
    raw = plain(idx)
    assert raw.abs().max() > 10
    logits, loss = capped(idx, targets)
    torch.testing.assert_close(logits, 2.0 * torch.tanh(raw / 2.0))
    assert logits.abs().max() <= 2.0  # tanh rounds to 1 in float32 for large inputs
    torch.testing.assert_close(loss, F.cross_entropy(logits.reshape(48, 40), targets.reshape(48)))
    with torch.no_grad():  # a cached step and the last position only see the same cap
        caches = capped.new_caches(3)
        first = capped(idx[:, :10], caches=caches)
        rest = capped(idx[:, 10:], caches=caches, last_only=True)
    torch.testing.assert_close(first, logits[:, :10].detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rest, logits[:, -1:].detach(), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="logit_softcap"):
        GPTConfig(logit_softcap=-1.0)
