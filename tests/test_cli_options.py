"""The command line's options made from the config dataclasses (``tinygpt.cli.options``): a config
error names the options it is about, and only those, from the fields the error names."""

from __future__ import annotations

import pytest
from conftest import CLI_TINY, assert_one_line_error

from tinygpt.cli import main
from tinygpt.config import GPTConfig, TrainConfig


@pytest.mark.parametrize("flags, expected", [
    (["--n-embd", "30", "--n-head", "4"], "(options --n-embd, --n-head)"),
    (["--lr", "-1"], "(option --lr)"),
    (["--min-lr", "1"], "(option --min-lr)"),
    (["--positional", "rope", "--n-embd", "18", "--n-head", "2"],
     "(options --positional, --n-embd, --n-head)"),
])
def test_a_config_error_names_the_options_it_is_about(capsys, cli_corpus, tmp_path, flags,
                                                      expected):
    """The config's checks say which fields an error is about (``err.fields``): the command
    line names those options, and only those, without reading the message."""
    args = ["train", "--data", str(cli_corpus), "--out", str(tmp_path / "run"), *CLI_TINY, *flags]
    code = main(args)
    err = capsys.readouterr().err
    assert_one_line_error(code, err, expected)
    assert err.count("(option") == 1


def test_an_error_about_no_config_field_names_no_option():
    from tinygpt.checks import ArgumentValueError
    from tinygpt.cli.options import name_options

    assert name_options(ValueError("GPTConfig.n_layer is wrong"), GPTConfig) == (
        "GPTConfig.n_layer is wrong")  # a message is not parsed
    error = ArgumentValueError("bad", "GPTConfig.n_layer")
    assert name_options(error, GPTConfig, TrainConfig) == "bad (option --n-layer)"
    assert name_options(ArgumentValueError("bad", "top_k"), GPTConfig) == "bad"
