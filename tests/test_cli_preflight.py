"""The checks the command line makes before it spends time or memory (``tinygpt.cli.preflight``):
a ``--device`` tinygpt does not run on or this machine lacks, a seed torch cannot take, sizes
whose memory estimate is more than is free, absurd gradient accumulation. Each is one line, for
``tinygpt train`` and ``tinygpt sample`` alike."""

from __future__ import annotations

import pytest
from conftest import CLI_TINY, FOLDER_TINY, assert_one_line_error
from conftest import run_cli as run

from tinygpt.cli import preflight
from tinygpt.config import GPTConfig, TrainConfig

HUGE = str(10**12)


@pytest.mark.parametrize("device", ["meta", "xpu", "hpu", "tpu", "cuda:99"])
def test_sample_unsupported_or_absent_device_is_a_one_line_error(capsys, cli_checkpoint, device):
    code, _, err = run(capsys, "sample", "--out", cli_checkpoint, "--device", device,
                       "--max-new-tokens", "5")
    assert_one_line_error(code, err, f"--device {device}")


@pytest.mark.parametrize("option", ["--max-new-tokens", "--num-samples"])
def test_sample_huge_sizes_are_refused_with_a_memory_estimate(capsys, cli_checkpoint, option):
    code, _, err = run(capsys, "sample", "--out", cli_checkpoint, option, HUGE)
    assert_one_line_error(code, err, "sampling needs about", "available", option)


def test_train_unavailable_device_is_a_one_line_error(capsys, cli_corpus, tmp_path):
    for device in ("meta", "hpu", "cuda:99"):
        code, _, err = run(capsys, "train", "--data", cli_corpus, "--out", tmp_path / "o",
                           *CLI_TINY, "--device", device)
        assert_one_line_error(code, err, device)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("option", ["--n-embd", "--batch-size", "--n-layer"])
def test_train_huge_sizes_are_refused_with_a_memory_estimate(capsys, cli_corpus, tmp_path,
                                                             option):
    sizes = dict(zip(CLI_TINY[0:8:2], CLI_TINY[1:8:2], strict=True))
    sizes |= {option: HUGE, "--n-head": "1"}
    code, _, err = run(capsys, "train", "--data", cli_corpus, "--out", tmp_path / "o",
                       *CLI_TINY[8:], *[x for kv in sizes.items() for x in kv])
    assert_one_line_error(code, err, "training needs about", "available", option)


def test_memory_estimate_grows_with_every_size_and_is_refused_past_the_free_memory(monkeypatch):
    base_model, base_train = GPTConfig(vocab_size=65), TrainConfig(batch_size=12)
    base = preflight.train_memory(base_model, base_train)["total"]
    for model, train in [(GPTConfig(vocab_size=65, n_layer=8), base_train),
                         (GPTConfig(vocab_size=65, n_embd=256), base_train),
                         (base_model, TrainConfig(batch_size=24))]:
        assert preflight.train_memory(model, train)["total"] > base
    free = preflight.available_memory("cpu")
    assert free is not None and free > 0
    # what is free moves while other work runs: hold it still for the two checks below
    monkeypatch.setattr(preflight, "available_memory", lambda device: free)
    with pytest.raises(ValueError, match="available"):
        preflight.check_memory({"total": free + 1}, "cpu", "training", "lower the sizes")
    preflight.check_memory({"total": 1}, "cpu", "training", "lower the sizes")


@pytest.mark.parametrize("command", ["train", "sample"])
def test_seed_1e29_gives_the_range(capsys, cli_corpus, cli_checkpoint, tmp_path, command):
    extra = (["--data", cli_corpus, "--out", tmp_path / "o", *CLI_TINY] if command == "train"
             else ["--out", cli_checkpoint])
    code, _, err = run(capsys, command, *extra, "--seed", 10**29)
    assert_one_line_error(code, err, "--seed", "from 0 to 9223372036854775807")


def test_absurd_gradient_accumulation_is_refused_before_training(capsys, folder_data, tmp_path,
                                                                 monkeypatch):
    import tinygpt.train

    def never(*args, **kwargs):  # were the check missing: fail now, not after 1e9 micro-batches
        raise AssertionError("training started")

    monkeypatch.setattr(tinygpt.train, "train", never)
    code, _, err = run(capsys, "train", "--data", folder_data, "--out", tmp_path / "run",
                       *FOLDER_TINY, "--gradient-accumulation-steps", "1000000000")
    assert_one_line_error(code, err, "--gradient-accumulation-steps 1000000000", "at most 65536")
    assert not (tmp_path / "run").exists()
