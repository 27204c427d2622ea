"""The reader's function cannot stop or fool the checker (``tinygpt.exercises.running``): an
object whose repr raises, ``sys.exit()``, a replaced torch or package function, and a call that
never ends are each reported as a failure, in ``check`` and in ``tinygpt exercises --from``.
"""

from __future__ import annotations

import sys
import threading

import torch
from conftest import run_cli

from tinygpt import bpe
from tinygpt.exercises import check, result


class NoRepr:
    def __repr__(self):
        raise RuntimeError("no repr for you")

    def __eq__(self, other):
        raise RuntimeError("no comparison either")


def test_a_result_whose_repr_raises_is_reported(capsys):
    assert not check("softmax", lambda x, dim=-1: NoRepr())
    out, err = capsys.readouterr()
    assert "<a NoRepr object>" in out and "Traceback" not in out + err
    outcome = result("bpe_merge", lambda ids, pair, new_id: NoRepr())
    assert outcome.status == "failed" and "<a NoRepr object>" in outcome.report


def test_an_exception_whose_message_raises_is_reported():
    class Odd(Exception):
        def __str__(self):
            raise ValueError("no message")

    def fn(x, dim=-1):
        raise Odd()

    outcome = result("softmax", fn)
    assert outcome.status == "failed" and "raised Odd" in outcome.problem


def test_sys_exit_in_the_readers_code_is_a_failure():
    def leaves(x, dim=-1):
        sys.exit(3)

    outcome = result("softmax", leaves)
    assert outcome.status == "failed"
    assert "your code called sys.exit(3)" in outcome.problem and "sys.exit" in outcome.hint


def test_replacing_torch_softmax_does_not_pass_and_is_undone():
    original = torch.softmax

    def cheats(x, dim=-1):
        torch.softmax = lambda x, dim=-1, **kwargs: torch.zeros_like(x)
        return torch.zeros_like(x)

    outcome = result("softmax", cheats)
    assert torch.softmax is original
    assert outcome.status == "failed" and "replaced torch.softmax" in outcome.problem


def test_replacing_a_tensor_method_or_the_packages_reference_is_undone():
    original = bpe.merge

    def cheats(ids, pair, new_id):
        bpe.merge = lambda ids, pair, new_id: []
        torch.Tensor.sum = lambda self, *a, **k: 0
        return []

    outcome = result("bpe_merge", cheats)
    assert bpe.merge is original and "sum" not in vars(torch.Tensor)
    assert outcome.status == "failed"
    assert "tinygpt.bpe.merge" in outcome.problem and "torch.Tensor.sum" in outcome.problem


def test_a_function_replaced_before_the_check_is_put_back_and_named():
    original = torch.softmax
    torch.softmax = lambda x, dim=-1, **kwargs: torch.zeros_like(x)
    try:
        outcome = result("softmax", lambda x, dim=-1: torch.zeros_like(x))
    finally:
        replaced, torch.softmax = torch.softmax, original
    assert replaced is original  # the check put it back itself
    assert outcome.status == "failed" and "torch.softmax had been replaced" in outcome.report
    assert result("softmax", lambda x, dim=-1: torch.softmax(x, dim)).passed


def endless(x, dim=-1):
    while True:
        pass


def test_a_call_that_takes_too_long_is_stopped():
    outcome = result("softmax", endless, time_limit=0.3)
    assert outcome.status == "failed" and "took longer than 0.3 s" in outcome.problem
    assert "endless loop" in outcome.hint


def test_an_exception_handler_in_the_readers_code_does_not_swallow_the_time_limit():
    def stubborn(x, dim=-1):
        try:
            while True:
                pass
        except Exception:
            return torch.softmax(x, dim)

    outcome = result("softmax", stubborn, time_limit=0.3)
    assert "took longer than 0.3 s" in outcome.problem


def test_the_time_limit_holds_off_the_main_thread():
    found = {}
    worker = threading.Thread(target=lambda: found.update(r=result(
        "softmax", lambda x, dim=-1: (__import__("time").sleep(2), x)[1], time_limit=0.3)))
    worker.start()
    worker.join(30)
    assert "took longer than 0.3 s" in found["r"].problem


WORKBOOK = '''
import sys
import torch

class NoRepr:
    def __repr__(self):
        raise RuntimeError("no repr")

def merge(ids, pair, new_id):
    return NoRepr()

def softmax(x, dim=-1):
    sys.exit(0)

def attention(q, k, v):
    torch.softmax = lambda x, dim=-1, **kw: x
    return torch.zeros_like(q)

layer_norm = NoRepr()
'''


def test_the_command_reports_each_guarded_failure_and_goes_on(tmp_path, capsys):
    path = tmp_path / "my_gpt.py"
    path.write_text(WORKBOOK)
    original = torch.softmax
    code, out, err = run_cli(capsys, "exercises", "--from", path)
    assert torch.softmax is original
    assert code == 0, err
    assert "Traceback" not in out + err
    lines = {line.split()[2]: line for line in out.splitlines() if line.startswith("  ch")}
    assert "not yet" in lines["bpe_merge"]
    assert "your code called sys.exit(0)" in lines["softmax"]
    assert "replaced torch.softmax" in lines["causal_attention"]
    assert "not yet" in lines["layer_norm"]
    code, out, err = run_cli(capsys, "exercises", "--from", path, "merge", "layer_norm")
    assert code == 0 and "<a NoRepr object>" in out and "Traceback" not in out + err


def test_a_file_that_replaces_torch_at_its_top_level_is_named_and_undone(tmp_path, capsys):
    path = tmp_path / "my_gpt.py"
    path.write_text("import torch\ntorch.softmax = lambda x, dim=-1, **kw: x\n"
                    "def softmax(x, dim=-1):\n    return torch.softmax(x, dim)\n")
    original = torch.softmax
    code, out, err = run_cli(capsys, "exercises", "--from", path, "softmax")
    assert torch.softmax is original and code == 0
    assert "replaced torch.softmax" in err and "put back" in err
    assert "softmax (chapter 5): passed" in out  # graded with torch's own softmax


def test_a_kernels_own_input_hook_is_not_the_readers_replacement():
    # ipykernel sets builtins.input again before every cell (to forward the reader's typing);
    # the check must neither refuse to grade for it nor put back a stale hook.
    import builtins

    original = builtins.input

    def kernels_input(prompt=""):
        return ""

    builtins.input = kernels_input
    try:
        outcome = result("softmax", lambda x, dim=-1: torch.softmax(x, dim))
        assert builtins.input is kernels_input
    finally:
        builtins.input = original
    assert outcome.passed, outcome.report


def test_a_check_in_a_real_kernel_grades_the_solution(tmp_path):
    # The chapters run their checks in a Jupyter kernel, cell after cell: what CI caught once.
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("import torch\nfrom tinygpt.exercises import check"),
        nbformat.v4.new_code_cell("def softmax(x, dim=-1):\n    return torch.softmax(x, dim)"),
        nbformat.v4.new_code_cell('check("softmax", softmax)')])
    NotebookClient(notebook, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    printed = "".join(output.get("text", "") for output in notebook.cells[-1].outputs)
    assert "softmax (chapter 5): passed" in printed, printed
