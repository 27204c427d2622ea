"""Tests for tinygpt.config: the block and model switches of GPTConfig and their validation."""

from __future__ import annotations

import dataclasses

import pytest

from tinygpt.config import ACTIVATIONS, NORM_POSITIONS, NORMS, POSITIONALS, GPTConfig


def test_defaults_are_gpt2s_choices():
    c = GPTConfig()
    assert (c.norm, c.norm_position, c.activation, c.positional) == (
        "layernorm", "pre", "gelu_tanh", "learned")
    assert c.tie_weights is True and c.mlp_hidden is None and c.norm_eps == 1e-5
    assert (NORMS[0], NORM_POSITIONS[0], ACTIVATIONS[0], POSITIONALS[0]) == (
        c.norm, c.norm_position, c.activation, c.positional)


@pytest.mark.parametrize("n_embd, hidden, expected", [(128, None, 512), (768, None, 3072),
                                                      (128, 100, 100), (8, 1, 1)])
def test_mlp_width(n_embd, hidden, expected):
    assert GPTConfig(n_embd=n_embd, n_head=1, mlp_hidden=hidden).mlp_width == expected


@pytest.mark.parametrize("field, choices", [("norm", NORMS), ("norm_position", NORM_POSITIONS),
                                            ("activation", ACTIVATIONS),
                                            ("positional", POSITIONALS)])
def test_every_choice_is_accepted(field, choices):
    for choice in choices:
        assert getattr(GPTConfig(**{field: choice}), field) == choice


@pytest.mark.parametrize("field, bad", [
    ("norm", "batchnorm"), ("norm", "LayerNorm"), ("norm", None),
    ("norm_position", "sandwich"), ("norm_position", ""),
    ("activation", "swish"), ("activation", "GELU"), ("activation", 1),
    ("positional", "rotary"), ("positional", "sinusoid"),
])
def test_unknown_choices_are_rejected_with_the_valid_ones(field, bad):
    error = ValueError if isinstance(bad, str) else TypeError  # a wrong type is a TypeError
    with pytest.raises(error, match=field) as info:
        GPTConfig(**{field: bad})
    valid = {"norm": NORMS, "norm_position": NORM_POSITIONS, "activation": ACTIVATIONS,
             "positional": POSITIONALS}[field]
    assert all(repr(v) in str(info.value) for v in valid)


@pytest.mark.parametrize("kwargs, match", [
    ({"n_layer": 0}, "n_layer"), ({"n_layer": -2}, "n_layer"), ({"mlp_hidden": 0}, "mlp_hidden"),
    ({"norm_eps": 0.0}, "norm_eps"), ({"norm_eps": -1e-5}, "norm_eps"),
    ({"norm_eps": 1.0}, "norm_eps"),
])
def test_bad_values_raise_value_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GPTConfig(**kwargs)


@pytest.mark.parametrize("kwargs, match", [
    ({"norm_eps": "1e-5"}, "norm_eps"), ({"norm_eps": True}, "norm_eps"),
    ({"n_layer": 1.5}, "n_layer"), ({"mlp_hidden": 3.0}, "mlp_hidden"),
    ({"mlp_hidden": True}, "mlp_hidden"),
    ({"tie_weights": 1}, "tie_weights"), ({"tie_weights": "yes"}, "tie_weights"),
])
def test_bad_types_raise_type_error(kwargs, match):
    with pytest.raises(TypeError, match=match):
        GPTConfig(**kwargs)


def test_replace_validates_again():
    c = GPTConfig()
    assert dataclasses.replace(c, norm="rmsnorm", norm_position="post").norm == "rmsnorm"
    with pytest.raises(ValueError, match="norm_position"):
        dataclasses.replace(c, norm_position="middle")
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.norm = "rmsnorm"  # type: ignore[misc]


def test_the_argument_checks_name_the_argument_in_a_field_not_only_in_the_message():
    """The command line names its option from ``err.field``; it never parses the message."""
    from tinygpt.checks import (
        ArgumentTypeError,
        ArgumentValueError,
        check_bool,
        check_choice,
        check_float,
        check_instance,
        check_int,
    )
    from tinygpt.sample import check_sampling

    cases = [(lambda: check_int(0, "n_layer"), ArgumentValueError, "n_layer"),
             (lambda: check_int(1.5, "n_head"), ArgumentTypeError, "n_head"),
             (lambda: check_float(2.0, "dropout", 0, 1), ArgumentValueError, "dropout"),
             (lambda: check_bool(1, "bias"), ArgumentTypeError, "bias"),
             (lambda: check_choice("x", "norm", ("a", "b")), ArgumentValueError, "norm"),
             (lambda: check_instance(3, str, "text"), ArgumentTypeError, "text"),
             (lambda: check_sampling(temperature=-1.0), ArgumentValueError, "temperature"),
             (lambda: check_sampling(top_p=0.0, vocab_size=5), ArgumentValueError, "top_p"),
             (lambda: check_sampling(temperature=0.0, greedy=False), ArgumentValueError,
              "temperature")]
    for call, kind, field in cases:
        with pytest.raises(kind) as caught:
            call()
        assert caught.value.field == field
        assert isinstance(caught.value, ValueError if kind is ArgumentValueError else TypeError)


DEVICE_NAMES = ["cpu", "cuda", "cuda:0", "cuda:12", "mps", "auto"]


@pytest.mark.parametrize("name", [*DEVICE_NAMES, "gpu", "CPU", "cuda:", "cuda:-1", "cuda:1 ",
                                  " cuda", "cuda:0\n", "cuda:²", "cuda:٣", "cuda0", "", None, 0])
def test_the_config_and_the_runtime_know_the_same_device_names(name):
    """``TrainConfig`` and ``runtime.device_problem`` share one rule (``is_device_name``):
    a name one accepts, the other never calls unknown (digits are ASCII: ``"cuda:²"`` passed
    ``str.isdigit`` and then failed in ``int``)."""
    from tinygpt.config import TrainConfig
    from tinygpt.runtime import device_problem

    try:
        TrainConfig(device=name)
        accepted = True
    except ValueError as err:
        assert getattr(err, "field", None) == "TrainConfig.device"
        accepted = False
    assert accepted == (name in DEVICE_NAMES)
    if isinstance(name, str):  # the runtime may still lack the device, but knows its name
        problem = device_problem(name)
        assert (problem is None or not problem.startswith("not a device")) == accepted
