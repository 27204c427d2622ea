"""The small models of chapters 4 and 5, the loss ladder's rungs between counting and the GPT.

``ContextMLP`` is chapter 4's model: a Bengio-style MLP that reads a fixed window of the previous
``context`` characters (their embeddings side by side, a hidden layer, logits). ``AttentionOnly``
is chapter 5's: embeddings, causal self-attention layers in residual connections, a final norm and
the output layer, with no MLP. Both map ids ``(B, T)`` to logits ``(B, T, V)`` (and a loss, given
targets), as ``GPT`` does, so that ``tinygpt.book.scoring.score`` and the ladder's ``fit`` take any
of the three. This module builds the models; it does not train them (``tinygpt.book.ladder.fit``
does, with chapter 8's optimizer and schedule).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tinygpt.attention import CausalSelfAttention
from tinygpt.block import make_norm
from tinygpt.checks import check_instance, check_int, check_token_ids
from tinygpt.config import GPTConfig
from tinygpt.embedding import Embeddings
from tinygpt.model import INIT_STD, init_gpt2


def _output(logits: Tensor, targets: Tensor | None) -> Tensor | tuple[Tensor, Tensor]:
    """``logits``, or ``(logits, mean cross-entropy)`` when ``targets`` ``(B, T)`` are given."""
    if targets is None:
        return logits
    B, T, V = logits.shape
    check_token_ids(targets, V, name="targets")
    if targets.shape != (B, T):
        raise ValueError(f"targets must have the shape {(B, T)} of idx, got {tuple(targets.shape)}")
    return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten())


class ContextMLP(nn.Module):
    """The next token from the previous ``context`` tokens: embed each, concatenate, one hidden
    layer (tanh), logits. Positions with fewer tokens before them see a padding token ``V``
    instead (row ``V`` of ``wte``), so every position of a ``(B, T)`` input gets a prediction."""

    def __init__(self, vocab_size: int, context: int, n_embd: int, hidden: int) -> None:
        super().__init__()
        self.vocab_size = check_int(vocab_size, "vocab_size")
        self.context = check_int(context, "context")
        check_int(n_embd, "n_embd")
        check_int(hidden, "hidden")
        self.wte = nn.Embedding(vocab_size + 1, n_embd)  # (V + 1, C): row V is the padding
        self.c_fc = nn.Linear(context * n_embd, hidden)  # k C -> H
        self.lm_head = nn.Linear(hidden, vocab_size)  # H -> V

    def forward(self, idx: Tensor, targets: Tensor | None = None) -> Tensor | tuple[Tensor, Tensor]:
        check_token_ids(idx, self.vocab_size)
        pad = idx.new_full((idx.shape[0], self.context - 1), self.vocab_size)  # (B, k-1)
        windows = torch.cat([pad, idx], dim=1).unfold(1, self.context, 1)  # (B, T, k)
        x = self.wte(windows).flatten(2)  # (B, T, k C): the k embeddings side by side
        h = torch.tanh(self.c_fc(x))  # (B, T, H)
        return _output(self.lm_head(h), targets)  # (B, T, V)


class AttentionLayer(nn.Module):
    """Half a pre-norm block: ``x + attn(ln_1(x))``, ``(B, T, C) -> (B, T, C)``."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = make_norm(config)
        self.attn = CausalSelfAttention(config)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.attn(self.ln_1(x))  # (B, T, C)


class AttentionOnlyParts(nn.ModuleDict):
    """``AttentionOnly``'s ``transformer``: its parts, named and typed as in ``GPTParts``."""

    embed: Embeddings
    h: nn.ModuleList
    ln_f: nn.Module


class AttentionOnly(nn.Module):
    """``GPT`` without the MLPs: embeddings, ``n_layer`` attention layers, ``ln_f``, ``lm_head``
    (tied to ``wte`` if ``tie_weights``), initialised as GPT-2 is. It reads ``config``'s sizes,
    norm and positions, and ignores its MLP fields."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        check_instance(config, GPTConfig, "config")
        self.config = config
        self.transformer = AttentionOnlyParts({
            "embed": Embeddings.from_config(config, config.positional),
            "h": nn.ModuleList(AttentionLayer(config) for _ in range(config.n_layer)),
            "ln_f": make_norm(config),
        })
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)  # (V, C)
        init_gpt2(self, residual_std=INIT_STD / math.sqrt(config.n_layer))  # one addition per layer
        if config.tie_weights:
            self.lm_head.weight = self.transformer.embed.wte.weight

    def forward(self, idx: Tensor, targets: Tensor | None = None) -> Tensor | tuple[Tensor, Tensor]:
        x = self.transformer.embed(idx)  # (B, T, C), the ids checked here
        for layer in self.transformer.h:
            x = layer(x)  # (B, T, C)
        x = self.transformer.ln_f(x)  # (B, T, C)
        return _output(self.lm_head(x), targets)  # (B, T, V)

