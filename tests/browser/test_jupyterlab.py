"""Chapter 1 in JupyterLab, run the way a learner runs it.

A JupyterLab server is started on 127.0.0.1 (a free port, a random token) over a temporary copy
of the chapter, so that the committed notebook is never changed. Headless Chromium opens the
notebook, runs every cell from the menu (Run > Run All Cells), waits until the kernel is idle
and every code cell has its execution count, checks that no cell shows an error, then saves the
notebook and checks the saved file the same way. The server is then shut down through its API.

Chapter 1 needs GPT-2's tokenizer files: with no ``TINYGPT_DATA`` copy, no cached copy and no
network, the test is skipped (it fails under CI), like the unit tests that need them.
JupyterLab's own settings, workspaces and runtime files go to the temporary folder, not to the
user's ``~/.jupyter``.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from browser_support import SCREENSHOTS
from lab_support import START_TIMEOUT_S, Lab, lab_server

NOTEBOOK = "chapters/01_tokens.ipynb"
DATA_FILES = ("gpt2/vocab.json", "gpt2/merges.txt")
RUN_TIMEOUT_S = 180
ERROR_MIME = "application/vnd.jupyter.error"
STDERR_MIME = "application/vnd.jupyter.stderr"
EXECUTED = re.compile(r"^\[\d+\]:$")


@pytest.fixture
def lab(tmp_path: Path, data_path) -> Iterator[Lab]:
    for name in DATA_FILES:
        data_path(name)  # skip (or fail under CI) when the chapter's data cannot be had
    with lab_server(tmp_path, [NOTEBOOK]) as server:
        yield server


def tagged_to_raise(notebook: dict) -> list[bool]:
    """For each cell: whether it carries the ``raises-exception`` tag (its error is expected)."""
    return [
        "raises-exception" in cell.get("metadata", {}).get("tags", []) for cell in notebook["cells"]
    ]


# For each cell on the page, in order: its type, prompt, and whether it shows an error
# (an error output, or a traceback written to stderr).
CELLS = f"""() => Array.from(document.querySelectorAll('.jp-Notebook .jp-Cell')).map(cell => ({{
    code: cell.classList.contains('jp-CodeCell'),
    prompt: (cell.querySelector('.jp-InputArea-prompt') || {{}}).textContent || '',
    errors: Array.from(cell.querySelectorAll('.jp-OutputArea-output'))
        .filter(out => out.dataset.mimeType === '{ERROR_MIME}' ||
            out.querySelector('[data-mime-type="{ERROR_MIME}"]') ||
            (out.dataset.mimeType === '{STDERR_MIME}' && /Traceback/.test(out.textContent)))
        .map(out => out.textContent.slice(0, 2000)),
}}))"""


def menu(page, title: str, item: str) -> None:
    """Click menu ``title``, then its item ``item``, as a reader does."""
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(f"^{title}$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(f"^{item}$")).click()


def test_chapter_runs_in_jupyterlab(lab: Lab, browser) -> None:
    started = time.monotonic()
    expected_errors = tagged_to_raise(json.loads((lab.root / NOTEBOOK).read_text(encoding="utf-8")))
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    context.set_default_timeout(60_000)
    external: list[str] = []

    def local_only(route) -> None:
        url = urlsplit(route.request.url)
        if url.scheme in ("http", "https", "ws", "wss") and url.hostname != "127.0.0.1":
            external.append(route.request.url)
            route.abort("blockedbyclient")
        else:
            route.continue_()

    context.route("**/*", local_only)
    page = context.new_page()
    try:
        page.goto(f"{lab.url}/lab/tree/{NOTEBOOK}?token={lab.token}")
        page.locator(".jp-NotebookPanel .jp-Notebook .jp-Cell").first.wait_for()
        # Wait for the notebook's kernel to be up before running anything.
        deadline = time.monotonic() + START_TIMEOUT_S
        while lab.kernel_states() != ["idle"]:
            assert time.monotonic() < deadline, f"kernel not ready: {lab.kernel_states()}"
            page.wait_for_timeout(500)  # not time.sleep: Playwright must keep serving the page

        # The committed notebook has its outputs and execution counts: clear them first, so
        # that every count and output checked below comes from this run.
        # The set-up cell and a solution's code start collapsed: show them, so that every cell's
        # prompt (its execution count) is on the page.
        menu(page, "View", "Expand All Code")
        menu(page, "View", "Expand All Outputs")
        menu(page, "Edit", "Clear Outputs of All Cells")
        page.wait_for_function(
            "() => Array.from(document.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt'))"
            ".every(prompt => !/\\d/.test(prompt.textContent))"
        )
        menu(page, "Run", "Run All Cells")
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while True:
            page.wait_for_timeout(1000)
            cells = page.evaluate(CELLS)
            code = [cell for cell in cells if cell["code"]]
            done = all(EXECUTED.match(cell["prompt"].strip()) for cell in code)
            unexpected = [
                f"cell {index}: {error}"
                for index, cell in enumerate(cells)
                for error in cell["errors"]
                if not (index < len(expected_errors) and expected_errors[index])
            ]
            idle = lab.kernel_states() == ["idle"]
            if (done or unexpected) and idle:
                break
            if time.monotonic() > deadline:
                prompts = [cell["prompt"] for cell in code]
                pytest.fail(f"the chapter did not finish in {RUN_TIMEOUT_S} s: prompts {prompts}")
        assert len(cells) == len(expected_errors), "the page does not show every cell"
        assert not unexpected, "errors in JupyterLab:\n" + "\n".join(unexpected)
        assert done, f"cells without an execution count: {[c['prompt'] for c in code]}"
        prompts = [cell["prompt"].strip() for cell in code]
        assert prompts == [f"[{n}]:" for n in range(1, len(code) + 1)], prompts

        # Save, and check the file that JupyterLab wrote.
        menu(page, "File", "Save Notebook")
        page.locator(".jp-NotebookPanel-toolbar").wait_for()
        page.wait_for_function(
            "() => !document.querySelector('.jp-NotebookPanel.jp-mod-dirty, .jp-mod-dirty')"
        )
        saved = json.loads((lab.root / NOTEBOOK).read_text(encoding="utf-8"))
        counts = [c["execution_count"] for c in saved["cells"] if c["cell_type"] == "code"]
        assert counts == list(range(1, len(counts) + 1)), f"execution counts: {counts}"
        errors = [
            index
            for index, cell in enumerate(saved["cells"])
            if any(out.get("output_type") == "error" for out in cell.get("outputs", []))
            and not expected_errors[index]
        ]
        assert not errors, f"saved notebook: error outputs in cells {errors}"
        assert not external, f"JupyterLab made requests to other hosts: {external}"
    finally:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=SCREENSHOTS / "jupyterlab-01_tokens.png")
        context.close()
        print(f"chapter 1 in JupyterLab: {time.monotonic() - started:.1f} s")
