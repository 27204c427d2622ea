"""The whole GPT in pure Python: lists of ``Value`` scalars, trained one short string at a time.

Chapter 11 builds it.

On nothing but the standard library and :class:`tinygpt.autograd.Value`: sizes (``MicroConfig``),
a character tokenizer with a BOS token, GPT-2-named parameters (exported as lists of floats and
mapped onto :class:`tinygpt.model.GPT`'s state dict), the forward pass one token at a time with a
key/value cache (RMSNorm, multi-head attention, ReLU MLP; no biases, no norm scales), the loss,
Adam, a training loop and sampling. It does not batch, vectorise, use a GPU or save files: it is
for reading, and far slower than the same model in torch.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from tinygpt.autograd import Value, gc_paused, zero_grad
from tinygpt.checks import check_float, check_ids, check_int
from tinygpt.tokenizer import CharTokenizer

Vector = list[Value]
Matrix = list[list[Value]]
Params = dict[str, Matrix]
Cache = list[list[Vector]]  # per layer, one vector per position seen so far


@dataclass(frozen=True)
class MicroConfig:
    """Sizes: vocabulary ``V``, width ``C``, heads ``H`` (each ``C / H`` wide), blocks, context."""

    vocab_size: int
    n_embd: int = 16
    n_head: int = 4
    n_layer: int = 1
    block_size: int = 16

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            check_int(value, name)
        if self.n_embd % self.n_head:
            raise ValueError(f"MicroConfig.n_embd={self.n_embd} must be divisible by "
                             f"n_head={self.n_head}")

    @property
    def head_size(self) -> int:
        return self.n_embd // self.n_head


class DocTokenizer:
    """The characters of a list of strings (a ``CharTokenizer``) plus ``bos``, the last id.

    ``encode("ada")`` is ``[bos, a, d, a, bos]``: the same token marks where a string starts
    (the model's first input) and where it ends (its last target).
    """

    def __init__(self, docs: Sequence[str]) -> None:
        self.chars = CharTokenizer.from_text("".join(docs))
        self.bos = self.chars.vocab_size
        self.vocab_size = self.chars.vocab_size + 1

    def encode(self, doc: str) -> list[int]:
        return [self.bos, *self.chars.encode(doc), self.bos]

    def decode(self, ids: Sequence[int]) -> str:
        """The characters of ``ids``, BOS tokens left out."""
        return self.chars.decode([i for i in ids if i != self.bos])


# --- parameters ----------------------------------------------------------------------------------

def shapes(config: MicroConfig) -> dict[str, tuple[int, int]]:
    """Every matrix's (rows, columns); a linear layer's matrix is (out, in), as in ``nn.Linear``."""
    V, C, T = config.vocab_size, config.n_embd, config.block_size
    out = {"wte": (V, C), "wpe": (T, C)}
    for i in range(config.n_layer):
        out |= {f"h.{i}.attn.c_attn": (3 * C, C), f"h.{i}.attn.c_proj": (C, C),
                f"h.{i}.mlp.c_fc": (4 * C, C), f"h.{i}.mlp.c_proj": (C, 4 * C)}
    return out | {"lm_head": (V, C)}


def init_params(config: MicroConfig, seed: int = 0, std: float = 0.08) -> Params:
    """Every weight drawn from normal(0, ``std``) by ``random.Random(seed)``, in shapes order."""
    rng = random.Random(seed)
    return {name: [[Value(rng.gauss(0.0, std)) for _ in range(cols)] for _ in range(rows)]
            for name, (rows, cols) in shapes(config).items()}


def parameters(params: Params) -> list[Value]:
    """All parameters in one flat list (matrix by matrix, row by row)."""
    return [p for matrix in params.values() for row in matrix for p in row]


def export_weights(params: Params) -> dict[str, list[list[float]]]:
    """The weights as plain nested lists of floats (``torch.tensor`` of each gives the matrix)."""
    return {name: [[p.data for p in row] for row in matrix] for name, matrix in params.items()}


def import_weights(weights: Mapping[str, Sequence[Sequence[float]]], config: MicroConfig) -> Params:
    """New parameters holding ``weights`` (as from ``export_weights``); checks names and shapes."""
    expected = shapes(config)
    if set(weights) != set(expected):
        missing, extra = set(expected) - set(weights), set(weights) - set(expected)
        raise ValueError(f"weights must have the keys {list(expected)}: missing "
                         f"{sorted(missing)}, extra {sorted(extra)}")
    for name, (rows, cols) in expected.items():
        got = (len(weights[name]), {len(row) for row in weights[name]})
        if got != (rows, {cols}):
            raise ValueError(f"{name} must be {rows} x {cols}, got {got[0]} rows of {got[1]}")
    return {name: [[Value(float(w)) for w in row] for row in weights[name]] for name in expected}


def gpt_names(config: MicroConfig) -> dict[str, str]:
    """Our name -> the key of the same weight in ``tinygpt.model.GPT``'s state dict."""
    return {name: ("transformer.embed." if name in ("wte", "wpe") else
                   "" if name == "lm_head" else "transformer.") + name + ".weight"
            for name in shapes(config)}


def gpt_config_fields(config: MicroConfig) -> dict[str, object]:
    """The ``GPTConfig`` fields of the same model in torch (``GPTConfig(**fields)``)."""
    return asdict(config) | {"bias": False, "norm": "rmsnorm", "activation": "relu",
                             "tie_weights": False}


def to_gpt_state_dict(weights: Mapping[str, list[list[float]]],
                      config: MicroConfig) -> dict[str, list]:
    """``weights`` under GPT's keys, plus its norms' scales set to ones (ours have none).

    ``{k: torch.tensor(v) for k, v in ...items()}`` loads into
    ``GPT(GPTConfig(**gpt_config_fields(config)))``; freeze its norms to keep them at 1.
    """
    out: dict[str, list] = {gpt: weights[ours] for ours, gpt in gpt_names(config).items()}
    norms = [f"transformer.h.{i}.ln_{j}.weight" for i in range(config.n_layer) for j in (1, 2)]
    return out | {name: [1.0] * config.n_embd for name in [*norms, "transformer.ln_f.weight"]}


def from_gpt_state_dict(state: Mapping[str, Any], config: MicroConfig) -> dict[str, list]:
    """The inverse of ``to_gpt_state_dict`` (tensors welcome); every norm scale must still be 1."""
    lists = {k: v.tolist() if hasattr(v, "tolist") else v for k, v in state.items()}
    changed = [k for k, v in lists.items() if ".ln_" in k and any(w != 1.0 for w in v)]
    if changed:
        raise ValueError(f"{changed[0]} is not all ones: our norms have no scale (freeze them)")
    return {ours: lists[gpt] for ours, gpt in gpt_names(config).items()}


# --- the forward pass, one token at a time -------------------------------------------------------

def dot(a: Vector, b: Vector) -> Value:
    """``sum(a[i] * b[i])`` as ONE node: its children are ``a`` and ``b``, and the local
    derivative with respect to ``a[i]`` is ``b[i]`` (and vice versa). The same value as summing
    ``a[i] * b[i]`` with the engine's ``*`` and ``+``, with one node instead of 2n."""
    if len(a) != len(b):
        raise ValueError(f"dot needs two vectors of the same length, got {len(a)} and {len(b)}")
    ad, bd = [u.data for u in a], [u.data for u in b]
    return Value(sum([u * v for u, v in zip(ad, bd)]), (*a, *b), (*bd, *ad), "dot")


def linear(x: Vector, w: Matrix) -> Vector:
    """``w @ x``: one dot product per row of ``w`` (out x in); ``x`` has ``in`` entries."""
    return [dot(row, x) for row in w]


def rmsnorm(x: Vector, eps: float = 1e-5) -> Vector:
    """``x / sqrt(mean(x^2) + eps)``: the vector rescaled to a root mean square of about 1."""
    scale = (dot(x, x) / len(x) + eps) ** -0.5
    return [xi * scale for xi in x]


def softmax(logits: Vector) -> Vector:
    """Probabilities from scores; the largest is subtracted first, so ``exp`` cannot overflow."""
    top = max(v.data for v in logits)
    exps = [(v - top).exp() for v in logits]
    total = sum(exps)
    return [e / total for e in exps]


def new_cache(config: MicroConfig) -> tuple[Cache, Cache]:
    """Empty keys and values: one list per layer, which grows by one vector per position."""
    return [[] for _ in range(config.n_layer)], [[] for _ in range(config.n_layer)]


def _check_position(token_id: int, pos: int, config: MicroConfig) -> None:
    check_ids([token_id], config.vocab_size)
    if pos >= config.block_size:
        raise ValueError(f"position {pos} is past the context length block_size="
                         f"{config.block_size}; start a new cache or crop the sequence")


def forward_token(params: Params, config: MicroConfig, token_id: int,
                  keys: Cache, values: Cache) -> Vector:
    """The ``V`` logits for the token after ``token_id``, which sits at position ``len(keys[0])``.

    Appends this position's key and value to ``keys`` and ``values``: attention sees exactly the
    positions fed so far, so the model cannot look ahead (causality by construction).
    """
    C, d, pos = config.n_embd, config.head_size, len(keys[0])
    _check_position(token_id, pos, config)
    x = [t + p for t, p in zip(params["wte"][token_id], params["wpe"][pos])]  # (C,)
    for i in range(config.n_layer):
        h = f"h.{i}."
        qkv = linear(rmsnorm(x), params[h + "attn.c_attn"])  # (3C,): [q | k | v]
        q, k, v = qkv[:C], qkv[C:2 * C], qkv[2 * C:]
        keys[i].append(k)  # a plain list append: position pos is now visible to later positions
        values[i].append(v)
        heads: Vector = []
        for s in range(0, C, d):  # one head: dimensions s .. s+d-1 of q, k and v
            scores = [dot(q[s:s + d], kt[s:s + d]) / math.sqrt(d)
                      for kt in keys[i]]  # (pos+1,) one score per cached position
            w = softmax(scores)  # (pos+1,) attention weights, summing to 1
            heads += [dot(w, [vt[s + j] for vt in values[i]])
                      for j in range(d)]  # (d,) the values' weighted mean
        x = [a + b for a, b in zip(x, linear(heads, params[h + "attn.c_proj"]))]  # (C,) residual
        hidden = [u.relu() for u in linear(rmsnorm(x), params[h + "mlp.c_fc"])]  # (4C,)
        x = [a + b for a, b in zip(x, linear(hidden, params[h + "mlp.c_proj"]))]  # (C,) residual
    return linear(rmsnorm(x), params["lm_head"])  # (V,) logits


def _check_document(tokens: Sequence[int], config: MicroConfig) -> int:
    check_ids(tokens, config.vocab_size)
    if not 2 <= len(tokens) <= config.block_size + 1:
        raise ValueError(f"tokens must hold 2 to block_size + 1 = {config.block_size + 1} ids "
                         f"(inputs and targets), got {len(tokens)}; crop longer strings")
    return len(tokens) - 1


def loss_fn(params: Params, config: MicroConfig, tokens: Sequence[int]) -> Value:
    """Mean cross-entropy of predicting ``tokens[t + 1]`` from ``tokens[:t + 1]``, for every t."""
    n = _check_document(tokens, config)  # the number of predictions: len(tokens) - 1
    keys, values = new_cache(config)
    losses = []
    for t in range(n):
        probs = softmax(forward_token(params, config, tokens[t], keys, values))  # (V,)
        losses.append(-probs[tokens[t + 1]].log())  # -ln p(target)
    return sum(losses) / n  # type: ignore[return-value]  # 0 + Value is a Value (__radd__)


# --- training and sampling -----------------------------------------------------------------------

class Adam:
    """Adam (Kingma and Ba): per parameter, running means of the gradient and of its square."""

    def __init__(self, params: Sequence[Value], lr: float = 0.01,
                 betas: tuple[float, float] = (0.85, 0.99), eps: float = 1e-8) -> None:
        self.params, self.lr, self.betas, self.eps = list(params), lr, betas, eps
        self.m = [0.0] * len(self.params)  # first moment: mean of the gradient
        self.v = [0.0] * len(self.params)  # second moment: mean of the squared gradient
        self.t = 0  # steps taken

    def step(self, lr: float | None = None) -> None:
        """One update from the current ``grad``s; ``lr`` overrides the learning rate once."""
        lr = self.lr if lr is None else lr
        b1, b2 = self.betas
        self.t += 1
        c1, c2 = 1 - b1 ** self.t, 1 - b2 ** self.t  # bias corrections: m and v start at 0
        for i, p in enumerate(self.params):
            self.m[i] = b1 * self.m[i] + (1 - b1) * p.grad
            self.v[i] = b2 * self.v[i] + (1 - b2) * p.grad ** 2
            p.data -= lr * (self.m[i] / c1) / (math.sqrt(self.v[i] / c2) + self.eps)


def train(params: Params, config: MicroConfig, docs: Sequence[Sequence[int]], steps: int,
          lr: float = 0.01, log_every: int = 0) -> list[float]:
    """``steps`` Adam steps, step ``s`` on ``docs[s % len(docs)]``, the learning rate falling
    linearly from ``lr`` to 0; returns each step's loss (printed every ``log_every`` steps)."""
    flat = parameters(params)
    opt = Adam(flat, lr=lr)
    history = []
    with gc_paused():  # a Value graph has no reference cycles: skip the cycle collector
        for step in range(steps):
            loss = loss_fn(params, config, docs[step % len(docs)])
            zero_grad(flat)
            loss.backward()
            opt.step(lr=lr * (1 - step / steps))
            history.append(loss.data)
            if log_every and (step % log_every == 0 or step == steps - 1):
                print(f"step {step:4d}  loss {loss.data:.4f}")
    return history


def sample(params: Params, config: MicroConfig, bos: int, rng: random.Random,
           temperature: float = 0.5) -> list[int]:
    """Ids drawn from ``softmax(logits / temperature)`` after ``bos``, until ``bos`` comes again
    (not returned) or the context is full."""
    check_float(temperature, "temperature", 0, low_open=True)
    keys, values = new_cache(config)
    token, out = bos, []
    for _ in range(config.block_size):
        logits = forward_token(params, config, token, keys, values)
        probs = softmax([z / temperature for z in logits])
        token = rng.choices(range(config.vocab_size), weights=[p.data for p in probs])[0]
        if token == bos:
            break
        out.append(token)
    return out
