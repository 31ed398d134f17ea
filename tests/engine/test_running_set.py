"""``state.running.RunningSet``: the running workloads, their indexes and the cycle's undo log."""

from __future__ import annotations

import math
from dataclasses import replace

from gpupool.engine.state.running import RunningSet
from tests.engine.clusters import job, running


def test_indexes_by_pool_and_queue_and_the_lowest_preemptible_priority() -> None:
    rs = RunningSet()
    rs.set("a", running(job("a", "q", 1, prio=5), "n0", (0,)))
    rs.set("b", running(job("b", "q", 1, prio=3), "n0", (1,)))
    rs.set("c", running(replace(job("c", "q", 1, prio=1), preemptible=False), "n0", (2,)))
    assert set(rs.by_pq[("p0", "q")]) == {"a", "b", "c"}
    assert rs.lowest_priority("p0", "q") == 3  # the non-preemptible one is no candidate
    rs.set("b", None)
    assert rs.lowest_priority("p0", "q") == 5
    assert rs.lowest_priority("p0", "other") == math.inf


def test_work_admitted_in_the_open_cycle_is_never_indexed_and_discard_forgets_it() -> None:
    rs = RunningSet()
    rs.set("old", running(job("old", "q", 1, prio=5), "n0", (0,)))
    rs.open()
    rs.admit(running(job("new", "q", 1, prio=1), "n0", (1,)))
    assert "new" in rs.by_name and "new" in rs.fresh
    assert set(rs.by_pq[("p0", "q")]) == {"old"} and rs.lowest_priority("p0", "q") == 5
    rs.set("old", None)
    rs.discard()
    assert set(rs.by_name) == {"old"} and set(rs.by_pq[("p0", "q")]) == {"old"}


def test_rollback_restores_what_each_name_was_at_the_checkpoint() -> None:
    rs = RunningSet()
    a = running(job("a", "q", 1), "n0", (0,))
    rs.set("a", a)
    rs.open()
    cp = rs.checkpoint()
    rs.set("a", None)
    rs.set("b", running(job("b", "q", 1), "n0", (1,)))
    rs.rollback(cp)
    assert rs.by_name == {"a": a} and set(rs.by_pq[("p0", "q")]) == {"a"}
    rs.close()


def test_busy_ends_per_device_sorted_with_the_cycles_admissions() -> None:
    """A device frees when the last workload on it ends; unknown durations never end; work
    admitted in the open cycle counts on the devices it took."""
    rs = RunningSet()
    rs.set("s", running(job("s", "q", 1, expected_duration_s=10.0), "n0", (0,), at=0.0))
    rs.set("l", running(job("l", "q", 1, expected_duration_s=50.0), "n0", (1,), at=0.0))
    rs.set("u", running(job("u", "q", 1), "n0", (2,), at=0.0))
    assert rs.busy_ends("n0") == [10.0, 50.0, math.inf]
    rs.open()
    rs.admit(running(job("f", "q", 1, expected_duration_s=5.0), "n0", (3,), at=2.0))
    assert rs.busy_ends("n0") == [7.0, 10.0, 50.0, math.inf]
    rs.discard()
    assert rs.busy_ends("n0") == [10.0, 50.0, math.inf]
    assert rs.busy_ends("n9") == []
