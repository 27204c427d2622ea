"""The GitHub Actions workflow that tests and publishes the book (.github/workflows/book.yml).

A broken workflow is only noticed after a push; these checks catch the mistakes that matter
before: what triggers it, that it runs `make test` with the tools that needs, that it publishes
to GitHub Pages only from main and only after the tests passed, and with the least permissions.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

WORKFLOW = Path(__file__).resolve().parents[1] / ".github" / "workflows" / "book.yml"
ON_MAIN = "github.ref == 'refs/heads/main'"


@pytest.fixture(scope="module")
def workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))


def triggers(workflow: dict) -> dict:
    # YAML 1.1 reads the bare key `on` as the boolean True.
    on = workflow.get("on", workflow.get(True))
    assert isinstance(on, dict), f"`on:` should be a mapping of events, got {on!r}"
    return on


def steps(job: dict) -> list[dict]:
    return job.get("steps", [])


def uses(job: dict, action: str) -> list[dict]:
    """The steps of ``job`` that use ``action`` (``owner/name``, any version)."""
    return [step for step in steps(job) if step.get("uses", "").split("@")[0] == action]


def test_triggers(workflow: dict) -> None:
    on = triggers(workflow)
    assert on["push"]["branches"] == ["main"]
    assert "workflow_dispatch" in on
    (schedule,) = on["schedule"]
    fields = schedule["cron"].split()
    assert len(fields) == 5, schedule
    minute, hour, day_of_month, month, day_of_week = fields
    assert (day_of_month, month) == ("*", "*") and re.fullmatch(r"[0-6]", day_of_week), (
        f"not a weekly schedule: {schedule['cron']}"
    )
    assert minute.isdigit() and hour.isdigit()


def test_jobs(workflow: dict) -> None:
    assert set(workflow["jobs"]) == {"build", "deploy"}
    deploy = workflow["jobs"]["deploy"]
    needs = deploy["needs"]
    assert "build" in ([needs] if isinstance(needs, str) else needs)


def test_build_runs_make_test(workflow: dict) -> None:
    build = workflow["jobs"]["build"]
    assert uses(build, "actions/checkout")
    (python,) = uses(build, "actions/setup-python")
    assert str(python["with"]["python-version"]) == "3.11"
    assert uses(build, "actions/setup-node"), "npm is needed to fetch MathJax"
    runs = [step.get("run", "") for step in steps(build)]
    assert any(re.search(r"(^|\n)\s*make test\s*($|\n)", run) for run in runs)
    chromium = [i for i, run in enumerate(runs) if "chromium" in run]
    tests = [i for i, run in enumerate(runs) if "make test" in run]
    assert chromium and chromium[0] < tests[0], "Chromium must be installed before make test"
    # Nothing may turn CI off: under CI, skipped tests fail and every chapter is executed.
    env = {**workflow.get("env", {}), **build.get("env", {})}
    for step in steps(build):
        env.update(step.get("env", {}))
    assert str(env.get("CI", "true")).lower() not in ("", "0", "false", "no")


def test_pages_artifact_is_the_built_book(workflow: dict) -> None:
    build = workflow["jobs"]["build"]
    (upload,) = uses(build, "actions/upload-pages-artifact")
    assert upload["with"]["path"] == "_build/html"
    assert ON_MAIN in upload.get("if", "")
    assert steps(build).index(upload) > max(
        i for i, step in enumerate(steps(build)) if "make test" in step.get("run", "")
    )


def test_deploy_only_from_main(workflow: dict) -> None:
    deploy = workflow["jobs"]["deploy"]
    condition = deploy["if"]
    assert ON_MAIN in condition
    assert "github.event_name != 'pull_request'" in condition
    assert uses(deploy, "actions/deploy-pages")
    assert deploy["environment"]["name"] == "github-pages"
    assert "steps.deployment.outputs.page_url" in deploy["environment"]["url"]


def test_permissions(workflow: dict) -> None:
    assert workflow["permissions"] == {"contents": "read"}
    assert "permissions" not in workflow["jobs"]["build"]
    assert workflow["jobs"]["deploy"]["permissions"] == {"pages": "write", "id-token": "write"}


def test_actions_are_pinned_to_a_version(workflow: dict) -> None:
    for name, job in workflow["jobs"].items():
        for step in steps(job):
            if "uses" in step:
                assert re.fullmatch(r"[\w.-]+/[\w.-]+@v\d+", step["uses"]), f"{name}: {step}"
