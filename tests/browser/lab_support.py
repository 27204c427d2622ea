"""A JupyterLab server for the browser tests, over a temporary copy of some chapters.

The server listens on 127.0.0.1 (a free port, a random token); JupyterLab's own settings,
workspaces and runtime files go to the temporary folder, not to the user's ``~/.jupyter``; every
cell stays in the page (JupyterLab otherwise renders only the cells near the view). The server is
shut down through its API at the end.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from browser_support import REPO

START_TIMEOUT_S = 60


@dataclass
class Lab:
    url: str
    token: str
    root: Path
    process: subprocess.Popen
    log: Path

    def api(self, path: str, method: str = "GET") -> object:
        request = urllib.request.Request(
            f"{self.url}{path}", method=method, headers={"Authorization": f"token {self.token}"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            body = response.read()
        return json.loads(body) if body else None

    def kernel_states(self) -> list[str]:
        return [session["kernel"]["execution_state"] for session in self.api("/api/sessions")]

    def output(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")[-4000:]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def lab_server(tmp_path: Path, notebooks: list[str]) -> Iterator[Lab]:
    """A JupyterLab server whose root holds a copy of ``notebooks`` (paths in the repository)."""
    root = tmp_path / "book"
    for notebook in notebooks:
        (root / notebook).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / notebook, root / notebook)
    # Every cell stays in the page (JupyterLab otherwise renders only those near the view).
    settings = tmp_path / "lab" / "user-settings"
    tracker = settings / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings"
    tracker.parent.mkdir(parents=True)
    tracker.write_text(json.dumps({"windowingMode": "none"}), encoding="utf-8")
    # No "get notified about Jupyter news?" pop-up over the page (it would ask the network).
    news = settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    news.parent.mkdir(parents=True)
    news.write_text(json.dumps({"fetchNews": "false"}), encoding="utf-8")

    token, port = secrets.token_hex(16), free_port()
    command = [
        sys.executable, "-m", "jupyterlab",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        "--ServerApp.open_browser=False",
        f"--ServerApp.root_dir={root}",
        f"--LabApp.user_settings_dir={settings}",
        f"--LabApp.workspaces_dir={tmp_path / 'lab' / 'workspaces'}",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    ]  # fmt: skip
    if os.geteuid() == 0:
        command.append("--allow-root")
    env = dict(
        os.environ,
        JUPYTER_CONFIG_DIR=str(tmp_path / "jupyter" / "config"),
        JUPYTER_DATA_DIR=str(tmp_path / "jupyter" / "data"),
        JUPYTER_RUNTIME_DIR=str(tmp_path / "jupyter" / "runtime"),
        IPYTHONDIR=str(tmp_path / "ipython"),
    )
    log = tmp_path / "jupyterlab.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, cwd=root, env=env, stdin=subprocess.DEVNULL, stdout=out,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    server = Lab(f"http://127.0.0.1:{port}", token, root, process, log)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if process.poll() is not None:
                pytest.fail(f"JupyterLab exited with status {process.returncode}:\n"
                            f"{server.output()}")  # fmt: skip
            try:
                server.api("/api/status")
                break
            except (urllib.error.URLError, ConnectionError):
                if time.monotonic() > deadline:
                    pytest.fail(f"JupyterLab did not start in {START_TIMEOUT_S} s:\n"
                                f"{server.output()}")  # fmt: skip
                time.sleep(0.5)
        yield server
    finally:
        stop(server)


def stop(server: Lab) -> None:
    """Shut the server down through its API (it stops its kernels), or terminate it."""
    if server.process.poll() is None:
        try:
            server.api("/api/shutdown", method="POST")
            server.process.wait(timeout=30)
        except (urllib.error.URLError, ConnectionError, subprocess.TimeoutExpired):
            server.process.terminate()
            try:
                server.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.process.kill()
                server.process.wait()


