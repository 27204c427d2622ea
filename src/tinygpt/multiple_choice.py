"""A multiple-choice benchmark from the validation plays: how does this line go on?

Chapter 14's benchmark; ``tinygpt eval`` runs it.

A validation loss says how surprised a model is on average; it does not say what the model can
tell apart. This benchmark asks, in the way HellaSwag-style harnesses do: each question shows
the opening of a speech from the validation split -- its speaker, its first line and the start
of its second line -- and offers four candidates for the rest of the second line: the true one
and three *distractors*, the rest of the second lines of other validation speeches, cut the same
way, whose lengths are closest to the true one's. A model answers with the candidate it gives
the highest likelihood after the opening: by total log-probability (*raw*), or per character
(*normalised*, which does not favour short candidates).

Where the line is cut sets what a right answer needs (``CUTS``): cut inside a word, the model
must know how words are spelled; cut between words, which word may come next; cut before the
line, which line may follow another.

The construction is fixed by ``seed`` and versioned (``VERSION``, ``fingerprint``). A speech
whose second line also occurs as a line of the training split is never asked about (a model
could have learned it by heart), and no distractor equals the answer or another distractor.

Scoring takes a *log-probability function*: ``ids -> (len(ids) - 1,)`` tensor of
``ln P(ids[t] | ids[:t])`` for ``t = 1 .. len(ids) - 1``. ``network_log_probs`` makes one from a
network (a ``GPT`` or any causal module mapping ``(B, T)`` ids to logits; it also scores many
sequences in one forward pass of padded rows, and ``evaluate`` gives it every candidate of every
question at once), ``ngram_log_probs`` from a counting model, ``uniform_log_probs`` for the
uniform guess; ``evaluate`` scores every question
and gives both accuracies with a 95% Wilson interval. A tie between the top candidates earns a
fraction of a point (1 / the number tied, when the answer is among them): a model that cannot
tell the candidates apart scores chance, not whatever a tie-break favours.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tinygpt.checks import check_choice, check_instance, check_int
from tinygpt.model import GPT
from tinygpt.ngram import NGramModel
from tinygpt.tokenizer import Tokenizer

VERSION = 1  # bump when the construction changes: a new version is a new benchmark
NUM_CHOICES = 4
CUTS = ("word", "space", "line")  # where the second line is cut: inside a word, between, before
LINE_CHARS = (20, 80)  # the opening line and every candidate: at least 20, at most 80 characters

LogProbs = Callable[[Sequence[int]], Tensor]


@dataclass(frozen=True)
class Speech:
    """One speech of a text in the book's format: where it starts, who speaks, its lines."""

    offset: int
    speaker: str
    lines: tuple[str, ...]


@dataclass(frozen=True)
class Question:
    """A question of kind ``cut``: the opening (``"SPEAKER:\\nfirst line\\n"`` and the second
    line up to the cut), the candidates for the rest of the second line (each ending in a line
    break), the index of the true one, and where its speech starts in the validation text."""

    cut: str
    opening: str
    choices: tuple[str, ...]
    answer: int
    offset: int


@dataclass(frozen=True)
class Accuracy:
    """A share of right answers out of ``n`` questions, with its 95% Wilson interval."""

    value: float
    low: float
    high: float
    n: int


@dataclass(frozen=True)
class Evaluation:
    """A model's accuracy by total log-probability (``raw``) and per character
    (``normalised``), its loss on the true lines (nats per character), and the credit it earned
    on each question by total log-probability (1, 0, or a tie's share), in the questions' order:
    what a paired comparison of two models on the same questions needs
    (``tinygpt.significance``)."""

    raw: Accuracy
    normalised: Accuracy
    answer_nats_per_char: float
    credits: tuple[float, ...]


def speeches(text: str) -> list[Speech]:
    """The speeches of ``text``: paragraphs (separated by blank lines) whose first line is
    ``SPEAKER:``. A paragraph cut by the start or end of ``text`` (no speaker line) is
    skipped."""
    check_instance(text, str, "text")
    found = []
    offset = 0
    for paragraph in text.split("\n\n"):
        lines = paragraph.split("\n")
        head = lines[0]
        if len(lines) >= 2 and head.endswith(":") and len(head) > 1 and all(lines[1:]):
            found.append(Speech(offset, head[:-1], tuple(lines[1:])))
        offset += len(paragraph) + 2
    return found


def _fits(line: str) -> bool:
    return LINE_CHARS[0] <= len(line) <= LINE_CHARS[1]


def cut_line(line: str, cut: str) -> int | None:
    """Where to cut ``line`` for a question of kind ``cut``: ``"line"`` before it (0),
    ``"space"`` at the word boundary nearest its middle (after the space), ``"word"`` inside
    the word nearest its middle (at least two letters on each side); ``None`` where ``line``
    has no such place."""
    check_choice(cut, "cut", CUTS)
    if cut == "line":
        return 0
    middle = len(line) // 2
    if cut == "space":
        places = [m.start() for m in re.finditer(r"(?<= )\S", line)]
    else:
        places = [i for m in re.finditer(r"[A-Za-z]{4,}", line)
                  for i in range(m.start() + 2, m.end() - 1)]
    return min(places, key=lambda i: (abs(i - middle), i)) if places else None


def build(val_text: str, train_text: str, *, cut: str = "line", size: int = 500,
          seed: int = 0) -> list[Question]:
    """``size`` questions of kind ``cut`` from the speeches of ``val_text`` (fewer if it has
    fewer usable speeches), fixed by ``seed``.

    A speech is used when its first two lines have 20-80 characters, its second line does not
    occur as a line of ``train_text``, and ``cut_line`` finds a place to cut it. The opening is
    the speaker, the first line and the second line up to the cut; the answer is the rest of
    the second line. Distractors are the rest of the second lines of the other usable speeches
    whose lengths are closest to the answer's (ties broken by the seeded shuffle), never equal
    to the answer or to each other.
    """
    check_instance(val_text, str, "val_text")
    check_instance(train_text, str, "train_text")
    check_choice(cut, "cut", CUTS)
    check_int(size, "size")
    check_int(seed, "seed", low=0)
    seen_in_training = set(train_text.split("\n"))
    pieces = []  # (speech, opening, ending)
    for speech in speeches(val_text):
        if len(speech.lines) < 2 or not (_fits(speech.lines[0]) and _fits(speech.lines[1])):
            continue
        second = speech.lines[1]
        at = cut_line(second, cut)
        if at is None or second in seen_in_training:
            continue
        opening = f"{speech.speaker}:\n{speech.lines[0]}\n{second[:at]}"
        pieces.append((speech, opening, second[at:] + "\n"))
    if len(pieces) < NUM_CHOICES:
        raise ValueError(f"val_text has too few usable speeches ({len(pieces)}) for questions "
                         f"of {NUM_CHOICES} candidates")
    rng = random.Random(seed)
    order = list(range(len(pieces)))
    rng.shuffle(order)  # the questions, and the tie order among distractors of equal length
    rank = {i: r for r, i in enumerate(order)}
    questions = []
    for i in order[:size]:
        speech, opening, answer = pieces[i]
        nearest = sorted((j for j in range(len(pieces)) if j != i),
                         key=lambda j: (abs(len(pieces[j][2]) - len(answer)), rank[j]))
        distractors: list[str] = []
        for j in nearest:
            ending = pieces[j][2]
            if ending != answer and ending not in distractors:
                distractors.append(ending)
            if len(distractors) == NUM_CHOICES - 1:
                break
        if len(distractors) < NUM_CHOICES - 1:
            raise ValueError(f"val_text has too few usable speeches ({len(pieces)}) to draw "
                             f"{NUM_CHOICES - 1} distinct distractors")
        choices = [answer, *distractors]
        rng.shuffle(choices)
        questions.append(Question(cut, opening, tuple(choices), choices.index(answer),
                                  speech.offset))
    return questions


def fingerprint(questions: Sequence[Question]) -> str:
    """A SHA-256 of the version and every question: two builds are the same benchmark exactly
    when their fingerprints are equal."""
    payload = json.dumps({"version": VERSION, "questions": [asdict(q) for q in questions]},
                         sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def wilson_interval(successes: float, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """The Wilson score interval for a proportion (95% by default): the values of p that a
    score test at this ``z`` would not reject after ``successes`` out of ``n``."""
    check_int(n, "n")
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be between 0 and n={n}, got {successes}")
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    low = 0.0 if successes == 0 else max(0.0, centre - half)  # exact at the ends, where the
    high = 1.0 if successes == n else min(1.0, centre + half)  # formula rounds off zero
    return low, high


class NetworkLogProbs:
    """``network_log_probs``'s function: ``self(ids)`` scores one sequence; ``self.many(seqs)``
    scores many at once, in batches of right-padded rows (a causal network's prediction at a
    position does not depend on what follows it, so the padding changes nothing), giving what
    ``self`` gives for each one up to float rounding."""

    def __init__(self, model: nn.Module, block_size: int, batch_tokens: int) -> None:
        self.model, self.block_size, self.batch_tokens = model, block_size, batch_tokens

    def __call__(self, ids: Sequence[int]) -> Tensor:
        return self.many([ids])[0]

    def many(self, sequences: Sequence[Sequence[int]]) -> list[Tensor]:
        """Each sequence's ``(len - 1,)`` log-probabilities (float64, ``nan`` beyond the
        context), in order. Sequences of similar length share a forward pass of at most
        ``batch_tokens`` padded positions."""
        windows = []  # each one's last block_size + 1 ids: what one pass of its own reads
        for ids in sequences:
            if len(ids) < 2:
                raise ValueError("log_probs needs at least 2 ids (one prediction)")
            windows.append(torch.as_tensor(list(ids)[-(self.block_size + 1):], dtype=torch.long))
        order = sorted(range(len(windows)), key=lambda i: len(windows[i]))
        chosen: list[Tensor] = [torch.empty(0)] * len(windows)
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                start = 0
                while start < len(order):  # a batch: the next rows while they fit batch_tokens
                    stop = start + 1  # (sorted by length: the last row taken is the longest)
                    while stop < len(order) and (stop + 1 - start) * (
                            len(windows[order[stop]]) - 1) <= self.batch_tokens:
                        stop += 1
                    width = len(windows[order[stop - 1]]) - 1  # predictions of the longest row
                    rows = [windows[i] for i in order[start:stop]]
                    x = torch.zeros(len(rows), width + 1, dtype=torch.long)  # (B, width + 1)
                    for r, row in enumerate(rows):
                        x[r, : len(row)] = row  # right-padded with id 0
                    out = self.model(x[:, :-1])
                    logits = out[0] if isinstance(out, tuple) else out  # (B, width, V)
                    picked = F.log_softmax(logits.float(), dim=-1).gather(
                        2, x[:, 1:, None])[:, :, 0]  # (B, width)
                    for r, i in enumerate(order[start:stop]):
                        chosen[i] = picked[r, : len(rows[r]) - 1]
                    start = stop
        finally:
            self.model.train(was_training)
        out_list = []
        for ids, got in zip(sequences, chosen):
            pad = torch.full((len(ids) - 1 - len(got),), float("nan"))  # beyond the context
            out_list.append(torch.cat([pad, got.double()]))
        return out_list

    def after(self, groups: Sequence[tuple[Sequence[int], Sequence[Sequence[int]]]]
              ) -> list[list[Tensor]]:
        """For each ``(prefix, endings)``: each ending's ``(len(ending),)`` log-probabilities
        after ``prefix`` (float64, ``nan`` beyond the context), as ``self(prefix + ending)``
        gives them. For a ``GPT``, a prefix that fits the context with each of its endings is
        read once: its keys and values (``KVCache``) are copied to a row for each ending, which
        reads on from there; prefixes of one length share a pass. Other groups go through
        ``many``."""
        out: list[list[Tensor]] = [[] for _ in groups]
        by_length: dict[int, list[int]] = {}  # prefix length -> the groups read once
        rest = []
        for g, (prefix, endings) in enumerate(groups):
            if not endings or min(len(e) for e in endings) < 1 or len(prefix) < 1:
                raise ValueError("after needs a prefix and endings of at least 1 id each")
            fits = len(prefix) + max(len(e) for e in endings) - 1 <= self.block_size
            if isinstance(self.model, GPT) and fits:
                by_length.setdefault(len(prefix), []).append(g)
            else:
                rest.append(g)
        joined = [list(groups[g][0]) + list(e) for g in rest for e in groups[g][1]]
        scored = iter(self.many(joined))
        for g in rest:
            out[g] = [next(scored)[len(groups[g][0]) - 1:] for _ in groups[g][1]]
        model = self.model
        if not isinstance(model, GPT):  # every group went through many
            return out
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                for members in by_length.values():
                    for part in self._parts(members, groups):
                        found = _shared_prefix(model, [groups[g] for g in part])
                        for g, got in zip(part, found):
                            out[g] = got
        finally:
            model.train(was_training)
        return out

    def _parts(self, members: list[int], groups: Sequence[tuple[Sequence[int],
               Sequence[Sequence[int]]]]) -> list[list[int]]:
        """``members`` (groups of one prefix length) in parts whose ending rows fit
        ``batch_tokens`` padded positions (a part holds one group at least)."""
        parts: list[list[int]] = []
        rows = width = 0
        for g in members:
            n, w = len(groups[g][1]), max(len(e) for e in groups[g][1]) - 1
            if parts and (rows + n) * max(width, w, 1) <= self.batch_tokens:
                parts[-1].append(g)
                rows, width = rows + n, max(width, w)
            else:
                parts.append([g])
                rows, width = n, w
        return parts


def _shared_prefix(model: GPT, part: Sequence[tuple[Sequence[int], Sequence[Sequence[int]]]]
                   ) -> list[list[Tensor]]:
    """``after`` for groups whose prefixes have one length, in two passes of a GPT: the
    prefixes, then every ending after a copy of its prefix's keys and values."""
    prefixes = torch.tensor([list(prefix) for prefix, _ in part])  # (G, P)
    caches = model.new_caches(len(part))
    last = model(prefixes, caches=caches, last_only=True)  # (G, 1, V): the first ending ids
    first = F.log_softmax(last[:, 0].float(), dim=-1)  # (G, V)
    owner = torch.tensor([g for g, (_, endings) in enumerate(part) for _ in endings])  # (R,)
    endings = [list(e) for _, group in part for e in group]
    width = max(len(e) for e in endings) - 1  # inputs of the longest ending
    picked = torch.empty(len(endings), 0)
    if width > 0:
        P = prefixes.shape[1]
        rows = model.new_caches(len(endings))
        for row, cache in zip(rows, caches):  # each ending's row starts from its prefix's
            row.k[:, :, :P] = cache.k[owner, :, :P]
            row.v[:, :, :P] = cache.v[owner, :, :P]
            row.length = P
        x = torch.zeros(len(endings), width + 1, dtype=torch.long)  # (R, width + 1)
        for r, e in enumerate(endings):
            x[r, : len(e)] = torch.tensor(e)  # right-padded with id 0
        logits = model(x[:, :-1], caches=rows)  # (R, width, V)
        picked = F.log_softmax(logits.float(), dim=-1).gather(2, x[:, 1:, None])[:, :, 0]
    out: list[list[Tensor]] = [[] for _ in part]
    for r, e in enumerate(endings):
        g = int(owner[r])
        head = first[g, e[0]].reshape(1)
        out[g].append(torch.cat([head, picked[r, : len(e) - 1]]).double())
    return out


BATCH_TOKENS = 4096  # padded positions per forward pass of NetworkLogProbs.many and .after


def network_log_probs(model: nn.Module, block_size: int, *,
                      batch_tokens: int = BATCH_TOKENS) -> NetworkLogProbs:
    """The log-probability function of a network that maps ``(B, T)`` ids to ``(B, T, V)``
    logits (or to ``(logits, loss)``, as ``GPT`` does), reading at most ``block_size`` tokens of
    context: a longer sequence is scored in one pass over its last ``block_size + 1`` ids, so
    only its last ``block_size`` predictions are returned with full accuracy -- enough for a
    candidate line after a short opening. The network must be causal (a position's logits read
    only the ids up to it): its ``many`` scores many sequences in one pass of padded rows, its
    ``after`` many endings of shared prefixes (``evaluate`` uses it)."""
    check_instance(model, nn.Module, "model")
    check_int(block_size, "block_size")
    check_int(batch_tokens, "batch_tokens")
    return NetworkLogProbs(model, block_size, batch_tokens)


def ngram_log_probs(model: NGramModel) -> LogProbs:
    """The log-probability function of a fitted counting model: ``ln P(ids[t] | the previous
    n - 1 ids)``, with the first ``n - 1`` positions (too little context to count) left ``nan``."""
    check_instance(model, NGramModel, "model")

    def log_probs(ids: Sequence[int]) -> Tensor:
        known = model.token_log_probs(list(ids))  # (len(ids) - n + 1,): t = n - 1 ..
        if model.n == 1:
            known = known[1:]  # t = 0 has nothing before it: not a prediction here
        pad = torch.full((len(ids) - 1 - len(known),), float("nan"), dtype=torch.float64)
        return torch.cat([pad, known])

    return log_probs


def uniform_log_probs(vocab_size: int) -> LogProbs:
    """The log-probability function of the uniform guess: ``-ln V`` for every token."""
    check_int(vocab_size, "vocab_size")

    def log_probs(ids: Sequence[int]) -> Tensor:
        return torch.full((len(ids) - 1,), -math.log(vocab_size), dtype=torch.float64)

    return log_probs


def choice_log_probs(log_probs: LogProbs, tokenizer: Tokenizer,
                     question: Question) -> list[float]:
    """Each candidate's total log-probability after the opening (its tokens only)."""
    return all_choice_log_probs(log_probs, tokenizer, [question])[0]


def all_choice_log_probs(log_probs: LogProbs, tokenizer: Tokenizer,
                         questions: Sequence[Question]) -> list[list[float]]:
    """``choice_log_probs`` of every question, in order: a function with an ``after`` method
    (``NetworkLogProbs``) scores all the candidates of all the questions in batches, any other
    one candidate at a time."""
    groups = [(tokenizer.encode(q.opening), [tokenizer.encode(c) for c in q.choices])
              for q in questions]  # each opening encoded once for its candidates
    after = getattr(log_probs, "after", None)
    if callable(after):
        scored = after(groups)
    else:
        scored = [[log_probs(opening + ids)[len(opening) - 1:] for ids in choices]
                  for opening, choices in groups]
    by_question = []
    for each in scored:
        if any(torch.isnan(scores).any() for scores in each):
            raise ValueError("the model's context is too short to score a candidate: each "
                             "needs the opening and the candidate's tokens in one window")
        by_question.append([float(scores.sum()) for scores in each])
    return by_question


def _credit(scores: Sequence[float], answer: int) -> float:
    best = max(scores)
    tied = [i for i, s in enumerate(scores) if s == best]
    return 1 / len(tied) if answer in tied else 0.0


def evaluate(log_probs: LogProbs, tokenizer: Tokenizer,
             questions: Sequence[Question]) -> Evaluation:
    """Score every question: the raw and normalised accuracy with their Wilson intervals, and
    the loss on the true lines (nats per character: minus their mean log-probability)."""
    if not questions:
        raise ValueError("evaluate needs at least one question")
    raw = normalised = answer_nats = 0.0
    answer_chars = 0
    credits = []
    for q, totals in zip(questions, all_choice_log_probs(log_probs, tokenizer, questions)):
        credits.append(_credit(totals, q.answer))
        raw += credits[-1]
        normalised += _credit([t / len(c) for t, c in zip(totals, q.choices)], q.answer)
        answer_nats += totals[q.answer]
        answer_chars += len(q.choices[q.answer])
    n = len(questions)
    return Evaluation(Accuracy(raw / n, *wilson_interval(raw, n), n),
                      Accuracy(normalised / n, *wilson_interval(normalised, n), n),
                      -answer_nats / answer_chars, tuple(credits))
