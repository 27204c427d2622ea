"""How much faster the batched multiple-choice scorer is than scoring one candidate at a time.

Times, side by side in one run, ``tinygpt.multiple_choice.evaluate`` with the network's batched
function (``network_log_probs``: every candidate of every question in passes of padded rows)
and with the straightforward one (one forward pass per candidate, the scorer before batching),
on the first ``--questions`` questions of each cut of the book's benchmark, for untrained
networks of the book model's and the modern model's sizes (what is timed does not depend on
the weights). It checks that both give the same totals (to float tolerance) and prints each
one's seconds and the ratio. It writes no record: run it on a quiet machine for one, e.g.

    nice -n 10 python benchmarks/choice_ladder_speed.py --questions 20
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tinygpt import multiple_choice as mc
from tinygpt.book import trained_model
from tinygpt.model import GPT


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=20, help="per cut (default 20)")
    parser.add_argument("--batch-tokens", type=int, nargs="+", default=[mc.BATCH_TOKENS])
    args = parser.parse_args()
    tok, train_ids, val_ids = trained_model.book_data(trained_model.BOOK_RECIPE.corpus)
    val, train = tok.decode(val_ids.tolist()), tok.decode(train_ids.tolist())
    questions = [q for cut in mc.CUTS
                 for q in mc.build(val, train, cut=cut, size=args.questions)]
    torch.manual_seed(0)
    models = {"book model": trained_model.BOOK_RECIPE.model,
              "modern model": trained_model.MODERN_RECIPE.model}
    print(f"{len(questions)} questions ({args.questions} per cut), {torch.get_num_threads()} "
          "torch threads")
    for name, config in models.items():
        model = GPT(config)
        start = time.perf_counter()
        old = mc.all_choice_log_probs(one_at_a_time(model, config.block_size), tok, questions)
        old_s = time.perf_counter() - start
        for batch_tokens in args.batch_tokens:
            scorer = mc.network_log_probs(model, config.block_size, batch_tokens=batch_tokens)
            start = time.perf_counter()
            new = mc.all_choice_log_probs(scorer, tok, questions)
            new_s = time.perf_counter() - start
            torch.testing.assert_close(torch.tensor(new), torch.tensor(old), rtol=1e-5,
                                       atol=1e-4)
            print(f"{name}, batch_tokens {batch_tokens}: one at a time {old_s:.2f} s, "
                  f"batched {new_s:.2f} s, ratio {old_s / new_s:.1f}")


if __name__ == "__main__":
    main()
