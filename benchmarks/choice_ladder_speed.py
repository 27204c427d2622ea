"""How much faster the batched multiple-choice scorer is than scoring one candidate at a time.

Times, side by side in one run, ``tinygpt.multiple_choice.all_choice_log_probs`` (what
``evaluate`` scores) three ways: one forward pass per candidate (the scorer before batching, on
the first ``--old-questions`` questions of each cut), every candidate as a padded row of
batched passes, and ``network_log_probs`` as ``evaluate`` uses it (each opening read once, its
keys and values shared by its candidates), the last two on the first ``--questions`` of each
cut of the book's benchmark (a realistic share of openings of one length). The networks are
untrained ones of the sizes of the ladder's networks (what is timed does not depend on the
weights; ``gpt_init`` is the book model's size). It checks that all give the same totals (to
float tolerance) and prints the seconds per question and the ratios. It writes no record: run
it on a quiet machine for one:

    nice -n 10 python benchmarks/choice_ladder_speed.py --questions 500 --old-questions 20
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tinygpt import multiple_choice as mc
from tinygpt.book import ladder, trained_model
from tinygpt.model import GPT
from tinygpt.small_models import AttentionOnly, ContextMLP


def one_at_a_time(model: nn.Module, block_size: int) -> mc.LogProbs:
    """The scorer before batching: one forward pass of one row per sequence."""

    def log_probs(ids: Sequence[int]) -> Tensor:
        x = torch.as_tensor(list(ids), dtype=torch.long)[None][:, -(block_size + 1):]  # (1, T)
        model.eval()
        with torch.no_grad():
            out = model(x[:, :-1])
        logits = out[0] if isinstance(out, tuple) else out  # (1, T, V)
        chosen = F.log_softmax(logits.float(), dim=-1)[0].gather(1, x[0, 1:, None])[:, 0]
        pad = torch.full((len(ids) - 1 - len(chosen),), float("nan"))
        return torch.cat([pad, chosen.double()])

    return log_probs


MODELS = ("book model", "modern model", "one block", "attention only", "context mlp")


class Rows(nn.Module):
    """A network as it is, but not a ``GPT``: ``network_log_probs`` of it scores every candidate
    as a row of its own (``many``), with no prefix read once."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.inner = model

    def forward(self, idx: Tensor) -> Tensor:
        out = self.inner(idx)
        return out[0] if isinstance(out, tuple) else out


def timed(log_probs: mc.LogProbs, tok: object, questions: list[mc.Question]
          ) -> tuple[float, list[list[float]]]:
    """Seconds per question, and the totals."""
    start = time.perf_counter()
    totals = mc.all_choice_log_probs(log_probs, tok, questions)  # type: ignore[arg-type]
    return (time.perf_counter() - start) / len(questions), totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=100,
                        help="per cut, for the batched scorers (default 100)")
    parser.add_argument("--old-questions", type=int, default=10,
                        help="per cut, the first ones, for one pass per candidate (default 10)")
    parser.add_argument("--models", nargs="+", choices=MODELS, help="default: all")
    args = parser.parse_args()
    tok, train_ids, val_ids = trained_model.book_data(trained_model.BOOK_RECIPE.corpus)
    val, train = tok.decode(val_ids.tolist()), tok.decode(train_ids.tolist())
    by_cut = {cut: mc.build(val, train, cut=cut, size=args.questions) for cut in mc.CUTS}
    questions = [q for cut in mc.CUTS for q in by_cut[cut]]
    first = [q for cut in mc.CUTS for q in by_cut[cut][: args.old_questions]]
    torch.manual_seed(0)
    small = dataclasses.replace(ladder.SMALL_GPT, vocab_size=tok.vocab_size)
    models: dict[str, tuple[nn.Module, int]] = {
        "book model": (GPT(trained_model.BOOK_RECIPE.model), 128),
        "modern model": (GPT(trained_model.MODERN_RECIPE.model), 128),
        "one block": (GPT(small), ladder.BLOCK_SIZE),
        "attention only": (AttentionOnly(small), ladder.BLOCK_SIZE),
        "context mlp": (ContextMLP(tok.vocab_size, **ladder.MLP_SIZES), ladder.BLOCK_SIZE)}
    chosen = args.models or list(models)
    print(f"{len(questions)} questions for the batched scorers, the first {len(first)} of them "
          f"for one pass per candidate; {torch.get_num_threads()} torch threads; seconds per "
          "question")
    for name in chosen:
        model, block_size = models[name]
        old_s, old = timed(one_at_a_time(model, block_size), tok, first)
        rows_s, rows = timed(mc.network_log_probs(Rows(model), block_size), tok, questions)
        new_s, new = timed(mc.network_log_probs(model, block_size), tok, questions)
        index = [questions.index(q) for q in first]
        for got in (rows, new):
            torch.testing.assert_close(torch.tensor([got[i] for i in index]), torch.tensor(old),
                                       rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(torch.tensor(new), torch.tensor(rows), rtol=1e-5, atol=1e-4)
        print(f"{name}: one pass per candidate {old_s:.4f}, padded rows {rows_s:.4f} "
              f"(ratio {old_s / rows_s:.1f}), prefix read once {new_s:.4f} "
              f"(ratio {old_s / new_s:.1f})")


if __name__ == "__main__":
    main()
