"""GPT-2 interoperability: what it takes to read and write OpenAI's GPT-2 in its usual formats.

It gathers the names and layouts of GPT-2's published files: the weight names of Hugging Face's
``GPT2LMHeadModel`` here (and GPT-2's tokenizer files). It downloads nothing and does not import
``transformers``: the mapping only renames and transposes tensors. Importing it does not import
torch (the weight functions import it when called).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from tinygpt.checks import check_instance
from tinygpt.config import GPTConfig

if TYPE_CHECKING:
    from torch import Tensor

    from tinygpt.model import GPT

__all__ = ["from_hf_state_dict", "to_hf_state_dict"]


# --- weights: Hugging Face's GPT2LMHeadModel ---

# HF's ``Conv1D`` layers store their weight as ``(in, out)``, where ``nn.Linear`` stores ``(out, in)``.
_CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
_HF_BUFFERS = (".attn.bias", ".attn.masked_bias")  # HF's masks: buffers, not weights
_GPT2_LAYOUT = {"norm": "layernorm", "norm_position": "pre", "activation": "gelu_tanh",
                "positional": "learned", "bias": True}


def _is_conv1d(name: str) -> bool:
    return name.endswith(_CONV1D)


def _hf_name(name: str) -> str:
    """Our parameter name -> GPT2LMHeadModel's: only the embeddings' group differs."""
    return name.replace("transformer.embed.", "transformer.", 1)


def _check_gpt2_layout(config: GPTConfig) -> None:
    wrong = {k: getattr(config, k) for k, v in _GPT2_LAYOUT.items() if getattr(config, k) != v}
    if wrong:
        raise ValueError(f"GPT2LMHeadModel has {_GPT2_LAYOUT}; this config differs in {wrong}")


def to_hf_state_dict(model: GPT) -> dict[str, Tensor]:
    """``model``'s weights under ``GPT2LMHeadModel``'s names and layouts (copies)."""
    from tinygpt.model import GPT

    check_instance(model, GPT, "model")
    _check_gpt2_layout(model.config)
    return {_hf_name(name): (t.t() if _is_conv1d(name) else t).detach().clone()
            for name, t in model.state_dict().items()}


def from_hf_state_dict(state_dict: Mapping[str, Tensor], config: GPTConfig) -> GPT:
    """A ``GPT(config)`` holding the weights of a ``GPT2LMHeadModel`` state dict.

    ``config`` must describe the same model in GPT-2's layout. Missing, unexpected or mis-shaped
    tensors raise ``ValueError``; HF's mask buffers are ignored, and a tied model may omit
    ``lm_head.weight``.
    """
    import torch

    from tinygpt.model import GPT

    check_instance(config, GPTConfig, "config")
    check_instance(state_dict, Mapping, "state_dict")
    _check_gpt2_layout(config)
    model = GPT(config)
    ours = model.state_dict()
    wanted = {_hf_name(name): name for name in ours}
    extra = [k for k in state_dict if k not in wanted and not k.endswith(_HF_BUFFERS)]
    missing = [k for k in wanted if k not in state_dict
               and not (k == "lm_head.weight" and config.tie_weights)]
    if extra or missing:
        raise ValueError(f"state dict does not match GPTConfig {config}: "
                         f"missing {missing[:5]}, unexpected {extra[:5]}")
    head, wte = state_dict.get("lm_head.weight"), state_dict.get("transformer.wte.weight")
    if config.tie_weights and head is not None and not torch.equal(head, wte):
        raise ValueError("lm_head.weight differs from transformer.wte.weight: the weights "
                         "are not tied; use a config with tie_weights=False")
    with torch.no_grad():
        for hf, name in wanted.items():
            if hf not in state_dict:
                continue  # a tied lm_head: it is wte, loaded under its own name
            given, shape = tuple(state_dict[hf].shape), tuple(ours[name].shape)
            expected = shape[::-1] if _is_conv1d(name) else shape
            if given != expected:
                raise ValueError(f"{hf} has shape {given}, but this config needs {expected}")
            ours[name].copy_(state_dict[hf].t() if _is_conv1d(name) else state_dict[hf])
    return model
