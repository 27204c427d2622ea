"""The GPT: token ids in, next-token logits (and a loss) out.

Chapter 7 builds it.

``GPT(config)`` stacks the embeddings, ``n_layer`` blocks, a final norm and the output layer
``lm_head``, with GPT-2's parameter names, weight tying and initialisation, and one ``KVCache``
per block for sampling. ``parameter_counts(config)`` and its helpers count the parameters in
closed form without building a model. Training, sampling and Hugging Face's weight names live
elsewhere (``tinygpt.train``, ``tinygpt.sample``, ``tinygpt.gpt2``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tinygpt.attention import KVCache
from tinygpt.block import GATED, Block, make_norm
from tinygpt.checks import check_bool, check_instance, check_token_ids
from tinygpt.config import GPTConfig
from tinygpt.embedding import Embeddings

__all__ = [
    "GPT",
    "INIT_STD",
    "attention_parameters",
    "init_gpt2",
    "mlp_parameters",
    "norm_parameters",
    "num_parameters",
    "parameter_counts",
]

INIT_STD = 0.02  # GPT-2's standard deviation for every weight matrix and embedding table


def init_gpt2(model: nn.Module, residual_std: float) -> None:
    """GPT-2's initialisation of every layer of ``model``: weights normal(0, 0.02), biases zero,
    and the projections that end a residual branch (``c_proj``) normal(0, ``residual_std``)."""
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            std = residual_std if name.endswith("c_proj") else INIT_STD
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=INIT_STD)


# --- counting parameters -------------------------------------------------------------------------

def norm_parameters(n_embd: int, norm: str = "layernorm", bias: bool = True) -> int:
    """Parameters of one norm of width ``C``: ``2C`` for LayerNorm with a bias, else ``C``."""
    return 2 * n_embd if norm == "layernorm" and bias else n_embd


def attention_parameters(n_embd: int, bias: bool = True) -> int:
    """``c_attn`` (``C x 3C``) + ``c_proj`` (``C x C``): ``4C^2``, plus ``4C`` biases."""
    return 4 * n_embd * n_embd + (4 * n_embd if bias else 0)


def mlp_parameters(n_embd: int, hidden: int, bias: bool = True, gated: bool = False) -> int:
    """``c_fc`` (``C x F``) + ``c_proj`` (``F x C``): ``2CF``, plus ``F + C`` biases; a gated
    MLP (SwiGLU) has ``c_fc`` ``C x 2F``: ``3CF``, plus ``2F + C`` biases."""
    fc = hidden * (2 if gated else 1)
    return (fc + hidden) * n_embd + (fc + n_embd if bias else 0)


def parameter_counts(config: GPTConfig) -> dict[str, int]:
    """The parameters of ``GPT(config)`` part by part, in closed form; ``attn``, ``mlp`` and
    ``norms`` sum over the ``L`` blocks, ``ln_f`` is 0 for post-norm, ``lm_head`` 0 when tied;
    ``attn`` includes QK-norm's two gains of ``d_k``."""
    check_instance(config, GPTConfig, "config")
    V, C, L = config.vocab_size, config.n_embd, config.n_layer
    norm = norm_parameters(C, config.norm, config.bias)
    qk = 2 * config.head_size if config.qk_norm else 0
    gated = config.activation in GATED
    return {
        "wte": V * C,
        "wpe": config.block_size * C if config.positional == "learned" else 0,
        "attn": L * (attention_parameters(C, config.bias) + qk),
        "mlp": L * mlp_parameters(C, config.mlp_width, config.bias, gated),
        "norms": L * 2 * norm,
        "ln_f": norm if config.norm_position == "pre" else 0,
        "lm_head": 0 if config.tie_weights else V * C,
    }


def num_parameters(config: GPTConfig) -> int:
    """The number of distinct parameters of ``GPT(config)`` (a tied matrix counts once)."""
    return sum(parameter_counts(config).values())


# --- the model -----------------------------------------------------------------------------------

class GPTParts(nn.ModuleDict):
    """GPT-2's ``transformer``: a ``ModuleDict`` (so the weights keep GPT-2's names) whose
    parts are declared here with their types, for readers and type checkers alike."""

    embed: Embeddings
    drop: nn.Dropout
    h: nn.ModuleList
    ln_f: nn.Module  # a norm, or nn.Identity for post-norm


class GPT(nn.Module):
    """A decoder-only transformer language model: ids ``(B, T)`` -> logits ``(B, T, V)``.

    GPT-2's names: ``transformer.embed`` (``wte``, ``wpe``), ``transformer.h`` (the blocks),
    ``transformer.ln_f`` (an ``nn.Identity`` for post-norm) and ``lm_head``.
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        check_instance(config, GPTConfig, "config")
        self.config = config
        self.transformer = GPTParts({
            "embed": Embeddings.from_config(config, config.positional),
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
        """GPT-2's initialisation (``init_gpt2``), the projections that end a residual branch at
        0.02 / sqrt(2 L): the stream receives ``2 L`` such additions, two per block. With
        ``zero_init_proj`` those projections then start at zero: every block starts as the
        identity (the random numbers drawn are the same, so the other weights are too)."""
        init_gpt2(self, residual_std=INIT_STD / math.sqrt(2 * self.config.n_layer))
        if self.config.zero_init_proj:
            for name, p in self.named_parameters():
                if name.endswith("c_proj.weight"):
                    nn.init.zeros_(p)

    def new_caches(self, batch_size: int, *, device: torch.device | str | None = None,
                   dtype: torch.dtype | None = None) -> list[KVCache]:
        """One empty ``KVCache`` per block, for ``batch_size`` sequences of up to ``T_max``
        positions, on the model's device and dtype unless given. Use under ``torch.no_grad()``."""
        p = self.lm_head.weight
        return [KVCache.for_config(self.config, batch_size, device=device or p.device,
                                   dtype=dtype or p.dtype) for _ in range(self.config.n_layer)]

    def forward(self, idx: Tensor, targets: Tensor | None = None,
                caches: Sequence[KVCache] | None = None, *,
                last_only: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """Logits ``(B, T, V)`` for ids ``idx`` ``(B, T)``; with ``targets`` ``(B, T)`` also the
        mean cross-entropy. ``caches`` (from ``new_caches(B)``) hold the positions before ``idx``
        and are extended. ``last_only=True`` (sampling) computes only the last position's logits.
        """
        self.check_inputs(idx, targets, caches, last_only)  # a clear error for any bad argument
        past = 0 if caches is None else caches[0].length  # positions already cached
        T = idx.shape[1]
        tok = self.transformer.embed.wte(idx)  # (B, T, C)
        pos = self.transformer.embed.positions(past + T)[past:]  # (T, C): past .. past+T-1
        x = self.transformer.drop(tok + pos)  # (B, T, C)
        for i, block in enumerate(self.transformer.h):
            x = block(x, cache=None if caches is None else caches[i])  # (B, T, C)
        return self.logits_and_loss(x, targets, last_only=last_only)

    def logits_and_loss(self, x: Tensor, targets: Tensor | None = None, *,
                        last_only: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """The end of ``forward``, from the residual stream ``x`` ``(B, T, C)`` after the last
        block: the final norm, ``lm_head``, the soft cap if set, and with ``targets`` ``(B, T)``
        the mean cross-entropy. ``last_only=True`` keeps only the last position."""
        B, T, _ = x.shape
        if last_only:
            x = x[:, -1:, :]  # (B, 1, C): the final norm and lm_head act on each position
        x = self.transformer.ln_f(x)  # (B, T, C), or (B, 1, C)
        logits = self.lm_head(x)  # (B, T, V), or (B, 1, V)
        if self.config.logit_softcap:  # a smooth clamp of every logit to (-c, c)
            c = self.config.logit_softcap
            logits = c * torch.tanh(logits / c)
        if targets is None:
            return logits
        loss = F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(B * T))  # scalar
        return logits, loss

    def check_inputs(self, idx: Tensor, targets: Tensor | None,
                     caches: Sequence[KVCache] | None, last_only: bool) -> None:
        """A clear error for any bad argument of ``forward``, which calls it first: ids of the
        right shape, dtype and range, targets like them, caches that fit, a length that fits."""
        check_bool(last_only, "last_only")
        if last_only and targets is not None:
            raise ValueError("last_only=True gives only the last position's logits, so it cannot "
                             "compute the loss over all positions: pass targets=None")
        check_token_ids(idx, self.config.vocab_size)
        B, T = idx.shape
        past = 0 if caches is None else self._check_caches(caches, B)
        T_max = self.config.block_size
        if T == 0 or past + T > T_max:
            where = f"{past} cached + {T} new = {past + T}" if caches is not None else f"T={T}"
            raise ValueError(f"sequence length must be in [1, {T_max}] (the context length "
                             f"T_max), got {where}; crop the input to its last {T_max} tokens")
        if targets is not None:
            if not isinstance(targets, Tensor) or targets.shape != idx.shape:
                got = (tuple(targets.shape) if isinstance(targets, Tensor)
                       else type(targets).__name__)
                raise ValueError(f"targets must be a tensor of shape {(B, T)} like idx, got {got}")
            check_token_ids(targets, self.config.vocab_size, name="targets")

    def _check_caches(self, caches: object, batch_size: int) -> int:
        """The number of positions the caches hold, after checking they fit this model and batch."""
        L, cfg = self.config.n_layer, self.config
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
        shape = tuple(caches[0].k.shape)
        if any((c.k.shape[0], c.k.shape[1], c.k.shape[3]) != (batch_size, cfg.n_head, cfg.head_size)
               for c in caches):
            raise ValueError(f"the caches hold keys of shape {shape} (B, H, T_max, d_k), but idx "
                             f"has batch size {batch_size} and this model H={cfg.n_head}, "
                             f"d_k={cfg.head_size}; make them with model.new_caches(B)")
        return lengths.pop()
