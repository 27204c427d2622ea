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


def test_modern_sets_the_speedrun_switches_and_options_still_override(monkeypatch):
    seen = {}

    def stop(args):
        seen["model"], seen["train"] = speedrun.speedrun_configs(args)
        raise SystemExit(0)

    monkeypatch.setattr(speedrun, "load_data", lambda: stop(parsed[0]))
    parsed = []
    real_parse = speedrun.argparse.ArgumentParser.parse_args

    def capture(self, argv=None, namespace=None):
        parsed.append(real_parse(self, argv, namespace))
        return parsed[-1]

    monkeypatch.setattr(speedrun.argparse.ArgumentParser, "parse_args", capture)
    with pytest.raises(SystemExit):
        speedrun.main(["--modern", "--sr-activation", "swiglu", "--no-sr-qk-norm"])
    m, t = seen["model"], seen["train"]
    assert (m.positional, m.norm, m.zero_init_proj, t.optimizer) == (
        "rope", "rmsnorm", True, "muon")
    assert (m.activation, m.qk_norm) == ("swiglu", False)  # the options given win
    parsed.clear()
    with pytest.raises(SystemExit):
        speedrun.main([])
    m, t = seen["model"], seen["train"]
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
