"""How fast the page's engine (book/_static/tinygpt/engine.js) runs the book's models in Chromium.

For the book's model, the modern book model and the chat model (``book_model(BOOK_RECIPE)``,
``MODERN_RECIPE``, ``chat_model()``: loaded from the results cache, trained first if missing, as
the book build does), it writes a page
with the built book's layout into a temporary folder (the engine, the panel and the model exported
by tinygpt.book.web_export), opens it from disk in headless Chromium (/usr/bin/chromium, network
blocked) and measures, in the page:

* ``load_s``: from adding the model's ``<script>`` to a loaded ``Model`` (parse, base64 decode,
  inflate and interleave the packed weights);
* ``first_char_s``: from the start of generation to the first character, the prompt fed;
* ``chars_per_s`` with the key/value cache (``--chars`` characters) and without it (a fifth as
  many: each step feeds the whole context);
* ``attention_s``: one pass over a full context (``block_size`` characters) with the attention
  weights kept, what the attention panel computes when the reader presses its button;
* ``page_bytes_file``: what a page opened from disk adds at most: every script of
  book/_static/tinygpt and the model's base64 ``.js``; ``page_bytes_served``: over http(s),
  the scripts and the model's ``.json`` and float32 ``.bin`` (models.js fetches those).

``--random`` uses random weights of the same shapes instead of the trained models (a smoke run:
the speed does not depend on the weights' values). Prints JSON; with ``--out FILE`` also writes
it there. Not a test: run it on a quiet machine, e.g.

    python benchmarks/web_engine.py --out benchmarks/results/web_engine.json
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import shutil
import sys
import tempfile
from pathlib import Path

import torch

from tinygpt.book.chat_model import chat_model
from tinygpt.book.trained_model import BOOK_RECIPE, MODERN_RECIPE, book_model
from tinygpt.book.web_export import export_model
from tinygpt.chat import SPECIAL_TOKENS
from tinygpt.model import GPT
from tinygpt.tokenizer import CharTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import cpu_description  # benchmarks/_machine.py

REPO = Path(__file__).resolve().parents[1]
STATIC = REPO / "book" / "_static" / "tinygpt"
CHROMIUM = "/usr/bin/chromium"
PROMPT = "ROMEO:\n"

MEASURE = """async ([name, n, prompt]) => {
  const t0 = performance.now();
  await new Promise((ok, fail) => {
    const s = document.createElement("script");
    s.src = "_static/models/" + name + ".js"; s.onload = ok; s.onerror = fail;
    document.head.appendChild(s);
  });
  const e = window.TINYGPT_MODELS[name];
  const m = tinygptEngine.loadModel(e.manifest, await tinygptEngine.unpackWeights(e));
  const load = (performance.now() - t0) / 1000;
  const run = (count, useCache) => {
    const ids = m.encode(prompt);
    const start = performance.now();
    let first = null, k = 0;
    for (const _ of tinygptEngine.generateTokens(m, ids, count,
                                               {temperature: 0.8, seed: 0, useCache})) {
      if (first === null) first = (performance.now() - start) / 1000;
      k++;
    }
    return [first, k / ((performance.now() - start) / 1000)];
  };
  const [first, cached] = run(n, true);
  const [, uncached] = run(Math.max(1, Math.floor(n / 5)), false);
  const full = Array.from({length: m.Tmax}, (_, i) => i % m.V);
  const t1 = performance.now();
  m.forward(full, null, {attention: true});
  return {load_s: load, first_char_s: first, chars_per_s_cached: cached,
          chars_per_s_uncached: uncached, attention_s: (performance.now() - t1) / 1000};
}"""


def models(random: bool):
    chat_config = dataclasses.replace(BOOK_RECIPE.model, vocab_size=BOOK_RECIPE.model.vocab_size
                                      + len(SPECIAL_TOKENS))
    for name, config in (("book", BOOK_RECIPE.model), ("modern", MODERN_RECIPE.model),
                         ("chat", chat_config)):
        if random:
            torch.manual_seed(0)
            chars = sorted(set(PROMPT) | {chr(c) for c in range(32, 127)})[:config.vocab_size]
            yield name, GPT(config).eval(), CharTokenizer(chars)
        else:
            run = (chat_model() if name == "chat" else
                   book_model(BOOK_RECIPE if name == "book" else MODERN_RECIPE, progress=False))
            yield name, run.model, run.tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chars", type=int, default=500, help="characters with the cache")
    parser.add_argument("--random", action="store_true", help="random weights (smoke run)")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    results: dict = {"command": "python benchmarks/web_engine.py " + " ".join(sys.argv[1:]),
                     "date": datetime.date.today().isoformat(),
                     "machine": f"{platform.machine()}, {cpu_description()}",
                     "load_1min_before": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as pw:
        root = Path(tmp)
        (root / "_static" / "tinygpt").mkdir(parents=True)
        for f in ("engine.js", "panel.js"):
            shutil.copy(STATIC / f, root / "_static" / "tinygpt" / f)
        (root / "page.html").write_text(
            '<!DOCTYPE html><meta charset="utf-8"><script src="_static/tinygpt/engine.js">'
            "</script>", encoding="utf-8")
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                     args=["--no-sandbox", "--disable-gpu"])
        results["browser"] = f"Chromium {browser.version}, headless, one page at a time"
        for name, model, tok in models(args.random):
            sizes = export_model(model, tok, root / "_static" / "models", name)
            page = browser.new_page()
            page.route("http*://**/*", lambda route: route.abort("blockedbyclient"))
            page.goto((root / "page.html").as_uri())
            got = page.evaluate(MEASURE, [name, args.chars, PROMPT])
            scripts = sum(f.stat().st_size for f in STATIC.glob("*.js"))
            got["page_bytes_file"] = scripts + sizes[f"{name}.js"]
            got["page_bytes_served"] = scripts + sizes[f"{name}.json"] + sizes[f"{name}.bin"]
            got["random_weights"] = args.random
            results[name] = got
            page.close()
        browser.close()
    results["load_1min_after"] = os.getloadavg()[0]
    text = json.dumps(results, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
