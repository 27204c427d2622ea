"""Tests for tinygpt.model: the GPT, its parameter count, initialisation, KV cache and the
equivalence with Hugging Face's GPT2LMHeadModel (the trusted reference)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from conftest import count_calls
from hypothesis import given, settings
from hypothesis import strategies as st

import tinygpt.config
from tinygpt.config import GPTConfig
from tinygpt.gpt2 import from_hf_state_dict, to_hf_state_dict
from tinygpt.model import GPT, num_parameters, parameter_counts

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

SMALL = GPTConfig(vocab_size=61, block_size=24, n_layer=2, n_head=4, n_embd=32)


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # shared tensors are yielded once


def hf_model(config: GPTConfig) -> torch.nn.Module:
    """A randomly initialised GPT2LMHeadModel of the same shape as ``config``."""
    hc = transformers.GPT2Config(
        vocab_size=config.vocab_size, n_positions=config.block_size, n_embd=config.n_embd,
        n_layer=config.n_layer, n_head=config.n_head, n_inner=config.mlp_width,
        layer_norm_epsilon=config.norm_eps, activation_function="gelu_new",
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
        tie_word_embeddings=config.tie_weights,
    )
    return transformers.GPT2LMHeadModel(hc).eval()


def test_every_public_name_has_one_import_path():
    """No module's ``__all__`` re-exports a class or function defined in another module."""
    import importlib
    import pkgutil

    import tinygpt.model as m
    assert "GPT" in m.__all__ and "GPTConfig" not in m.__all__
    for info in pkgutil.iter_modules(tinygpt.__path__):
        module = importlib.import_module(f"tinygpt.{info.name}")
        for name in getattr(module, "__all__", ()):
            obj = getattr(module, name)
            home = getattr(obj, "__module__", module.__name__)
            assert home == module.__name__, f"{module.__name__}.__all__ re-exports {home}.{name}"


# --- parameter counting --------------------------------------------------------------------------

configs = st.builds(
    lambda V, T, L, H, d, bias, norm, pos, act, tie, placement, hidden: GPTConfig(
        vocab_size=V, block_size=T, n_layer=L, n_head=H, n_embd=H * d, bias=bias, norm=norm,
        positional=pos, activation=act, tie_weights=tie, norm_position=placement,
        mlp_hidden=hidden),
    V=st.integers(1, 80), T=st.integers(1, 20), L=st.integers(1, 3), H=st.integers(1, 4),
    d=st.sampled_from([2, 4, 6]), bias=st.booleans(),
    norm=st.sampled_from(["layernorm", "rmsnorm"]),
    pos=st.sampled_from(["learned", "sinusoidal"]), act=st.sampled_from(["gelu_tanh", "relu"]),
    tie=st.booleans(), placement=st.sampled_from(["pre", "post"]),
    hidden=st.one_of(st.none(), st.integers(1, 50)),
)


@settings(max_examples=25, deadline=None)
@given(configs)
def test_formula_equals_the_count_of_a_built_model(config):
    model = GPT(config)
    assert num_parameters(config) == n_params(model)
    counts = parameter_counts(config)
    assert counts["lm_head"] == (0 if config.tie_weights else config.vocab_size * config.n_embd)
    blocks = sum(n_params(b) for b in model.transformer.h)
    assert counts["attn"] + counts["mlp"] + counts["norms"] == blocks


@pytest.mark.parametrize("n_layer,n_embd,n_head,tie", [(2, 32, 4, True), (3, 48, 3, False),
                                                       (12, 768, 12, True)])
def test_formula_equals_hugging_face_count(n_layer, n_embd, n_head, tie):
    config = GPTConfig(vocab_size=50257 if n_embd == 768 else 97, block_size=1024 if n_embd == 768
                       else 40, n_layer=n_layer, n_head=n_head, n_embd=n_embd, tie_weights=tie)
    if n_embd == 768:  # GPT-2 small: build HF's on the meta device (no 500 MB of weights)
        with torch.device("meta"):
            reference = hf_model(config)
        assert num_parameters(config) == 124_439_808  # HF's model card: "124M"
    else:
        reference = hf_model(config)
    assert num_parameters(config) == reference.num_parameters()


def test_tying_saves_exactly_the_output_matrix():
    untied = replace(SMALL, tie_weights=False)
    assert num_parameters(untied) - num_parameters(SMALL) == SMALL.vocab_size * SMALL.n_embd
    assert n_params(GPT(untied)) - n_params(GPT(SMALL)) == SMALL.vocab_size * SMALL.n_embd


# --- weight tying and initialisation ------------------------------------------------------------

def test_tied_weights_share_storage_and_gradient():
    model = GPT(SMALL)
    wte = model.transformer.embed.wte.weight
    assert model.lm_head.weight is wte and model.lm_head.weight.data_ptr() == wte.data_ptr()
    with torch.no_grad():
        wte[3, 0] = 7.0
    assert model.lm_head.weight[3, 0].item() == 7.0  # one tensor, seen through both names
    untied = GPT(replace(SMALL, tie_weights=False))
    assert untied.lm_head.weight.data_ptr() != untied.transformer.embed.wte.weight.data_ptr()
    # the shared matrix collects the gradient of both uses: compare with an untied copy
    torch.manual_seed(0)
    idx = torch.randint(0, SMALL.vocab_size, (2, 10))
    tgt = torch.randint(0, SMALL.vocab_size, (2, 10))
    untied.load_state_dict(model.state_dict())
    model(idx, tgt)[1].backward()
    untied(idx, tgt)[1].backward()
    both = untied.lm_head.weight.grad + untied.transformer.embed.wte.weight.grad
    torch.testing.assert_close(wte.grad, both, rtol=1e-5, atol=1e-7)


def test_initialisation_follows_gpt2():
    config = GPTConfig(vocab_size=500, block_size=64, n_layer=8, n_head=4, n_embd=128)
    torch.manual_seed(0)
    model = GPT(config)
    resid = 0.02 / math.sqrt(2 * config.n_layer)
    for name, p in model.named_parameters():
        if name.endswith("bias"):
            assert torch.all(p == 0), name
        elif ".ln_" in name:
            assert torch.all(p == 1), name
        else:
            want = resid if name.endswith("c_proj.weight") else 0.02
            assert p.std().item() == pytest.approx(want, rel=0.05), name
            assert abs(p.mean().item()) < 0.1 * want, name


@pytest.mark.parametrize("tie", [True, False])
def test_initial_loss_is_close_to_ln_v(tie):
    config = GPTConfig(vocab_size=256, block_size=64, n_layer=4, n_head=4, n_embd=64,
                       tie_weights=tie)
    torch.manual_seed(1)
    model = GPT(config).eval()
    idx = torch.randint(0, 256, (8, 64))
    tgt = torch.randint(0, 256, (8, 64))
    with torch.no_grad():
        logits, loss = model(idx, tgt)
    assert abs(loss.item() - math.log(256)) < 0.05
    # Why not exactly ln V: the logits spread a little, and for Gaussian logits of variance s^2
    # E[logsumexp] ~ ln V + s^2 / 2. Averaging the loss over all V targets removes the noise of
    # drawing targets, and leaves that excess.
    over_targets = (logits.logsumexp(-1) - logits.mean(-1)).mean().item()
    s2 = logits.var(-1).mean().item()
    assert over_targets - math.log(256) == pytest.approx(s2 / 2, abs=0.003)
    assert s2 == pytest.approx(0.02**2 * config.n_embd, rel=0.2)  # LN output (unit var) @ W


def test_loss_is_the_mean_cross_entropy_of_the_logits():
    torch.manual_seed(2)
    model = GPT(SMALL).eval()
    idx = torch.randint(0, SMALL.vocab_size, (3, 11))
    tgt = torch.randint(0, SMALL.vocab_size, (3, 11))
    with torch.no_grad():
        logits, loss = model(idx, tgt)
        alone = model(idx)
    torch.testing.assert_close(logits, alone)
    logp = logits.double().log_softmax(-1)  # (B, T, V)
    manual = -logp.gather(-1, tgt[..., None]).mean()
    assert loss.item() == pytest.approx(manual.item(), rel=1e-5)
    assert logits.shape == (3, 11, SMALL.vocab_size)


def test_forward_is_the_stack_of_its_parts():
    torch.manual_seed(3)
    model = GPT(SMALL).eval()
    idx = torch.randint(0, SMALL.vocab_size, (2, 9))
    with torch.no_grad():
        x = model.transformer.embed(idx)  # (B, T, C)
        for block in model.transformer.h:
            x = block(x)
        manual = model.transformer.ln_f(x) @ model.transformer.embed.wte.weight.T  # (B, T, V)
        torch.testing.assert_close(model(idx), manual)


# --- equivalence with Hugging Face ---------------------------------------------------------------

@pytest.mark.parametrize("tie", [True, False])
def test_same_logits_as_hugging_face_gpt2(tie):
    config = replace(SMALL, tie_weights=tie)
    torch.manual_seed(4)
    ours = GPT(config).eval()
    theirs = hf_model(config)
    theirs.load_state_dict(to_hf_state_dict(ours), strict=True)
    idx = torch.randint(0, config.vocab_size, (3, config.block_size))
    with torch.no_grad():
        ref = theirs(idx).logits
        assert (ours(idx) - ref).abs().max().item() < 1e-5
        # the other direction: HF's own random weights loaded into ours
        back = from_hf_state_dict(hf_model(config).state_dict(), config).eval()
        theirs.load_state_dict(to_hf_state_dict(back))
        assert (back(idx) - theirs(idx).logits).abs().max().item() < 1e-5
        # HF shifts labels itself; ours takes the already-shifted targets
        hf_loss = theirs(idx, labels=idx).loss
        _, loss = back(idx[:, :-1], idx[:, 1:])
        assert loss.item() == pytest.approx(hf_loss.item(), abs=1e-5)
        # weights of a realistic size (an initialisation hides e.g. a wrong GELU variant):
        # every tensor shifted by N(0, 0.1^2), norms and biases included
        g = torch.Generator().manual_seed(0)
        noisy = {k: v + 0.1 * torch.randn(v.shape, generator=g)
                 for k, v in theirs.state_dict().items()}
        if tie:
            noisy["lm_head.weight"] = noisy["transformer.wte.weight"]
        theirs.load_state_dict(noisy, strict=True)
        back = from_hf_state_dict(noisy, config).eval()
        ref = theirs(idx).logits
        assert ref.std() > 0.3  # logits no longer near 0 (at initialisation: about 0.1)
        assert (back(idx) - ref).abs().max().item() < 1e-5
        wrong_gelu = GPT(replace(config, activation="gelu")).eval()
        wrong_gelu.load_state_dict(back.state_dict())
        assert (wrong_gelu(idx) - ref).abs().max().item() > 1e-4  # caught


def test_hf_mapping_rejects_mismatches():
    sd = to_hf_state_dict(GPT(SMALL))
    with pytest.raises(TypeError, match="model must be a GPT"):
        to_hf_state_dict(sd)
    with pytest.raises(ValueError, match="missing"):
        from_hf_state_dict({k: v for k, v in sd.items() if "ln_f" not in k}, SMALL)
    with pytest.raises(ValueError, match="unexpected"):
        from_hf_state_dict({**sd, "transformer.extra.weight": torch.zeros(1)}, SMALL)
    with pytest.raises(ValueError, match="shape"):
        from_hf_state_dict(sd, replace(SMALL, vocab_size=60))
    with pytest.raises(ValueError, match="rmsnorm"):
        to_hf_state_dict(GPT(replace(SMALL, norm="rmsnorm")))
    untied = to_hf_state_dict(GPT(replace(SMALL, tie_weights=False)))
    with pytest.raises(ValueError, match="not tied"):
        from_hf_state_dict(untied, SMALL)
    tied_without_head = {k: v for k, v in sd.items() if k != "lm_head.weight"}
    model = from_hf_state_dict(tied_without_head, SMALL)
    assert torch.equal(model.lm_head.weight, sd["transformer.wte.weight"])


# --- KV cache ------------------------------------------------------------------------------------

variants = [
    SMALL,
    replace(SMALL, norm="rmsnorm", norm_position="post", activation="relu", bias=False),
    replace(SMALL, positional="sinusoidal", tie_weights=False, n_layer=3),
]


@pytest.mark.parametrize("config", variants, ids=["gpt2", "post-rms", "sinusoidal"])
def test_incremental_logits_equal_full_logits(config):
    torch.manual_seed(5)
    model = GPT(config).eval()
    idx = torch.randint(0, config.vocab_size, (2, config.block_size))
    with torch.no_grad():
        full = model(idx)  # (B, T, V)
        caches = model.new_caches(2)
        one_by_one = torch.cat([model(idx[:, t:t + 1], caches=caches)
                                for t in range(config.block_size)], dim=1)
        for c in caches:
            c.reset()
        chunks, start = [], 0
        for size in [5, 1, 7, 11]:
            chunks.append(model(idx[:, start:start + size], caches=caches))
            start += size
    assert caches[0].length == config.block_size
    torch.testing.assert_close(one_by_one, full, rtol=0, atol=1e-5)
    torch.testing.assert_close(torch.cat(chunks, dim=1), full, rtol=0, atol=1e-5)


# --- errors --------------------------------------------------------------------------------------

def test_bad_inputs_raise_clear_errors():
    model = GPT(SMALL)
    ok = torch.zeros(1, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="T_max"):
        model(torch.zeros(1, SMALL.block_size + 1, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\[0, 60\]"):
        model(torch.tensor([[1, 61]]))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model(torch.tensor([[-1, 2]]))
    with pytest.raises(TypeError, match="integer"):
        model(ok.float())
    with pytest.raises(ValueError, match=r"shape \(B, T\)"):
        model(torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"at least|\[1,"):
        model(torch.zeros(1, 0, dtype=torch.long))
    with pytest.raises(ValueError, match="targets"):
        model(ok, torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model(ok, torch.full((1, 4), 99))
    with torch.no_grad():
        caches = model.new_caches(1)
        model(torch.zeros(1, 20, dtype=torch.long), caches=caches)
        with pytest.raises(ValueError, match="20 cached"):
            model(torch.zeros(1, 5, dtype=torch.long), caches=caches)
        with pytest.raises(ValueError, match="batch size"):
            model(torch.zeros(2, 1, dtype=torch.long), caches=model.new_caches(1))
        with pytest.raises(ValueError, match="list of 2"):
            model(ok, caches=model.new_caches(1)[:1])
        with pytest.raises(TypeError, match="KVCache"):
            model(ok, caches=[None, None])
        other = GPT(replace(SMALL, n_head=8)).new_caches(1)  # d_k = 4, not 8
        with pytest.raises(ValueError, match="d_k=8"):
            model(ok, caches=other)


def test_a_gpt_checks_its_ids_once_per_forward_and_each_layer_its_shape_once(monkeypatch):
    """The ids are checked once per forward, at its first line; each norm and attention layer
    checks its input's shape (comparisons only) once per call of its own forward, inside a GPT
    as on its own: nothing switches a check off, so nothing stays switched off."""
    import tinygpt.attention
    import tinygpt.block
    import tinygpt.model

    calls = count_calls(monkeypatch, [(tinygpt.attention, "check_attention_input"),
                                      (tinygpt.block, "check_width"),
                                      (tinygpt.model, "check_token_ids")])
    config = replace(SMALL, norm="rmsnorm")
    model = GPT(config)
    L = config.n_layer
    for _ in range(2):  # twice: the second forward counts exactly as the first
        model(torch.zeros(2, 5, dtype=torch.long))
        assert calls.count("model.check_token_ids") == 1  # the ids, once
        assert calls.count("attention.check_attention_input") == L  # once per block
        assert calls.count("block.check_width") == 2 * L + 1  # ln_1, ln_2 per block, and ln_f
        assert len(calls) == 3 * L + 2
        calls.clear()
    alone = tinygpt.block.Block(SMALL)  # a block of its own checks what it is given
    with pytest.raises(ValueError, match="last dimension must be 32"):
        alone(torch.zeros(1, 3, 31))
    calls.clear()
    alone(torch.zeros(1, 3, 32))
    assert sorted(calls) == ["attention.check_attention_input", "block.check_width",
                             "block.check_width"]


def test_bad_configs_raise_clear_errors():
    with pytest.raises(TypeError, match="GPTConfig"):
        GPT({"n_layer": 2})
    with pytest.raises(TypeError, match="GPTConfig"):
        parameter_counts("gpt2")
    with pytest.raises(ValueError, match="divisible"):
        GPT(replace(SMALL, n_head=5))
    with pytest.raises(ValueError, match="n_layer"):
        GPT(replace(SMALL, n_layer=0))


@pytest.mark.parametrize("config", variants, ids=["gpt2", "post-rms", "sinusoidal"])
def test_last_only_gives_the_last_row_of_the_full_logits(config):
    torch.manual_seed(6)
    model = GPT(config).eval()
    idx = torch.randint(0, config.vocab_size, (3, 10))
    with torch.no_grad():
        full = model(idx)  # (B, T, V)
        last = model(idx, last_only=True)
        assert last.shape == (3, 1, config.vocab_size)
        torch.testing.assert_close(last, full[:, -1:], rtol=0, atol=1e-5)
        caches = model.new_caches(3)
        model(idx[:, :7], caches=caches, last_only=True)
        for t in range(7, 10):  # cached one-token steps, as sampling feeds them
            step = model(idx[:, t:t + 1], caches=caches, last_only=True)
            torch.testing.assert_close(step, full[:, t:t + 1], rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="targets=None"):
        model(idx, idx, last_only=True)
    with pytest.raises(TypeError, match="last_only"):
        model(idx, last_only="yes")


def test_torch_compile_breaks_the_graph_only_at_the_input_check():
    """The layers' "checked upstream?" test must not break torch.compile's graph: a break in
    every layer cost a third of the compiled step's speed on a GPU (a ContextVar did that)."""
    import torch._dynamo as dynamo

    model = GPT(SMALL)
    x = torch.randint(SMALL.vocab_size, (2, 8))
    explained = dynamo.explain(model)(x, x)
    reasons = [str(reason.reason) for reason in explained.break_reasons]
    where = {frame.filename.rsplit("/", 1)[-1] for reason in explained.break_reasons
             for frame in reason.user_stack[-1:]}
    # the check of the ids reads their min and max (Tensor.item), and nothing else breaks
    assert all("item()" in reason for reason in reasons), reasons
    assert where <= {"checks.py"}, where
    dynamo.reset()


def test_a_gpt_checks_its_input_once_and_a_layer_on_its_own_checks_its_own(monkeypatch):
    """A GPT's forward checks its arguments once, in its first line (``check_inputs``: the ids,
    and the targets in the same call); a layer called on its own checks its input in the first
    line of its forward, and bad input still gets a clear error."""
    import tinygpt.attention
    import tinygpt.block
    import tinygpt.model
    from tinygpt.attention import CausalSelfAttention
    from tinygpt.block import LayerNorm

    calls = count_calls(monkeypatch, [(GPT, "check_inputs"), (tinygpt.model, "check_token_ids")])
    model = GPT(SMALL)
    idx = torch.randint(SMALL.vocab_size, (2, 8))
    model(idx)
    assert calls == ["GPT.check_inputs", "model.check_token_ids"]
    calls.clear()
    model(idx, idx)  # the targets are checked in the same single call
    assert calls == ["GPT.check_inputs", "model.check_token_ids", "model.check_token_ids"]
    calls.clear()
    layer_calls = count_calls(monkeypatch, [(tinygpt.attention, "check_attention_input"),
                                            (tinygpt.block, "check_width")])
    attention, norm = CausalSelfAttention(SMALL), LayerNorm(SMALL.n_embd)
    x = torch.randn(2, 8, SMALL.n_embd)
    attention(norm(x))
    assert layer_calls == ["block.check_width", "attention.check_attention_input"]
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model(idx + SMALL.vocab_size)
    with pytest.raises(ValueError, match=r"shape \(B, T, C\)"):
        attention(x[0])
    with pytest.raises(ValueError, match="last dimension must be 32"):
        norm(x[..., :5])


def test_an_attention_only_model_checks_its_ids_once_and_each_layer_its_shape(monkeypatch):
    import tinygpt.attention
    import tinygpt.block
    import tinygpt.embedding
    from tinygpt.small_models import AttentionOnly

    calls = count_calls(monkeypatch, [(tinygpt.attention, "check_attention_input"),
                                   (tinygpt.block, "check_width"),
                                   (tinygpt.embedding, "check_token_ids")])
    model = AttentionOnly(replace(SMALL, norm="rmsnorm"))
    logits = model(torch.zeros(2, 5, dtype=torch.long))
    assert logits.shape == (2, 5, SMALL.vocab_size)
    L = SMALL.n_layer
    assert calls.count("embedding.check_token_ids") == 1  # the ids, once
    assert calls.count("attention.check_attention_input") == L  # each layer its shape, once
    assert calls.count("block.check_width") == L + 1  # each layer's ln_1, and ln_f
    assert len(calls) == 2 * L + 2
    with pytest.raises(ValueError, match="vocab"):
        model(torch.full((1, 3), SMALL.vocab_size))
    calls.clear()
    model.transformer.h[0](torch.zeros(1, 3, SMALL.n_embd))  # a layer alone checks its input
    assert "attention.check_attention_input" in calls
