"""How many threads the book's long trainings take: the cores free now, never more
(``tinygpt.runtime.cores_free``, ``cpu_times``, ``free_threads``)."""

from __future__ import annotations

import pytest
import torch

from tinygpt import runtime
from tinygpt.runtime import cores_free, cpu_times, free_threads, threads_free, usable_cpus

STAT = """cpu  300 0 100 1600 0 0 0 0 0 0
cpu0 100 0 50 800 0 0 0 0 0 0
cpu1 200 0 50 800 0 0 0 0 0 0
intr 12345
"""


def test_cpu_times_reads_each_cpus_idle_and_total_ticks(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text(STAT)
    assert cpu_times(str(stat)) == {0: (800, 950), 1: (800, 1050)}


@pytest.mark.parametrize("text", ["", "cpu0 a b c d e\n", "intr 1\n"])
def test_cpu_times_is_none_where_it_cannot_be_read(tmp_path, text):
    stat = tmp_path / "stat"
    stat.write_text(text)
    assert cpu_times(str(stat)) is None
    assert cpu_times(str(tmp_path / "missing")) is None


def ticks(*idle_shares: float) -> tuple[dict, dict]:
    """Two readings 100 ticks apart, CPU i idle for ``idle_shares[i]`` of them."""
    before = dict.fromkeys(range(len(idle_shares)), (1000, 5000))
    after = {i: (1000 + round(100 * s), 5100) for i, s in enumerate(idle_shares)}
    return before, after


@pytest.mark.parametrize(("shares", "cpus", "free"), [
    ((1.0, 1.0), {0, 1}, 2),   # a quiet machine: both cores
    ((1.0, 0.0), {0, 1}, 1),   # another process holds a core: one thread, not two
    ((0.0, 0.0), {0, 1}, 1),   # every core taken: still one
    ((0.7, 1.0), {0, 1}, 2),   # a core 30% busy counts as free
    ((0.3, 1.0), {0, 1}, 1),   # one 70% busy does not
    ((1.0, 1.0, 1.0, 1.0), {0, 1}, 2),  # only the CPUs this process may use count
])
def test_cores_free_counts_the_idle_share_of_the_usable_cpus(shares, cpus, free):
    assert cores_free(*ticks(*shares), cpus) == free


def test_a_cpu_without_two_readings_counts_as_free():
    before, after = ticks(0.0)
    assert cores_free(before, after, {0, 1}) == 1  # cpu 1 unread: free, cpu 0 busy
    assert cores_free(before, before, {0}) == 1  # no ticks between the readings


def test_free_threads_sets_the_count_inside_and_restores_it_after_an_error(monkeypatch):
    threads = torch.get_num_threads()
    monkeypatch.setattr(runtime, "threads_free", lambda window: 1)
    with pytest.raises(RuntimeError, match="inside"), free_threads() as chosen:
        assert chosen == 1 and torch.get_num_threads() == 1
        raise RuntimeError("inside")
    assert torch.get_num_threads() == threads


def test_threads_free_measures_this_machine_within_its_usable_cpus():
    assert 1 <= threads_free(0.05) <= len(usable_cpus())


def test_without_cpu_times_torchs_own_count_is_kept(monkeypatch):
    monkeypatch.setattr(runtime, "cpu_times", lambda: None)
    assert threads_free(0.0) == max(1, min(torch.get_num_threads(), len(usable_cpus())))
