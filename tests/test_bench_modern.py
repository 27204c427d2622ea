"""benchmarks/modern.py (chapter 12's ablation) and speedrun.py's modern recipe: their helpers."""

from __future__ import annotations

import json
import sys
from dataclasses import fields
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import modern
import speedrun

from tinygpt.book.trained_model import BOOK_RECIPE
from tinygpt.config import GPTConfig


def differences(a, b) -> dict:
    return {f.name: getattr(b, f.name) for f in fields(a)
            if getattr(a, f.name) != getattr(b, f.name)}


def test_the_ablation_changes_one_thing_per_row_then_everything():
    rows = modern.variants(BOOK_RECIPE.model, BOOK_RECIPE.train)
    (name0, m0, t0), middle, (name_all, m_all, t_all) = rows[0], rows[1:-1], rows[-1]
    assert (name0, m0, t0) == (modern.BASELINE, BOOK_RECIPE.model, BOOK_RECIPE.train)
    assert len(middle) == len(modern.CHANGES) >= 6
    for (name, m, t), (change, m_changes, t_changes) in zip(middle, modern.CHANGES):
        assert name == f"+ {change}"
        assert differences(m0, m) == m_changes and differences(t0, t) == t_changes, name
        assert len(m_changes) + len(t_changes) == 1  # one change per row
    every_m = {k: v for _, m, _ in modern.CHANGES for k, v in m.items()}
    assert name_all == modern.ALL and differences(m0, m_all) == every_m
    assert differences(t0, t_all) == {"optimizer": "muon"}


def test_steps_to_target_is_the_first_check_at_or_below_it():
    curve = [[0, 4.2], [25, 2.5], [50, 2.1], [75, 2.2], [100, 1.9]]
    assert modern.steps_to_target(curve, 2.1) == 50  # at the target counts
    assert modern.steps_to_target(curve, 2.0) == 100  # the dip back up does not matter
    assert modern.steps_to_target(curve, 1.5) is None  # never reached


def configs_of(argv: list[str], monkeypatch) -> tuple:
    """The speedrun's (model, train) configurations that ``speedrun.main(argv)`` would train."""
    seen = {}
    parsed = []
    real_parse = speedrun.argparse.ArgumentParser.parse_args

    def capture(self, args=None, namespace=None):
        parsed.append(real_parse(self, args, namespace))
        return parsed[-1]

    def stop():
        seen["configs"] = speedrun.speedrun_configs(parsed[-1])
        raise SystemExit(0)

    with monkeypatch.context() as patch:  # undone on return: the next call patches afresh
        patch.setattr(speedrun.argparse.ArgumentParser, "parse_args", capture)
        patch.setattr(speedrun, "load_data", stop)
        with pytest.raises(SystemExit):
            speedrun.main(argv)
    return seen["configs"]


def test_modern_sets_the_speedrun_switches_and_options_still_override(monkeypatch):
    m, t = configs_of(["--modern", "--sr-activation", "swiglu", "--no-sr-qk-norm"], monkeypatch)
    assert (m.positional, m.norm, m.zero_init_proj, t.optimizer) == (
        "rope", "rmsnorm", True, "muon")
    assert (m.activation, m.qk_norm) == ("swiglu", False)  # the options given win
    m, t = configs_of([], monkeypatch)
    assert (m.positional, m.activation, m.norm, m.qk_norm, m.zero_init_proj, t.optimizer) == (
        "learned", "gelu", "layernorm", False, False, "adamw")  # without --modern: as before


def complete(time_ratio: float) -> dict:
    """A result with everything chapter 12 reads of a modern run."""
    return {**dict.fromkeys(speedrun.COMPLETE, 1.0), "time_ratio": time_ratio}


def test_each_modern_speedrun_is_appended_with_its_command(tmp_path):
    path = tmp_path / "results" / "speedrun_modern.json"
    speedrun.record_modern(complete(0.2), ["--modern"], path)
    done = speedrun.record_modern(complete(0.1), ["--modern", "--sr-seed", "1"], path)
    assert [r["result"]["time_ratio"] for r in done["runs"]] == [0.2, 0.1]
    assert json.loads(path.read_text()) == done
    assert done["runs"][1]["command"].endswith("speedrun.py --modern --sr-seed 1")
    assert "cores" in done["runs"][0]["machine"]


def test_an_incomplete_modern_run_is_never_recorded(tmp_path):
    path = tmp_path / "speedrun_modern.json"
    speedrun.record_modern(complete(0.2), ["--modern"], path)
    before = path.read_bytes()
    no_nanogpt = {**complete(0.2), "nanogpt_time_2000_s": None, "nanogpt_ms_per_iter": None}
    del no_nanogpt["time_ratio"]  # --skip-nanogpt: nothing to compare with
    with pytest.raises(ValueError, match="nanogpt_time_2000_s, time_ratio"):
        speedrun.record_modern(no_nanogpt, ["--modern", "--skip-nanogpt"], path)
    assert path.read_bytes() == before


def test_a_modern_run_appends_to_the_record_only_when_asked(monkeypatch, capsys):
    import torch

    recorded = []
    monkeypatch.setattr(speedrun, "record_modern", lambda *a, **k: recorded.append(a))
    monkeypatch.setattr(speedrun, "load_data", lambda: (torch.zeros(99, dtype=torch.long),
                                                        torch.zeros(99, dtype=torch.long), 65))
    monkeypatch.setattr(speedrun, "run_tinygpt", lambda *a, **k: {
        "iters": 2, "ms_per_iter": 1.0, "median_ms": 1.0, "val_loss": 1.0, "train_s": 0.1,
        "eval_s": 0.0, "checks": [], "stopped_early": False})
    argv = ["--skip-nanogpt", "--skip-tinygpt", "--skip-hf", "--modern", "--sr-iters", "2"]
    assert speedrun.main(argv) == 0  # the command of the issue: nothing recorded
    assert recorded == []
    for asked in (argv + ["--record"], ["--record", "--skip-hf"]):  # incomplete, or not modern
        with pytest.raises(SystemExit) as stop:
            speedrun.main(asked)
        assert stop.value.code == 2 and "--record" in capsys.readouterr().err
    assert recorded == []


def test_chapter_12_reads_only_complete_modern_runs():
    nb = json.loads((Path(__file__).resolve().parents[1] / "chapters" / "12_modern.ipynb")
                    .read_text(encoding="utf-8"))
    reader = next("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"
                  and "speedrun_modern.json" in "".join(c["source"]))
    runs = [{"result": complete(0.2)}, {"result": {**complete(0.1), "time_ratio": None}}]
    scope = {"json": json, "Path": lambda _: type("F", (), {
        "read_text": lambda self: json.dumps({"runs": runs})})()}
    exec(reader.split("ratios = []")[0], scope)  # the cell's lines that choose the runs
    assert scope["runs"] == runs[:1]


def test_the_ablation_replaces_only_its_own_result(tmp_path, capsys):
    other = tmp_path / "notes.json"
    other.write_text('{"mine": 1}')
    with pytest.raises(SystemExit) as stop:
        modern.main(["--out", str(other)])
    assert stop.value.code == 2 and "left alone" in capsys.readouterr().err
    assert other.read_text() == '{"mine": 1}'
    (tmp_path / "earlier.json").write_text('{"command": "python benchmarks/modern.py"}')
    assert modern.ours(tmp_path / "earlier.json") and modern.ours(tmp_path / "missing.json")
    (tmp_path / "text.json").write_text("not json")
    assert not modern.ours(tmp_path / "text.json")


def test_the_committed_record_is_written_only_when_asked():
    """It used to overwrite benchmarks/results/modern.json, which chapter 12 reads, by default."""
    assert modern.output(modern.parser().parse_args([])) is None
    assert modern.output(modern.parser().parse_args(["--record"])) == modern.RESULT
    assert modern.output(modern.parser().parse_args(["--out", "/tmp/m.json"])) == Path(
        "/tmp/m.json")
    with pytest.raises(SystemExit):
        modern.parser().parse_args(["--record", "--out", "/tmp/m.json"])


def test_the_tuned_speedrun_options_reach_the_configurations(monkeypatch):
    m, t = configs_of(["--modern", "--no-sr-tie-weights", "--sr-adamw-lr-scale", "3",
                       "--sr-beta1", "0.8"], monkeypatch)
    assert (m.tie_weights, t.adamw_lr_scale, t.beta1) == (False, 3.0, 0.8)
    m, t = configs_of(["--modern"], monkeypatch)
    assert (m.tie_weights, t.adamw_lr_scale, t.beta1) == (True, 1.0, 0.9)  # the baby GPT's


def ladder_configs(rung: int) -> tuple:
    """The speedrun's (model, train) configurations at rung ``rung`` of the levers ladder."""
    import speedrun_search

    options = speedrun_search.namespace(speedrun_search.BASE_SHAPE, 0, 0.0, 0)
    vars(options).update(speedrun_search.lever_options(rung))
    return speedrun.speedrun_configs(options)


def recorded_as(run: dict, model, train) -> bool:
    """Whether a run of speedrun_modern.json trained this model with these settings (older runs
    lack beta1 and adamw_lr_scale: they ran at the defaults)."""
    recipe = run["result"]["speedrun_recipe"]
    return (GPTConfig(**recipe["model"]) == model  # fields added since: their defaults
            and (recipe["lr"], recipe["max_iters"], recipe["warmup"], recipe["batch_size"],
                 recipe["beta2"], recipe["weight_decay"], recipe.get("beta1", 0.9),
                 recipe.get("adamw_lr_scale", 1.0))
            == (train.learning_rate, train.max_iters, train.warmup_iters, train.batch_size,
                train.beta2, train.weight_decay, train.beta1, train.adamw_lr_scale))


def test_the_levers_ladder_runs_from_the_recorded_modern_recipe_to_the_recorded_tuned_one():
    import speedrun_search

    runs = json.loads(speedrun.MODERN_RESULT.read_text())["runs"]
    first, last = ladder_configs(0), ladder_configs(len(speedrun_search.LEVERS) - 1)
    tied = [run for run in runs if run["result"]["speedrun_recipe"]["model"]["tie_weights"]]
    untied = [run for run in runs if run not in tied]
    assert tied and untied
    assert all(recorded_as(run, *first) for run in tied)  # rung 0: the modern recipe's runs
    assert all(recorded_as(run, *last) for run in untied)  # every change kept to the last rung
    assert not any(recorded_as(run, *first) for run in untied)
