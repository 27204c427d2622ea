"""The two configurations: what a GPT is (``GPTConfig``) and how to train it (``TrainConfig``).

``GPTConfig`` first sizes a layer in chapter 5 and gains its block switches in chapter 6;
``TrainConfig`` comes with training in chapter 8; later chapters and the command line
(``tinygpt.cli.options``) use both.

``GPTConfig`` holds what fixes the shapes of a model's parameters -- vocabulary size ``V``,
context length ``T_max`` (``block_size``), number of blocks ``L``, heads ``H`` and embedding
width ``C`` -- plus dropout, biases and the switches that choose a block's variant; its defaults
reproduce GPT-2's choices. ``TrainConfig`` holds nanoGPT's training settings, with nanoGPT's
names. Each string switch is typed as a ``Literal[...]``, whose values ``checks.choices`` lists
(the command line offers exactly those).

Both are frozen dataclasses, validated when created (``tinygpt.checks``: ``TypeError`` for a
wrong type, ``ValueError`` for a wrong value, naming the field); make a variant with
``dataclasses.replace(config, n_layer=8)``, which validates again. Neither builds or trains
anything.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, fields
from typing import Literal, get_origin, get_type_hints

from tinygpt.checks import (
    ArgumentValueError,
    check_bool,
    check_choice,
    check_float,
    check_int,
    choices,
)

# The valid values of each string switch, the first one being GPT-2's.
Norm = Literal["layernorm", "rmsnorm"]
NormPosition = Literal["pre", "post"]
Activation = Literal["gelu_tanh", "gelu", "relu", "swiglu", "relu2"]
Positional = Literal["learned", "sinusoidal", "rope"]
Optimizer = Literal["adamw", "muon"]
Schedule = Literal["cosine", "wsd"]
Dtype = Literal["float32", "bfloat16"]
NORMS, NORM_POSITIONS = choices(Norm), choices(NormPosition)
ACTIVATIONS, POSITIONALS = choices(Activation), choices(Positional)
DEVICES = "cpu, cuda, cuda:N, mps or auto"  # the devices tinygpt runs on


def is_device_name(name: object) -> bool:
    """Whether ``name`` is one of ``DEVICES`` as a string (``"cuda:N"``: N in ASCII digits),
    whether or not this machine has it (``tinygpt.runtime.device_problem`` says that)."""
    return isinstance(name, str) and (name in ("cpu", "cuda", "mps", "auto")
                                      or re.fullmatch(r"cuda:[0-9]+", name) is not None)


@functools.cache
def _literal_fields(cls: type) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """``(name, values)`` of every field of ``cls`` typed as a ``Literal``."""
    hints = get_type_hints(cls)  # the annotations are strings here: this resolves them
    return tuple((f.name, choices(hints[f.name])) for f in fields(cls)
                 if get_origin(hints[f.name]) is Literal)


def _check_choices(config: GPTConfig | TrainConfig) -> None:
    """Check every field typed as a ``Literal`` against its values."""
    config_class: type = type(config)
    for name, valid in _literal_fields(config_class):
        check_choice(getattr(config, name), f"{type(config).__name__}.{name}", valid)


@dataclass(frozen=True)
class GPTConfig:
    """Sizes and switches of a GPT; the defaults describe a small character-level model.

    Attributes:
        vocab_size: ``V``, the number of token ids (256 covers every byte).
        block_size: ``T_max``, the context length: the longest sequence the model accepts.
        n_layer: ``L``, the number of transformer blocks.
        n_head: ``H``, the number of attention heads; must divide ``n_embd``.
        n_embd: ``C``, the width of every position's vector (``d_model``).
        dropout: probability of zeroing an activation during training, in ``[0, 1)``.
        bias: whether linear layers and norms have bias terms (GPT-2 has them).
        norm: ``"layernorm"`` (GPT-2) or ``"rmsnorm"`` (Llama and most recent models).
        norm_position: ``"pre"`` (GPT-2: normalise each sub-layer's input) or ``"post"``
            (GPT-1 and the 2017 transformer: normalise after each residual addition).
        activation: the MLP's nonlinearity: ``"gelu_tanh"`` (GPT-2's tanh approximation of
            GELU), ``"gelu"`` (exact GELU), ``"relu"``, ``"relu2"`` (ReLU squared) or
            ``"swiglu"`` (Llama's gated ``silu(gate) * up``: ``c_fc`` makes both halves).
        mlp_hidden: width of the MLP's hidden layer; ``None`` means ``4 * n_embd``
            (read the resolved value from ``mlp_width``).
        norm_eps: the ``eps`` added to the variance (mean square) inside the norms, > 0.
        positional: ``"learned"`` (GPT-2's table ``wpe``), ``"sinusoidal"`` (the 2017 paper)
            or ``"rope"`` (rotary: attention rotates queries and keys; needs an even head size).
        tie_weights: whether the output layer ``lm_head`` shares ``wte``'s weight (GPT-2 does).
        rope_theta: RoPE's base: pair ``i`` of a head turns by ``t * rope_theta^(-2i/d_k)``.
        qk_norm: RMS-normalise each head's queries and keys before their dot product.
        zero_init_proj: start every ``c_proj`` (the end of each residual branch) at zero.
        logit_softcap: 0 (off), or ``c > 0``: the logits become ``c * tanh(logits / c)``, so none
            exceeds ``c`` in size (Gemma 2; modded-nanogpt's speedrun).
    """

    vocab_size: int = 256
    block_size: int = 256
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    bias: bool = True
    norm: Norm = "layernorm"
    norm_position: NormPosition = "pre"
    activation: Activation = "gelu_tanh"
    mlp_hidden: int | None = None
    norm_eps: float = 1e-5
    positional: Positional = "learned"
    tie_weights: bool = True
    rope_theta: float = 10000.0
    qk_norm: bool = False
    zero_init_proj: bool = False
    logit_softcap: float = 0.0

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            check_int(getattr(self, name), f"GPTConfig.{name}")
        if self.n_embd % self.n_head != 0:
            raise ArgumentValueError(
                f"GPTConfig.n_embd={self.n_embd} must be divisible by n_head={self.n_head}: "
                f"each head gets n_embd / n_head dimensions; try n_head in "
                f"{[h for h in range(1, min(self.n_embd, 16) + 1) if self.n_embd % h == 0]}",
                "GPTConfig.n_embd", "GPTConfig.n_head",
            )
        check_float(self.dropout, "GPTConfig.dropout", 0.0, 1.0, high_open=True)
        check_bool(self.bias, "GPTConfig.bias")
        for name in ("tie_weights", "qk_norm", "zero_init_proj"):
            check_bool(getattr(self, name), f"GPTConfig.{name}")
        check_float(self.rope_theta, "GPTConfig.rope_theta", 1.0, math.inf, low_open=True,
                    high_open=True)
        check_float(self.logit_softcap, "GPTConfig.logit_softcap", 0.0, math.inf,
                    high_open=True)
        _check_choices(self)
        if self.mlp_hidden is not None:
            check_int(self.mlp_hidden, "GPTConfig.mlp_hidden")
        check_float(self.norm_eps, "GPTConfig.norm_eps", 0.0, 1.0, low_open=True, high_open=True)
        if self.positional == "rope" and self.head_size % 2:
            raise ArgumentValueError(
                f"GPTConfig.positional='rope' rotates pairs of dimensions, so the head size "
                f"n_embd / n_head must be even, got {self.n_embd} / {self.n_head} = "
                f"{self.head_size}", "GPTConfig.positional", "GPTConfig.n_embd", "GPTConfig.n_head")

    @property
    def head_size(self) -> int:
        """``d_k = C / H``, the width of one head's queries, keys and values."""
        return self.n_embd // self.n_head

    @property
    def mlp_width(self) -> int:
        """The MLP's hidden width: ``mlp_hidden``, or ``4 * n_embd`` when it is ``None``."""
        return 4 * self.n_embd if self.mlp_hidden is None else self.mlp_hidden


@dataclass(frozen=True)
class TrainConfig:
    """How to train: nanoGPT's settings and names. The context length is the model's block_size.

    Attributes:
        batch_size: ``B``, sequences per micro-batch.
        max_iters: optimizer steps in the whole run.
        learning_rate: the peak learning rate, reached at the end of warm-up.
        min_lr: the learning rate at the end of the cosine decay (and after it).
        warmup_iters: steps of linear warm-up from ``learning_rate / warmup_iters``.
        lr_decay_iters: the step where the cosine decay ends; ``None`` means ``max_iters``.
        weight_decay: AdamW's decoupled weight decay, applied to matrices only.
        beta1, beta2: AdamW's averaging coefficients for the gradient and its square.
        grad_clip: clip the global gradient norm to this value; 0 turns clipping off.
        grad_accum_steps: micro-batches whose gradients are averaged into one step
            (the step sees ``batch_size * grad_accum_steps`` sequences on each process; under
            ``torchrun`` that times the number of processes).
        eval_interval: evaluate every this many steps (and after the last step).
        eval_iters: batches per split in each evaluation.
        log_interval: refresh the progress bar every this many steps.
        save_every: with an ``out_dir``, save a checkpoint every this many steps; the last
            step is always saved; 0 saves only the last step.
        seed: seeds the model's initialisation, dropout, batches and evaluation batches.
        device: ``"cpu"``, ``"cuda"``, ``"cuda:N"``, ``"mps"`` or ``"auto"`` (CUDA if available).
            Under ``torchrun`` with several processes, CUDA means ``cuda:LOCAL_RANK``.
        dtype: ``"float32"``, or ``"bfloat16"`` for mixed precision: the forward pass and the
            loss run under ``torch.autocast`` in bfloat16, while the weights, the gradients and
            AdamW stay float32 (needs a CPU or a GPU with bf16 support).
        optimizer: ``"adamw"``, or ``"muon"``: Muon for the blocks' weight matrices, AdamW for
            the rest, at the same learning rate (``tinygpt.muon.configure_muon``).
        adamw_lr_scale: with ``optimizer="muon"``, the AdamW part (embeddings, an untied
            ``lm_head``, norms) trains at ``adamw_lr_scale`` times the schedule's rate.
        schedule: ``"cosine"`` (warm-up, then a cosine decay to ``min_lr``) or ``"wsd"``
            (warm-up, stable, decay: warm-up, then ``learning_rate`` held until the last
            ``cooldown_fraction`` of the steps to ``lr_decay_iters``, then a straight line down
            to ``min_lr``).
        cooldown_fraction: the share of the steps (after warm-up) that ``"wsd"`` spends
            decaying, in ``(0, 1]``; 1 is a linear decay from the end of warm-up.
    """

    batch_size: int = 32
    max_iters: int = 2000
    learning_rate: float = 1e-3
    min_lr: float = 1e-4
    warmup_iters: int = 100
    lr_decay_iters: int | None = None
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.99
    grad_clip: float = 1.0
    grad_accum_steps: int = 1
    eval_interval: int = 250
    eval_iters: int = 20
    log_interval: int = 10
    save_every: int = 0
    seed: int = 1337
    device: str = "cpu"
    dtype: Dtype = "float32"
    optimizer: Optimizer = "adamw"
    adamw_lr_scale: float = 1.0
    schedule: Schedule = "cosine"
    cooldown_fraction: float = 0.2

    def __post_init__(self) -> None:
        for name in ("batch_size", "max_iters", "grad_accum_steps", "eval_interval",
                     "eval_iters", "log_interval"):
            check_int(getattr(self, name), f"TrainConfig.{name}")
        for name in ("warmup_iters", "save_every", "seed"):
            check_int(getattr(self, name), f"TrainConfig.{name}", low=0)
        if self.lr_decay_iters is not None:
            check_int(self.lr_decay_iters, "TrainConfig.lr_decay_iters")
        check_float(self.learning_rate, "TrainConfig.learning_rate", 0.0, math.inf, low_open=True,
                    high_open=True)
        check_float(self.min_lr, "TrainConfig.min_lr", 0.0, self.learning_rate)
        check_float(self.weight_decay, "TrainConfig.weight_decay", 0.0, math.inf, high_open=True)
        check_float(self.beta1, "TrainConfig.beta1", 0.0, 1.0, high_open=True)
        check_float(self.beta2, "TrainConfig.beta2", 0.0, 1.0, high_open=True)
        check_float(self.grad_clip, "TrainConfig.grad_clip", 0.0, math.inf, high_open=True)
        check_float(self.adamw_lr_scale, "TrainConfig.adamw_lr_scale", 0.0, math.inf,
                    low_open=True, high_open=True)
        check_float(self.cooldown_fraction, "TrainConfig.cooldown_fraction", 0.0, 1.0,
                    low_open=True)
        if not is_device_name(self.device):
            raise ArgumentValueError(f"TrainConfig.device must be 'cpu', 'cuda', 'cuda:N', 'mps' "
                                     f"or 'auto', got {self.device!r}", "TrainConfig.device")
        if self.dtype == "float16":
            raise ArgumentValueError("TrainConfig.dtype must be 'float32' or 'bfloat16', got "
                                     "'float16' (float16 needs loss scaling, which tinygpt does "
                                     "not do)", "TrainConfig.dtype")
        _check_choices(self)

    @property
    def sequences_per_step(self) -> int:
        """Sequences per optimizer step on one process, ``batch_size * grad_accum_steps``."""
        return self.batch_size * self.grad_accum_steps
