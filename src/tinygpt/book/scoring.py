"""One way to score every model of the book: the mean loss over a whole validation split.

Every model the book trains is compared on the same validation text (the last 10% of the
complete plays, ``data.split_train_val``), scored the same way: the mean cross-entropy, in nats
per token, of *every* next-token prediction of the split — ``len(ids) - 1`` of them, not a
sample of random batches. A model with a context window reads the split in consecutive windows of
``block_size`` tokens (the last one shorter), so the first prediction of each window sees one
token of context, the last sees ``block_size``: the way nanoGPT's training windows are read.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tinygpt.checks import check_ids, check_instance, check_int


def score(model: nn.Module, ids: Tensor, block_size: int, batch_size: int = 32) -> float:
    """Mean cross-entropy (nats per token) of ``model`` over every prediction of ``ids`` (1-D).

    ``model`` maps ``(B, T)`` token ids to ``(B, T, V)`` logits (or to ``(logits, loss)``, as
    ``GPT`` does); it runs in eval mode without gradients and is left in the mode it was in.
    ``ids``: a 1-D integer tensor (or list) of at least 2 ids; for a model with a ``config``
    (a ``GPT``), ids must be in its vocabulary and ``block_size`` at most its context length.
    The windows are moved to the device of the model's parameters (a GPU, say).
    """
    check_instance(model, nn.Module, "model")
    check_int(block_size, "block_size")
    check_int(batch_size, "batch_size")
    config = getattr(model, "config", None)
    limit = getattr(config, "block_size", None)
    if limit is not None and block_size > limit:
        raise ValueError(f"block_size={block_size} exceeds the model's context length {limit}")
    check_ids(ids, getattr(config, "vocab_size", None) or sys.maxsize)  # 1-D integer ids
    if len(ids) < 2:
        raise ValueError(f"score needs at least 2 tokens (one prediction), got {len(ids)}")
    ids = torch.as_tensor(ids, dtype=torch.long)  # (N,)
    n = len(ids) - 1  # predictions: ids[t] -> ids[t + 1]
    was_training = model.training
    model.eval()
    total = 0.0
    try:
        with torch.no_grad():
            full = n // block_size * block_size  # tokens in whole windows
            x = ids[:full].view(-1, block_size)  # (N, T)
            y = ids[1 : full + 1].view(-1, block_size)  # (N, T): the next tokens
            pieces = [(x[i : i + batch_size], y[i : i + batch_size])
                      for i in range(0, len(x), batch_size)]
            if full < n:  # the last, shorter window
                pieces.append((ids[full:n][None], ids[full + 1 : n + 1][None]))
            device = next(model.parameters(), torch.empty(0)).device
            for xb, yb in pieces:
                xb, yb = xb.to(device), yb.to(device)
                out = model(xb)
                logits = out[0] if isinstance(out, tuple) else out  # (B, T, V)
                total += F.cross_entropy(logits.flatten(0, 1), yb.flatten(),
                                         reduction="sum").item()
    finally:
        model.train(was_training)
    return total / n
