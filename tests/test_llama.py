"""Tests for tinygpt.llama: a tinygpt configured Llama-style gives the logits of Hugging Face's
LlamaForCausalLM holding the same weights (small random models, nothing downloaded), and what it
cannot build is refused with a clear error."""

from __future__ import annotations

import pytest
import torch

from tinygpt.llama import from_llama, from_llama_state_dict, llama_config
from tinygpt.sample import generate

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()


def hf_llama(seed: int = 0, **overrides) -> torch.nn.Module:
    """A small random LlamaForCausalLM, its weights drawn wider than the default init so that
    every part (norm gains included) matters."""
    kwargs = dict(vocab_size=53, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=24,
                  rms_norm_eps=1e-6, tie_word_embeddings=False, rope_theta=500.0,
                  attn_implementation="eager")
    kwargs.update(overrides)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**kwargs)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, 0.2)
    return model


@pytest.mark.parametrize("overrides", [{}, {"tie_word_embeddings": True},
                                       {"rope_theta": 10000.0, "num_attention_heads": 2,
                                        "num_key_value_heads": 2}])
def test_llama_style_tinygpt_gives_hugging_faces_logits(overrides):
    hf = hf_llama(**overrides)
    ours = from_llama(hf)
    config = ours.config
    assert (config.norm, config.positional, config.activation, config.bias) == (
        "rmsnorm", "rope", "swiglu", False)
    assert config.tie_weights == overrides.get("tie_word_embeddings", False)
    assert config.rope_theta == overrides.get("rope_theta", 500.0)
    idx = torch.randint(0, 53, (3, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(idx).logits
        got = ours(idx)
    assert ref.abs().max() > 1.0  # logits of some size, so 1e-5 is a real tolerance
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


def test_llama_generation_with_the_cache_equals_hugging_faces_greedy_tokens():
    hf = hf_llama(seed=2)
    ours = from_llama(hf)
    idx = torch.randint(0, 53, (2, 5), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = hf.generate(idx, max_new_tokens=12, do_sample=False, pad_token_id=0,
                          attention_mask=torch.ones_like(idx))
    assert torch.equal(generate(ours, idx, 12, temperature=0), ref)


def test_what_tinygpt_does_not_build_is_refused():
    with pytest.raises(ValueError, match="num_key_value_heads"):
        llama_config(transformers.LlamaConfig(hidden_size=32, num_attention_heads=4,
                                              num_key_value_heads=2, intermediate_size=40))
    with pytest.raises(ValueError, match="attention_bias"):
        llama_config(transformers.LlamaConfig(hidden_size=32, num_attention_heads=4,
                                              num_key_value_heads=4, intermediate_size=40,
                                              attention_bias=True))
    with pytest.raises(TypeError, match="LlamaForCausalLM"):
        from_llama(torch.nn.Linear(2, 2))


def test_a_state_dict_that_does_not_fit_is_a_clear_error():
    hf = hf_llama()
    config = llama_config(hf.config)
    state = dict(hf.state_dict())
    del state["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(ValueError, match=r"missing.*up_proj"):
        from_llama_state_dict(state, config)
    state = dict(hf.state_dict())
    state["model.layers.0.self_attn.q_proj.weight"] = torch.zeros(8, 32)
    with pytest.raises(ValueError, match=r"q_proj.*shape"):
        from_llama_state_dict(state, config)
    with pytest.raises(ValueError, match="a Llama has"):
        from_llama_state_dict(hf.state_dict(), config.__class__(**{**config.__dict__,
                                                                   "norm": "layernorm"}))
