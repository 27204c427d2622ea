"""GPT-2 interoperability: OpenAI's GPT-2 tokenizer files and Hugging Face's weight names.

Chapter 1 loads GPT-2's tokenizer with it; chapter 7 maps the GPT's weights to Hugging Face's names
(``to_hf_state_dict``).

It handles GPT-2's ``vocab.json`` and ``merges.txt`` (found and checked by ``tinygpt.data``),
which spell bytes with printable characters (``bytes_to_unicode``), read into a
``BPETokenizer``; and the names and layouts of Hugging Face's ``GPT2LMHeadModel`` weights, to and
from a ``GPT``. It downloads nothing and does not import ``transformers``: the mapping only
renames and transposes tensors. Importing it does not import torch (the weight functions import
it when called). It does not train or apply merges (``tinygpt.bpe``, ``tinygpt.tokenizer``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from tinygpt.checks import check_instance
from tinygpt.config import GPTConfig
from tinygpt.data import get_path
from tinygpt.tokenizer import EOT, BPETokenizer

if TYPE_CHECKING:
    from torch import Tensor

    from tinygpt.model import GPT

__all__ = ["bytes_to_unicode", "from_hf_state_dict", "load_tokenizer", "to_hf_state_dict",
           "tokenizer_files"]

# --- tokenizer files: vocab.json and merges.txt ---



def tokenizer_files() -> tuple[Path, Path]:
    """Paths of GPT-2's ``vocab.json`` and ``merges.txt`` (the latter without its header)."""
    return get_path("gpt2/vocab.json"), get_path("gpt2/merges.txt")


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's table from each byte to a printable character, used in its vocabulary files.

    Printable Latin-1 bytes stand for themselves; the 68 others (controls, space, ...)
    get the characters 256, 257, ... in byte order, so a space is ``'Ġ'``.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    others = [b for b in range(256) if b not in table]
    table.update({b: chr(256 + k) for k, b in enumerate(others)})
    return table


def load_tokenizer(vocab_json: str | Path, merges_txt: str | Path) -> BPETokenizer:
    """GPT-2's tokenizer from its ``vocab.json`` and ``merges.txt`` (``#version`` line optional).

    The files' printable characters are turned back into bytes. ValueError if the files are
    unreadable or do not agree (merge ``i`` must make token ``256 + i``).
    """
    files = f"GPT-2 files {vocab_json} and {merges_txt}"
    decoder = {ch: b for b, ch in bytes_to_unicode().items()}
    try:
        vocab = json.loads(Path(vocab_json).read_text(encoding="utf-8"))
        lines = Path(merges_txt).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"cannot read {files}: {err}") from None
    try:
        eot_id = vocab.pop(EOT)
        by_id = sorted((i, t) for t, i in vocab.items())
        if [i for i, _ in by_id] != list(range(len(by_id))):
            raise ValueError("the ids of vocab.json are not 0, 1, 2... without gaps")
        tokens = [bytes(decoder[ch] for ch in t) for _, t in by_id]
        ids = {t: i for i, t in enumerate(tokens)}
        merges = []
        for line in lines:
            if line.strip() and not line.startswith("#version"):
                a, b = (bytes(decoder[ch] for ch in part) for part in line.split(" "))
                merges.append((ids[a], ids[b]))
        return BPETokenizer(tokens + [EOT.encode()], merges, "gpt2", {EOT: eot_id})
    except (AttributeError, KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{files} do not match or are not GPT-2's: "
                         f"{type(err).__name__} {err}") from None


# --- weights: Hugging Face's GPT2LMHeadModel ---

# HF's ``Conv1D`` layers store a weight as ``(in, out)``; ``nn.Linear`` stores ``(out, in)``.
_CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
_HF_BUFFERS = (".attn.bias", ".attn.masked_bias")  # HF's masks: buffers, not weights
_GPT2_LAYOUT = {"norm": "layernorm", "norm_position": "pre", "activation": "gelu_tanh",
                "positional": "learned", "bias": True, "qk_norm": False, "logit_softcap": 0.0}


def _is_conv1d(name: str) -> bool:
    return name.endswith(_CONV1D)


def _hf_name(name: str) -> str:
    """Our parameter name -> GPT2LMHeadModel's: only the embeddings' group differs."""
    return name.replace("transformer.embed.", "transformer.", 1)


def _check_gpt2_model(model: GPT) -> None:
    """A clear error unless ``model`` is a ``GPT`` in GPT-2's layout."""
    from tinygpt.model import GPT

    check_instance(model, GPT, "model")
    _check_gpt2_layout(model.config)


def _check_gpt2_layout(config: GPTConfig) -> None:
    wrong = {k: getattr(config, k) for k, v in _GPT2_LAYOUT.items() if getattr(config, k) != v}
    if wrong:
        raise ValueError(f"GPT2LMHeadModel has {_GPT2_LAYOUT}; this config differs in {wrong}")


def to_hf_state_dict(model: GPT) -> dict[str, Tensor]:
    """``model``'s weights under ``GPT2LMHeadModel``'s names and layouts (copies)."""
    _check_gpt2_model(model)
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
    if config.tie_weights and head is not None and wte is not None and not torch.equal(head, wte):
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
