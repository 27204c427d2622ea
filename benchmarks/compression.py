"""Standard compressors on the book's split: the compression rung beside the loss ladder.

Each compressor of ``tinygpt.book.ladder.COMPRESSORS`` (gzip -9, bzip2 -9, xz -6, PPMd var. H of
orders 3 and 8 with 256 MiB) is measured afresh on the book's validation split given its training
split, ``len(C(train + val)) - len(C(train))`` bytes of the UTF-8 text (PPMd order 8 also on the
validation text alone), in bits and nats per character of the validation text. These are byte
counts, the same on any machine and under any load; the seconds each took are recorded for
information only. The record is written to ``--out`` (atomically).

Usage: python benchmarks/compression.py [--out benchmarks/results/compression.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from importlib.metadata import version
from pathlib import Path

from tinygpt.book import ladder
from tinygpt.book.compression import code_length
from tinygpt.files.writing import write_atomically


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="benchmarks/results/compression.json")
    args = parser.parse_args()
    train_text, val_text = ladder.book_texts()
    record: dict = {"command": "python " + " ".join(sys.argv),
                    "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, Python "
                               f"{platform.python_version()}, pyppmd {version('pyppmd')}",
                    "load_at_start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
                    "method": "conditional code length: 8 * (len(C(train + val)) - len(C(train))) "
                              "bits, texts as UTF-8 bytes, per character of the validation text; "
                              "given_context false: 8 * len(C(val))",
                    "split": ladder.compression_recipe() | {"train_chars": len(train_text),
                                                            "val_chars": len(val_text)},
                    "rows": []}
    for rung in ladder.COMPRESSORS:
        start = time.perf_counter()
        measured = code_length(rung.compressor, val_text, train_text if rung.given_train else "")
        row = {"key": rung.key, **measured.to_json(), "seconds": time.perf_counter() - start}
        record["rows"].append(row)
        print(f"{rung.title:40s} {row['nats_per_char']:.4f} nats/char "
              f"{row['bits_per_char']:.4f} bits/char ({row['seconds']:.1f} s)", flush=True)
    write_atomically((json.dumps(record, indent=1) + "\n").encode("utf-8"), Path(args.out))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
