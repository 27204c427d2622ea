"""Two levers of modded-nanogpt and nanochat, as experiments for the benchmark only (issue #43).

``LeverGPT`` is chapter 7's ``GPT`` (chapter 12's modern parts, as its config asks) with two
optional changes that ``benchmarks/modern_book.py --train`` trains against ``MODERN_RECIPE`` on
the selection split, seed by seed (a job's ``"model_levers"``):

- **value embeddings** (``value_embeddings=True``): each block has a table of its own,
  ``(V, C)``, looked up with the input ids and mixed into that block's attention values,
  ``v = a v + b ve[idx]`` (per block, learned scalars ``a`` and ``b``), so every layer can read
  the token it stands on directly, however far the residual stream has carried it away;
- **U-net skips** (``unet_skips=True``): with ``L`` blocks, the output of block ``i`` (for
  ``i < L // 2``) is added, times a learned scalar, to the input of its mirror block ``L-1-i``,
  as modded-nanogpt's encoder-decoder skips do; with 3 blocks, block 0's output enters block 2.

Both start as the plain model: ``b`` and the skip scalars start at 0, ``a`` at 1, so the
first forward pass gives the plain model's logits, and the random draws of the plain parts are
the plain model's own (``GPT.__init__`` runs first; the new tables are drawn after). They are
built here, not in ``tinygpt``: they move into the package only if their seed spread says they
help. The model is trained and scored only; key/value caches (sampling) are refused.

Run as a script (``make bench`` runs it), it prints the parameters each lever adds to chapter
12's model (``MODERN_RECIPE``): ``python benchmarks/levers_model.py``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from tinygpt.attention import CausalSelfAttention, KVCache
from tinygpt.block import Block
from tinygpt.config import GPTConfig
from tinygpt.model import GPT, INIT_STD

__all__ = ["LeverGPT", "added_parameters", "attend_with_value_embedding", "unet_mirror"]


def unet_mirror(n_layer: int) -> dict[int, int]:
    """The U-net's skips of ``n_layer`` blocks: receiving block ``L-1-i`` -> giving block ``i``,
    for the first ``L // 2`` blocks (an odd middle block neither gives nor receives)."""
    return {n_layer - 1 - i: i for i in range(n_layer // 2)}


def attend_with_value_embedding(attn: CausalSelfAttention, x: Tensor, value_embedding: Tensor,
                                value_scale: Tensor, embedding_scale: Tensor) -> Tensor:
    """``attn``'s causal self-attention over ``x`` ``(B, T, C)`` (no cache), its values mixed
    with ``value_embedding`` ``(B, T, C)``: ``v = value_scale * v + embedding_scale * ve``.

    The steps of ``CausalSelfAttention.forward`` on its fused path, with the mixing after the
    split into ``q, k, v`` (before the heads' split, which cuts ``v`` and the table alike):
    ``c_attn``, the split, the heads, ``position_queries_keys`` (QK-norm and RoPE, the layer's
    own), ``fused_attention``, the heads side by side again, ``c_proj`` and its dropout. The
    mixed values keep ``v``'s dtype (under autocast the table's float32 would promote them)."""
    B, T, C = x.shape
    H = attn.n_head
    q, k, v = attn.c_attn(x).split(C, dim=2)  # 3 x (B, T, C)
    v = value_scale * v + (embedding_scale * value_embedding).to(v.dtype)  # (B, T, C)
    q = q.view(B, T, H, C // H).transpose(1, 2)  # (B, H, T, d_k)
    k = k.view(B, T, H, C // H).transpose(1, 2)  # (B, H, T, d_k)
    v = v.view(B, T, H, C // H).transpose(1, 2)  # (B, H, T, d_k), the table split alike
    q, k = attn.position_queries_keys(q, k, past=0)
    y = attn.fused_attention(q, k, v)  # (B, H, T, d_k)
    y = y.transpose(1, 2).contiguous().view(B, T, C)  # heads side by side: (B, T, C)
    return attn.resid_dropout(attn.c_proj(y))  # (B, T, C)


class LeverGPT(GPT):
    """``GPT(config)`` with value embeddings and/or U-net skips; both off, it is ``GPT``.

    New parameters (none when both levers are off), all outside ``transformer.h``, so that
    ``configure_muon`` gives them to AdamW, not Muon (Muon takes the blocks' 2-D matrices):

    - ``value_embeddings``: ``L`` tables ``(V, C)``, normal(0, 0.02) like ``wte`` (AdamW with
      weight decay, as ``wte``);
    - ``value_scales`` (``a``, ``L`` of them, start 1) and ``value_embedding_scales`` (``b``,
      start 0), vectors: AdamW without weight decay, like the norms' gains;
    - ``skip_scales``: ``L // 2`` scalars, start 0, AdamW without weight decay.

    Why ``b = 0`` with a random table, rather than ``b = 0.5``: the model starts exactly as the
    plain one (as ``zero_init_proj`` starts every block as the identity), so a lever is measured
    from the same starting function; and nothing is lost, because ``b``'s gradient,
    ``sum ve * dL/dv``, is not 0 (the table is random), and AdamW's first steps move ``b`` by
    about its learning rate whatever the gradient's size; the table's own gradient (``b``
    times that of ``v``) follows from the second step, which AdamW again scales to full size.
    The skip scalars start at 0 for the same reason: their gradient, ``skip . dL/dx``, is not 0.
    """

    def __init__(self, config: GPTConfig, value_embeddings: bool = False,
                 unet_skips: bool = False) -> None:
        super().__init__(config)  # the plain model's parts, drawn first: the same weights
        if not isinstance(value_embeddings, bool) or not isinstance(unet_skips, bool):
            raise TypeError(f"value_embeddings and unet_skips must be True or False, got "
                            f"{value_embeddings!r} and {unet_skips!r}")
        self.use_value_embeddings = value_embeddings
        self.use_unet_skips = unet_skips
        L, V, C = config.n_layer, config.vocab_size, config.n_embd
        if value_embeddings:
            self.value_embeddings = nn.ModuleList(nn.Embedding(V, C) for _ in range(L))
            for table in self.value_embeddings:
                nn.init.normal_(table.weight, mean=0.0, std=INIT_STD)
            self.value_scales = nn.Parameter(torch.ones(L))  # a: the layer's own values kept
            self.value_embedding_scales = nn.Parameter(torch.zeros(L))  # b: none of the table
        self.skips = unet_mirror(L) if unet_skips else {}
        if unet_skips:
            self.skip_scales = nn.Parameter(torch.zeros(L // 2))  # one per giving block

    def new_caches(self, batch_size: int, *, device: torch.device | str | None = None,
                   dtype: torch.dtype | None = None) -> list[KVCache]:
        """Refused: these models are trained and scored, never sampled with a cache."""
        raise ValueError("LeverGPT (benchmarks/levers_model.py) is trained and scored only: it "
                         "has no key/value caches; call it with caches=None")

    def forward(self, idx: Tensor, targets: Tensor | None = None,
                caches: Sequence[KVCache] | None = None, *,
                last_only: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """What ``GPT.forward`` returns: logits ``(B, T, V)``, with ``targets`` also the mean
        cross-entropy; ``last_only=True`` gives the last position's logits only. ``caches``
        must be None (``ValueError`` otherwise)."""
        if caches is not None:
            raise ValueError("LeverGPT (benchmarks/levers_model.py) is trained and scored only: "
                             "it takes no key/value caches; call it with caches=None")
        self.check_inputs(idx, targets, None, last_only)
        T = idx.shape[1]
        tok = self.transformer.embed.wte(idx)  # (B, T, C)
        pos = self.transformer.embed.positions(T)  # (T, C); zeros with RoPE
        x = self.transformer.drop(tok + pos)  # (B, T, C)
        given: dict[int, Tensor] = {}  # the outputs of the blocks that give a skip
        givers = set(self.skips.values())
        for i, block in enumerate(self.transformer.h):
            if i in self.skips:  # a block of the second half: its mirror's output enters
                j = self.skips[i]
                x = x + self.skip_scales[j] * given[j]  # (B, T, C)
            x = self.run_block(i, block, x, idx)  # (B, T, C)
            if i in givers:
                given[i] = x
        return self.logits_and_loss(x, targets, last_only=last_only)

    def run_block(self, i: int, block: Block, x: Tensor, idx: Tensor) -> Tensor:
        """Block ``i`` on the stream ``x`` ``(B, T, C)``: the block itself, or with value
        embeddings the same steps (``Block.forward``) with its attention's values mixed with
        table ``i`` looked up at ``idx``."""
        if not self.use_value_embeddings:
            return block(x)
        ve = self.value_embeddings[i](idx)  # (B, T, C)
        a, b = self.value_scales[i], self.value_embedding_scales[i]
        if block.pre_norm:  # GPT-2
            x = x + attend_with_value_embedding(block.attn, block.ln_1(x), ve, a, b)
            return x + block.mlp(block.ln_2(x))  # (B, T, C)
        x = block.ln_1(x + attend_with_value_embedding(block.attn, x, ve, a, b))  # post-norm
        return block.ln_2(x + block.mlp(x))  # (B, T, C)

    def extra_repr(self) -> str:
        return (f"value_embeddings={self.use_value_embeddings}, "
                f"unet_skips={self.use_unet_skips}")


def added_parameters(config: GPTConfig) -> dict[str, int]:
    """The parameters each lever adds to ``GPT(config)``: ``{"ve": ..., "unet": ...,
    "ve+unet": ...}``, counted on built models."""
    plain = sum(p.numel() for p in GPT(config).parameters())
    counts = {}
    for tag, levers in (("ve", {"value_embeddings": True}), ("unet", {"unet_skips": True}),
                        ("ve+unet", {"value_embeddings": True, "unet_skips": True})):
        counts[tag] = sum(p.numel() for p in LeverGPT(config, **levers).parameters()) - plain
    return counts


if __name__ == "__main__":  # `make bench`: what the levers cost chapter 12's model
    from tinygpt.book.trained_model import MODERN_RECIPE

    total = sum(p.numel() for p in GPT(MODERN_RECIPE.model).parameters())
    print(f"MODERN_RECIPE's model: {total:,} parameters")
    for tag, added in added_parameters(MODERN_RECIPE.model).items():
        print(f"{tag:>8s}: +{added:,} ({100 * added / total:.1f}%)")
