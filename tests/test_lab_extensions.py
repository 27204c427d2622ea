"""JupyterLab and its MyST renderer are versions that agree.

jupyterlab-myst 2.7.0 is built against ``@jupyter/ydoc`` 3; JupyterLab 4.6 ships version 4, and
``jupyter labextension list`` then marks the extension ``X`` and prints "is not compatible with
the current JupyterLab". pyproject.toml pins versions that agree; this test asks JupyterLab.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("jupyterlab")
pytest.importorskip("jupyterlab_myst")


def test_jupyterlab_myst_is_enabled_with_no_conflict(tmp_path: Path):
    jupyter = Path(sys.executable).with_name("jupyter")
    command = [str(jupyter)] if jupyter.exists() else [shutil.which("jupyter") or "jupyter"]
    result = subprocess.run(
        [*command, "labextension", "list"],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": str(Path(sys.executable).parent), "HOME": str(tmp_path), "NO_COLOR": "1"},
    )
    report = re.sub(r"\x1b\[[0-9;]*m", "", result.stdout + result.stderr)
    assert result.returncode == 0, report
    line = next((x for x in report.splitlines() if "jupyterlab-myst" in x), None)
    assert line is not None, f"jupyterlab-myst is not installed:\n{report}"
    assert re.search(r"jupyterlab-myst v\S+ enabled +OK", line), line
    assert "not compatible" not in report and "Conflicting Dependencies" not in report, report
