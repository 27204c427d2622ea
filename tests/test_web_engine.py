"""The page's engine (book/_static/tinygpt/engine.js, run in Node) against PyTorch and tinygpt.

Small random models of every kind the page serves (the book model's GPT-2 parts; the modern
model's RoPE, RMSNorm, ReLU^2, QK-norm and untied head; and the remaining switches: biases,
post-norm, sinusoidal positions, tanh-GELU, SwiGLU) are exported by tinygpt.book.web_export and
loaded by the engine from the same ``.js`` file the page loads. Checked: the logits of every
position agree with ``GPT.forward`` to 1e-4, fed at once or one position at a time through the
cache; greedy decoding of 300 characters (past the context, so with cropping) gives
``generate``'s tokens at temperature 0; seeded sampling gives ``generate(..., rng=PCG32(seed))``'s
tokens; the sampler alone gives ``choose_token``'s choice on many seeds and settings.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import re
import shutil
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

from tinygpt.book.web_export import export_model, pack_weights, unpack_weights
from tinygpt.config import GPTConfig
from tinygpt.model import GPT
from tinygpt.sample import PCG32, choose_token, generate
from tinygpt.tokenizer import CharTokenizer

DRIVER = Path(__file__).parent / "node" / "engine_driver.js"
NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="node (Node.js) is not installed")

CHARS = list("\n !',.:;?abcdeghilmnorstuwy")
BASE = dict(vocab_size=len(CHARS), block_size=16, n_layer=2, n_head=2, n_embd=16)
CONFIGS = {
    # the book model's parts (tinygpt.book.trained_model.BOOK_RECIPE)
    "book": GPTConfig(**BASE, bias=False, activation="gelu"),
    # the modern book model's (MODERN_RECIPE), zero_init_proj off: the weights are redrawn anyway
    "modern": GPTConfig(**BASE, bias=False, activation="relu2", positional="rope", qk_norm=True,
                        norm="rmsnorm", tie_weights=False),
    "gpt2_bias_tanh": GPTConfig(**BASE, activation="gelu_tanh"),
    "post_sinusoidal_swiglu": GPTConfig(**BASE, norm_position="post", positional="sinusoidal",
                                        activation="swiglu", mlp_hidden=24),
    "llama_relu": GPTConfig(**{**BASE, "n_layer": 1}, bias=False, norm="rmsnorm",
                            positional="rope", activation="relu"),
    # the modern parts with chapter 12's logit soft cap, small enough to bend these logits
    "softcapped_modern": GPTConfig(**BASE, bias=False, activation="relu2", positional="rope",
                                   qk_norm=True, norm="rmsnorm", tie_weights=False,
                                   logit_softcap=2.0),
}
TOL = 1e-4  # float32 weights; the engine sums in float64, PyTorch in float32


def random_model(config: GPTConfig, seed: int) -> GPT:
    """A GPT whose weights are redrawn with std 0.3 (norm gains about 1): peaked logits, so that
    decoding is not a string of near ties."""
    torch.manual_seed(seed)
    model = GPT(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 and "weight" in name:  # a norm's gain
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.3 * torch.randn_like(p))
    return model


def run_node(tmp_path: Path, cases: list[dict], model_js: Path | None = None,
             name: str = "") -> list:
    job = tmp_path / f"job-{len(list(tmp_path.iterdir()))}.json"
    job.write_text(json.dumps({"model_js": str(model_js) if model_js else None, "name": name,
                               "cases": cases}))
    done = subprocess.run([NODE, str(DRIVER), str(job)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def exported(request, tmp_path_factory):
    """(kind, model, path of its .js) for each kind of model, seeds 0 and 1 alternating."""
    kind = request.param
    model = random_model(CONFIGS[kind], seed=sorted(CONFIGS).index(kind))
    folder = tmp_path_factory.mktemp(f"models-{kind}")
    export_model(model, CharTokenizer(CHARS), folder, "m")
    return kind, model, folder / "m.js"


def test_pcg32_gives_the_reference_outputs(tmp_path):
    # pcg32-demo of PCG's reference C code (pcg32_srandom_r(&rng, 42u, 54u)), round 1
    expected = [0xA15C02B7, 0x7B47F409, 0xBA1D3330, 0x83D2F293, 0xBFA4784B, 0xCBED606E]
    rng = PCG32(42, 54)
    assert [rng.next() for _ in range(6)] == expected
    assert run_node(tmp_path, [{"kind": "pcg", "seed": 42, "n": 6}]) == [expected]


@pytest.mark.parametrize("cached", [False, True])
def test_logits_match_pytorch(exported, tmp_path, cached):
    kind, model, js = exported
    gen = torch.Generator().manual_seed(123)
    prompts = [torch.randint(0, model.config.vocab_size, (T,), generator=gen).tolist()
               for T in (1, 5, model.config.block_size)]
    got = run_node(tmp_path, [{"kind": "logits", "ids": p, "cached": cached} for p in prompts],
                   js, "m")
    for ids, logits in zip(prompts, got, strict=True):
        with torch.no_grad():
            want = model(torch.tensor([ids]))[0].double().numpy()  # (T, V)
        err = np.abs(np.array(logits) - want).max()
        assert err <= TOL, f"{kind}: logits differ by {err:.2e} for a prompt of {len(ids)}"
        assert np.abs(want).max() > 1.0  # the check is not on near-zero logits


def python_tokens(model: GPT, ids: list[int], n: int, use_cache: bool, **settings) -> list[int]:
    seed = settings.pop("seed", None)
    rng = None if seed is None else PCG32(seed)
    out = generate(model, torch.tensor([ids]), n, use_cache=use_cache, rng=rng, **settings)
    return out[0, len(ids):].tolist()


@pytest.mark.parametrize("use_cache", [True, False])
def test_greedy_300_characters_match_generate(exported, tmp_path, use_cache):
    kind, model, js = exported
    ids = [CHARS.index(c) for c in "to be or not"]
    want = python_tokens(model, ids, 300, use_cache, temperature=0.0)
    settings = {"temperature": 0, "useCache": use_cache}
    got = run_node(tmp_path, [{"kind": "generate", "ids": ids, "n": 300, "settings": settings}],
                   js, "m")[0]
    assert got == want, f"{kind}: first difference at token " + str(
        next(i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b))


SETTINGS = [dict(temperature=1.0, top_k=None, top_p=None), dict(temperature=0.8, top_k=5,
            top_p=None), dict(temperature=1.3, top_k=None, top_p=0.9),
            dict(temperature=0.7, top_k=10, top_p=0.8)]


def js_settings(s: dict, seed: int, use_cache: bool = True) -> dict:
    return {"temperature": s["temperature"], "topK": s["top_k"], "topP": s["top_p"],
            "seed": seed, "useCache": use_cache}


def test_seeded_generation_matches_the_portable_sampler(exported, tmp_path):
    kind, model, js = exported
    ids = [CHARS.index(c) for c in "\nwhat "]
    cases, want = [], []
    for i, s in enumerate(SETTINGS):
        for seed in (i, 1000 + i):
            want.append(python_tokens(model, ids, 120, True, seed=seed, **s))
            cases.append({"kind": "generate", "ids": ids, "n": 120,
                          "settings": js_settings(s, seed, use_cache=seed % 2 == 0)})
    got = run_node(tmp_path, cases, js, "m")
    assert got == want, kind
    assert len({tuple(w) for w in want}) == len(want)  # the seeds and settings matter


def test_sampler_matches_choose_token_on_many_seeds(tmp_path):
    rows = np.random.default_rng(0).normal(0.0, 2.0, size=(40, 30))
    rows[:, 5] = rows[:, 6]  # ties, which top-k and top-p must break the same way
    rows[3] = 1.0  # a row of equal logits
    cases, want = [], []
    for s in SETTINGS + [dict(temperature=0.0, top_k=None, top_p=None),
                         dict(temperature=1.0, top_k=1, top_p=None),
                         dict(temperature=2.0, top_k=None, top_p=0.05)]:
        for seed in range(25):
            rng = PCG32(seed)
            want.append([choose_token(r, s["temperature"], s["top_k"], s["top_p"], rng)
                         for r in rows.tolist()])
            cases.append({"kind": "sample", "rows": rows.tolist(), "seed": seed,
                          "settings": js_settings(s, seed)})
    assert run_node(tmp_path, cases) == want


def test_portable_sampler_follows_the_distribution():
    # 20,000 draws from softmax([0, 1, 2]): each frequency within 0.015 of its probability
    probs = torch.softmax(torch.tensor([0.0, 1.0, 2.0], dtype=torch.float64), 0).tolist()
    rng = PCG32(7)
    draws = [choose_token([0.0, 1.0, 2.0], 1.0, None, None, rng) for _ in range(20_000)]
    for token, p in enumerate(probs):
        assert abs(draws.count(token) / len(draws) - p) < 0.015
    rng = PCG32(8)  # top-p 0.6 keeps ids 2 and 1 (mass before id 1: 0.665 is not below 0.6)
    assert {choose_token([0.0, 1.0, 2.0], 1.0, None, 0.6, rng) for _ in range(200)} == {2}


def test_attention_weights_match_pytorch(tmp_path):
    model = random_model(CONFIGS["modern"], seed=3)
    folder = tmp_path / "models"
    export_model(model, CharTokenizer(CHARS), folder, "m")
    ids = [1, 5, 9, 2, 7, 3]
    got = run_node(tmp_path, [{"kind": "attention", "ids": ids}], folder / "m.js", "m")[0]
    x = model.transformer.embed.wte(torch.tensor([ids]))
    for layer, block in enumerate(model.transformer.h):
        with torch.no_grad():
            _, w = block.attn(block.ln_1(x), return_weights=True)  # (1, H, T, T)
            x = block(x)
        for t in range(len(ids)):
            for h in range(model.config.n_head):
                want = w[0, h, t, :t + 1].double().numpy()
                assert np.abs(np.array(got[t][layer][h]) - want).max() < 1e-5


def test_export_writes_the_weights_and_refuses_foreign_files(tmp_path):
    model = random_model(CONFIGS["book"], seed=0)
    sizes = export_model(model, CharTokenizer(CHARS), tmp_path, "book")
    manifest = json.loads((tmp_path / "book.json").read_text())
    blob = (tmp_path / "book.bin").read_bytes()
    assert sizes["book.bin"] == len(blob) == manifest["bytes"] == 4 * sum(
        p.numel() for p in model.parameters())  # tied: wte once
    assert manifest["chars"] == CHARS
    assert GPTConfig(**manifest["config"]) == model.config
    wpe = next(t for t in manifest["tensors"] if t["name"] == "transformer.embed.wpe.weight")
    got = np.frombuffer(blob, "<f4", count=int(np.prod(wpe["shape"])), offset=wpe["offset"])
    assert np.array_equal(got, model.transformer.embed.wpe.weight.detach().numpy().ravel())
    export_model(model, CharTokenizer(CHARS), tmp_path, "book")  # its own files: replaced
    (tmp_path / "other.js").write_text("console.log('a reader file')\n")
    with pytest.raises(FileExistsError, match=r"other\.js"):
        export_model(model, CharTokenizer(CHARS), tmp_path, "other")
    assert (tmp_path / "other.js").read_text() == "console.log('a reader file')\n"
    assert not (tmp_path / "other.bin").exists()
    with pytest.raises(ValueError, match="vocab_size is 43"):
        export_model(GPT(dataclasses.replace(CONFIGS["book"], vocab_size=43)),
                     CharTokenizer(CHARS), tmp_path, "x")


def test_the_model_script_holds_the_bin_packed_and_the_engine_unpacks_it(exported, tmp_path):
    """The .js a page opened from disk loads holds the .bin's bytes packed (byte planes,
    deflated, base64); Python's unpack_weights and the engine's unpackWeights (in Node, with
    its DecompressionStream) both give back exactly the .bin, whose SHA-256 the manifest
    holds."""
    _, _, script = exported
    text = script.read_text()
    packed = base64.b64decode(re.search(r'weights: "([A-Za-z0-9+/=]+)"', text).group(1))
    blob = script.with_suffix(".bin").read_bytes()
    assert '"shuffle4-deflate"' in text and unpack_weights(packed) == blob
    manifest = json.loads(script.with_suffix(".json").read_text())
    got = run_node(tmp_path, [{"kind": "weights_sha256"}], script, "m")[0]
    assert got == manifest["sha256"]


def test_packing_puts_each_byte_of_a_float_in_its_plane_and_refuses_a_partial_float():
    blob = bytes(range(8))  # two floats: bytes 0-3 and 4-7
    assert unpack_weights(pack_weights(blob)) == blob
    assert pack_weights(blob) != pack_weights(bytes([0, 4, 1, 5, 2, 6, 3, 7]))
    assert zlib.decompress(pack_weights(blob)) == bytes([0, 4, 1, 5, 2, 6, 3, 7])
    with pytest.raises(ValueError, match="multiple of 4, got 7"):
        pack_weights(blob[:7])


def test_generate_refuses_a_generator_and_an_rng_together():
    model = random_model(CONFIGS["book"], seed=0)
    with pytest.raises(ValueError, match="not both"):
        generate(model, torch.tensor([[1]]), 3, generator=torch.Generator(), rng=PCG32(0))
