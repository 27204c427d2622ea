"""The README's walk-through, replayed from the shell on a tiny model: prepare, train, eval,
finetune (chat), finetune --dpo (preference), chat. Each stage runs as a real ``tinygpt``
process and its output is checked: eval prints a finite loss, the chat model answers from a
pipe as the replier it was fine-tuned on."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def play_text() -> str:
    """A small text in the plays' format, from the example conversations: 20 documents."""
    speeches = []
    for line in (EXAMPLES / "conversations.jsonl").read_text().splitlines():
        for turn in json.loads(line)["turns"]:
            speeches.append(f"{turn['speaker']}:\n{turn['text']}\n")
    return "<|endoftext|>".join(["\n".join(speeches * 2)] * 20)


def tinygpt(*args: object, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-m", "tinygpt", *map(str, args)], input=stdin,
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, f"tinygpt {args[0]}: {out.stderr}"
    assert "Traceback" not in out.stderr
    return out


def test_the_whole_path_from_the_shell(tmp_path):
    text = tmp_path / "plays.txt"
    text.write_text(play_text())
    shards, base, chat, tuned = (tmp_path / n for n in ("shards", "base", "chat", "tuned"))
    tinygpt("prepare", text, "--tokenizer", "char", "--out", shards, "--quiet")
    assert (shards / "shards.json").is_file()
    trained = tinygpt("train", "--data", shards, "--out", base, "--max-iters", 20,
                      "--n-layer", 1, "--n-head", 2, "--n-embd", 32, "--block-size", 64,
                      "--eval-iters", 2, "--quiet")
    assert "trained to step 20" in trained.stdout
    held_out = tmp_path / "held-out.txt"
    held_out.write_text(text.read_text().split("<|endoftext|>")[0])
    scored = json.loads(tinygpt("eval", base, "--data", held_out, "--split", "all",
                                "--json").stdout)
    assert math.isfinite(scored["loss_nats_per_token"]) and scored["bits_per_character"] > 0
    sft = tinygpt("finetune", base, "--data", EXAMPLES / "conversations.jsonl", "--out", chat,
                  "--max-iters", 10, "--batch-size", 4, "--quiet")
    assert "fine-tuned 10 steps on 7 conversations" in sft.stdout  # 1 of 8 too long for 64
    assert "1 of 8 conversations do not fit the context of 64" in sft.stderr
    dpo = tinygpt("finetune", chat, "--dpo", EXAMPLES / "preferences.jsonl", "--out", tuned,
                  "--max-iters", 4, "--batch-size", 2, "--quiet")
    assert "fine-tuned 4 steps on 4 preference pairs" in dpo.stdout
    reply = tinygpt("chat", tuned, "--max-chars", 20, stdin="Good morrow, sweet.\n")
    assert reply.stdout.startswith("JULIET:\n") and len(reply.stdout) > len("JULIET:\n")
