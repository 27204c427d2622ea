"""The options that say how a model samples, shared by ``tinygpt sample`` and ``tinygpt chat``.

``add_sampling_options`` adds ``--temperature``, ``--top-k``, ``--top-p``, ``--seed``,
``--no-cache`` and ``--device`` to a command (each command keeps its own length option:
``--max-new-tokens`` tokens, ``--max-chars`` characters). ``check_sampling_options`` refuses a
seed torch cannot take and a device this machine lacks before the checkpoint is loaded, and
``naming_the_option`` gives an error about a sampling setting the name of its option;
``model_on_device`` moves a loaded model to ``--device``'s device. It does not load a model or
sample (the commands do).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from tinygpt.cli.preflight import check_device, check_seed

if TYPE_CHECKING:  # torch is imported when a command runs, not when the parser is built
    import torch

Model = TypeVar("Model", bound="torch.nn.Module")  # the model's own class is kept (a GPT)

# the sampling parameters of tinygpt.sample.generate and tinygpt.chat.ChatSession, by option
OPTION_NAMES = {"temperature": "--temperature", "top_k": "--top-k", "top_p": "--top-p"}


def add_sampling_options(
    parser: argparse.ArgumentParser, add_option: Callable[..., None], *, seed: int
) -> None:
    """Add the sampling options to ``parser`` with ``add_option`` (``tinygpt.cli.add_option``,
    which shows each default in the help); ``seed``: the command's default seed."""
    for flag, kind, default, text in [
        ("--temperature", float, 0.8, "divides the logits; 0 is greedy"),
        ("--top-k", int, None, "keep the k most likely tokens (1 to the vocabulary size)"),
        ("--top-p", float, None, "keep the fewest likeliest tokens reaching probability p"),
        ("--seed", int, seed, "seeds the sampling"),
    ]:
        add_option(parser, flag, text, type=kind, default=default, metavar=kind.__name__.upper())
    add_option(
        parser,
        "--no-cache",
        "read the whole context again for every token instead of "
        "keeping keys and values in the cache (the same output, slower)",
        action="store_true",
    )
    add_option(parser, "--device", "cpu, cuda, cuda:N, mps or auto", default="cpu")


def check_sampling_options(args: argparse.Namespace) -> None:
    """Refuse ``--seed`` outside the range torch takes and a ``--device`` this machine lacks
    (the other settings are checked where the model samples: ``tinygpt.sample.check_sampling``)."""
    check_seed(args.seed)
    check_device(args.device)


@contextmanager
def naming_the_option(option_names: dict[str, str]) -> Iterator[None]:
    """Inside the block, an error a tinygpt check raises about a parameter named in
    ``option_names`` (its ``field``) ends with the option's name: ``(option --top-k)``."""
    try:
        yield
    except (ValueError, TypeError) as err:
        field: Any = getattr(err, "field", None)  # the argument a tinygpt check names
        if field not in option_names:
            raise
        raise ValueError(f"{err} (option {option_names[field]})") from None


def model_on_device(model: Model, device: torch.device, option: str) -> Model:
    """``model`` moved to ``device`` (the one ``--device option`` resolved to); a device this
    torch was not built for is a ``ValueError`` naming the option, not torch's traceback."""
    try:
        return model.to(device)
    except (RuntimeError, AssertionError) as err:  # a device this torch was not built for
        raise ValueError(f"--device {option}: {err}") from None
