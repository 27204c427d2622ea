"""tinygpt.checks and the checks at the door, run from several threads at once.

The checks are plain calls in the first line of each forward and sampling function, with no
process-wide switch: threads that run models and sampling at overlapping times (forced to
interleave by a barrier) each get every check, once per call, never skipped and never twice.
"""

from __future__ import annotations

import re
import threading
from collections import Counter

import pytest
import torch

import tinygpt.model
from tinygpt.attention import CausalSelfAttention
from tinygpt.block import LayerNorm, RMSNorm
from tinygpt.checks import ArgumentTypeError, ArgumentValueError, check_float, check_int
from tinygpt.config import GPTConfig
from tinygpt.model import GPT
from tinygpt.sample import apply_temperature, generate, sample_next, top_k_filter, top_p_filter

CONFIG = GPTConfig(vocab_size=13, block_size=8, n_layer=2, n_head=2, n_embd=8)
THREADS = 4
ROUNDS = 6
NEW_TOKENS = 5

# Each bad call and the package's message for it: torch's own errors would not match.
BAD_CALLS = [
    (lambda m: apply_temperature(torch.zeros(1, 13), -1), ValueError, "temperature must be in"),
    (lambda m: top_k_filter(torch.zeros(1, 13), 0), ValueError, r"top_k must be an integer in"),
    (lambda m: top_p_filter(torch.zeros(1, 13), 1.5), ValueError, "top_p must be in"),
    (lambda m: sample_next(torch.zeros(1, 13), temperature=-5), ValueError,
     "temperature must be in"),
    (lambda m: LayerNorm(4)(torch.zeros(2, 3)), ValueError, "last dimension must be 4"),
    (lambda m: RMSNorm(4)(torch.zeros(2, 3)), ValueError, "last dimension must be 4"),
    (lambda m: CausalSelfAttention(CONFIG)(torch.zeros(1, 9, 8)), ValueError,
     "sequence too long"),
    (lambda m: m(torch.full((1, 3), 13)), ValueError, "outside the vocabulary"),
    (lambda m: m(torch.zeros(1, 9, dtype=torch.long)), ValueError, "context length"),
    (lambda m: generate(m, torch.zeros(1, 2, dtype=torch.long), 2, top_k=99), ValueError,
     "top_k"),
]


def test_the_number_checks_name_the_argument():
    with pytest.raises(ArgumentValueError, match=r"n_head must be an integer in \[1, 4\], got 5"):
        check_int(5, "n_head", 1, 4)
    with pytest.raises(ArgumentTypeError, match="got True"):
        check_int(True, "n_head")
    with pytest.raises(ArgumentValueError, match=r"dropout must be in \[0, 1\), got 1"):
        check_float(1, "dropout", 0, 1, high_open=True)
    assert check_float(0.5, "dropout", 0, 1, high_open=True) == 0.5


def test_no_check_is_skipped_or_doubled_when_threads_interleave(monkeypatch):
    """Four threads, six rounds each, meet at a barrier before every step (so that their model
    forwards, generations and bad calls overlap as the old global switch could not survive:
    A enters, B enters, A leaves, B leaves). Every bad call in every thread raises the package's
    own error, and every forward of every thread runs its check exactly once."""
    lock = threading.Lock()
    forwards: Counter[int] = Counter()  # per thread: GPT.forward calls
    checks: Counter[int] = Counter()  # per thread: GPT.check_inputs calls
    real_forward, real_check = GPT.forward, GPT.check_inputs

    def counted_forward(self, *args, **kwargs):
        with lock:
            forwards[threading.get_ident()] += 1
        return real_forward(self, *args, **kwargs)

    def counted_check(self, *args, **kwargs):
        with lock:
            checks[threading.get_ident()] += 1
        return real_check(self, *args, **kwargs)

    monkeypatch.setattr(tinygpt.model.GPT, "forward", counted_forward)
    monkeypatch.setattr(tinygpt.model.GPT, "check_inputs", counted_check)
    torch.manual_seed(0)
    model = GPT(CONFIG).eval()
    barrier = threading.Barrier(THREADS, timeout=60)
    failures: list[str] = []

    def worker(index: int) -> None:
        me = threading.get_ident()
        idx = torch.randint(CONFIG.vocab_size, (1, 4))
        try:
            for round_ in range(ROUNDS):
                barrier.wait()  # everyone generates at the same moment
                before = checks[me]
                out = generate(model, idx, NEW_TOKENS, temperature=0.9, top_k=5,
                               generator=torch.Generator().manual_seed(index))
                if out.shape != (1, 4 + NEW_TOKENS) or checks[me] - before != NEW_TOKENS:
                    failures.append(f"thread {index}: {checks[me] - before} checks for "
                                    f"{NEW_TOKENS} forwards of generate")
                barrier.wait()  # then every bad call, each thread starting at another one
                for k in range(len(BAD_CALLS)):
                    call, error, match = BAD_CALLS[(k + index + round_) % len(BAD_CALLS)]
                    try:
                        call(model)
                    except error as err:
                        if not re.search(match, str(err)):
                            failures.append(f"thread {index}: wrong message {err}")
                    else:
                        failures.append(f"thread {index}: bad call {k} was accepted")
                barrier.wait()  # and a plain forward: one check, no more
                before = checks[me]
                with torch.no_grad():
                    model(idx)
                if checks[me] - before != 1:
                    failures.append(f"thread {index}: {checks[me] - before} checks for 1 forward")
        except threading.BrokenBarrierError:
            failures.append(f"thread {index}: the barrier broke")
        except Exception as err:  # any other failure is the test's to report, with its thread
            failures.append(f"thread {index}: {type(err).__name__}: {err}")
            barrier.abort()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not any(thread.is_alive() for thread in threads), "a thread did not finish"
    assert not failures, "\n".join(failures[:20])
    assert len(forwards) == THREADS  # every thread ran forwards, each counted as its own
    assert forwards == checks  # per thread: as many checks as forwards
    # per round: the forwards of generate, one plain forward and the two bad ones
    assert all(n == ROUNDS * (NEW_TOKENS + 1 + 2) for n in checks.values()), checks
    # after all that, a layer on its own still gets the package's error in this thread too
    with pytest.raises(ValueError, match="last dimension must be 4"):
        LayerNorm(4)(torch.zeros(2, 3))
