"""``tinygpt finetune CHECKPOINT --data CONVERSATIONS --out DIR``: supervised fine-tuning to the
chat template, and with ``--dpo PAIRS`` preference tuning, from the shell.

The conversation file is JSON Lines, one conversation a line::

    {"turns": [{"speaker": "ROMEO", "text": "But soft!"}, {"speaker": "JULIET", "text": "Ay me!"}]}

Each two consecutive turns by two different speakers are one training example in the template
of ``tinygpt.chat`` (``▷SPEAKER:\\nspeech\\n▶REPLIER:\\nreply■``), the loss on the reply and its
``■`` only (``tinygpt.chat.fine_tune``); a speech is cut to its last words to fit the context,
and a pair whose reply cannot fit is skipped (said). ``--data plays`` takes the book's
conversations (``tinygpt.book.chat_model.conversations``: the plays wholly in the training
text). A checkpoint without the template (a character-level model of ``tinygpt train``) is
widened by the template's three tokens first (``tinygpt.chat.add_tokens``). Characters the
model does not know are mapped or dropped (``tinygpt.cli.fold``), said in one line.

The preference file (``--dpo``) is JSON Lines too, one pair a line::

    {"speaker": "HAMLET", "speech": "...", "replier": "HORATIO", "chosen": "...", "rejected": "..."}

and the model, already a chat model, is tuned by DPO (``tinygpt.dpo.train_dpo``) against a frozen
copy of itself. ``--lora-rank R`` trains a LoRA change of rank R (``tinygpt.lora``) merged into
the weights before saving; without it every weight is trained.

Safety is ``tinygpt train``'s: ``--out`` is checked before any work (``check_out_dir``: never a
user's file, a non-empty folder or an existing checkpoint without ``--overwrite``), held locked
for the run (``claim``), and the checkpoint is written atomically (``save_checkpoint``); a
progress bar shows the loss and the time left. The run is saved every ``--save-every`` steps;
an interrupted one continues with the same command and ``--resume``, to the weights an
uninterrupted run ends with (``tinygpt.cli.finetune_run``): the same checkpoint, examples and
options are checked, and a difference is refused naming it.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import sys
import time
from pathlib import Path
from typing import Any

from tinygpt.cli import preflight

EPILOG = """\
examples:
  tinygpt finetune out/base --data plays --out out/chat --max-iters 300
  tinygpt finetune out/base --data talks.jsonl --out out/chat --lora-rank 8
  tinygpt finetune out/chat --dpo pairs.jsonl --out out/chat-dpo --beta 0.1
  tinygpt finetune out/base --data plays --out out/chat --max-iters 300 --resume   (after ^C)
"""


def add_finetune(commands: Any, add_option: Any) -> None:
    """Add the ``finetune`` command to the ``tinygpt`` parser's ``commands``."""
    parser = commands.add_parser(
        "finetune", help="fine-tune a checkpoint to chat (SFT) or to a preference (--dpo)",
        description="Fine-tune a checkpoint on conversations (JSON Lines of turns, or the "
        "plays') with the loss on the replies only, or with --dpo on preference pairs.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", metavar="CHECKPOINT", help="the checkpoint to start from")
    add_option(parser, "--data", "conversations: a JSON Lines file of {\"turns\": [{\"speaker\", "
               "\"text\"}, ...]}, or 'plays' for the book's", metavar="FILE|plays")
    add_option(parser, "--dpo", "preference pairs: a JSON Lines file of {\"speaker\", "
               "\"speech\", \"replier\", \"chosen\", \"rejected\"} (instead of --data)",
               metavar="PAIRS")
    add_option(parser, "--out", "the folder of the fine-tuned checkpoint", required=True,
               metavar="DIR")
    add_option(parser, "--overwrite", "replace a checkpoint in --out (files tinygpt did not "
               "write are never touched)", action="store_true")
    add_option(parser, "--resume", "continue the interrupted run in --out (give the same "
               "CHECKPOINT, data and options)", action="store_true")
    add_option(parser, "--save-every", "save the run every this many steps, to --resume it",
               type=int, default=50, metavar="INT")
    add_option(parser, "--lora-rank", "train a LoRA change of this rank instead of every weight",
               type=int, metavar="R")
    add_option(parser, "--max-iters", "optimizer steps", type=int, default=300, metavar="INT")
    add_option(parser, "--batch-size", "conversations (or pairs) a step", type=int, default=32,
               metavar="INT")
    add_option(parser, "--lr", "the peak learning rate (default: 1e-3, 1e-4 with --dpo)",
               type=float, shown="1e-3 or 1e-4", metavar="FLOAT")
    add_option(parser, "--beta", "DPO's beta (--dpo only)", type=float, default=0.1,
               metavar="FLOAT")
    add_option(parser, "--seed", "seeds the batches", type=int, default=0, metavar="INT")
    add_option(parser, "--quiet", "no progress bar", action="store_true")
    parser.set_defaults(run=run_finetune)


def read_jsonl(path: str, what: str) -> list[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` of each non-blank line of the JSON Lines file ``path``."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise ValueError(f"{what} {path}: no such file ({file.absolute()})")
    found = []
    try:
        lines = file.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as err:
        raise ValueError(f"{what} {path}: not UTF-8 text ({err.reason} at byte {err.start})"
                         ) from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path} line {number}: not JSON ({err.msg})") from None
        if not isinstance(value, dict):
            raise ValueError(f"{path} line {number}: a JSON object is expected")
        found.append((number, value))
    if not found:
        raise ValueError(f"{what} {path} holds no lines")
    return found


def text_field(value: dict[str, Any], key: str, where: str) -> str:
    got = value.get(key)
    if not isinstance(got, str) or not got.strip():
        raise ValueError(f"{where}: \"{key}\" must be a non-empty string")
    return got


def read_conversations(path: str) -> list[Any]:
    """The conversations of a turns file: each two consecutive turns by two speakers."""
    from tinygpt.chat import Conversation, check_name

    found = []
    for number, value in read_jsonl(path, "--data"):
        turns = value.get("turns")
        where = f"{path} line {number}"
        if not isinstance(turns, list) or len(turns) < 2:
            raise ValueError(f"{where}: \"turns\" must be a list of at least two "
                             "{\"speaker\", \"text\"} objects")
        said = []
        for i, turn in enumerate(turns):
            if not isinstance(turn, dict):
                raise ValueError(f"{where}: turn {i + 1} is not an object")
            speaker = text_field(turn, "speaker", f"{where}, turn {i + 1}")
            try:
                check_name(speaker, "speaker")
            except ValueError as err:
                raise ValueError(f"{where}, turn {i + 1}: {err}") from None
            said.append((speaker, text_field(turn, "text", f"{where}, turn {i + 1}")))
        found += [Conversation(a, x, b, y) for (a, x), (b, y) in itertools.pairwise(said)
                  if a != b]
    return found


def read_pairs(path: str) -> list[Any]:
    """The preference pairs of a pairs file."""
    from tinygpt.chat import END, Conversation
    from tinygpt.dpo import Pair

    pairs = []
    for number, value in read_jsonl(path, "--dpo"):
        where = f"{path} line {number}"
        fields = [text_field(value, k, where) for k in
                  ("speaker", "speech", "replier", "chosen", "rejected")]
        longer = max(fields[3:], key=len)  # the reply that must fit the context
        pairs.append(Pair(Conversation(fields[0], fields[1], fields[2], longer), fields[3] + END,
                          fields[4] + END))
    return pairs


def fitted(conversations: list[Any], known: set[str], block_size: int) -> tuple[list[Any], str]:
    """The conversations in the model's characters (``tinygpt.cli.fold``), each speech cut to its
    last words so that the whole conversation fits in ``block_size + 1`` tokens; those whose
    reply cannot fit are left out. Returns them and a line saying what was changed."""
    import dataclasses

    from tinygpt.chat import last_words, render
    from tinygpt.cli.fold import fold

    kept, changed, skipped = [], 0, 0
    for c in conversations:
        parts = {}
        for key in ("speaker", "speech", "replier", "reply"):
            folded = fold(getattr(c, key), known)
            changed += len(folded.changes)
            parts[key] = folded.text
        c = dataclasses.replace(c, **parts)
        room = block_size + 1 - (len(render(dataclasses.replace(c, speech=""))))
        speech = last_words(c.speech, room) if room > 0 else ""
        if not speech.strip() or not c.reply.strip() or not c.speaker or not c.replier:
            skipped += 1
            continue
        kept.append(dataclasses.replace(c, speech=speech))
    said = []
    if changed:
        said.append(f"{changed} characters the model does not know were mapped or dropped")
    if skipped:
        said.append(f"{skipped} of {len(conversations)} conversations do not fit the context "
                    f"of {block_size} and are left out")
    return kept, "; ".join(said)


def run_finetune(args: argparse.Namespace, argv: list[str]) -> int:
    """``tinygpt finetune``: check, read, fine-tune (or resume), save, print a summary line."""
    import torch

    from tinygpt.checkpoint import load_checkpoint
    from tinygpt.checkpoint.folder import check_out_dir
    from tinygpt.cli import finetune_run as R
    from tinygpt.config import TrainConfig
    from tinygpt.lora import add_lora

    if (args.data is None) == (args.dpo is None):
        raise ValueError("give --data CONVERSATIONS (fine-tuning to chat) or --dpo PAIRS "
                         "(preference tuning), one of them")
    preflight.check_seed(args.seed)
    for flag, value in (("--max-iters", args.max_iters), ("--batch-size", args.batch_size),
                        ("--save-every", args.save_every)):
        if value < 1:
            raise ValueError(f"{flag} {value}: must be at least 1")
    out = check_out_dir(args.out, data=args.data or args.dpo, resume=args.resume,
                        overwrite=args.overwrite)
    if Path(args.checkpoint).expanduser().resolve() == out.resolve():
        raise ValueError(f"--out {args.out} is the checkpoint fine-tuned: write it to a folder "
                         "of its own")
    if args.resume and args.overwrite:
        raise ValueError("--resume continues the run in --out and --overwrite replaces it: "
                         "give one of them")
    interrupted = None
    if args.resume:
        interrupted = load_checkpoint(out)
        saved = R.interrupted_settings(interrupted, out)
    elif (out / "checkpoint.json").exists() and not args.overwrite:
        raise ValueError(f"--out {args.out} holds a checkpoint already: choose a new folder, "
                         "pass --overwrite to replace it, or --resume to continue an "
                         "interrupted fine-tuning there")
    start = load_checkpoint(args.checkpoint)
    model, tokenizer, examples, said = examples_for(args, start)
    lr = args.lr if args.lr is not None else 1e-4 if args.dpo else 1e-3
    config = TrainConfig(batch_size=args.batch_size, max_iters=args.max_iters,
                         learning_rate=lr, min_lr=lr / 10,
                         warmup_iters=min(30, max(args.max_iters // 10, 1)),
                         weight_decay=0.0, seed=args.seed, save_every=args.save_every)
    settings = {"mode": "dpo" if args.dpo else "sft", "lora_rank": args.lora_rank,
                "max_iters": args.max_iters, "batch_size": args.batch_size, "lr": lr,
                "beta": args.beta if args.dpo else None, "seed": args.seed,
                "start": R.start_sha256(start.model, start.tokenizer),  # a CharTokenizer
                "data": R.examples_sha256(examples)}
    if interrupted is not None:
        R.check_same_run(saved, settings, out, args.checkpoint, args.data or args.dpo)
    if said:  # once the run is known to go ahead
        print(f"tinygpt: note: {said}", file=sys.stderr)
    torch.manual_seed(args.seed)  # LoRA's A, and the dropout of SFT
    if args.lora_rank is not None:
        try:
            add_lora(model, args.lora_rank)
        except ValueError as err:
            raise ValueError(f"--lora-rank {args.lora_rank}: {err}") from None
    reference = copy.deepcopy(model).eval().requires_grad_(False) if args.dpo else None
    run = R.Run(model, tokenizer, config, settings)
    if interrupted is not None:
        run.resume(interrupted, out)
    if reference is not None:
        step = R.dpo_step(model, reference, tokenizer, examples, config, args.beta,
                          run.optimizer, run.generator)
    else:
        step = R.sft_step(model, tokenizer, examples, config, run.optimizer, run.generator)
    return tune(args, argv, run, step, out, start.history, examples)


def examples_for(args: argparse.Namespace, start: Any) -> tuple[Any, Any, list[Any], str]:
    """The model (widened to the chat template if it has none), its tokenizer, the examples fitted
    to it (``fitted``) and a line saying what fitting changed."""
    from tinygpt import chat, dpo
    from tinygpt.cli.fold import fold
    from tinygpt.tokenizer import CharTokenizer

    model, tokenizer = start.model, start.tokenizer
    if not isinstance(tokenizer, CharTokenizer):
        raise ValueError(f"the checkpoint in {args.checkpoint} has a "
                         f"{type(tokenizer).__name__}: the chat template's tokens are characters, "
                         "so fine-tuning takes a character-level checkpoint (tinygpt train "
                         "--tokenizer char)")
    if tokenizer.vocab_size != model.config.vocab_size:
        raise ValueError(f"the checkpoint in {args.checkpoint} pads its vocabulary "
                         f"({tokenizer.vocab_size} characters, {model.config.vocab_size} rows): "
                         "fine-tuning takes a model whose rows are its characters")
    if args.dpo is not None and not chat.has_chat_template(tokenizer):
        raise ValueError(f"--dpo tunes a chat model, and the checkpoint in {args.checkpoint} has "
                         "no chat template: fine-tune it with --data first")
    if not chat.has_chat_template(tokenizer):
        model = chat.add_tokens(model, len(chat.SPECIAL_TOKENS))
        tokenizer = chat.chat_tokenizer(tokenizer)
    known = set(tokenizer.chars) - set(chat.SPECIAL_TOKENS)
    T = model.config.block_size
    if args.dpo is None:
        raw = (read_plays() if args.data == "plays" else read_conversations(args.data))
        examples, said = fitted(raw, known, T)
        if not examples:
            raise ValueError(f"--data {args.data}: no conversation fits this model ({said})")
        return model, tokenizer, examples, said
    pairs = read_pairs(args.dpo)

    def folded(reply: str) -> str:  # a reply in the model's characters, its ■ kept
        return fold(reply.removesuffix(chat.END), known).text + chat.END

    examples = []
    for pair in pairs:  # one at a time: a pair that does not fit is left out
        talk = fitted([pair.conversation], known, T)[0]
        examples += [dpo.Pair(c, folded(pair.chosen), folded(pair.rejected)) for c in talk]
    said = "" if len(examples) == len(pairs) else (
        f"{len(pairs) - len(examples)} of {len(pairs)} pairs do not fit the context of {T} "
        "and are left out")
    if not examples:
        raise ValueError(f"--dpo {args.dpo}: no pair fits this model ({said})")
    return model, tokenizer, examples, said


def tune(args: argparse.Namespace, argv: list[str], run: Any, step: Any, out: Path,
         start_history: list[dict[str, Any]], examples: list[Any]) -> int:
    """Run the steps left under ``out``'s lock with a progress bar; save; say what was done (or,
    on Ctrl-C, which checkpoint is kept and how to continue)."""
    import shlex

    from tqdm.auto import tqdm

    from tinygpt import chat
    from tinygpt.checkpoint.folder import claim

    bar = tqdm(total=args.max_iters, initial=run.step, disable=args.quiet, unit="step")

    def progress(record: dict[str, float]) -> None:
        bar.update(1)
        bar.set_postfix(loss=f"{record['loss']:.4f}")

    began, first = time.perf_counter(), run.step
    try:
        with claim(out), bar:
            run.steps(step, out, args.save_every, progress)
            if args.dpo is not None:
                speaker, replier = chat.trained_names(start_history)  # the chat's names stay
                names = {"step": args.max_iters,
                         chat.NAMES_KEY: {"speaker": speaker, "replier": replier}}
            else:
                names = chat.names_record(examples, args.max_iters)
            run.save(out, [names])
    except KeyboardInterrupt:
        kept = ("no checkpoint was saved" if run.saved is None else
                f"the checkpoint of step {run.saved} in {out} is kept")
        again = shlex.join(["tinygpt", *argv] + ([] if args.resume else ["--resume"]))
        print(f"tinygpt: interrupted; {kept}; continue with: {again}", file=sys.stderr)
        return 130
    losses = [r["loss"] for r in run.history if "loss" in r]
    what = "preference pairs" if args.dpo else "conversations"
    print(f"tinygpt: fine-tuned {args.max_iters - first} steps"
          f"{f' (from step {first})' if first else ''} on {len(examples):,} {what} in "
          f"{time.perf_counter() - began:.1f} s: loss {losses[0]:.4f} -> {losses[-1]:.4f}; "
          f"checkpoint: {out}; try: tinygpt chat {out}")
    return 0


def read_plays() -> list[Any]:
    """The book's training conversations (the plays wholly in its training text)."""
    from tinygpt.book.chat_model import conversations

    return conversations()[0]
