"""Hugging Face's Llama weights in a tinygpt ``GPT``: the same network under other names.

Chapter 12 loads a Llama with it (``from_llama``).

A Llama is a GPT with RMSNorm, rotary positions in the halves layout (``tinygpt.rope``), a SwiGLU
MLP, no biases and (usually) an untied output layer. ``llama_config`` turns a ``LlamaConfig`` into
that ``GPTConfig``, refusing what tinygpt does not build (grouped-query attention, biases, another
activation or RoPE scaling); ``from_llama_state_dict`` loads a ``LlamaForCausalLM`` state dict,
joining ``q_proj``, ``k_proj``, ``v_proj`` into ``c_attn`` and ``gate_proj``, ``up_proj`` into
``c_fc``. It does not download anything, convert back, or load GPT-2 (``tinygpt.gpt2``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from tinygpt.checks import check_instance
from tinygpt.config import GPTConfig
from tinygpt.model import GPT


def _rope_theta(hf: Any) -> float:
    """RoPE's base from a ``LlamaConfig`` (``rope_parameters`` in transformers 5, else
    ``rope_theta``), refusing any scaling of the default rotation."""
    params = getattr(hf, "rope_parameters", None) or getattr(hf, "rope_scaling", None) or {}
    kind = params.get("rope_type", "default")
    if kind != "default":
        raise ValueError(f"LlamaConfig has rope_type={kind!r}; tinygpt builds only the default "
                         "(unscaled) rotation")
    return float(params.get("rope_theta", getattr(hf, "rope_theta", 10000.0)))


def llama_config(hf: Any) -> GPTConfig:
    """The ``GPTConfig`` of the model a ``transformers.LlamaConfig`` describes."""
    C, H = hf.hidden_size, hf.num_attention_heads
    unsupported = {
        "num_key_value_heads": (getattr(hf, "num_key_value_heads", H), H),  # no GQA
        "head_dim": (getattr(hf, "head_dim", None) or C // H, C // H),
        "attention_bias": (getattr(hf, "attention_bias", False), False),
        "mlp_bias": (getattr(hf, "mlp_bias", False), False),
        "hidden_act": (hf.hidden_act, "silu"),
    }
    wrong = {k: got for k, (got, want) in unsupported.items() if got != want}
    if wrong:
        raise ValueError(f"tinygpt cannot build this Llama: it has {wrong}, tinygpt builds "
                         f"only {({k: unsupported[k][1] for k in wrong})}")
    return GPTConfig(
        vocab_size=hf.vocab_size, block_size=hf.max_position_embeddings,
        n_layer=hf.num_hidden_layers, n_head=H, n_embd=C, bias=False, norm="rmsnorm",
        activation="swiglu", mlp_hidden=hf.intermediate_size, norm_eps=float(hf.rms_norm_eps),
        positional="rope", rope_theta=_rope_theta(hf),
        tie_weights=bool(getattr(hf, "tie_word_embeddings", False)))


def _sources(config: GPTConfig) -> dict[str, list[str]]:
    """Our parameter name -> the Llama tensors it is made of (joined along dim 0)."""
    out = {"transformer.embed.wte.weight": ["model.embed_tokens.weight"],
           "transformer.ln_f.weight": ["model.norm.weight"]}
    for i in range(config.n_layer):
        hf, ours = f"model.layers.{i}.", f"transformer.h.{i}."
        out[ours + "ln_1.weight"] = [hf + "input_layernorm.weight"]
        out[ours + "attn.c_attn.weight"] = [hf + f"self_attn.{x}_proj.weight" for x in "qkv"]
        out[ours + "attn.c_proj.weight"] = [hf + "self_attn.o_proj.weight"]
        out[ours + "ln_2.weight"] = [hf + "post_attention_layernorm.weight"]
        out[ours + "mlp.c_fc.weight"] = [hf + "mlp.gate_proj.weight", hf + "mlp.up_proj.weight"]
        out[ours + "mlp.c_proj.weight"] = [hf + "mlp.down_proj.weight"]
    if not config.tie_weights:
        out["lm_head.weight"] = ["lm_head.weight"]
    return out


def from_llama_state_dict(state_dict: Mapping[str, Tensor], config: GPTConfig) -> GPT:
    """A ``GPT(config)`` holding the weights of a ``LlamaForCausalLM`` state dict.

    ``config`` must be Llama-shaped (``llama_config``). Missing, unexpected or mis-shaped tensors
    raise ``ValueError``; rotary buffers (``inv_freq``) are ignored, and a tied model may carry
    ``lm_head.weight`` equal to the embeddings.
    """
    check_instance(config, GPTConfig, "config")
    check_instance(state_dict, Mapping, "state_dict")
    want = {"norm": "rmsnorm", "activation": "swiglu", "positional": "rope", "bias": False,
            "qk_norm": False, "norm_position": "pre", "logit_softcap": 0.0}
    wrong = {k: getattr(config, k) for k, v in want.items() if getattr(config, k) != v}
    if wrong:
        raise ValueError(f"a Llama has {want}; this config differs in {wrong}")
    model = GPT(config)
    ours, sources = model.state_dict(), _sources(config)
    used = {name for names in sources.values() for name in names}
    tied_head = config.tie_weights and "lm_head.weight" in state_dict
    extra = [k for k in state_dict if k not in used and not k.endswith("inv_freq")
             and not (tied_head and k == "lm_head.weight")]
    missing = [k for k in used if k not in state_dict]
    if extra or missing:
        raise ValueError(f"state dict does not match GPTConfig {config}: missing "
                         f"{sorted(missing)[:5]}, unexpected {sorted(extra)[:5]}")
    with torch.no_grad():
        for name, names in sources.items():
            joined = torch.cat([state_dict[k] for k in names], dim=0)
            if joined.shape != ours[name].shape:
                raise ValueError(f"{' + '.join(names)} make shape {tuple(joined.shape)}, but "
                                 f"this config needs {tuple(ours[name].shape)} for {name}")
            ours[name].copy_(joined)
    return model


def from_llama(hf_model: Any) -> GPT:
    """A ``GPT`` with the config and weights of a ``transformers.LlamaForCausalLM``, in eval
    mode."""
    if not hasattr(hf_model, "config") or not hasattr(hf_model, "state_dict"):
        raise TypeError(f"hf_model must be a transformers LlamaForCausalLM, got "
                        f"{type(hf_model).__name__}")
    config = llama_config(hf_model.config)
    return from_llama_state_dict(hf_model.state_dict(), config).eval()
