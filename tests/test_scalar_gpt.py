"""Tests for tinygpt.scalar_gpt: the pure-Python GPT against the book's torch GPT given the same
weights (logits, loss, gradients, Adam), the fused dot product against the engine's own
operations, sampling, training and the errors bad input gets."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tinygpt import scalar_gpt
from tinygpt.autograd import Value, zero_grad
from tinygpt.config import GPTConfig
from tinygpt.model import GPT
from tinygpt.scalar_gpt import MicroConfig

SMALL = MicroConfig(vocab_size=7, n_embd=8, n_head=2, n_layer=2, block_size=6)


def torch_twin(params: scalar_gpt.Params, config: MicroConfig) -> GPT:
    """The book's GPT in float64 holding ``params``, its norm scales frozen at 1."""
    model = GPT(GPTConfig(**scalar_gpt.gpt_config_fields(config))).double()
    state = scalar_gpt.to_gpt_state_dict(scalar_gpt.export_weights(params), config)
    model.load_state_dict({k: torch.tensor(v, dtype=torch.float64) for k, v in state.items()})
    for name, p in model.named_parameters():
        p.requires_grad_(".ln_" not in name)
    return model


def micro_logits(params: scalar_gpt.Params, config: MicroConfig,
                 ids: list[int]) -> list[list[float]]:
    keys, values = scalar_gpt.new_cache(config)
    return [[z.data for z in scalar_gpt.forward_token(params, config, i, keys, values)]
            for i in ids]


@pytest.mark.parametrize("config", [SMALL, MicroConfig(vocab_size=5, n_embd=4, n_head=4,
                                                       n_layer=1, block_size=3)])
def test_logits_loss_and_gradients_match_the_torch_gpt(config):
    params = scalar_gpt.init_params(config, seed=1, std=0.5)  # large weights: nothing is near zero
    tokens = random.Random(2).choices(range(config.vocab_size), k=config.block_size + 1)
    model = torch_twin(params, config)
    idx = torch.tensor(tokens)[None]  # (1, T + 1)
    logits, loss = model(idx[:, :-1], idx[:, 1:])  # (1, T, V)
    ours = torch.tensor(micro_logits(params, config, tokens[:-1]), dtype=torch.float64)
    torch.testing.assert_close(ours, logits[0].detach(), rtol=0, atol=1e-12)

    ours_loss = scalar_gpt.loss_fn(params, config, tokens)
    assert ours_loss.data == pytest.approx(loss.item(), abs=1e-12)
    ours_loss.backward()
    loss.backward()
    grads = dict(model.named_parameters())
    for name, gpt_name in scalar_gpt.gpt_names(config).items():
        expected = grads[gpt_name].grad
        got = torch.tensor([[p.grad for p in row] for row in params[name]], dtype=torch.float64)
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-12, msg=name)
        assert expected.abs().max() > 0 or name in ("wte", "wpe")


def test_adam_steps_match_torch_optim_adam():
    params = scalar_gpt.init_params(SMALL, seed=3)
    model = torch_twin(params, SMALL)
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt_t = torch.optim.Adam(trainable, lr=0.05, betas=(0.85, 0.99), eps=1e-8)
    flat = scalar_gpt.parameters(params)
    opt = scalar_gpt.Adam(flat, lr=0.05)
    rng = random.Random(4)
    for step in range(3):
        tokens = rng.choices(range(SMALL.vocab_size), k=5)
        loss = scalar_gpt.loss_fn(params, SMALL, tokens)
        zero_grad(flat)
        loss.backward()
        opt.step(lr=0.05 / (step + 1))  # a changing learning rate, as in a schedule
        idx = torch.tensor(tokens)[None]
        opt_t.zero_grad()
        model(idx[:, :-1], idx[:, 1:])[1].backward()
        opt_t.param_groups[0]["lr"] = 0.05 / (step + 1)
        opt_t.step()
    back = scalar_gpt.from_gpt_state_dict(model.state_dict(), SMALL)
    for name, weights in scalar_gpt.export_weights(params).items():
        torch.testing.assert_close(torch.tensor(weights), torch.tensor(back[name]),
                                   rtol=0, atol=1e-12)
    other = scalar_gpt.init_params(SMALL, seed=3)
    assert scalar_gpt.export_weights(params) != scalar_gpt.export_weights(other)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-5, 5), min_size=1, max_size=6), st.data())
def test_dot_equals_products_summed_with_the_engine(a_data, draw):
    b_data = draw.draw(st.lists(st.floats(-5, 5), min_size=len(a_data), max_size=len(a_data)))
    a1, b1 = [Value(x) for x in a_data], [Value(x) for x in b_data]
    a2, b2 = [Value(x) for x in a_data], [Value(x) for x in b_data]
    # a reused vector: gradients from both uses
    fused = scalar_gpt.dot(a1, b1) * scalar_gpt.dot(a1, a1)
    plain = sum(x * y for x, y in zip(a2, b2)) * sum(x * x for x in a2)
    fused.backward()
    plain.backward()
    assert fused.data == pytest.approx(plain.data, rel=1e-12, abs=1e-12)
    for u, v in zip(a1 + b1, a2 + b2):
        assert u.grad == pytest.approx(v.grad, rel=1e-9, abs=1e-9)


def test_sampling_is_reproducible_and_ends_at_bos():
    params = scalar_gpt.init_params(SMALL, seed=5, std=0.5)
    bos = SMALL.vocab_size - 1
    draws = [scalar_gpt.sample(params, SMALL, bos, random.Random(s), temperature=1.0)
             for s in range(8)]
    assert draws == [scalar_gpt.sample(params, SMALL, bos, random.Random(s), temperature=1.0)
                     for s in range(8)]
    assert len(set(map(tuple, draws))) > 1  # the seed matters
    assert all(len(d) <= SMALL.block_size and bos not in d for d in draws)
    with pytest.raises(ValueError, match="temperature"):
        scalar_gpt.sample(params, SMALL, bos, random.Random(0), temperature=0.0)


def test_training_lowers_the_loss_and_weights_round_trip():
    tok = scalar_gpt.DocTokenizer(["abba", "baab"])
    config = MicroConfig(tok.vocab_size, n_embd=8, n_head=2, block_size=6)
    params = scalar_gpt.init_params(config, seed=0)
    history = scalar_gpt.train(params, config, [tok.encode("abba"), tok.encode("baab")], steps=40,
                          lr=0.05)
    assert history[-1] < 0.5 * history[0]
    weights = scalar_gpt.export_weights(params)
    assert scalar_gpt.export_weights(scalar_gpt.import_weights(weights, config)) == weights


def test_tokenizer_adds_one_bos_token():
    tok = scalar_gpt.DocTokenizer(["emma", "olivia"])
    assert tok.vocab_size == len(set("emmaolivia")) + 1 and tok.bos == tok.vocab_size - 1
    ids = tok.encode("liam")
    assert ids[0] == ids[-1] == tok.bos and tok.decode(ids) == "liam"
    with pytest.raises(ValueError, match="'z'"):
        tok.encode("zoe")


def test_bad_input_gets_a_clear_error():
    params = scalar_gpt.init_params(SMALL)
    keys, values = scalar_gpt.new_cache(SMALL)
    for bad in (SMALL.vocab_size, -1):
        with pytest.raises(ValueError, match="unknown token id"):
            scalar_gpt.forward_token(params, SMALL, bad, keys, values)
    for bad in (2.0, True):
        with pytest.raises(TypeError, match="token ids must be integers"):
            scalar_gpt.forward_token(params, SMALL, bad, keys, values)
    for t in range(SMALL.block_size):
        scalar_gpt.forward_token(params, SMALL, t % SMALL.vocab_size, keys, values)
    with pytest.raises(ValueError, match="block_size=6"):
        scalar_gpt.forward_token(params, SMALL, 0, keys, values)
    with pytest.raises(ValueError, match="block_size"):
        scalar_gpt.loss_fn(params, SMALL, [0] * (SMALL.block_size + 2))
    with pytest.raises(ValueError, match="unknown token id 7"):
        scalar_gpt.loss_fn(params, SMALL, [0, 7])
    with pytest.raises(ValueError, match="n_head"):
        MicroConfig(vocab_size=5, n_embd=6, n_head=4)
    with pytest.raises(ValueError, match="vocab_size"):
        MicroConfig(vocab_size=0)
    weights = scalar_gpt.export_weights(params)
    with pytest.raises(ValueError, match="lm_head must be 7 x 8"):
        scalar_gpt.import_weights(weights | {"lm_head": weights["lm_head"][:-1]}, SMALL)
    with pytest.raises(ValueError, match="missing"):
        scalar_gpt.import_weights({"wte": weights["wte"]}, SMALL)
    state = scalar_gpt.to_gpt_state_dict(weights, SMALL)
    state["transformer.ln_f.weight"] = [2.0] * SMALL.n_embd
    with pytest.raises(ValueError, match="ln_f"):
        scalar_gpt.from_gpt_state_dict(state, SMALL)
