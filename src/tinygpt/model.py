"""The GPT: token ids in, next-token logits (and a loss) out.

It handles the whole model built from the layers of the earlier modules:

* ``GPT(config)``: embeddings (``tinygpt.embedding``) -> ``n_layer`` blocks (``tinygpt.block``)
  -> a final norm -> the output layer ``lm_head``, with GPT-2's parameter names.
  ``model(idx)`` gives logits ``(B, T, V)``; ``model(idx, targets)`` gives ``(logits, loss)``,
  the mean cross-entropy. With ``caches=model.new_caches(B)`` (one ``KVCache`` per block) new
  tokens can be fed a few at a time and give what the whole sequence gives.
* Weight tying (``config.tie_weights``): ``lm_head`` and the token table share one matrix.
* GPT-2's initialisation: normal(0, 0.02) weights, zero biases, and the two projections that end
  each residual branch (``attn.c_proj``, ``mlp.c_proj``) scaled down by ``1/sqrt(2 n_layer)``.
* ``parameter_counts(config)`` / ``num_parameters(config)``: the parameter count in closed form,
  without building the model, from per-layer counts (``attention_parameters``,
  ``mlp_parameters``, ``norm_parameters``) that also price layouts ``GPTConfig`` cannot express.
* ``to_hf_state_dict`` / ``GPT.from_hf_state_dict``: the name mapping to and from Hugging Face's
  ``GPT2LMHeadModel`` (whose ``Conv1D`` layers store their weights transposed).

It does not train (``tinygpt.train``), sample (``tinygpt.sample``), download weights, or import
``transformers``: the mapping only renames and transposes tensors.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tinygpt.attention import KVCache
from tinygpt.block import Block, make_norm
from tinygpt.checks import check_token_ids
from tinygpt.config import GPTConfig
from tinygpt.embedding import Embeddings

__all__ = [
    "GPT",
    "INIT_STD",
    "attention_parameters",
    "mlp_parameters",
    "norm_parameters",
    "num_parameters",
    "parameter_counts",
]

INIT_STD = 0.02  # GPT-2's standard deviation for every weight matrix and embedding table


# --- counting parameters -------------------------------------------------------------------------

def norm_parameters(n_embd: int, norm: str = "layernorm", bias: bool = True) -> int:
    """Parameters of one norm of width ``C``: ``2C`` for LayerNorm with a bias, else ``C``."""
    return 2 * n_embd if norm == "layernorm" and bias else n_embd


def attention_parameters(n_embd: int, bias: bool = True) -> int:
    """``c_attn`` (``C x 3C``) + ``c_proj`` (``C x C``): ``4C^2``, plus ``4C`` biases."""
    return 4 * n_embd * n_embd + (4 * n_embd if bias else 0)


def mlp_parameters(n_embd: int, hidden: int, bias: bool = True) -> int:
    """``c_fc`` (``C x F``) + ``c_proj`` (``F x C``): ``2CF``, plus ``F + C`` biases."""
    return 2 * n_embd * hidden + (hidden + n_embd if bias else 0)


def parameter_counts(config: GPTConfig) -> dict[str, int]:
    """The closed-form parameter count of ``GPT(config)``, part by part (blocks: all ``L``).

    Keys: ``wte`` (``V C``), ``wpe`` (``T_max C``, 0 for sinusoidal positions), ``attn``,
    ``mlp`` and ``norms`` (``ln_1`` + ``ln_2``) summed over the ``L`` blocks, ``ln_f`` (0 for
    post-norm, whose blocks already end with a norm) and ``lm_head`` (``V C``, 0 when tied).
    """
    if not isinstance(config, GPTConfig):
        raise TypeError(f"config must be a GPTConfig, got {type(config).__name__}")
    V, C, L = config.vocab_size, config.n_embd, config.n_layer
    norm = norm_parameters(C, config.norm, config.bias)
    return {
        "wte": V * C,
        "wpe": config.block_size * C if config.positional == "learned" else 0,
        "attn": L * attention_parameters(C, config.bias),
        "mlp": L * mlp_parameters(C, config.mlp_width, config.bias),
        "norms": L * 2 * norm,
        "ln_f": norm if config.norm_position == "pre" else 0,
        "lm_head": 0 if config.tie_weights else V * C,
    }


def num_parameters(config: GPTConfig) -> int:
    """The number of distinct parameters of ``GPT(config)`` (a tied matrix counts once)."""
    return sum(parameter_counts(config).values())


# --- the model -----------------------------------------------------------------------------------

class GPT(nn.Module):
    """A decoder-only transformer language model: ids ``(B, T)`` -> logits ``(B, T, V)``.

    Submodules (GPT-2 names, the embeddings grouped in ``transformer.embed``):
    ``transformer.embed`` (``Embeddings``: ``wte`` ``(V, C)`` and ``wpe`` ``(T_max, C)``),
    ``transformer.drop``, ``transformer.h`` (``n_layer`` ``Block``s), ``transformer.ln_f`` (an
    ``nn.Identity`` for post-norm) and ``lm_head`` (``C -> V``, no bias; with
    ``config.tie_weights`` its weight *is* ``wte``'s weight).
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise TypeError(f"config must be a GPTConfig, got {type(config).__name__}")
        self.config = config
        self.transformer = nn.ModuleDict({
            "embed": Embeddings.from_config(config, config.positional),  # type: ignore[arg-type]
            "drop": nn.Dropout(config.dropout),
            "h": nn.ModuleList(Block(config) for _ in range(config.n_layer)),
            # post-norm blocks end with a norm already (GPT-1 has no final norm)
            "ln_f": make_norm(config) if config.norm_position == "pre" else nn.Identity(),
        })
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)  # (V, C)
        self.init_weights()
        if config.tie_weights:
            self.lm_head.weight = self.transformer.embed.wte.weight  # one tensor, two uses

    def init_weights(self) -> None:
        """GPT-2's initialisation (norms keep weight 1, bias 0).

        Every linear layer and embedding table: normal(0, 0.02), biases zero. The projections
        that end a residual branch, ``attn.c_proj`` and ``mlp.c_proj``: normal(0, 0.02 /
        sqrt(2 L)), because the residual stream receives ``2 L`` such additions.
        """
        residual_std = INIT_STD / math.sqrt(2 * self.config.n_layer)
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                std = residual_std if name.endswith("c_proj") else INIT_STD
                nn.init.normal_(module.weight, mean=0.0, std=std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=INIT_STD)

    def new_caches(
        self, batch_size: int, *, device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> list[KVCache]:
        """One empty ``KVCache`` per block, for ``batch_size`` sequences of up to ``T_max``.

        Device and dtype default to the model's. Use under ``torch.no_grad()``.
        """
        p = self.lm_head.weight
        return [KVCache.for_config(self.config, batch_size, device=device or p.device,
                                   dtype=dtype or p.dtype) for _ in range(self.config.n_layer)]

    def _past_length(self, caches: Sequence[KVCache] | None, batch_size: int) -> int:
        if caches is None:
            return 0
        L = self.config.n_layer
        if not isinstance(caches, (list, tuple)) or len(caches) != L:
            raise ValueError(f"caches must be a list of {L} KVCache (one per block, from "
                             f"model.new_caches(B)), got {type(caches).__name__}"
                             + (f" of length {len(caches)}" if hasattr(caches, "__len__") else ""))
        if not all(isinstance(c, KVCache) for c in caches):
            raise TypeError("every element of caches must be a KVCache")
        lengths = {c.length for c in caches}
        if len(lengths) != 1:
            raise ValueError(f"the caches hold different numbers of positions {sorted(lengths)}; "
                             "they must be filled together (reset them all to start again)")
        if caches[0].k.shape[0] != batch_size:
            raise ValueError(f"the caches were made for batch size {caches[0].k.shape[0]}, but "
                             f"idx has batch size {batch_size}")
        return lengths.pop()

    def forward(
        self, idx: Tensor, targets: Tensor | None = None,
        caches: Sequence[KVCache] | None = None, *, last_only: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Logits ``(B, T, V)`` for ids ``idx`` ``(B, T)``; with ``targets``, ``(logits, loss)``.

        ``targets``: ``(B, T)`` ids in ``[0, V)``, the token that should follow each position;
        the loss is the mean cross-entropy over all ``B T`` positions. ``caches``: from
        ``new_caches(B)``; ``idx`` then continues the cached positions (``T_past + T <= T_max``)
        and the caches are extended. ``last_only=True`` (for sampling, without ``targets``)
        returns only the last position's logits, ``(B, 1, V)``: the output layer, the largest
        matrix product for a big vocabulary, then runs on one position instead of ``T``.
        """
        if not isinstance(last_only, bool):
            raise TypeError(f"last_only must be True or False, got {last_only!r}")
        if last_only and targets is not None:
            raise ValueError("last_only=True gives only the last position's logits, so it cannot "
                             "compute the loss over all positions: pass targets=None")
        check_token_ids(idx, self.config.vocab_size)
        B, T = idx.shape
        past = self._past_length(caches, B)
        T_max = self.config.block_size
        if T == 0 or past + T > T_max:
            where = f"{past} cached + {T} new = {past + T}" if caches is not None else f"T={T}"
            raise ValueError(f"sequence length must be in [1, {T_max}] (the context length "
                             f"T_max), got {where}; crop the input to its last {T_max} tokens")
        embed = self.transformer.embed
        tok = embed.wte(idx)  # (B, T, C)
        pos = embed.positions(past + T)[past:]  # (T, C): positions past .. past+T-1
        x = self.transformer.drop(tok + pos)  # (B, T, C)
        for i, block in enumerate(self.transformer.h):
            x = block(x, cache=None if caches is None else caches[i])  # (B, T, C)
        if last_only:
            x = x[:, -1:, :]  # (B, 1, C): the final norm and lm_head act on each position alone
        x = self.transformer.ln_f(x)  # (B, T, C), or (B, 1, C)
        logits = self.lm_head(x)  # (B, T, V), or (B, 1, V)
        if targets is None:
            return logits
        if not isinstance(targets, Tensor) or targets.shape != idx.shape:
            shape = tuple(targets.shape) if isinstance(targets, Tensor) else type(targets).__name__
            raise ValueError(f"targets must be a tensor of shape {tuple(idx.shape)} like idx, "
                             f"got {shape}")
        check_token_ids(targets, self.config.vocab_size)
        loss = F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(B * T))  # scalar
        return logits, loss

    # --- Hugging Face's GPT2LMHeadModel ----------------------------------------------------------

    def to_hf_state_dict(self) -> dict[str, Tensor]:
        """This model's weights under ``GPT2LMHeadModel``'s names and layouts (copies)."""
        _check_gpt2_layout(self.config)
        return {_hf_name(name): (t.t() if _is_conv1d(name) else t).detach().clone()
                for name, t in self.state_dict().items()}

    @classmethod
    def from_hf_state_dict(cls, state_dict: Mapping[str, Tensor], config: GPTConfig) -> GPT:
        """A ``GPT(config)`` holding the weights of a ``GPT2LMHeadModel`` state dict.

        ``config`` must describe the same model (GPT-2 layout: LayerNorm, pre-norm, tanh GELU,
        learned positions, biases). Missing, unexpected or mis-shaped tensors raise
        ``ValueError``; HF's non-parameter buffers (``attn.bias``, ``attn.masked_bias``) are
        ignored, and a tied model may omit ``lm_head.weight``.
        """
        _check_gpt2_layout(config)
        model = cls(config)
        ours = model.state_dict()
        wanted = {_hf_name(name): name for name in ours}
        extra = [k for k in state_dict if k not in wanted
                 and not k.endswith((".attn.bias", ".attn.masked_bias"))]
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
                given, ours_shape = tuple(state_dict[hf].shape), tuple(ours[name].shape)
                expected = ours_shape[::-1] if _is_conv1d(name) else ours_shape
                if given != expected:
                    raise ValueError(f"{hf} has shape {given}, but this config needs {expected}")
                src = state_dict[hf].t() if _is_conv1d(name) else state_dict[hf]
                ours[name].copy_(src)
        return model


_CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def _is_conv1d(name: str) -> bool:
    """HF's ``Conv1D`` stores ``(in, out)`` where ``nn.Linear`` stores ``(out, in)``."""
    return name.endswith(_CONV1D)


def _hf_name(name: str) -> str:
    """Our parameter name -> GPT2LMHeadModel's: only the embeddings' group differs."""
    return name.replace("transformer.embed.", "transformer.", 1)


def _check_gpt2_layout(config: GPTConfig) -> None:
    gpt2 = {"norm": "layernorm", "norm_position": "pre", "activation": "gelu_tanh",
            "positional": "learned", "bias": True}
    wrong = {k: getattr(config, k) for k, v in gpt2.items() if getattr(config, k) != v}
    if wrong:
        raise ValueError(f"GPT2LMHeadModel has {gpt2}; this config differs in {wrong}")
