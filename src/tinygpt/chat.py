"""From a model of plays to a model that replies: conversations, a chat template, and supervised
fine-tuning (SFT) with the loss on the reply only.

Chapter 15 builds it; ``tinygpt chat`` and ``tinygpt finetune`` use it from the shell.

A ``Conversation`` is two consecutive speeches of one play by two different speakers: the end of
the first (``speech``, by ``speaker``) and the whole of the second (``reply``, by ``replier``).
The *chat template* writes it with three special tokens, which the plays never contain::

    ▷HAMLET:
    Soft you now! The fair Ophelia!
    ▶OPHELIA:
    Good my lord, how does your honour?■

``▷`` opens the speech, ``▶`` the reply, ``■`` ends the reply's turn. The book's tokenizer is
one token per character, so each special token is one reserved character added to it
(``chat_tokenizer``); a text a user types may not contain them (``check_plain``). A checkpoint
stores a character tokenizer's characters, so the special tokens travel with it.

The model learns only what the reply says: the targets of every position whose next token is
part of the prompt (the speech, the speaker names, ``▶``) are ``IGNORE`` (``reply_targets``), and
``reply_loss`` is the cross-entropy over the others -- the reply's characters and its ``■``.

The conversations a model is measured on come from plays it never trained on
(``split_titles``): the plays that lie wholly in the book's validation text (the last 10% of
the complete plays), which the book's model did not see either. Plays that straddle the cut are
used for neither. The headings between scenes are not in the text, so a "reply" may be the
first speech of the next scene; such pairs are left in.

``ChatSession`` holds a conversation with a model turn after turn, its key/value cache kept
across turns (``tinygpt chat`` is built on it).
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeGuard

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tinygpt import data
from tinygpt.checks import check_instance, check_int
from tinygpt.config import TrainConfig
from tinygpt.model import GPT
from tinygpt.sample import generate
from tinygpt.shakespeare import Play
from tinygpt.tokenizer import CharTokenizer
from tinygpt.train import configure_optimizer, lr_at

SPEECH, REPLY, END = "\u25b7", "\u25b6", "\u25a0"  # ▷ ▶ ■
SPECIAL_TOKENS = (SPEECH, REPLY, END)
IGNORE = -100  # a target that adds nothing to the loss (F.cross_entropy's ignore_index)
MAX_NAME, MAX_SPEECH, MAX_REPLY = 14, 40, 48  # a whole conversation fits 128 + 1 characters


@dataclass(frozen=True)
class Conversation:
    """A speech's end by ``speaker``, then the whole ``reply`` by ``replier``; ``title``: the
    play (empty for one a user wrote)."""

    speaker: str
    speech: str
    replier: str
    reply: str
    title: str = ""


def check_plain(text: object, name: str) -> str:
    """``text`` if it is a str without the chat template's special tokens; a clear error
    otherwise."""
    check_instance(text, str, name)
    assert isinstance(text, str)
    found = next((c for c in text if c in SPECIAL_TOKENS), None)
    if found is not None:
        raise ValueError(f"{name} contains {found!r} (position {text.index(found)}), one of the "
                         f"chat template's special tokens {' '.join(SPECIAL_TOKENS)}, which only "
                         "the template may write")
    return text


def check_name(name: object, what: str) -> str:
    """A speaker's name: one line of text, without ':' or special tokens."""
    check_plain(name, what)
    assert isinstance(name, str)
    if not name.strip() or "\n" in name or ":" in name:
        raise ValueError(f"{what} must be a name on one line without ':', got {name!r}")
    return name


def speeches(play: Play) -> list[tuple[str, str]]:
    """``(speaker, speech)`` for each speech of ``play``, in order."""
    check_instance(play, Play, "play")
    found = []
    for paragraph in play.text.strip("\n").split("\n\n"):
        header, _, body = paragraph.partition("\n")
        if header.endswith(":") and body:
            found.append((header[:-1], body))
    return found


def last_words(text: str, limit: int) -> str:
    """The end of ``text`` in at most ``limit`` characters, starting at a word (after a space
    or a line break); empty if its last word alone is longer."""
    if len(text) <= limit:
        return text
    tail = text[len(text) - limit:]
    if text[len(text) - limit - 1] in " \n":  # the tail starts a word
        return tail
    cut = re.search(r"[ \n]", tail)
    return tail[cut.end():] if cut else ""


def conversations(plays: Iterable[Play], *, max_name: int = MAX_NAME,
                  max_speech: int = MAX_SPEECH, max_reply: int = MAX_REPLY) -> list[Conversation]:
    """Every pair of consecutive speeches by two speakers of one play whose reply is whole in
    ``max_reply`` characters and whose names have at most ``max_name``; the speech is cut to
    its last words in ``max_speech`` characters (skipped if none fit)."""
    for value, name in ((max_name, "max_name"), (max_speech, "max_speech"),
                        (max_reply, "max_reply")):
        check_int(value, name)
    found = []
    for play in plays:
        said = speeches(play)
        for (speaker, speech), (replier, reply) in itertools.pairwise(said):
            end = last_words(speech, max_speech)
            if (speaker != replier and len(reply) <= max_reply and end
                    and max(len(speaker), len(replier)) <= max_name):
                found.append(Conversation(speaker, end, replier, reply, play.title))
    return found


def split_titles(plays: Sequence[Play], val_fraction: float = 0.1) -> tuple[tuple[str, ...],
                                                                              tuple[str, ...]]:
    """The titles of the plays wholly in the training part and of those wholly in the
    validation part of the plays' text joined as ``tinygpt.shakespeare.shakespeare`` joins
    them, cut as ``tinygpt.data.split_train_val`` cuts it. A play across the cut is in neither."""
    total = sum(len(p.text) for p in plays) + max(len(plays) - 1, 0)
    train_chars = len(data.split_train_val(range(total), val_fraction)[0])
    train, held_out, start = [], [], 0
    for play in plays:
        end = start + len(play.text)
        if end <= train_chars:
            train.append(play.title)
        elif start >= train_chars:
            held_out.append(play.title)
        start = end + 1
    return tuple(train), tuple(held_out)


# --- the template ---------------------------------------------------------------------------

def prompt(speaker: str, speech: str, replier: str | None = None) -> str:
    """The template up to where the reply starts: ``▷SPEAKER:\\nspeech\\n▶`` and, if given,
    ``REPLIER:\\n`` (the model then answers as ``replier``; else it names the replier itself)."""
    check_name(speaker, "speaker")
    check_plain(speech, "speech")
    head = f"{SPEECH}{speaker}:\n{speech}\n{REPLY}"
    return head if replier is None else head + f"{check_name(replier, 'replier')}:\n"


def render(conversation: Conversation) -> str:
    """The whole conversation in the template: its prompt, the reply, ``■``."""
    check_instance(conversation, Conversation, "conversation")
    c = conversation
    return prompt(c.speaker, c.speech, c.replier) + check_plain(c.reply, "reply") + END


_TEMPLATE = re.compile(f"{SPEECH}([^:\n]+):\n(.*)\n{REPLY}([^:\n]+):\n(.*){END}", re.DOTALL)


def parse(text: str) -> Conversation:
    """The conversation that ``render`` wrote as ``text`` (without a title)."""
    check_instance(text, str, "text")
    match = _TEMPLATE.fullmatch(text)
    if match is None or any(c in SPECIAL_TOKENS for g in match.groups() for c in g):
        raise ValueError(f"not one conversation in the chat template "
                         f"({SPEECH}SPEAKER:\\nspeech\\n{REPLY}REPLIER:\\nreply{END}): "
                         f"{text[:60]!r}")
    return Conversation(*match.groups())


# --- the tokenizer and the model -------------------------------------------------------------

def chat_tokenizer(tokenizer: CharTokenizer) -> CharTokenizer:
    """``tokenizer`` with the special tokens after its characters (their ids are the new last
    ids, so every old character keeps its id)."""
    check_instance(tokenizer, CharTokenizer, "tokenizer")
    present = [c for c in SPECIAL_TOKENS if c in tokenizer.stoi]
    if present:
        raise ValueError(f"the tokenizer already holds {present[0]!r}: it has a chat template "
                         "already, or its text uses the template's characters")
    return CharTokenizer([*tokenizer.chars, *SPECIAL_TOKENS])


def has_chat_template(tokenizer: object) -> TypeGuard[CharTokenizer]:
    """Whether ``tokenizer`` is a character tokenizer holding the three special tokens."""
    return isinstance(tokenizer, CharTokenizer) and all(
        c in tokenizer.stoi for c in SPECIAL_TOKENS)


def add_tokens(model: GPT, count: int) -> GPT:
    """A copy of ``model`` whose vocabulary has ``count`` more tokens, with the last ids.

    The old rows of the token embedding and of the output head (one matrix when tied) are
    copied; each new row, in both, is the *mean of the old rows*. The head is linear, so the new
    token's logit is then the mean of the old tokens' logits, and since the mean of numbers is
    below their log-sum-exp by at least ln V, the new token starts with probability at most
    1/V: the model's predictions over the old tokens barely move, and the new token's embedding
    starts where the old ones are, not at a random point the blocks never saw. A random row at
    the initial scale would give a logit near 0, far above the trained model's typical logits
    for unlikely characters, or far below, by chance.
    """
    check_instance(model, GPT, "model")
    check_int(count, "count")
    config = model.config
    wider = dataclasses.replace(config, vocab_size=config.vocab_size + count)
    new = GPT(wider).to(model.lm_head.weight.device)
    state = model.state_dict()
    with torch.no_grad():
        for name, value in new.state_dict().items():
            old = state[name]
            if old.shape == value.shape:
                value.copy_(old)
            else:  # the embedding or the head: (V, C) -> (V + count, C)
                value[:config.vocab_size] = old
                value[config.vocab_size:] = old.mean(dim=0)
    return new.train(model.training)


# --- the loss on the reply only ---------------------------------------------------------------

def reply_targets(ids: Sequence[int], prompt_length: int) -> list[int]:
    """The next-token targets of ``ids`` (``ids[1:]``) with those that are still part of the
    prompt (its first ``prompt_length`` tokens) replaced by ``IGNORE``: position ``t``
    predicts ``ids[t + 1]``, so the first ``prompt_length - 1`` targets are ignored."""
    check_int(prompt_length, "prompt_length", 1, len(ids) - 1 if len(ids) > 1 else 1)
    if len(ids) < 2:
        raise ValueError(f"a conversation needs a prompt and at least one reply token, got "
                         f"{len(ids)} token(s)")
    return [IGNORE] * (prompt_length - 1) + list(ids[prompt_length:])


def batch(tokenizer: CharTokenizer, conversations: Sequence[Conversation],
          block_size: int) -> tuple[Tensor, Tensor]:
    """Inputs ``(B, T)`` and targets ``(B, T)`` of ``conversations`` in the template: each row
    is a conversation's tokens but the last, its targets ``reply_targets``; shorter rows are
    padded (inputs with ``■``, targets with ``IGNORE``). ``T`` is the longest row."""
    for c in conversations:
        render(c)  # checks each conversation
    return batch_replies(tokenizer, [prompt(c.speaker, c.speech, c.replier) for c in conversations],
                         [c.reply + END for c in conversations], block_size)


def batch_replies(tokenizer: CharTokenizer, prompts: Sequence[str], replies: Sequence[str],
                  block_size: int) -> tuple[Tensor, Tensor]:
    """``batch`` for texts as they are: each row is ``prompts[i] + replies[i]`` (a reply a model
    wrote, with its ``■`` if it wrote one), the targets of the reply's tokens kept."""
    if not prompts:
        raise ValueError("no conversations to batch")
    if len(prompts) != len(replies):
        raise ValueError(f"{len(prompts)} prompts but {len(replies)} replies")
    rows = []
    for head, reply in zip(prompts, replies):
        start, ids = len(tokenizer.encode(head)), tokenizer.encode(head + reply)
        if len(ids) - 1 > block_size:
            raise ValueError(f"the conversation {(head + reply)[:40]!r}... is {len(ids)} tokens; "
                             f"at most block_size + 1 = {block_size + 1} fit")
        rows.append((ids[:-1], reply_targets(ids, start)))
    T = max(len(x) for x, _ in rows)
    pad = tokenizer.stoi[END]
    inputs = torch.tensor([x + [pad] * (T - len(x)) for x, _ in rows])
    targets = torch.tensor([y + [IGNORE] * (T - len(y)) for _, y in rows])
    return inputs, targets


def reply_loss(model: nn.Module, inputs: Tensor, targets: Tensor) -> Tensor:
    """The mean cross-entropy over the targets that are not ``IGNORE``: the reply's tokens."""
    logits = model(inputs)  # (B, T, V)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE)


@torch.no_grad()
def mean_reply_loss(model: GPT, tokenizer: CharTokenizer, conversations: Sequence[Conversation],
                    batch_size: int = 256, *, end: bool = True) -> float:
    """The loss per reply token (nats), over every reply token of ``conversations``: the
    reply's characters and its ``■`` (only the characters with ``end=False``)."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    try:
        for i in range(0, len(conversations), batch_size):
            inputs, targets = batch(tokenizer, conversations[i:i + batch_size],
                                    model.config.block_size)
            if not end:  # a reply's text holds no ■: the only ■ targets end the replies
                targets[targets == tokenizer.stoi[END]] = IGNORE
            logits = model(inputs)
            total += F.cross_entropy(logits.flatten(0, 1), targets.flatten(),
                                     ignore_index=IGNORE, reduction="sum").item()
            count += int((targets != IGNORE).sum())
    finally:
        model.train(was_training)
    return total / count


Progress = Callable[[dict[str, float]], object]  # given each step's record: a progress bar


def ignore(record: dict[str, float]) -> None:
    """The ``callback`` that does nothing."""


def fine_tune(model: GPT, tokenizer: CharTokenizer, conversations: Sequence[Conversation],
              config: TrainConfig, *, held_out: Sequence[Conversation] = (),
              eval_every: int = 50, callback: Progress = ignore) -> list[dict[str, float]]:
    """Supervised fine-tuning: ``config.max_iters`` AdamW steps (``lr_at``'s schedule) of
    ``reply_loss`` on batches of ``config.batch_size`` conversations drawn at random (seeded
    by ``config.seed``). Returns one record per step (``step``, ``lr``, ``loss``), with
    ``held_out_loss`` (``mean_reply_loss``) every ``eval_every`` steps, at the first and after
    the last. ``callback`` is given each step's record (a progress bar)."""
    check_instance(model, GPT, "model")
    if not has_chat_template(tokenizer):
        raise ValueError("the tokenizer has no chat template: make it with chat_tokenizer")
    if tokenizer.vocab_size != model.config.vocab_size:
        raise ValueError(f"the tokenizer has {tokenizer.vocab_size} tokens but the model "
                         f"{model.config.vocab_size}: widen the model with add_tokens")
    if not conversations:
        raise ValueError("no conversations to fine-tune on")
    check_int(eval_every, "eval_every")
    generator = torch.Generator().manual_seed(config.seed)
    optimizer = configure_optimizer(model, config)
    history: list[dict[str, float]] = []
    model.train()
    for step in range(config.max_iters):
        record: dict[str, float] = {"step": step}
        if held_out and step % eval_every == 0:
            record["held_out_loss"] = mean_reply_loss(model, tokenizer, held_out)
        lr = lr_at(step, config)
        for group in optimizer.param_groups:
            group["lr"] = lr
        chosen = torch.randint(len(conversations), (config.batch_size,), generator=generator)
        inputs, targets = batch(tokenizer, [conversations[i] for i in chosen.tolist()],
                                model.config.block_size)
        loss = reply_loss(model, inputs, targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if config.grad_clip > 0:
            nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        record.update(lr=lr, loss=loss.item())
        history.append(record)
        callback(record)
    if held_out:
        history.append({"step": config.max_iters,
                        "held_out_loss": mean_reply_loss(model, tokenizer, held_out)})
    return history


# --- replies and what they do -----------------------------------------------------------------

def sample_replies(model: GPT, tokenizer: CharTokenizer, conversations: Sequence[Conversation],
                   *, max_chars: int = 64, temperature: float = 0.8,
                   seed: int = 0) -> list[str]:
    """The reply the model writes to each conversation's prompt (``replier`` given), up to and
    including ``■``, or its first ``max_chars`` characters if it writes none. Prompts of one
    length are sampled together; the generator is seeded with ``seed``."""
    if not has_chat_template(tokenizer):
        raise ValueError("the tokenizer has no chat template: make it with chat_tokenizer")
    check_int(max_chars, "max_chars")
    generator = torch.Generator().manual_seed(seed)
    prompts = [tokenizer.encode(prompt(c.speaker, c.speech, c.replier)) for c in conversations]
    replies: list[str] = [""] * len(prompts)
    end = tokenizer.stoi[END]
    for length in sorted({len(p) for p in prompts}):
        rows = [i for i, p in enumerate(prompts) if len(p) == length]
        out = generate(model, torch.tensor([prompts[i] for i in rows]), max_chars, temperature,
                       generator=generator, stop=end)
        for i, ids in zip(rows, out[:, length:].tolist()):
            if end in ids:
                ids = ids[:ids.index(end) + 1]
            replies[i] = tokenizer.decode(ids)
    return replies


def ends_turn(reply: str) -> bool:
    """Whether the reply ends its turn with ``■``."""
    return reply.endswith(END)


def stays_in_role(reply: str) -> bool:
    """Whether the reply is one speech by the requested speaker: it starts no other speech --
    no blank line (in the plays' text a blank line ends a speech and a new speaker's name
    follows) and no ``▷`` or ``▶``."""
    body = reply.removesuffix(END)
    return "\n\n" not in body and SPEECH not in body and REPLY not in body


def describe(replies: Sequence[str]) -> dict[str, float]:
    """The fraction of ``replies`` that end their turn and that stay in role, and their mean
    length in characters (without ``■``)."""
    n = len(replies)
    if n == 0:
        raise ValueError("no replies to describe")
    return {"ends_turn": sum(map(ends_turn, replies)) / n,
            "stays_in_role": sum(map(stays_in_role, replies)) / n,
            "mean_chars": sum(len(r.removesuffix(END)) for r in replies) / n}



# --- a conversation with a model, turn after turn ---------------------------------------------

# The names ``ChatSession`` (and ``tinygpt chat``) use when none is given: the pair the book's
# chat model was fine-tuned on most often with a replier it learned to answer as (56 of its
# 10,083 training conversations are HAMLET's speeches answered by HORATIO). The replier's name
# is always written by the program, never sampled: fine-tuning masks it, so a model never
# learns to write it.
DEFAULT_SPEAKER, DEFAULT_REPLIER = "HAMLET", "HORATIO"


class ChatSession:
    """Talk with a chat model: each ``reply(speech)`` adds ``▷SPEAKER:\\nspeech\\n▶REPLIER:\\n``
    to the conversation so far and samples the reply until ``■``, ``max_chars`` characters or
    the end of the context.

    The template is the program's: the replier's name is written into the prompt (the model
    was trained with it there and never learned to write it), and while a reply is sampled the
    model cannot write ``▷`` or ``▶`` (their logits are -inf), nor a blank line (which starts
    another speaker's speech in the plays' text), nor a token past the tokenizer's (a padded
    vocabulary): only ``■`` ends its turn, and it opens none.

    A speech is cut to its last words so that its turn's prompt leaves ``reserve`` tokens
    (default ``MAX_REPLY`` or half the context) for the reply (``fit``; ``reply`` records the
    characters cut in ``cut``); the reply stops where the context ends (``stop`` says why it
    stopped: ``"end"``, ``"max_chars"`` or ``"context"``). With ``use_cache`` the keys and
    values of every token already read stay in the model's ``KVCache`` across turns: a new turn
    reads only its own tokens. When a turn would not fit after the earlier ones, the oldest
    turns are dropped (the context restarts at a later ``▷``) and the cache is rebuilt. Without
    the cache every token reads the whole context again: the same replies, slower. The session
    runs on the model's device (its random generator too). ``clear()`` forgets the
    conversation."""

    def __init__(self, model: GPT, tokenizer: CharTokenizer, *, speaker: str = DEFAULT_SPEAKER,
                 replier: str = DEFAULT_REPLIER, temperature: float = 0.8,
                 top_k: int | None = None, top_p: float | None = None, max_chars: int = 200,
                 seed: int = 0, use_cache: bool = True, reserve: int | None = None) -> None:
        from tinygpt.sample import check_sampling

        check_instance(model, GPT, "model")
        if not has_chat_template(tokenizer):
            raise ValueError("the tokenizer has no chat template (its characters do not include "
                             f"{' '.join(SPECIAL_TOKENS)}): the model was not fine-tuned to chat")
        if tokenizer.vocab_size > model.config.vocab_size:
            raise ValueError(f"the tokenizer has {tokenizer.vocab_size} tokens but the model "
                             f"only {model.config.vocab_size} rows of embedding: they were not "
                             "saved together")
        self.model, self.tokenizer, self.use_cache = model.eval(), tokenizer, use_cache
        self.speaker = self.check_speaker(speaker, "speaker")
        self.replier = self.check_speaker(replier, "replier")
        self.temperature = check_sampling(temperature=temperature, top_k=top_k, top_p=top_p,
                                          vocab_size=tokenizer.vocab_size)
        self.top_k, self.top_p = top_k, top_p
        self.max_chars = check_int(max_chars, "max_chars")
        T = model.config.block_size
        self.reserve = min(MAX_REPLY, T // 2) if reserve is None else check_int(
            reserve, "reserve", 1, T - 1)
        self.device = model.lm_head.weight.device  # the session runs where the model is
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        # the logits a reply may never take: ▷ and ▶, and the rows of a padded vocabulary
        banned = torch.zeros(model.config.vocab_size, dtype=torch.bool)
        banned[[tokenizer.stoi[SPEECH], tokenizer.stoi[REPLY]]] = True
        banned[tokenizer.vocab_size:] = True
        self.banned = banned.to(self.device)
        self.newline = tokenizer.stoi.get("\n")
        self.cut, self.stop = 0, ""
        self.caches = model.new_caches(1) if use_cache else None
        self.clear()

    def check_speaker(self, name: object, what: str) -> str:
        """``name`` if it is a speaker's name (``check_name``) in the model's characters, whose
        turn's prompt leaves room in the context for a speech and a reply."""
        check_name(name, what)
        assert isinstance(name, str)
        unknown = next((c for c in name if c not in self.tokenizer.stoi), None)
        if unknown is not None:
            raise ValueError(f"{what} {name!r}: {unknown!r} (character {name.index(unknown) + 1}) "
                             "is not a character this model knows")
        if len(name) > self.model.config.block_size // 4:
            raise ValueError(f"{what} {name!r} is {len(name)} characters; this model's context "
                             f"of {self.model.config.block_size} takes names of at most "
                             f"{self.model.config.block_size // 4}")
        return name

    @property
    def room(self) -> int:
        """The most characters of a speech that one turn can hold."""
        head = len(prompt(self.speaker, "", self.replier))
        return max(self.model.config.block_size - self.reserve - head, 1)

    def fit(self, speech: str) -> str:
        """The end of ``speech`` that fits in a turn (``room``): its last words, or its last
        characters if its last word alone is longer."""
        if len(speech) <= self.room:
            return speech
        return last_words(speech, self.room) or speech[len(speech) - self.room:]

    def clear(self) -> None:
        """Forget the conversation: the next turn starts a new one."""
        self.ids: list[int] = []  # the context: the conversation's latest tokens
        self.fed = 0  # tokens of ``ids`` whose keys and values are in the caches
        for cache in self.caches or []:
            cache.reset()

    def _crop(self, keep: int) -> None:
        """Keep the last ``keep`` tokens of the context, from a ``▷`` if one is there."""
        if len(self.ids) <= keep:
            return
        tail = self.ids[len(self.ids) - keep:]
        opening = self.tokenizer.stoi[SPEECH]
        if opening in tail:
            tail = tail[tail.index(opening):]
        self.ids, self.fed = tail, 0
        for cache in self.caches or []:
            cache.reset()

    def stopped(self) -> None:
        """Close a reply that was interrupted (Ctrl-C) and rebuild the cache, which the
        interruption may have left half-extended."""
        end = self.tokenizer.stoi[END]
        if self.ids and self.ids[-1] != end:
            self.ids.append(end)
        self.fed = 0
        for cache in self.caches or []:
            cache.reset()

    def _next_token(self) -> int:
        from tinygpt.sample import sample_next

        if self.caches is None:
            logits = self.model(torch.tensor([self.ids], device=self.device), last_only=True)
        else:
            logits = self.model(torch.tensor([self.ids[self.fed:]], device=self.device),
                                caches=self.caches, last_only=True)
            self.fed = len(self.ids)
        banned = self.banned
        if self.newline is not None and self.ids[-1] == self.newline:
            banned = banned.clone()  # no blank line (the replier's name ends with a line break)
            banned[self.newline] = True
        logits = logits[:, -1, :].masked_fill(banned, float("-inf"))  # (1, V)
        token = sample_next(logits, self.temperature, self.top_k, self.top_p, self.generator)
        return int(token.item())

    @torch.no_grad()
    def reply(self, speech: str, on_text: Callable[[str], object] | None = None) -> str:
        """The model's reply to ``speech`` (said by ``speaker``): ``REPLIER:\\n`` and its text,
        without ``■``; ``on_text`` is given each piece of text as soon as it is sampled (the
        name first). A speech longer than a turn holds is cut (``fit``; ``cut`` says how many
        characters); one with a character the model does not know is refused, its position
        counted in ``speech``."""
        check_plain(speech, "speech")
        unknown = next((i for i, c in enumerate(speech) if c not in self.tokenizer.stoi), None)
        if unknown is not None:
            raise ValueError(f"the speech holds {speech[unknown]!r} (character {unknown + 1}), "
                             "which is not in the vocabulary of this model")
        kept = self.fit(speech)
        self.cut = len(speech) - len(kept)
        self.ids += self.tokenizer.encode(prompt(self.speaker, kept, self.replier))
        T = self.model.config.block_size
        self._crop(T - self.reserve)
        name = f"{self.replier}:\n"
        if on_text is not None:
            on_text(name)
        end, written = self.tokenizer.stoi[END], list[int]()
        self.stop = "context"
        while len(self.ids) < T:
            if len(written) == self.max_chars:
                self.stop = "max_chars"
                break
            token = self._next_token()
            self.ids.append(token)
            if token == end:
                self.stop = "end"
                break
            written.append(token)
            if on_text is not None:
                on_text(self.tokenizer.decode([token]))
        if self.stop != "end":
            self.ids.append(end)  # the turn is closed for the next one
        return name + self.tokenizer.decode(written)


NAMES_KEY = "chat_names"  # the history record of a fine-tuning: the names it trained most


def names_record(conversations: Sequence[Conversation], step: int) -> dict[str, object]:
    """The history record (``NAMES_KEY``) of the speaker and the replier of the conversations'
    most frequent pair: the names a chat with the model defaults to (``trained_names``)."""
    if not conversations:
        raise ValueError("no conversations to name")
    pairs: dict[tuple[str, str], int] = {}
    for c in conversations:
        pairs[c.speaker, c.replier] = pairs.get((c.speaker, c.replier), 0) + 1
    speaker, replier = max(pairs, key=lambda p: pairs[p])  # the first of the most frequent
    return {"step": step, NAMES_KEY: {"speaker": speaker, "replier": replier}}


def trained_names(history: object) -> tuple[str, str]:
    """``(speaker, replier)`` a checkpoint's history says it was fine-tuned on most (its last
    ``NAMES_KEY`` record), else ``(DEFAULT_SPEAKER, DEFAULT_REPLIER)``."""
    for record in reversed(history if isinstance(history, list) else []):
        names = record.get(NAMES_KEY) if isinstance(record, dict) else None
        if isinstance(names, dict) and all(isinstance(names.get(k), str)
                                           for k in ("speaker", "replier")):
            return names["speaker"], names["replier"]
    return DEFAULT_SPEAKER, DEFAULT_REPLIER
