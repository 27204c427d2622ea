"""Classifying speeches by the kind of their play (``tinygpt.genre``).

The labels are the First Folio's (checked play by play against the folders and the two
exceptions); examples are the speeches' own text without the speaker; the test set holds whole
plays, none of which the training set has. Naive Bayes is checked against its formula computed
directly; the classifier's features against each speech run on its own (padding must not
matter); the probe and fine-tuning learn a task that can be learned; LoRA trains only its
factors and the head.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from tinygpt import genre
from tinygpt.config import GPTConfig, TrainConfig
from tinygpt.lora import add_lora, trainable_parameters
from tinygpt.model import GPT
from tinygpt.shakespeare import Play, plays
from tinygpt.tokenizer import CharTokenizer


def test_the_labels_are_the_first_folios():
    labels = {p.title: genre.label_of(p) for p in plays()}
    assert Counter(labels.values()) == {"comedy": 15, "history": 11, "tragedy": 12}
    assert labels["the-tempest"] == labels["measure-for-measure"] == "comedy"
    assert labels["julius-caesar"] == labels["cymbeline"] == labels["troilus-and-cressida"] \
        == "tragedy"
    assert labels["edward-iii"] == labels["richard-iii"] == "history"
    with pytest.raises(ValueError, match="unknown folder"):
        genre.label_of(Play("x", "poems", "A:\nhello\n"))


def test_an_example_is_a_speech_without_its_speaker():
    play = Play("p", "comedies", "KING:\nA short one.\n\nQUEEN:\nA longer speech, of two\n"
                "lines, that is kept.\n\nKING:\nNo.\n")
    found = genre.examples([play], length=30, min_chars=20)
    assert found == [genre.Example("A longer speech, of two\nlines,", 0, "p")]
    by_title = {p.title: p.text for p in plays()[:3]}
    for e in genre.examples(plays()[:3]):
        assert 64 <= len(e.text) <= 128
        assert f":\n{e.text}" in by_title[e.title]  # from the line after a speaker's name


def test_the_test_plays_are_held_out_whole():
    every = genre.examples(plays())
    titles = genre.held_out_titles(plays(), per_label=3, seed=0)
    assert titles == genre.held_out_titles(plays(), per_label=3, seed=0)
    assert titles != genre.held_out_titles(plays(), per_label=3, seed=1)
    by_title = {p.title: genre.label_of(p) for p in plays()}
    assert Counter(by_title[t] for t in titles) == {"comedy": 3, "history": 3, "tragedy": 3}
    train, test = genre.split(every, titles)
    assert {e.title for e in test} == set(titles)
    assert not {e.title for e in train} & set(titles)
    assert len(train) + len(test) == len(every)
    with pytest.raises(ValueError, match="cannot hold out"):
        genre.held_out_titles(plays(), per_label=11)


def test_naive_bayes_is_its_formula():
    texts = ["the king the crown", "my lord the king", "sweet love and mirth", "love love jest",
             "death and the grave", "the dagger and death"]
    labels = [1, 1, 0, 0, 2, 2]
    bayes = genre.NaiveBayes().fit(texts, labels)
    vocabulary = {w for t in texts for w in t.split()}
    query = "the king and his love unseen"
    for y in range(3):
        counts = Counter(w for t, label in zip(texts, labels) if label == y for w in t.split())
        expected = math.log(2 / 6) + sum(
            math.log((counts[w] + 1) / (sum(counts.values()) + len(vocabulary)))
            for w in query.split() if w in vocabulary)
        assert bayes.log_scores(query)[y].item() == pytest.approx(expected, rel=1e-12)
    assert bayes.predict(["the crown of the king", "a jest of love", "the grave"]) == [1, 0, 2]
    with pytest.raises(ValueError, match="as many labels"):
        genre.NaiveBayes().fit(texts, labels[:-1])
    with pytest.raises(ValueError, match="call fit"):
        genre.NaiveBayes().log_scores("x")


def tiny_classifier(seed: int = 0) -> genre.SpeechClassifier:
    torch.manual_seed(seed)
    return genre.SpeechClassifier(GPT(GPTConfig(vocab_size=12, block_size=16, n_layer=1,
                                                n_head=2, n_embd=16)))


def test_the_features_of_a_padded_batch_are_each_speechs_own():
    classifier = tiny_classifier().eval()
    tok = CharTokenizer.from_text("abcdefghijk ")
    found = [genre.Example(text, 0, "t") for text in ("abc", "hide kid", "k", "badge fed")]
    idx, lengths, _ = genre.batch(found, tok)
    assert idx.shape == (4, 9) and lengths.tolist() == [3, 8, 1, 9]
    captured = []
    hook = classifier.gpt.transformer.ln_f.register_forward_hook(
        lambda module, inputs, output: captured.append(output))
    with torch.no_grad():
        for e in found:  # each speech on its own: no padding
            classifier.gpt(torch.tensor([tok.encode(e.text)]))
    hook.remove()
    with torch.no_grad():
        together = classifier.features(idx, lengths)
    for row, hidden in enumerate(captured):
        torch.testing.assert_close(together[row], hidden[0].mean(0))


def separable(n: int) -> list[genre.Example]:
    """Two labels told apart by their letters: 'ab' texts are 0, 'cd' texts are 1."""
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        letters = "ab" if i % 2 == 0 else "cd"
        text = "".join(letters[j] for j in torch.randint(2, (10,), generator=g).tolist())
        out.append(genre.Example(text, i % 2, "t"))
    return out


def test_a_probe_and_fine_tuning_learn_a_task_that_can_be_learned():
    tok = CharTokenizer.from_text("abcdefghijk ")
    train, test = separable(200), separable(41)[1:]
    labels = [e.label for e in test]
    probe = tiny_classifier()
    probe.head = torch.nn.Linear(16, 2)
    genre.fit_probe(probe.head, genre.features(probe, train, tok),
                    torch.tensor([e.label for e in train]))
    assert genre.accuracy(genre.predict(probe, test, tok), labels).value == 1.0
    classifier = tiny_classifier()
    classifier.head = torch.nn.Linear(16, 2)
    config = TrainConfig(batch_size=16, max_iters=60, learning_rate=1e-2, weight_decay=0.0,
                         seed=0)
    losses = genre.fine_tune(classifier, train, tok, config)
    assert losses[-1] < 0.1 < losses[0]
    assert genre.accuracy(genre.predict(classifier, test, tok), labels).value == 1.0


def test_with_lora_only_the_factors_and_the_head_change():
    tok = CharTokenizer.from_text("abcdefghijk ")
    classifier = tiny_classifier()
    add_lora(classifier.gpt, rank=2)
    classifier.head.requires_grad_(True)
    before = {name: p.detach().clone() for name, p in classifier.named_parameters()}
    assert trainable_parameters(classifier) == sum(
        p.numel() for name, p in classifier.named_parameters()
        if name.endswith((".A", ".B")) or name.startswith("head."))
    genre.fine_tune(classifier, separable(64), tok,
                    TrainConfig(batch_size=8, max_iters=5, learning_rate=1e-2, seed=0))
    for name, p in classifier.named_parameters():
        changed = not torch.equal(p, before[name])
        assert changed == p.requires_grad, name


def test_accuracy_and_bad_input():
    result = genre.accuracy([0, 1, 2, 2], [0, 1, 1, 2])
    assert (result.value, result.n) == (0.75, 4) and result.low < 0.75 < result.high
    with pytest.raises(ValueError, match="as many predictions"):
        genre.accuracy([0, 1], [0])
    with pytest.raises(ValueError, match="no parameter to train"):
        frozen = tiny_classifier().requires_grad_(False)
        genre.fine_tune(frozen, separable(4), CharTokenizer.from_text("abcd"), TrainConfig())
