"""The run of ``tinygpt finetune``: its steps (SFT or DPO), saved every ``save_every`` steps into
``--out`` and resumed from there exactly.

A step is the one of ``tinygpt.chat.fine_tune`` (SFT: the loss on the replies, dropout on) or of
``tinygpt.dpo.train_dpo`` (DPO against a frozen copy of the starting model, dropout off), built
from the same public pieces in the same order, so that an uninterrupted run ends with their
weights. What a resumed run needs besides the weights is saved with them through the checkpoint's
public API (``tinygpt.checkpoint.save_checkpoint``, ``tinygpt.checkpoint.run_state``): AdamW's
state, the step, the history, the RNG states (the batches' generator, torch's for dropout), and a
history record (``RUN_KEY``) of the run's settings, the SHA-256 of the starting checkpoint and
of the examples, and whether it finished. The starting checkpoint itself is read again on resume
(and must be the same): it gives the DPO reference and LoRA's frozen weights.

With LoRA, the checkpoint of an unfinished run holds the merged model (a usable checkpoint, as
every one of tinygpt's is), so the adapters ``A``, ``B`` and their AdamW moments, which a merge
loses, go in its optimizer file: concatenated and cut into tensors of the model's largest weight
shape (``pack_lora``), the only shapes that file may hold. It does not parse options or read
files (``tinygpt.cli.finetune``).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch
from torch import Tensor, nn

from tinygpt import chat, dpo
from tinygpt.checkpoint import save_checkpoint
from tinygpt.checkpoint.folder import CheckpointError
from tinygpt.checkpoint.run_state import restore_optimizer, restore_rng_states, rng_states
from tinygpt.config import TrainConfig
from tinygpt.lora import LoRALinear, merge_lora
from tinygpt.model import GPT
from tinygpt.tokenizer import CharTokenizer
from tinygpt.train import configure_optimizer, lr_at

RUN_KEY = "finetune_run"  # the history record of a fine-tuning run's settings
PACKED = "lora_"  # the optimizer file's names of a LoRA run's packed tensors: lora_0, lora_1...


@dataclass(frozen=True)
class Alone:
    """The place of a run of one process on the CPU (a ``run_state.Process``)."""

    rank: int = 0
    world_size: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))


def start_sha256(model: GPT, tokenizer: Any) -> str:
    """The SHA-256 of a model's config, characters and tensors (by name and bytes): which
    checkpoint a run started from."""
    chars = getattr(tokenizer, "chars", None)  # a CharTokenizer's (finetune takes no other)
    h = hashlib.sha256(json.dumps([dataclasses.asdict(model.config), chars]).encode())
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def examples_sha256(examples: Sequence[Any]) -> str:
    """The SHA-256 of the examples (conversations or preference pairs) a run is tuned on."""
    rows = [dataclasses.asdict(e) for e in examples]
    return hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()


# --- one step of each mode --------------------------------------------------------------------

Step = Callable[[int, float], dict[str, Any]]  # (step, lr) -> its record, once the step is done


def sft_step(model: GPT, tokenizer: CharTokenizer, examples: Sequence[chat.Conversation],
             config: TrainConfig, optimizer: torch.optim.Optimizer,
             generator: torch.Generator) -> Step:
    """``tinygpt.chat.fine_tune``'s step: a batch drawn with ``generator``, the reply loss."""
    def step(number: int, lr: float) -> dict[str, Any]:
        chosen = torch.randint(len(examples), (config.batch_size,), generator=generator)
        inputs, targets = chat.batch(tokenizer, [examples[i] for i in chosen.tolist()],
                                     model.config.block_size)  # (B, T) each
        loss = chat.reply_loss(model, inputs, targets)
        update(model, optimizer, loss, config)
        return {"step": number, "lr": lr, "loss": loss.item()}

    model.train()
    return step


def dpo_step(model: GPT, reference: GPT, tokenizer: CharTokenizer, pairs: Sequence[dpo.Pair],
             config: TrainConfig, beta: float, optimizer: torch.optim.Optimizer,
             generator: torch.Generator) -> Step:
    """``tinygpt.dpo.train_dpo``'s step; its record is of the batch before the update."""
    T = model.config.block_size

    def step(number: int, lr: float) -> dict[str, Any]:
        chosen = torch.randint(len(pairs), (config.batch_size,), generator=generator)
        batch = [pairs[i] for i in chosen.tolist()]
        with torch.no_grad():
            ref_chosen, ref_rejected = dpo.pair_log_probs(reference, tokenizer, batch, T)
        pol_chosen, pol_rejected = dpo.pair_log_probs(model, tokenizer, batch, T)  # (B,) each
        loss = dpo.dpo_loss(pol_chosen, pol_rejected, ref_chosen, ref_rejected, beta)
        margin = (pol_chosen - ref_chosen).detach() - (pol_rejected - ref_rejected).detach()
        record = {"step": number, "lr": lr, "loss": loss.item(),
                  "accuracy": dpo.pair_accuracy(margin), "margin": margin.mean().item()}
        update(model, optimizer, loss, config)
        return record

    model.eval()  # no dropout: the policy's log-probabilities are compared with the reference's
    return step


def update(model: nn.Module, optimizer: torch.optim.Optimizer, loss: Tensor,
           config: TrainConfig) -> None:
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if config.grad_clip > 0:
        nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
    optimizer.step()


# --- LoRA's state in a checkpoint's optimizer file --------------------------------------------

def trained(optimizer: torch.optim.Optimizer) -> list[nn.Parameter]:
    return [p for g in optimizer.param_groups for p in g["params"]]


def pack_lora(optimizer: torch.optim.Optimizer, shape: torch.Size) -> dict[str, Any]:
    """An ``optimizer.state_dict()``-like dict holding, under parameter 0, the trained tensors
    (the adapters) and their AdamW moments, concatenated and cut into tensors of ``shape`` (the
    last one padded with zeros), and the step count."""
    ours = trained(optimizer)
    state = optimizer.state_dict()
    pieces = [p.detach() for p in ours] + [optimizer.state[p][k] for k in ("exp_avg", "exp_avg_sq")
                                            for p in ours]
    flat = torch.cat([t.reshape(-1) for t in pieces])
    size = shape.numel()
    flat = torch.cat([flat, flat.new_zeros(-len(flat) % size)]).view(-1, *shape)
    entry: dict[str, Any] = {f"{PACKED}{k}": t.clone() for k, t in enumerate(flat)}
    entry[f"{PACKED}step"] = optimizer.state[ours[0]]["step"]
    return {"state": {0: entry}, "param_groups": state["param_groups"]}


def unpack_lora(optimizer: torch.optim.Optimizer, saved: dict[str, Any] | None,
                where: Path) -> None:
    """Set the adapters and the optimizer from what ``pack_lora`` saved."""
    entry = (saved or {}).get("state", {}).get(0, {})
    chunks = sorted((int(k[len(PACKED):]), t) for k, t in entry.items()
                    if k.startswith(PACKED) and k[len(PACKED):].isdigit())
    ours = trained(optimizer)
    n = sum(p.numel() for p in ours)
    flat = torch.cat([t.reshape(-1) for _, t in chunks]) if chunks else torch.zeros(0)
    if saved is None or f"{PACKED}step" not in entry or len(flat) < 3 * n:
        raise CheckpointError(f"{where}: the checkpoint holds no LoRA state of this run's "
                              f"adapters ({n} numbers): it is not an interrupted LoRA run")
    values, first, second = flat[:n], flat[n:2 * n], flat[2 * n:3 * n]
    state, start = {}, 0
    for i, p in enumerate(ours):
        piece = slice(start, start + p.numel())
        with torch.no_grad():
            p.copy_(values[piece].view_as(p))
        state[i] = {"step": entry[f"{PACKED}step"].clone(),
                    "exp_avg": first[piece].view_as(p).clone(),
                    "exp_avg_sq": second[piece].view_as(p).clone()}
        start += p.numel()
    restore_optimizer(optimizer, {"state": state, "param_groups": saved["param_groups"]}, where)


# --- the run ----------------------------------------------------------------------------------

@dataclass
class Run:
    """A fine-tuning run ready for its next step: the model (with LoRA layers for LoRA), its
    optimizer and batch generator, the settings (``RUN_KEY``), and what it did so far."""

    model: GPT
    tokenizer: CharTokenizer
    config: TrainConfig
    settings: dict[str, Any]
    optimizer: torch.optim.Optimizer = field(init=False)
    generator: torch.Generator = field(init=False)
    step: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    saved: int | None = None  # the step of the checkpoint in --out, if any

    def __post_init__(self) -> None:
        self.optimizer = configure_optimizer(self.model, self.config)
        self.generator = torch.Generator().manual_seed(self.config.seed)

    @property
    def lora(self) -> bool:
        return any(isinstance(m, LoRALinear) for m in self.model.modules())

    def record(self, done: bool) -> dict[str, Any]:
        return {"step": self.step, RUN_KEY: {**self.settings, "done": done}}

    def save(self, out: Path, extra: Sequence[dict[str, Any]] = ()) -> None:
        """Save the run after its last step (``extra`` records: a finished run's names)."""
        rng = rng_states(Alone(), self.generator)  # before the merge below, which draws
        done = self.step == self.config.max_iters
        model, optimizer = self.model, self.optimizer
        if self.lora:
            with torch.random.fork_rng(devices=[]):  # merge's nn.Linear initialises: no draw
                model = cast(GPT, merge_lora(copy.deepcopy(self.model)))
            shape = max((t.shape for t in model.state_dict().values()), key=lambda s: s.numel())
            optimizer = cast(torch.optim.Optimizer,
                             Packed(pack_lora(self.optimizer, shape)))
        save_checkpoint(out, model, None if done else optimizer, model.config, self.config,
                        self.step, tokenizer=self.tokenizer, rng_states=rng,
                        history=[*self.history, *extra, self.record(done)])
        self.saved = self.step

    def resume(self, ckpt: Any, out: Path) -> None:
        """Continue the interrupted run of the checkpoint ``ckpt`` (of ``out``)."""
        if self.lora:
            with torch.no_grad():  # the merged weights; the frozen ones are the start's
                unpack_lora(self.optimizer, ckpt.optimizer_state, out)
        else:
            self.model.load_state_dict(ckpt.model.state_dict())
            restore_optimizer(self.optimizer, ckpt.optimizer_state, out)
        restore_rng_states(ckpt.rng_states, Alone(), self.generator)
        self.step = self.saved = ckpt.step
        self.history = [r for r in ckpt.history if RUN_KEY not in r]

    def steps(self, step: Step, out: Path, save_every: int,
              callback: Callable[[dict[str, Any]], None]) -> None:
        """Run the steps left, saving every ``save_every`` steps (the last one is the caller's)."""
        while self.step < self.config.max_iters:
            lr = lr_at(self.step, self.config)
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            self.history.append(step(self.step, lr))
            self.step += 1
            callback(self.history[-1])
            if self.step % save_every == 0 and self.step < self.config.max_iters:
                self.save(out)


@dataclass
class Packed:
    """Stands for the optimizer in ``save_checkpoint``: its ``state_dict`` is ``pack_lora``'s."""

    state: dict[str, Any]

    def state_dict(self) -> dict[str, Any]:
        return self.state


def interrupted_settings(ckpt: Any, out: Path) -> dict[str, Any]:
    """The settings of the interrupted fine-tuning run whose checkpoint ``ckpt`` is in ``out``."""
    found = [r[RUN_KEY] for r in ckpt.history if isinstance(r, dict) and
             isinstance(r.get(RUN_KEY), dict)]
    if not found:
        raise ValueError(f"--out {out} holds a checkpoint of no tinygpt finetune run: --resume "
                         "continues an interrupted fine-tuning")
    if found[-1].get("done"):
        raise ValueError(f"--out {out} holds a finished fine-tuning (step {ckpt.step}): there is "
                         "nothing to resume")
    return found[-1]


# The options whose values a resumed run must repeat: (settings key, option)
OPTIONS = (("mode", "--data/--dpo"), ("lora_rank", "--lora-rank"), ("max_iters", "--max-iters"),
           ("batch_size", "--batch-size"), ("lr", "--lr"), ("beta", "--beta"),
           ("seed", "--seed"))


def check_same_run(saved: dict[str, Any], settings: dict[str, Any], out: Path,
                   checkpoint: str, data: str) -> None:
    """Refuse a resume whose start, examples or options differ from the interrupted run's."""
    if saved.get("start") != settings["start"]:
        raise ValueError(f"CHECKPOINT {checkpoint} is not the checkpoint the interrupted run in "
                         f"{out} started from (its config, characters or weights differ): "
                         "resume with that one")
    if saved.get("data") != settings["data"]:
        raise ValueError(f"{data} holds other examples than the interrupted run in {out} was "
                         "tuned on (their SHA-256 differs): resume on the same file")
    for key, flag in OPTIONS:
        if saved.get(key) != settings[key]:
            raise ValueError(f"{flag} {settings[key]} differs from the interrupted run in {out} "
                             f"({saved.get(key)}): --resume continues it with the options it "
                             "started with; give the same")
