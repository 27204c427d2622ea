"""The graded exercises (``tinygpt.exercises``) are themselves tested.

For every exercise the reference passes, and so do solutions written the way a reader would
write them (a formula that rounds differently from the reference's must pass). For the eight
exercises the book names (bpe_merge, cross_entropy, softmax, causal_attention, layer_norm,
top_k, top_p_filter, adamw_step), classic wrong implementations, written here
independently of the checker's own catalogue of mistakes, fail, and the report's hint names the
mistake. A stub is "not implemented yet"; an exception, a wrong shape or dtype in the reader's
function is reported, and no traceback escapes. ``tinygpt exercises --from FILE`` shows
progress.
"""

from __future__ import annotations

import ast
import json
import math
import re
from pathlib import Path

import pytest
import torch
from conftest import run_cli

from tinygpt import exercises
from tinygpt.exercises import EXERCISES, check, result

INF = float("-inf")
EIGHT = {"bpe_merge": "merge", "cross_entropy": "cross_entropy", "softmax": "softmax",
         "causal_attention": "attention", "layer_norm": "layer_norm", "top_k": "top_k",
         "top_p_filter": "top_p", "adamw_step": "adamw_step"}


# -- reader-style solutions: correct ones ------------------------------------------------------


def merge(ids, pair, new_id):
    out, i = [], 0
    while i < len(ids):
        if i < len(ids) - 1 and ids[i] == pair[0] and ids[i + 1] == pair[1]:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def cross_entropy(logits, targets):
    top = logits.max(dim=1, keepdim=True).values
    log_z = top + (logits - top).exp().sum(dim=1, keepdim=True).log()
    return (log_z.squeeze(1) - logits[torch.arange(len(targets)), targets]).mean()


def softmax(x, dim=-1):
    e = torch.exp(x - x.max(dim=dim, keepdim=True).values)
    return e / e.sum(dim=dim, keepdim=True)


def attention(q, k, v):
    T, d = q.shape[-2], q.shape[-1]
    scores = q @ k.transpose(-2, -1) / math.sqrt(d)
    scores = scores.masked_fill(torch.tril(torch.ones(T, T)) == 0, INF)
    return torch.softmax(scores, dim=-1) @ v


def layer_norm(x, weight, bias, eps=1e-5):
    mean = x.mean(dim=-1, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * weight + bias


def top_k(logits, k):
    v, _ = torch.topk(logits, k)
    out = logits.clone()
    out[out < v[..., [-1]]] = INF
    return out


def top_p(logits, p):  # Hugging Face's way: remove where the mass so far exceeds p, shifted
    sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
    cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
    remove = cumulative > p
    remove[..., 1:] = remove[..., :-1].clone()
    remove[..., 0] = False
    return logits.masked_fill(remove.scatter(-1, order, remove), INF)


def adamw_step(param, grad, m, v, t, lr, beta1, beta2, eps, weight_decay):
    param.mul_(1 - lr * weight_decay)  # in place, as an optimizer would: allowed
    m.mul_(beta1).add_(grad, alpha=1 - beta1)
    v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    m_hat, v_hat = m / (1 - beta1 ** t), v / (1 - beta2 ** t)
    param.sub_(lr * m_hat / (v_hat.sqrt() + eps))
    return param, m, v


def dynamic_losses(model, chunks, lr):
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for x, y in chunks:
        loss = torch.nn.functional.cross_entropy(model(x).reshape(-1, model(x).shape[-1]),
                                                 y.reshape(-1))
        losses.append(loss.item())  # scored, then learned from
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return torch.tensor(losses)


def dynamic_trained_first(model, chunks, lr):  # reads the answers before it is scored
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    out = []
    for x, y in chunks:
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
        optimizer.step()
        with torch.no_grad():
            out.append(torch.nn.functional.cross_entropy(model(x).flatten(0, 1),
                                                         y.flatten()).item())
    return torch.tensor(out)


CORRECT = {"bpe_merge": merge, "cross_entropy": cross_entropy, "softmax": softmax,
           "causal_attention": attention, "layer_norm": layer_norm, "top_k": top_k,
           "top_p_filter": top_p, "adamw_step": adamw_step,
           "rope": lambda x, base=10000.0: rope_interleaved_to_halves(x, base),
           "dynamic_evaluation": dynamic_losses}


def rope_interleaved_to_halves(x, base):  # Hugging Face's float32 angles, for any input
    T, d = x.shape[-2], x.shape[-1]
    inv = 1.0 / base ** (torch.arange(0, d, 2).float() / d)
    angles = torch.outer(torch.arange(T).float(), inv)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    rotated = torch.cat([-x[..., d // 2:], x[..., :d // 2]], dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


@pytest.mark.parametrize("exercise_id", list(EXERCISES))
def test_the_reference_passes(exercise_id, capsys):
    assert check(exercise_id, EXERCISES[exercise_id].reference)
    assert capsys.readouterr().out.startswith(f"{exercise_id} (chapter ")


@pytest.mark.parametrize("exercise_id", list(CORRECT))
def test_a_readers_correct_solution_passes(exercise_id):
    outcome = result(exercise_id, CORRECT[exercise_id])
    assert outcome.passed, outcome.report


def test_the_eight_exercises_have_the_issues_names():
    for exercise_id, function in EIGHT.items():
        assert EXERCISES[exercise_id].function == function


def test_every_chapter_has_two_exercises_and_the_list_says_what_each_is():
    entries = exercises.list()
    assert len(entries) == len(EXERCISES) >= 26
    for chapter in range(1, 14):
        assert sum(e.chapter == chapter for e in entries) >= 2, chapter
    exercise_id, chapter, task = entries[0]
    assert (exercise_id, chapter) == ("bpe_merge", 1) and "left to right" in task
    assert [e.chapter for e in entries] == sorted(e.chapter for e in entries)


@pytest.mark.parametrize("exercise_id", list(EXERCISES))
def test_the_checkers_own_mistakes_fail_and_are_named(exercise_id):
    exercise = EXERCISES[exercise_id]
    assert len(exercise.mistakes) >= 2
    for mistake in exercise.mistakes:
        outcome = result(exercise_id, mistake.model)
        assert outcome.status == "failed", mistake.hint
        assert outcome.hint == mistake.hint


def test_the_cases_are_the_same_on_every_run():
    for exercise in EXERCISES.values():
        first, second = exercise.cases(), exercise.cases()
        assert repr(first) == repr(second), exercise.id


# -- in the book: each exercise's chapter has its starter and its solution, both executed --------

CHAPTER_FILES = {int(path.name[:2]): path for path in
                 (Path(__file__).resolve().parents[1] / "chapters").glob("[0-9][0-9]_*.ipynb")}


def output_text(cell: dict) -> str:
    texts = []
    for output in cell.get("outputs", []):
        text = output.get("text") or output.get("data", {}).get("text/plain", "")
        texts.append("".join(text) if isinstance(text, list) else text)
    return "".join(texts)


@pytest.mark.parametrize("exercise_id", list(EXERCISES))
def test_its_chapter_runs_the_readers_starter_and_a_passing_solution(exercise_id):
    exercise = EXERCISES[exercise_id]
    notebook = json.loads(CHAPTER_FILES[exercise.chapter].read_text(encoding="utf-8"))
    calls = re.compile(rf"^check\(\"{exercise_id}\", \w+\)", re.MULTILINE)
    graded = [cell for cell in notebook["cells"] if cell["cell_type"] == "code"
              and calls.search("".join(cell["source"]))]
    hidden = [cell.get("metadata", {}).get("jupyter", {}).get("source_hidden", False)
              for cell in graded]
    assert hidden == [False, True], f"{exercise_id}: want one visible starter, one hidden solution"
    starter, solution = graded
    defined = [node for node in ast.walk(ast.parse("".join(starter["source"])))
               if isinstance(node, ast.FunctionDef) and node.name == exercise.function]
    body = [statement for statement in defined[0].body
            if not (isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)
                    and isinstance(statement.value.value, str))]  # a docstring may say the task
    assert [ast.dump(statement) for statement in body] == [
        ast.dump(ast.Expr(ast.Constant(...)))], "the starter's body is `...`"
    assert "not implemented yet" in output_text(starter)
    assert f"{exercise_id} (chapter {exercise.chapter}): passed" in output_text(solution)
    for cell in graded:
        assert "nbval-check-output" in cell.get("metadata", {}).get("tags", [])


# -- classic wrong implementations of the eight, and the hint each gets -----------------------


def merge_no_skip(ids, pair, new_id):  # the second token of a merged pair is seen again
    out = []
    for i, token in enumerate(ids):
        out.append(new_id if ids[i:i + 2] == list(pair) else token)
    return out


def merge_loses_last(ids, pair, new_id):
    out, i = [], 0
    while i < len(ids) - 1:
        if (ids[i], ids[i + 1]) == tuple(pair):
            out, i = out + [new_id], i + 2
        else:
            out, i = out + [ids[i]], i + 1
    return out


def merge_from_the_right(ids, pair, new_id):
    out, i = [], len(ids) - 1
    while i >= 0:
        if i > 0 and (ids[i - 1], ids[i]) == tuple(pair):
            out, i = [new_id, *out], i - 2
        else:
            out, i = [ids[i], *out], i - 1
    return out


def merge_once(ids, pair, new_id):
    ids = list(ids)
    for i in range(len(ids) - 1):
        if ids[i] == pair[0] and ids[i + 1] == pair[1]:
            ids[i:i + 2] = [new_id]
            break
    return ids


def ce_sum(logits, targets):
    return -torch.log_softmax(logits, dim=1)[torch.arange(len(targets)), targets].sum()


def ce_naive(logits, targets):
    probs = torch.exp(logits) / torch.exp(logits).sum(dim=1, keepdim=True)
    return -torch.log(probs[torch.arange(len(targets)), targets]).mean()


def ce_log2(logits, targets):
    return -torch.log2(torch.softmax(logits, 1)[torch.arange(len(targets)), targets]).mean()


def ce_no_minus(logits, targets):
    return torch.log_softmax(logits, 1)[torch.arange(len(targets)), targets].mean()


def ce_no_mean(logits, targets):
    return -torch.log_softmax(logits, 1)[torch.arange(len(targets)), targets]


def softmax_overflow(x, dim=-1):
    return torch.exp(x) / torch.exp(x).sum(dim=dim, keepdim=True)


def softmax_last_dim(x, dim=-1):
    e = torch.exp(x - x.max(dim=-1, keepdim=True).values)
    return e / e.sum(dim=-1, keepdim=True)


def softmax_no_keepdim(x, dim=-1):
    e = torch.exp(x - x.max(dim=dim, keepdim=True).values)
    return e / e.sum(dim=dim)


def softmax_global_sum(x, dim=-1):
    e = torch.exp(x - x.max())
    return e / e.sum()


def attention_with(scale=True, diagonal=0, dim=-1, future=False):
    def attend(q, k, v):
        T, d = q.shape[-2], q.shape[-1]
        scores = q @ k.transpose(-2, -1)
        if scale is True:
            scores = scores / d ** 0.5
        elif scale == "d":
            scores = scores / d
        ones = torch.ones(T, T)
        mask = torch.triu(ones) if future else torch.tril(ones, diagonal=diagonal)
        scores = scores.masked_fill(mask == 0, float("-inf"))
        return torch.softmax(scores, dim=dim) @ v
    return attend


def ln_unbiased(x, weight, bias, eps=1e-5):
    mean, var = x.mean(-1, keepdim=True), x.var(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * weight + bias


def ln_eps_outside(x, weight, bias, eps=1e-5):
    mean, std = x.mean(-1, keepdim=True), x.std(-1, keepdim=True, unbiased=False)
    return (x - mean) / (std + eps) * weight + bias


def ln_no_affine(x, weight, bias, eps=1e-5):
    mean, var = x.mean(-1, keepdim=True), x.var(-1, keepdim=True, unbiased=False)
    return (x - mean) / torch.sqrt(var + eps)


def ln_first_dim(x, weight, bias, eps=1e-5):
    mean, var = x.mean(0, keepdim=True), x.var(0, keepdim=True, unbiased=False)
    return (x - mean) / torch.sqrt(var + eps) * weight + bias


def top_k_le(logits, k):
    v, _ = torch.topk(logits, k)
    out = logits.clone()
    out[out <= v[..., [-1]]] = INF
    return out


def top_k_zero(logits, k):
    v, _ = torch.topk(logits, k)
    return torch.where(logits < v[..., [-1]], torch.zeros_like(logits), logits)


def top_k_sorted_index(logits, k):
    kth = torch.sort(logits, dim=-1, descending=True).values[..., k:k + 1]
    return logits.masked_fill(logits < kth, INF)


def top_k_scatter(logits, k):
    values, indices = torch.topk(logits, k)
    return torch.full_like(logits, INF).scatter(-1, indices, values)


def top_p_no_shift(logits, p):
    sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
    remove = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1) > p
    return logits.masked_fill(remove.scatter(-1, order, remove), INF)


def top_p_ascending(logits, p):
    probs = torch.softmax(logits, -1)
    sorted_probs, order = torch.sort(probs, dim=-1)
    keep = sorted_probs.cumsum(-1) - sorted_probs < p
    return logits.masked_fill(~keep.scatter(-1, order, keep), INF)


def top_p_sorted_order(logits, p):
    sorted_logits, _ = torch.sort(logits, descending=True, dim=-1)
    probs = torch.softmax(sorted_logits, -1)
    keep = probs.cumsum(-1) - probs < p
    return sorted_logits.masked_fill(~keep, INF)


def adamw_with(correct=True, l2=False, eps_inside=False, t_from_zero=False):
    def step(param, grad, m, v, t, lr, beta1, beta2, eps, weight_decay):
        if l2:
            grad = grad + weight_decay * param
        else:
            param = param - lr * weight_decay * param
        m = beta1 * m + (1 - beta1) * grad
        v = beta2 * v + (1 - beta2) * grad ** 2
        n = t - 1 if t_from_zero else t
        m_hat = m / (1 - beta1 ** n) if correct else m
        v_hat = v / (1 - beta2 ** n) if correct else v
        update = m_hat / torch.sqrt(v_hat + eps) if eps_inside else m_hat / (v_hat ** 0.5 + eps)
        return param - lr * update, m, v
    return step


WRONG = [
    ("bpe_merge", "no-skip-after-merge", merge_no_skip, "skip both of its tokens"),
    ("bpe_merge", "loses-last-token", merge_loses_last, "the last token is lost"),
    ("bpe_merge", "right-to-left", merge_from_the_right, "left to right"),
    ("bpe_merge", "first-occurrence-only", merge_once, "only the first occurrence"),
    ("cross_entropy", "summed", ce_sum, "take the mean over N"),
    ("cross_entropy", "no-log-sum-exp", ce_naive, "use log-sum-exp"),
    ("cross_entropy", "log2", ce_log2, "natural log"),
    ("cross_entropy", "no-minus", ce_no_minus, "minus sign"),
    ("cross_entropy", "no-reduction", ce_no_mean, "one loss per row"),
    ("softmax", "no-max-subtracted", softmax_overflow, "subtract the max"),
    ("softmax", "dim-ignored", softmax_last_dim, "wrong dimension"),
    ("softmax", "sum-without-keepdim", softmax_no_keepdim, "keepdim=True"),
    ("softmax", "sum-over-whole-tensor", softmax_global_sum, "whole tensor"),
    ("causal_attention", "no-scale", attention_with(scale=False), "1/sqrt(d)"),
    ("causal_attention", "scaled-by-d", attention_with(scale="d"), "not 1/d"),
    ("causal_attention", "mask-off-by-one", attention_with(diagonal=-1),
     "position t must see itself"),
    ("causal_attention", "mask-sees-next", attention_with(diagonal=1), "keep keys j <= t"),
    ("causal_attention", "mask-reversed", attention_with(future=True), "sees the future"),
    ("causal_attention", "softmax-over-queries", attention_with(dim=-2), "wrong axis"),
    ("layer_norm", "unbiased-variance", ln_unbiased, "biased one"),
    ("layer_norm", "eps-outside-sqrt", ln_eps_outside, "eps goes inside the square root"),
    ("layer_norm", "no-weight-bias", ln_no_affine, "scale by weight and shift by bias"),
    ("layer_norm", "first-dimension", ln_first_dim, "over the last dimension"),
    ("top_k", "drops-the-kth", top_k_le, "not <="),
    ("top_k", "zero-not-inf", top_k_zero, "must be -inf"),
    ("top_k", "keeps-k-plus-1", top_k_sorted_index, "where -inf is expected"),
    ("top_k", "ties-dropped", top_k_scatter, "ties with the k-th largest"),
    ("top_p_filter", "drops-crossing-token", top_p_no_shift, "crosses p is dropped"),
    ("top_p_filter", "ascending-sort", top_p_ascending, "descending order"),
    ("top_p_filter", "not-scattered-back", top_p_sorted_order, "tokens' order"),
    ("adamw_step", "no-bias-correction", adamw_with(correct=False), "bias correction"),
    ("adamw_step", "l2-in-gradient", adamw_with(l2=True), "decoupled"),
    ("adamw_step", "eps-inside-sqrt", adamw_with(eps_inside=True), "after the square root"),
    ("adamw_step", "t-from-zero", adamw_with(t_from_zero=True), "counted from 1"),
    ("dynamic_evaluation", "trained-before-scoring", dynamic_trained_first,
     "trained before scoring"),
]


@pytest.mark.parametrize("exercise_id, fn, hint", [w[::2] + w[3:] for w in WRONG],
                         ids=[f"{w[0]}-{w[1]}" for w in WRONG])
def test_a_classic_mistake_fails_with_the_hint_that_names_it(exercise_id, fn, hint, capsys):
    assert not check(exercise_id, fn)
    report = capsys.readouterr().out
    assert result(exercise_id, fn).hint.count(hint) == 1
    assert f"hint:     {result(exercise_id, fn).hint}" in report
    assert "input:" in report and "problem:" in report
    assert "raised" in report or ("expected:" in report and "got:" in report)


def test_each_of_the_eight_catches_three_classic_mistakes_or_more():
    for exercise_id in EIGHT:
        assert sum(w[0] == exercise_id for w in WRONG) >= 3, exercise_id


# -- what the reader's function does, reported -------------------------------------------------


def stub_ellipsis(x, dim=-1): ...


def stub_raises(x, dim=-1):
    raise NotImplementedError


@pytest.mark.parametrize("stub", [stub_ellipsis, stub_raises])
def test_a_stub_is_not_implemented_yet(stub, capsys):
    verdict = check("softmax", stub)
    assert not verdict and verdict.passed is False
    out, err = capsys.readouterr()
    assert "not implemented yet" in out and "softmax(x: Tensor" in out
    assert "Traceback" not in out + err and err == ""
    assert result("softmax", stub).status == "not implemented"


def test_an_exception_in_the_readers_code_is_reported_with_its_line(capsys):
    def breaks_on_float64(x, dim=-1):
        if x.dtype == torch.float64:
            return x / 0 if x.sum() < 0 else {}["missing"]  # a KeyError, this line
        return torch.softmax(x, dim)

    assert not check("softmax", breaks_on_float64)
    out, err = capsys.readouterr()
    assert "raised KeyError: 'missing' (at test_exercises.py:" in out
    assert "in breaks_on_float64" in out and "float64" in out
    assert "Traceback" not in out + err


def test_a_wrong_shape_dtype_or_type_is_reported():
    shape = result("softmax", lambda x, dim=-1: torch.softmax(x, dim).sum(dim))
    assert "expected shape" in shape.problem and "shape (2,), expected (2, 3)" in shape.hint
    dtype = result("softmax", lambda x, dim=-1: torch.softmax(x.float(), dim))
    assert "expected dtype torch.float64, got torch.float32" in dtype.problem
    assert "dtype torch.float32, expected torch.float64" in dtype.hint
    assert "keep the input's dtype" in dtype.hint
    kind = result("softmax", lambda x, dim=-1: torch.softmax(x, dim).tolist())
    assert "expected a tensor, got list" in kind.problem
    counts = result("bigram_counts", lambda ids, V: torch.zeros(V, V))
    assert "dtype" in counts.problem
    items = result("linear_backward", lambda dout, x, W: (dout @ W.T, x.T @ dout))
    assert "expected 3 items, got 2" in items.problem


def test_a_missing_return_on_a_later_case_is_not_a_stub():
    def forgets(x, dim=-1):
        if x.dtype == torch.float32:
            return torch.softmax(x, dim)

    outcome = result("softmax", forgets)
    assert outcome.status == "failed" and "returned None" in outcome.problem


def test_an_overflow_in_plain_python_is_named():
    outcome = result("softmax_list", lambda xs: [math.exp(x) / sum(map(math.exp, xs))
                                                 for x in xs])
    assert "raised OverflowError" in outcome.problem and "overflowed" in outcome.hint


def test_bad_ids_and_non_functions():
    with pytest.raises(ValueError, match="no exercise 'sofmax'; the exercises are: bpe_merge"):
        check("sofmax", softmax)
    outcome = result("softmax", 3)
    assert outcome.status == "failed" and "needs a function" in outcome.report


def test_the_readers_inputs_are_copies():
    seen = []

    def keeps(x, dim=-1):
        seen.append(x)
        return torch.softmax(x, dim)

    assert result("softmax", keeps).passed
    case = EXERCISES["softmax"].cases()[0]
    assert seen[0] is not case.args[0] and torch.equal(seen[0], case.args[0])


# -- the workbook: tinygpt exercises -----------------------------------------------------------

WORKBOOK = '''
import torch

def merge(ids, pair, new_id):
    out, i = [], 0
    while i < len(ids):
        if ids[i:i + 2] == list(pair):
            out, i = out + [new_id], i + 2
        else:
            out, i = out + [ids[i]], i + 1
    return out

def softmax(x, dim=-1):
    return torch.exp(x) / torch.exp(x).sum(dim=dim, keepdim=True)

def attention(q, k, v):
    ...

print("my file ran")
if __name__ == "__main__":
    raise SystemExit("not run by the workbook")
'''


def test_the_command_lists_the_exercises(capsys):
    code, out, err = run_cli(capsys, "exercises")
    assert code == 0 and err == ""
    assert "bpe_merge" in out and "merge(ids: list[int]" in out and "locate_window" in out
    code, out, _ = run_cli(capsys, "exercises", "--chapter", "5")
    assert code == 0 and "softmax" in out and "bpe_merge" not in out
    code, out, _ = run_cli(capsys, "exercises", "--help")
    assert code == 0 and "RUNS YOUR PYTHON FILE" in out and "--from FILE" in out


def test_the_command_shows_progress_from_a_readers_file(tmp_path, capsys):
    path = tmp_path / "my_gpt.py"
    path.write_text(WORKBOOK)
    code, out, err = run_cli(capsys, "exercises", "--from", path)
    assert code == 0, err
    lines = {line.split()[2]: line for line in out.splitlines() if line.startswith("  ch")}
    assert "passed" in lines["bpe_merge"]
    assert "not yet" in lines["softmax"] and "subtract the max" in lines["softmax"]
    assert "not yet" in lines["causal_attention"] and "not implemented" in lines[
        "causal_attention"]
    assert "missing" in lines["layer_norm"] and "define layer_norm(" in lines["layer_norm"]
    total = len(EXERCISES)
    assert f"1 of {total} passed, 2 not yet, {total - 3} missing" in out
    assert out.startswith("my file ran")
    code, out, _ = run_cli(capsys, "exercises", "--from", path, "attention", "softmax")
    assert code == 0
    assert "causal_attention (chapter 5): not implemented yet" in out
    assert "hint:     the largest logit overflows" in out


def test_the_command_reports_a_broken_file_or_a_bad_id(tmp_path, capsys):
    path = tmp_path / "broken.py"
    path.write_text("x = 1\nraise RuntimeError('half written')\n")
    code, _, err = run_cli(capsys, "exercises", "--from", path)
    assert code == 2 and "raised RuntimeError at line 2: half written" in err
    code, _, err = run_cli(capsys, "exercises", "--from", tmp_path / "absent.py")
    assert code == 2 and "no such file" in err
    code, _, err = run_cli(capsys, "exercises", "nope")
    assert code == 2 and "no exercise 'nope'" in err and "Traceback" not in err


def test_a_verdict_is_its_outcome_and_shows_nothing_in_a_notebook(capsys):
    from IPython.core.interactiveshell import InteractiveShell

    passed = check("softmax", EXERCISES["softmax"].reference)
    assert passed and passed.passed is True
    # What a notebook shows of a cell's last value is its formatted data: none for a Verdict
    # (a kernel sends no result for empty data), while a plain bool shows "True".
    formatter = InteractiveShell.instance().display_formatter
    assert formatter.format(passed)[0] == {}
    assert formatter.format(True)[0] == {"text/plain": "True"}
