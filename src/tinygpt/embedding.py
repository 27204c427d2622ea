"""Token and positional embeddings: the first layer of a GPT, ids ``(B, T)`` to ``(B, T, C)``.

Chapter 4 builds it.

``Embeddings`` adds a token table ``wte`` and one vector per position, learned (``wpe``, GPT-2)
or the fixed ``sinusoidal_positions`` of the 2017 transformer; with ``"rope"`` it adds nothing
(zeros), since rotary embeddings act inside attention (``tinygpt.rope``). It does not tokenize
text or add dropout.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from tinygpt.checks import check_choice, check_float, check_int, check_token_ids
from tinygpt.config import POSITIONALS, GPTConfig, Positional


def sinusoidal_positions(T: int, C: int, base: float = 10000.0) -> Tensor:
    """Vaswani et al.'s fixed positional encodings, ``(T, C)``: column pair ``(2i, 2i+1)`` holds
    ``sin`` and ``cos`` of ``t * base^(-2i/C)``. ``C`` must be even. Computed in float64."""
    check_int(T, "T")
    check_int(C, "C")
    check_float(base, "base", 1.0, low_open=True)
    if C % 2:
        raise ValueError(f"C must be even (sin/cos column pairs), got C={C}")
    t = torch.arange(T, dtype=torch.float64)  # (T,)
    freqs = base ** (-torch.arange(0, C, 2, dtype=torch.float64) / C)  # (C/2,)
    angles = t[:, None] * freqs[None, :]  # (T, C/2)
    pe = torch.empty(T, C, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angles)
    pe[:, 1::2] = torch.cos(angles)
    return pe.float()  # (T, C)


class Embeddings(nn.Module):
    """Token ids ``(B, T)`` to input vectors ``(B, T, C)``: ``wte[idx] + position[t]``.

    Positions are a learned table ``wpe`` ``(T_max, C)`` or the fixed sinusoids, kept in a buffer
    ``pe`` that is not saved (it is recomputed). Tables start normal with std 0.02, as in GPT-2.
    """

    pe: Tensor  # the buffer registered below (for the type checker: a buffer is a tensor)

    def __init__(self, vocab_size: int, n_embd: int, block_size: int,
                 positional: Positional = "learned") -> None:
        super().__init__()
        self.vocab_size = check_int(vocab_size, "vocab_size")
        self.n_embd = check_int(n_embd, "n_embd")
        self.block_size = check_int(block_size, "block_size")
        self.positional = check_choice(positional, "positional", POSITIONALS)
        self.wte = nn.Embedding(vocab_size, n_embd)  # (V, C)
        nn.init.normal_(self.wte.weight, mean=0.0, std=0.02)
        self.wpe: nn.Embedding | None = None
        if positional == "learned":
            self.wpe = nn.Embedding(block_size, n_embd)  # (T_max, C)
            nn.init.normal_(self.wpe.weight, mean=0.0, std=0.02)
        elif positional == "sinusoidal":
            self.register_buffer("pe", sinusoidal_positions(block_size, n_embd), persistent=False)
        else:  # "rope": the positions enter attention, nothing is added to the tokens
            self.register_buffer("pe", torch.zeros(block_size, n_embd), persistent=False)

    @classmethod
    def from_config(cls, config: GPTConfig, positional: Positional = "learned") -> Embeddings:
        """Embeddings sized by a ``GPTConfig``'s ``vocab_size``, ``n_embd`` and ``block_size``."""
        return cls(config.vocab_size, config.n_embd, config.block_size, positional)

    def positions(self, T: int) -> Tensor:
        """The vectors added at positions ``0 .. T-1``, shape ``(T, C)``."""
        check_int(T, "T", 0, self.block_size)
        if self.wpe is None:
            return self.pe[:T]  # (T, C)
        return self.wpe(torch.arange(T, device=self.wpe.weight.device))  # (T, C)

    def forward(self, idx: Tensor) -> Tensor:
        """Embed ids ``idx`` ``(B, T)`` in ``[0, V)``, ``T <= T_max``, as ``(B, T, C)``."""
        check_token_ids(idx, self.vocab_size, self.block_size)
        tok = self.wte(idx)  # (B, T, C)
        pos = self.positions(idx.shape[1])  # (T, C), broadcast over the batch
        return tok + pos  # (B, T, C)

    def extra_repr(self) -> str:
        return f"positional={self.positional!r}, block_size={self.block_size}"
