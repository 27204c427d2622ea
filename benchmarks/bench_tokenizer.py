"""Benchmark of the BPE tokenizer of chapter 1: training time, encoding speed, memory.

What it measures, all in one run on one corpus (tinyshakespeare by default):

* training a byte-level BPE vocabulary: the fast trainer (``tinygpt.bpe.train_merges``
  via ``BPETokenizer.train``) against the textbook one (``train_merges_naive``) and
  against HF ``tokenizers``' BPE trainer (Rust, may use several threads);
* peak Python memory of the fast training (``tracemalloc``);
* encoding with GPT-2's tokenizer: tinygpt against tiktoken and HF ``tokenizers``, all
  built from the same ``vocab.json`` / ``merges.txt``, checking the ids agree;
* pathological text (``pathological``): encoding one character repeated and training on
  DNA-like text with no spaces, each against normal text of the same size, as a time ratio:
  near 1 means near-linear (pre-tokens longer than ``tinygpt.bpe.MAX_CHUNK`` bytes are cut
  into pieces of that size); a ratio that grows with ``--pathological-chars`` means quadratic.

What it does not do: extrapolate. With ``--quick`` or ``--naive-chars`` the naive trainer
runs on a prefix of the corpus, and it is compared with the fast one on that same prefix.

Usage: python benchmarks/bench_tokenizer.py [--vocab-size 512] [--corpus PATH] [--quick]
       python benchmarks/bench_tokenizer.py --pathological-only [--pathological-chars 1000000]
"""

from __future__ import annotations

import argparse
import json
import os
import time
import tracemalloc
from pathlib import Path

from tinygpt.bpe import GPT2_PATTERN, split_text, train_merges_naive
from tinygpt.data import DataNotFoundError, get_path
from tinygpt.gpt2 import load_tokenizer
from tinygpt.tokenizer import BPETokenizer


def data_path(name: str) -> Path:
    """A data file, found (or downloaded and verified) by tinygpt.data."""
    try:
        return get_path(name)
    except DataNotFoundError as error:
        raise SystemExit(f"{error}\n(or pass --corpus and --gpt2-dir)") from None


def timed(fn, repeat: int = 1):
    """(best wall time in seconds over ``repeat`` runs, result of the last run)."""
    best, result = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def hf_train(text: str, vocab_size: int) -> float:
    """Seconds HF tokenizers takes to train a byte-level BPE of ``vocab_size`` tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    seconds, _ = timed(lambda: tok.train_from_iterator([text], trainer=trainer), repeat=3)
    if tok.get_vocab_size() != vocab_size:
        print(f"  note: HF vocabulary has {tok.get_vocab_size()} tokens")
    return seconds


def naive_train(text: str, num_merges: int, pattern: str) -> tuple[float, list]:
    """Seconds (and merges) of the textbook trainer, pre-splitting included."""
    return timed(lambda: train_merges_naive(
        [c.encode("utf-8") for c in split_text(text, pattern)], num_merges))


def dna(n: int, seed: int = 0) -> str:
    """``n`` random letters A, C, G, T: text with no spaces or punctuation to pre-split on."""
    import random
    return "".join(random.Random(seed).choices("ACGT", k=n))


def pathological(text: str, n: int, vocab_size: int, gpt2: BPETokenizer) -> dict[str, float]:
    """Seconds and time ratios, pathological over normal text of ``n`` characters each:
    encoding ``"a" * n`` and DNA against the first ``n`` characters of ``text`` (GPT-2's
    tokenizer, empty cache), and training a ``vocab_size`` tokenizer on DNA against ``text``."""
    normal = (text * (n // max(len(text), 1) + 1))[:n]
    cases = {"normal": normal, "one repeated character": "a" * n, "DNA": dna(n)}
    encode = {}
    for name, sample in cases.items():
        fresh = BPETokenizer(gpt2.tokens, gpt2.merges, gpt2.pattern, gpt2.special_tokens)
        encode[name], ids = timed(lambda tok=fresh, s=sample: tok.encode_ordinary(s))
        assert gpt2.decode(ids) == sample
    fresh = BPETokenizer(gpt2.tokens, gpt2.merges, gpt2.pattern, gpt2.special_tokens)
    quarter, _ = timed(lambda: fresh.encode_ordinary("a" * (n // 4)))
    n_train = n // 2  # training is slower than encoding: half the characters
    train = {name: timed(lambda s=cases[name][:n_train]: BPETokenizer.train(
        s, vocab_size, pattern="gpt2"))[0] for name in ("normal", "DNA")}
    dna_quarter, _ = timed(lambda: BPETokenizer.train(cases["DNA"][:n_train // 4], vocab_size,
                                                      pattern="gpt2"))
    result = {f"encode {name} ({n:,} chars)": t for name, t in encode.items()}
    result.update({f"train {name} ({n_train:,} chars)": t for name, t in train.items()})
    result["encode ratio, one repeated character / normal"] = (
        encode["one repeated character"] / encode["normal"])
    result["encode ratio, DNA / normal"] = encode["DNA"] / encode["normal"]
    result["train ratio, DNA / normal"] = train["DNA"] / train["normal"]
    # linear: 4x the characters take 4x the time; quadratic: 16x
    result["encode one repeated character, time ratio 4x chars"] = (
        encode["one repeated character"] / quarter)
    result["train DNA, time ratio 4x chars"] = train["DNA"] / dna_quarter
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab-size", type=int, default=512)
    parser.add_argument("--corpus", type=Path, default=None, help="default: tinyshakespeare")
    parser.add_argument("--gpt2-dir", type=Path, default=None,
                        help="folder with GPT-2's vocab.json and merges.txt")
    parser.add_argument("--pattern", default="gpt2",
                        help="pre-split for training (gpt2 matches HF's ByteLevel)")
    parser.add_argument("--quick", action="store_true",
                        help="run the naive trainer on the first 100,000 characters only")
    parser.add_argument("--naive-chars", type=int, default=None,
                        help="run the naive trainer on this many first characters only")
    parser.add_argument("--pathological-chars", type=int, default=1_000_000,
                        help="size of the pathological texts (training uses half)")
    parser.add_argument("--pathological-only", action="store_true",
                        help="run only the pathological-text timings")
    args = parser.parse_args()

    if args.pathological_only:
        text = (args.corpus or data_path("tinyshakespeare")).read_text(encoding="utf-8")
        gpt2 = load_tokenizer(*(
            (args.gpt2_dir / "vocab.json", args.gpt2_dir / "merges.txt") if args.gpt2_dir
            else (data_path("gpt2/vocab.json"), data_path("gpt2/merges.txt"))))
        result = pathological(text, args.pathological_chars, args.vocab_size, gpt2)
        for key, value in result.items():
            print(f"{key:<48}  {value:8.3f}{'' if 'ratio' in key else ' s'}")
        print(json.dumps(result))
        return

    corpus = args.corpus or data_path("tinyshakespeare")
    text = corpus.read_text(encoding="utf-8")
    naive_chars = args.naive_chars or (100_000 if args.quick else len(text))
    naive_chars = min(naive_chars, len(text))
    num_merges = args.vocab_size - 256
    print(f"corpus {corpus} ({len(text):,} chars), vocab {args.vocab_size}, "
          f"pattern {args.pattern}, {os.cpu_count()} CPUs")
    rows: list[tuple[str, str]] = []

    # ------------------------------------------------------------ training
    t_fast, tok = timed(
        lambda: BPETokenizer.train(text, args.vocab_size, pattern=args.pattern), repeat=3)
    t_hf = hf_train(text, args.vocab_size)
    rows += [("train tinygpt (full corpus)", f"{t_fast:8.3f} s"),
             ("train HF tokenizers (full corpus)", f"{t_hf:8.3f} s")]
    prefix = text[:naive_chars]
    t_naive, naive_merges = naive_train(prefix, num_merges, args.pattern)
    if naive_chars < len(text):
        t_fast_prefix, small = timed(
            lambda: BPETokenizer.train(prefix, args.vocab_size, pattern=args.pattern), repeat=3)
        same = small.merges == naive_merges
    else:
        t_fast_prefix, same = t_fast, tok.merges == naive_merges
    rows += [(f"train naive ({naive_chars:,} chars)", f"{t_naive:8.3f} s"),
             (f"train tinygpt ({naive_chars:,} chars)", f"{t_fast_prefix:8.3f} s"),
             ("naive and fast merges identical", str(same))]

    tracemalloc.start()
    BPETokenizer.train(text, args.vocab_size, pattern=args.pattern)
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    rows.append(("train tinygpt peak memory (tracemalloc)", f"{peak:8.1f} MB"))

    # ------------------------------------------------------------ encoding
    gpt2_dir = args.gpt2_dir
    vocab = gpt2_dir / "vocab.json" if gpt2_dir else data_path("gpt2/vocab.json")
    merges = gpt2_dir / "merges.txt" if gpt2_dir else data_path("gpt2/merges.txt")
    gpt2 = load_tokenizer(vocab, merges)
    cold = []
    for _ in range(3):  # a fresh tokenizer each time: its chunk cache starts empty
        fresh = BPETokenizer(gpt2.tokens, gpt2.merges, gpt2.pattern, gpt2.special_tokens)
        seconds, ids = timed(lambda tok=fresh: tok.encode_ordinary(text))
        cold.append(seconds)
    t_cold = min(cold)
    t_warm, _ = timed(lambda: fresh.encode_ordinary(text), repeat=3)

    import tiktoken
    ranks = {t: i for i, t in enumerate(gpt2.tokens[:256 + len(gpt2.merges)])}
    enc = tiktoken.Encoding(name="gpt2-local", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                            special_tokens=gpt2.special_tokens)
    t_tik, tik_ids = timed(lambda: enc.encode_ordinary(text), repeat=3)

    from tokenizers import Tokenizer, models, pre_tokenizers
    hf = Tokenizer(models.BPE.from_file(str(vocab), str(merges)))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t_hfe, hf_enc = timed(lambda: hf.encode(text), repeat=3)

    n = len(ids)
    rows += [("encode tinygpt, empty cache", f"{n / t_cold / 1e6:8.2f} M tokens/s"),
             ("encode tinygpt, warm cache", f"{n / t_warm / 1e6:8.2f} M tokens/s"),
             ("encode tiktoken", f"{n / t_tik / 1e6:8.2f} M tokens/s"),
             ("encode HF tokenizers", f"{n / t_hfe / 1e6:8.2f} M tokens/s"),
             ("tokens in corpus (GPT-2)", f"{n:,}"),
             ("ids equal tiktoken / HF", f"{ids == tik_ids} / {ids == hf_enc.ids}")]

    width = max(len(k) for k, _ in rows)
    print()
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    print()
    print(f"tinygpt vs naive (same {naive_chars:,} chars): {t_naive / t_fast_prefix:.0f}x faster")
    print(f"tinygpt vs HF training: {t_fast / t_hf:.2f}x the time of HF")
    print(f"tinygpt vs tiktoken encoding (empty cache): {t_cold / t_tik:.1f}x the time of tiktoken")
    print(f"tinygpt vs HF encoding (empty cache): {t_cold / t_hfe:.1f}x the time of HF")
    patho = pathological(text, min(args.pathological_chars, len(text)), args.vocab_size, gpt2)
    for key, value in patho.items():
        print(f"{key:<48}  {value:8.3f}{'' if 'ratio' in key else ' s'}")
    print(json.dumps({**patho, "train_fast_s": t_fast, "train_hf_s": t_hf, "train_naive_s": t_naive,
                      "naive_chars": naive_chars, "peak_mb": peak,
                      "encode_tokens_per_s": n / t_cold}))


if __name__ == "__main__":
    main()
