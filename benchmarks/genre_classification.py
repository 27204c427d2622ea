"""Which kind of play is a speech from? Four classifiers side by side (``tinygpt.genre``).

Training speeches come from 29 plays, test speeches from 9 others (3 comedies, 3 histories,
3 tragedies, ``genre.held_out_titles``). Compared: naive Bayes on words, a linear probe on the
frozen book model, full fine-tuning of the book model, and LoRA on it -- test accuracy with a
95% Wilson interval, trainable parameters, seconds, and the memory training needs beyond the
frozen model (each trainable number's value, gradient and two AdamW moments, float32).

    python benchmarks/genre_classification.py [--steps 300] [--rank 8] \\
        [--out benchmarks/results/genre_classification.json]

One torch thread; the seconds depend on the machine and its load (recorded), the accuracies
only on the seeds.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

from tinygpt import genre
from tinygpt.book.trained_model import BOOK_RECIPE, book_data, book_model
from tinygpt.config import TrainConfig
from tinygpt.lora import add_lora, trainable_parameters
from tinygpt.shakespeare import plays


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300, help="fine-tuning steps")
    parser.add_argument("--rank", type=int, default=8, help="LoRA's rank")
    parser.add_argument("--out", type=Path, default=None, help="write the record here (JSON)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    tokenizer = book_data(BOOK_RECIPE.corpus)[0]
    every = genre.examples(plays(), length=BOOK_RECIPE.model.block_size)
    test_titles = genre.held_out_titles(plays())
    train, test = genre.split(every, test_titles)
    test_labels = [e.label for e in test]
    record = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, "
                   f"Python {platform.python_version()}, torch {torch.__version__}",
        "load_before": round(os.getloadavg()[0], 2),
        "test_plays": test_titles, "train_examples": len(train), "test_examples": len(test),
        "majority": max(test_labels.count(y) for y in range(len(genre.LABELS))) / len(test),
        "rows": [],
    }

    def row(name: str, predicted, trainable: int, seconds: float, **more) -> None:
        result = genre.accuracy(predicted, test_labels)
        record["rows"].append({"method": name, "accuracy": dataclasses.asdict(result),
                               "trainable": trainable, "seconds": round(seconds, 1),
                               "training_bytes": 16 * trainable, **more})
        print(f"{name:22s} {result.value:.3f} [{result.low:.3f}, {result.high:.3f}]  "
              f"{trainable:>9,} trainable  {seconds:6.1f} s", flush=True)

    start = time.perf_counter()
    bayes = genre.NaiveBayes().fit([e.text for e in train], [e.label for e in train])
    predicted = bayes.predict([e.text for e in test])
    row("naive Bayes (words)", predicted,
        sum(len(c) for c in bayes.counts) + len(genre.LABELS), time.perf_counter() - start)

    base = book_model(progress=False).model
    start = time.perf_counter()
    probe = genre.SpeechClassifier(copy.deepcopy(base)).requires_grad_(False)
    probe.head.requires_grad_(True)
    inputs = genre.features(probe, train, tokenizer)
    genre.fit_probe(probe.head, inputs, torch.tensor([e.label for e in train]))
    row("linear probe", genre.predict(probe, test, tokenizer),
        trainable_parameters(probe), time.perf_counter() - start)

    config = TrainConfig(batch_size=32, max_iters=args.steps, learning_rate=1e-3,
                         weight_decay=0.0, seed=0)
    for name in ("full fine-tuning", f"LoRA, rank {args.rank}"):
        torch.manual_seed(0)
        classifier = genre.SpeechClassifier(copy.deepcopy(base))
        if name.startswith("LoRA"):
            add_lora(classifier.gpt, rank=args.rank)
            classifier.head.requires_grad_(True)
            config = dataclasses.replace(config, learning_rate=3e-3)
        start = time.perf_counter()
        losses = genre.fine_tune(classifier, train, tokenizer, config)
        row(name, genre.predict(classifier, test, tokenizer), trainable_parameters(classifier),
            time.perf_counter() - start, learning_rate=config.learning_rate,
            steps=config.max_iters, last_losses=round(sum(losses[-20:]) / 20, 4))
    record["load_after"] = round(os.getloadavg()[0], 2)
    if args.out:
        args.out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
