"""The configuration of a GPT: its sizes and a few switches, in one validated dataclass.

``GPTConfig`` holds what fixes the shapes of a model's parameters -- vocabulary size ``V``,
context length ``T_max`` (``block_size``), number of blocks ``L``, heads ``H`` and embedding
width ``C`` -- plus dropout, whether linear layers and norms carry a bias, and the switches that
choose a block's variant (which normalisation, where it sits, which activation, how wide the MLP
is), how positions are encoded and whether the output layer shares the token embedding. The
defaults of the switches reproduce GPT-2. Every layer of the package takes the whole config, so
one object describes one model. Invalid values raise a
``ValueError`` (a ``TypeError`` for a non-number dropout or a non-bool bias) that names the field
and the valid range (or the valid choices) as soon as the config is created.

It does not hold training settings (learning rate, batch size, steps: those belong to the
training configuration) and it does not build a model. It is frozen: make a variant with
``dataclasses.replace(config, n_layer=8)``, which validates again.
"""

from __future__ import annotations

from dataclasses import dataclass

# The valid values of each string switch, the first one being GPT-2's.
NORMS = ("layernorm", "rmsnorm")
NORM_POSITIONS = ("pre", "post")
ACTIVATIONS = ("gelu_tanh", "gelu", "relu")
POSITIONALS = ("learned", "sinusoidal")


def _check_positive_int(value: object, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"GPTConfig.{name} must be a positive integer, got {value!r}")


def _check_choice(value: object, name: str, choices: tuple[str, ...]) -> None:
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"GPTConfig.{name} must be one of {list(choices)}, got {value!r}")


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
            GELU), ``"gelu"`` (exact GELU) or ``"relu"``.
        mlp_hidden: width of the MLP's hidden layer; ``None`` means ``4 * n_embd``
            (read the resolved value from ``mlp_width``).
        norm_eps: the ``eps`` added to the variance (mean square) inside the norms, > 0.
        positional: ``"learned"`` (GPT-2's table ``wpe``) or ``"sinusoidal"`` (the 2017 paper).
        tie_weights: whether the output layer ``lm_head`` shares ``wte``'s weight (GPT-2 does).
    """

    vocab_size: int = 256
    block_size: int = 256
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    bias: bool = True
    norm: str = "layernorm"
    norm_position: str = "pre"
    activation: str = "gelu_tanh"
    mlp_hidden: int | None = None
    norm_eps: float = 1e-5
    positional: str = "learned"
    tie_weights: bool = True

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            _check_positive_int(getattr(self, name), name)
        if self.n_embd % self.n_head != 0:
            raise ValueError(
                f"GPTConfig.n_embd={self.n_embd} must be divisible by n_head={self.n_head}: "
                f"each head gets n_embd / n_head dimensions; try n_head in "
                f"{[h for h in range(1, min(self.n_embd, 16) + 1) if self.n_embd % h == 0]}"
            )
        dropout = self.dropout
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)):
            raise TypeError(f"GPTConfig.dropout must be a number in [0, 1), got {dropout!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"GPTConfig.dropout must be in [0, 1), got {dropout!r}")
        if not isinstance(self.bias, bool):
            raise TypeError(f"GPTConfig.bias must be True or False, got {self.bias!r}")
        _check_choice(self.norm, "norm", NORMS)
        _check_choice(self.norm_position, "norm_position", NORM_POSITIONS)
        _check_choice(self.activation, "activation", ACTIVATIONS)
        _check_choice(self.positional, "positional", POSITIONALS)
        if self.mlp_hidden is not None:
            _check_positive_int(self.mlp_hidden, "mlp_hidden")
        eps = self.norm_eps
        if isinstance(eps, bool) or not isinstance(eps, (int, float)):
            raise TypeError(f"GPTConfig.norm_eps must be a positive number, got {eps!r}")
        if not 0.0 < eps < 1.0:
            raise ValueError(f"GPTConfig.norm_eps must be in (0, 1), got {eps!r}")
        if not isinstance(self.tie_weights, bool):
            raise TypeError(f"GPTConfig.tie_weights must be True or False, got {self.tie_weights!r}")

    @property
    def head_size(self) -> int:
        """``d_k = C / H``, the width of one head's queries, keys and values."""
        return self.n_embd // self.n_head

    @property
    def mlp_width(self) -> int:
        """The MLP's hidden width: ``mlp_hidden``, or ``4 * n_embd`` when it is ``None``."""
        return 4 * self.n_embd if self.mlp_hidden is None else self.mlp_hidden
