"""Dynamic evaluation: a model that keeps learning while it reads the validation text, scored
honestly.

Chapter 14 teaches it (``read_and_learn`` is shown there, and its exercise is graded against it);
``tinygpt.book.evaluations`` caches its results.

A compressor such as PPMd keeps counting as it reads, so new plays' names cost it less the second
time they appear. A network can do the same (dynamic evaluation, Krause et al., 2018): read the
validation split in consecutive chunks and, for each chunk, first **score** it (its loss over
every prediction in it is added to the total), then take one optimizer **step** on that same
loss, and go on. Every prediction is then made by a model that has trained only on text before
it: the score is honest, the loss on what is read next. Training on a chunk before scoring it
would be reading the answers first.

``dynamic_score(model, ids, block_size, lr)`` reads ``ids`` in the windows
``tinygpt.book.scoring.score`` reads (consecutive windows of ``block_size``; ``windows``
windows a chunk) and returns the mean loss, in nats per token, over the same predictions: with
``lr = 0`` it is ``score``'s loss. With ``parts`` > 1 each chunk is read in that many pieces,
a step after each: a piece's predictions are made from the same context as in the whole window
(the window's inputs up to them), but by a model that has learned from the pieces before. The
update is a plain one: SGD or Adam at a fixed ``lr`` on the chunk's (or piece's) mean loss, in
eval mode (no dropout), with a ``momentum`` of choice (Adam's beta1) and Adam's ``beta2``.
Adam without momentum scales each chunk's own gradient by the running RMS of the gradients,
close to Krause et al.'s update scaled by the gradients' RMS (theirs is measured over the
training set). Their decay of the weights back towards the trained ones is ``decay``: after
each step every weight moves that fraction of the way back to its trained value
(``pull_back``), so what one play taught fades as the next is read. The model is copied first:
the caller's model (the book's cached one, say) is not changed.
``read_and_learn`` is the loop itself, for any chunks and optimizer.
"""

from __future__ import annotations

import copy
import itertools
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tinygpt.checks import check_choice, check_float, check_ids, check_instance, check_int

OPTIMIZERS = ("sgd", "adam")


def chunk_loss(model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    """The summed cross-entropy of ``model``'s predictions of ``y`` (B, S) from ``x`` (B, T),
    S <= T: the predictions at the last S positions (the inputs before them are context)."""
    out = model(x)
    logits = out[0] if isinstance(out, tuple) else out  # (B, T, V); a GPT returns (logits, loss)
    logits = logits[:, x.shape[1] - y.shape[1] :]  # (B, S, V): the positions that y scores
    return F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum")


def read_and_learn(model: nn.Module, chunks: Sequence[tuple[Tensor, Tensor]],
                   optimizer: torch.optim.Optimizer,
                   on_read: Callable[[int], None] | None = None) -> list[float]:
    """For each chunk ``(x, y)`` in order: score it (the summed loss of its predictions, taken
    before anything is learned from it), then one step of ``optimizer`` on its mean loss.
    Returns each chunk's summed loss, as scored. ``on_read(i)``, if given, is called after chunk
    ``i`` is scored and before the step on it. ``model`` is trained in place, in eval mode."""
    model.eval()  # no dropout: the model that is scored is the one that learns
    scored = []
    for i, (x, y) in enumerate(chunks):
        optimizer.zero_grad(set_to_none=True)
        total = chunk_loss(model, x, y)  # scored first ...
        scored.append(total.item())
        if on_read is not None:
            on_read(i)
        (total / y.numel()).backward()  # ... then learned from
        optimizer.step()
    return scored


def pull_back(optimizer: torch.optim.Optimizer, decay: float) -> None:
    """Make every ``optimizer.step()`` end by moving each of its parameters the fraction
    ``decay`` of the way back to the value it has now, ``p0``: ``p <- p + decay * (p0 - p)``
    (Krause et al.'s decay towards the trained weights). ``decay = 0`` changes nothing;
    ``decay = 1`` undoes every step."""
    check_float(decay, "decay", 0, 1)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    anchors = [p.detach().clone() for p in params]

    def after_step(*_: object) -> None:
        with torch.no_grad():
            for p, anchor in zip(params, anchors):
                p.lerp_(anchor, decay)

    if decay > 0:
        optimizer.register_step_post_hook(after_step)


def windows(ids: Tensor, block_size: int, per_chunk: int,
            parts: int = 1) -> list[tuple[Tensor, Tensor]]:
    """``ids`` (N,) as the chunks ``dynamic_score`` reads: ``per_chunk`` consecutive windows of
    ``block_size`` inputs and their next tokens each, ``(x, y)`` of shape (W, T), the last window
    shorter if ``N - 1`` is not a multiple of ``block_size`` (it is a chunk of its own).

    With ``parts`` > 1 each chunk is cut along its positions into that many pieces of about
    T / parts predictions (T of them if ``parts`` > T), in order: the piece of positions
    ``start`` to ``end`` is ``(x[:, :end], y[:, start:end])``, its predictions made from the
    window's inputs up to them (``chunk_loss`` scores the last positions). Every prediction is
    in exactly one piece."""
    check_int(parts, "parts")
    n = len(ids) - 1  # predictions: ids[t] -> ids[t + 1]
    full = n // block_size * block_size
    x = ids[:full].view(-1, block_size)  # (N // T, T)
    y = ids[1 : full + 1].view(-1, block_size)
    chunks = [(x[i : i + per_chunk], y[i : i + per_chunk]) for i in range(0, len(x), per_chunk)]
    if full < n:
        chunks.append((ids[full:n][None], ids[full + 1 : n + 1][None]))
    if parts == 1:
        return chunks
    pieces = []
    for x, y in chunks:
        ends = [round(y.shape[1] * j / parts) for j in range(parts + 1)]  # 0, ..., T
        pieces += [(x[:, :end], y[:, start:end]) for start, end in itertools.pairwise(ends)
                   if end > start]
    return pieces


@dataclass(frozen=True)
class DynamicScore:
    """What ``dynamic_score`` measured: ``loss``, the mean loss (nats per token) over every
    prediction, each scored before the model learned from it; ``chunk_losses``, each chunk's
    (each piece's, with ``parts`` > 1) mean loss in reading order; the settings it ran with."""

    loss: float
    chunk_losses: list[float]
    predictions: int
    lr: float
    optimizer: str
    block_size: int
    windows: int
    momentum: float
    parts: int = 1
    decay: float = 0.0
    beta2: float = 0.999


def dynamic_score(model: nn.Module, ids: Tensor, block_size: int, lr: float,
                  optimizer: str = "sgd", windows_per_chunk: int = 1,
                  momentum: float | None = None, parts: int = 1, decay: float = 0.0,
                  beta2: float = 0.999) -> DynamicScore:
    """Dynamic evaluation of ``model`` on ``ids`` (1-D, at least 2): each chunk of
    ``windows_per_chunk`` windows of ``block_size`` scored, then one step of ``optimizer``
    (``sgd`` or ``adam``) at ``lr`` on it; on a copy of ``model`` (the model is not changed).
    ``parts`` > 1 reads each chunk in that many pieces along its positions, a step after each
    (``windows``): the same predictions from the same context, scored and learned from sooner.
    ``momentum`` is SGD's momentum or Adam's beta1 (``None``: torch's default, 0 for SGD and
    0.9 for Adam); ``beta2`` is Adam's (the memory of its running RMS; SGD has none).
    ``decay`` pulls the weights that fraction of the way back to the trained ones after each step
    (``pull_back``; 0: not at all). ``block_size`` may not exceed a GPT's context; the chunks go
    to the model's device."""
    check_instance(model, nn.Module, "model")
    check_int(block_size, "block_size")
    check_float(lr, "lr", 0)
    check_choice(optimizer, "optimizer", OPTIMIZERS)
    check_int(windows_per_chunk, "windows_per_chunk")
    if momentum is None:
        momentum = 0.0 if optimizer == "sgd" else 0.9
    check_float(momentum, "momentum", 0, 1, high_open=True)
    check_float(beta2, "beta2", 0, 1, high_open=True)
    check_float(decay, "decay", 0, 1)
    config = getattr(model, "config", None)
    limit = getattr(config, "block_size", None)
    if limit is not None and block_size > limit:
        raise ValueError(f"block_size={block_size} exceeds the model's context length {limit}")
    check_ids(ids, getattr(config, "vocab_size", None) or sys.maxsize)
    if len(ids) < 2:
        raise ValueError(f"dynamic_score needs at least 2 tokens (one prediction), got {len(ids)}")
    device = next(model.parameters(), torch.empty(0)).device
    ids = torch.as_tensor(ids, dtype=torch.long).to(device)  # (N,)
    chunks = windows(ids, block_size, windows_per_chunk, parts)  # checks parts
    learner = copy.deepcopy(model)
    params = [p for p in learner.parameters() if p.requires_grad]
    step: torch.optim.Optimizer = (
        torch.optim.SGD(params, lr=lr, momentum=momentum) if optimizer == "sgd"
        else torch.optim.Adam(params, lr=lr, betas=(momentum, beta2)))
    pull_back(step, decay)
    scored = read_and_learn(learner, chunks, step)
    sizes = [y.numel() for _, y in chunks]
    return DynamicScore(sum(scored) / sum(sizes), [s / n for s, n in zip(scored, sizes)],
                        sum(sizes), float(lr), optimizer, block_size, windows_per_chunk,
                        float(momentum), parts, float(decay), float(beta2))
