"""Token and positional embeddings: the first layer of a GPT.

It handles the step from a batch of token ids ``(B, T)`` to the vectors ``(B, T, C)`` that the
transformer blocks read:

* ``Embeddings``: a token table ``wte`` of shape ``(V, C)`` (a lookup, the same as a one-hot
  vector times the table) plus one vector per position, either learned (``wpe``, GPT-2's choice)
  or the fixed sinusoids of the original transformer;
* ``sinusoidal_positions(T, C)``: those sinusoids, ``PE[t, 2i] = sin(t / 10000^(2i/C))`` and
  ``PE[t, 2i+1] = cos(t / 10000^(2i/C))``;

It does not tokenize text (``tinygpt.tokenizer``), add dropout, or implement rotary position
embeddings (RoPE), which rotate queries and keys inside attention instead of adding a vector here.
Parameter names follow GPT-2 (``wte``, ``wpe``) so that GPT-2-shaped weights map onto them.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

from tinygpt.checks import check_token_ids

Positional = Literal["learned", "sinusoidal"]


def _positive_int(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def sinusoidal_positions(T: int, C: int, base: float = 10000.0) -> Tensor:
    """The fixed positional encodings of Vaswani et al. (2017), shape ``(T, C)``, float32.

    Column pair ``(2i, 2i + 1)`` holds ``sin`` and ``cos`` of ``t * w_i`` with the frequency
    ``w_i = base^(-2i/C)``: fast oscillations in the first columns, slow ones in the last. ``C``
    must be even. Computed in float64, then rounded once to float32.
    """
    T = _positive_int(T, "T")
    C = _positive_int(C, "C")
    if C % 2:
        raise ValueError(f"C must be even (sin/cos column pairs), got C={C}")
    if not base > 1:
        raise ValueError(f"base must be greater than 1, got {base!r}")
    t = torch.arange(T, dtype=torch.float64)  # (T,)
    freqs = base ** (-torch.arange(0, C, 2, dtype=torch.float64) / C)  # (C/2,)
    angles = t[:, None] * freqs[None, :]  # (T, C/2)
    pe = torch.empty(T, C, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angles)
    pe[:, 1::2] = torch.cos(angles)
    return pe.float()  # (T, C)


class Embeddings(nn.Module):
    """Token ids ``(B, T)`` to input vectors ``(B, T, C)``: ``wte[idx] + position[t]``.

    ``positional="learned"`` (GPT-2) adds a trained table ``wpe`` of shape ``(T_max, C)``;
    ``positional="sinusoidal"`` adds the fixed ``sinusoidal_positions(T_max, C)``, kept as a
    buffer ``pe`` that is not a parameter (and not saved in the state dict: it is recomputed).
    Both tables start as GPT-2 initialises them, normal with standard deviation 0.02.
    """

    def __init__(
        self,
        vocab_size: int,
        n_embd: int,
        block_size: int,
        positional: Positional = "learned",
    ) -> None:
        super().__init__()
        self.vocab_size = _positive_int(vocab_size, "vocab_size")
        self.n_embd = _positive_int(n_embd, "n_embd")
        self.block_size = _positive_int(block_size, "block_size")
        if positional not in ("learned", "sinusoidal"):
            raise ValueError(f"positional must be 'learned' or 'sinusoidal', got {positional!r}")
        self.positional = positional
        self.wte = nn.Embedding(vocab_size, n_embd)  # (V, C)
        nn.init.normal_(self.wte.weight, mean=0.0, std=0.02)
        self.wpe: nn.Embedding | None = None
        if positional == "learned":
            self.wpe = nn.Embedding(block_size, n_embd)  # (T_max, C)
            nn.init.normal_(self.wpe.weight, mean=0.0, std=0.02)
        else:
            self.register_buffer("pe", sinusoidal_positions(block_size, n_embd), persistent=False)

    @classmethod
    def from_config(cls, config: object, positional: Positional = "learned") -> Embeddings:
        """Embeddings sized by a model config (e.g. ``GPTConfig``): its ``vocab_size``,
        ``n_embd`` and ``block_size``."""
        return cls(config.vocab_size, config.n_embd, config.block_size, positional)  # type: ignore[attr-defined]

    def positions(self, T: int) -> Tensor:
        """The vectors added at positions ``0 .. T-1``, shape ``(T, C)``."""
        if isinstance(T, bool) or not isinstance(T, int) or not 0 <= T <= self.block_size:
            raise ValueError(f"T must be an integer in [0, {self.block_size}] (T_max), got {T!r}")
        if self.wpe is None:
            return self.pe[:T]  # (T, C)
        pos = torch.arange(T, device=self.wpe.weight.device)  # (T,)
        return self.wpe(pos)  # (T, C)

    def forward(self, idx: Tensor) -> Tensor:
        """Embed ``idx`` (B, T), ids in ``[0, V)`` and ``T <= T_max``, as ``(B, T, C)``."""
        check_token_ids(idx, self.vocab_size, self.block_size)
        tok = self.wte(idx)  # (B, T, C)
        pos = self.positions(idx.shape[1])  # (T, C), broadcast over the batch
        return tok + pos  # (B, T, C)

    def extra_repr(self) -> str:
        return f"positional={self.positional!r}, block_size={self.block_size}"
