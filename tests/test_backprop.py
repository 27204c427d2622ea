"""Tests of tinygpt.backprop: the hand-written backward pass against torch.autograd (float64).

References: ``torch.nn.functional.cross_entropy`` for the loss, ``torch.autograd`` for every
gradient (per layer and for the whole two-layer MLP, over random shapes from hypothesis), and
central finite differences for the softmax + cross-entropy gradient.
"""

import re

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from tinygpt.backprop import (
    TwoLayerMLP,
    TwoLayerMLPConfig,
    cross_entropy,
    cross_entropy_backward,
    init_mlp,
    linear_backward,
    mlp_backward,
    mlp_forward,
    relu_backward,
    tanh_backward,
)

FAST = settings(max_examples=40, deadline=None)
F64 = torch.float64


def batch(config: TwoLayerMLPConfig, B: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, config.d_in, generator=g, dtype=F64)
    return x, torch.randint(0, config.vocab_size, (B,), generator=g)


@FAST
@given(
    B=st.integers(1, 9),
    d_in=st.integers(1, 7),
    hidden=st.integers(1, 8),
    vocab=st.integers(2, 9),
    activation=st.sampled_from(["tanh", "relu"]),
    seed=st.integers(0, 10**6),
)
def test_mlp_backward_matches_autograd(B, d_in, hidden, vocab, activation, seed):
    config = TwoLayerMLPConfig(d_in, hidden, vocab, activation)
    mlp = init_mlp(config, generator=torch.Generator().manual_seed(seed))
    mlp.W2 *= 30  # larger logits: probabilities far from uniform make a stronger test
    x, targets = batch(config, B, seed + 1)
    fwd = mlp_forward(mlp, x, targets)
    manual = mlp_backward(mlp, fwd)

    leaves = {name: p.clone().requires_grad_() for name, p in mlp.params().items()}
    ref_mlp = TwoLayerMLP(config, **leaves)
    ref = mlp_forward(ref_mlp, x, targets)
    assert torch.allclose(fwd.loss, F.cross_entropy(ref.logits, targets))
    ref.loss.backward()
    for name, leaf in leaves.items():
        assert manual[name].shape == leaf.shape
        assert torch.allclose(manual[name], leaf.grad, rtol=1e-10, atol=1e-12), name


@FAST
@given(
    B=st.integers(1, 8),
    V=st.integers(2, 10),
    scale=st.floats(0.1, 50.0),
    seed=st.integers(0, 10**6),
)
def test_cross_entropy_and_its_gradient(B, V, scale, seed):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(B, V, generator=g, dtype=F64) * scale).requires_grad_()
    targets = torch.randint(0, V, (B,), generator=g)
    loss, probs = cross_entropy(logits, targets)
    ref = F.cross_entropy(logits, targets)
    assert torch.allclose(loss, ref)
    assert torch.allclose(probs, torch.softmax(logits, dim=1))
    ref.backward()
    dlogits = cross_entropy_backward(probs.detach(), targets)
    expected = (torch.softmax(logits, 1) - F.one_hot(targets, V).to(F64)) / B  # the formula
    assert torch.allclose(dlogits, logits.grad) and torch.allclose(dlogits, expected)
    assert torch.allclose(dlogits.sum(dim=1), torch.zeros(B, dtype=F64), atol=1e-12)


def test_cross_entropy_gradient_by_finite_differences():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, generator=g, dtype=F64)
    targets = torch.tensor([4, 0, 2])
    _, probs = cross_entropy(logits, targets)
    analytic = cross_entropy_backward(probs, targets)
    eps = 1e-6
    for b in range(3):
        for j in range(5):
            bump = torch.zeros_like(logits)
            bump[b, j] = eps
            plus, _ = cross_entropy(logits + bump, targets)
            minus, _ = cross_entropy(logits - bump, targets)
            assert abs((plus - minus).item() / (2 * eps) - analytic[b, j].item()) < 1e-8


def test_layer_backwards_match_autograd():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 3, generator=g, dtype=F64, requires_grad=True)
    W = torch.randn(3, 5, generator=g, dtype=F64, requires_grad=True)
    b = torch.randn(5, generator=g, dtype=F64, requires_grad=True)
    dout = torch.randn(4, 5, generator=g, dtype=F64)
    (x @ W + b).backward(dout)
    dx, dW, db = linear_backward(dout, x.detach(), W.detach())
    assert torch.allclose(dx, x.grad) and torch.allclose(dW, W.grad) and torch.allclose(db, b.grad)

    a = torch.tensor([[-1.0, 0.0, 0.5], [2.0, -0.3, 1e-3]], dtype=F64, requires_grad=True)
    dh = torch.randn(2, 3, generator=g, dtype=F64)
    a.tanh().backward(dh)
    assert torch.allclose(tanh_backward(dh, a.detach().tanh()), a.grad)
    a.grad = None
    a.relu().backward(dh)
    assert torch.equal(relu_backward(dh, a.detach()), a.grad)  # 0 at a = 0, as torch


def test_per_example_gradients_scaled_by_one_over_B_sum_to_the_batch_gradient():
    config = TwoLayerMLPConfig(4, 6, 5)
    mlp = init_mlp(config, generator=torch.Generator().manual_seed(2))
    x, targets = batch(config, 8, 3)
    whole = mlp_backward(mlp, mlp_forward(mlp, x, targets))
    summed = {name: torch.zeros_like(p) for name, p in mlp.params().items()}
    for i in range(8):
        grads = mlp_backward(mlp, mlp_forward(mlp, x[i : i + 1], targets[i : i + 1]))
        for name in summed:
            summed[name] += grads[name] / 8
    for name, total in summed.items():
        assert torch.allclose(whole[name], total)


def test_initial_loss_is_close_to_ln_V():
    config = TwoLayerMLPConfig(27, 16, 27)
    mlp = init_mlp(config, generator=torch.Generator().manual_seed(0))
    x, targets = batch(config, 512, 0)
    loss = mlp_forward(mlp, x, targets).loss.item()
    assert abs(loss - torch.log(torch.tensor(27.0)).item()) < 0.05


def test_manual_sgd_follows_autograd_sgd():
    config = TwoLayerMLPConfig(5, 8, 4, "relu")
    mlp = init_mlp(config, generator=torch.Generator().manual_seed(4))
    ref = {name: p.clone().requires_grad_() for name, p in mlp.params().items()}
    x, targets = batch(config, 16, 5)
    for _ in range(20):
        grads = mlp_backward(mlp, mlp_forward(mlp, x, targets))
        for name, p in mlp.params().items():
            p -= 0.5 * grads[name]
        loss = mlp_forward(TwoLayerMLP(config, **ref), x, targets).loss
        loss.backward()
        with torch.no_grad():
            for p in ref.values():
                p -= 0.5 * p.grad
                p.grad = None
    for name, p in mlp.params().items():
        assert torch.allclose(p, ref[name])


def test_bad_input_gets_clear_errors():
    with pytest.raises(ValueError, match="activation must be one of"):
        TwoLayerMLPConfig(2, 3, 4, "gelu")
    with pytest.raises(ValueError, match="hidden must be a positive integer"):
        TwoLayerMLPConfig(2, 0, 4)
    mlp = init_mlp(TwoLayerMLPConfig(2, 3, 4))
    good_x, good_t = torch.zeros(5, 2, dtype=F64), torch.zeros(5, dtype=torch.long)
    with pytest.raises(ValueError, match=r"shape \(B, 2\)"):
        mlp_forward(mlp, torch.zeros(5, 3, dtype=F64), good_t)
    with pytest.raises(ValueError, match="dtype"):
        mlp_forward(mlp, good_x.float(), good_t)
    with pytest.raises(ValueError, match="integer tensor of shape"):
        mlp_forward(mlp, good_x, torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match=re.escape("unknown target id 4: valid ids are 0..3")):
        mlp_forward(mlp, good_x, torch.tensor([0, 1, 2, 3, 4]))
    with pytest.raises(ValueError, match="empty"):
        mlp_forward(mlp, torch.zeros(0, 2, dtype=F64), torch.zeros(0, dtype=torch.long))
