"""The preemption search's shortcuts decide exactly as the search without them.

Shortcuts of the issue 11 follow-up (the Philly replay's CPU): the device bounds before the
candidates are ordered, the bound on what the search could remove at most
(``engine/preemption/reach.py``), the replay of a successful search after the wait check instead of a
second search, and the blocked-at-start proof for a queue within its guarantee whose possible
victims hold too little (``hints.BlockedHints._room_from_victims``).
"""

from __future__ import annotations

from typing import Any
from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpupool.engine import Engine
from gpupool.engine.preemption import bounds, ordering
from gpupool.engine.preemption.search import Preemptor
from gpupool.model import (
    Node,
    PodGroup,
    PodRequest,
    PoolQuota,
    Queue,
    ResourcePool,
    Running,
    Snapshot,
    Workload,
    devices_only,
)
from tests.strategies import snapshots, workloads

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _searches_into(calls: list[str]) -> Any:
    """Patch the search so that each run appends its preemptor's name to ``calls``."""
    real = Preemptor._remove_until_fits

    def spy(self: Preemptor, w: Workload, *a: object) -> object:
        calls.append(w.name)
        return real(self, w, *a)  # type: ignore[arg-type]

    return mock.patch.object(Preemptor, "_remove_until_fits", spy)


def _job(name: str, queue: str, gpus: int, t: float) -> Workload:
    req = PodRequest(gpus=gpus, cpu_milli=1000, memory_mib=1024)
    return Workload(name, queue, (PodGroup("main", 1, req),), "c", 0, True, arrival=t)


def _cluster(guarantees: dict[str, int]) -> Engine:
    """One 8-GPU node; a cohort root and a leaf per entry with that many GPUs guaranteed."""
    nodes = (Node("n0", "A", 8, 81920, 64000, 524288, labels=(("pool", "p0"),)),)
    pools = (ResourcePool("p0", (("pool", "p0"),)),)
    queues = [Queue("root", quotas=(PoolQuota("p0", devices_only(100_000)),))]
    queues += [
        Queue(q, parent="root", quotas=(PoolQuota("p0", devices_only(g * 1000)),))
        for q, g in guarantees.items()
    ]
    return Engine(Snapshot(nodes, pools, tuple(queues)))


def _run(eng: Engine, jobs: list[Workload], now: float) -> None:
    d = eng.cycle(jobs, now)
    eng.apply(d, jobs, now)
    assert len(d.admitted) == len(jobs)


def test_a_search_that_cannot_reach_enough_is_not_run() -> None:
    """Queue b borrows 2 GPUs but runs 4: reclaim takes 2 at most (then b is within its
    guarantee), so a 6-GPU job of queue a, with 2 GPUs free, cannot fit. Counting all four of
    b's jobs the cheap bound passes; counting what reclaim could take it fails, and the search
    (with its evictions and rollback) is never run. The decision is the same either way."""
    eng = _cluster({"a": 6, "b": 2, "c": 2})
    _run(eng, [_job("c0", "c", 1, 0.0), _job("c1", "c", 1, 0.0)], 0.0)
    _run(eng, [_job(f"b{i}", "b", 1, 1.0) for i in range(4)], 1.0)
    big = [_job("big", "a", 6, 2.0)]
    calls: list[str] = []
    with _searches_into(calls):
        bounded = eng.cycle(big, 3.0)
        assert calls == []
        with mock.patch.object(bounds, "SEARCH_SHORTCUTS", False):
            plain = eng.cycle(big, 3.0)
        assert calls == ["big"]
    assert bounded == plain
    assert not bounded.admitted and not bounded.preempted


def test_candidates_that_cannot_make_room_are_not_ordered() -> None:
    """Even with all four of b's jobs gone, 6 GPUs are free: an 8-GPU job cannot fit, so its
    candidates are not put in order (nor costed) before the search gives up."""
    eng = _cluster({"a": 8, "b": 2, "c": 2})
    _run(eng, [_job("c0", "c", 1, 0.0), _job("c1", "c", 1, 0.0)], 0.0)
    _run(eng, [_job(f"b{i}", "b", 1, 1.0) for i in range(4)], 1.0)
    big = [_job("big", "a", 8, 2.0)]
    keys: list[str] = []
    real = ordering.candidate_order

    def spy(victim: Running, mine: str, now: float | None = None) -> tuple[object, ...]:
        keys.append(victim.name)
        return real(victim, mine, now)

    with mock.patch.object(ordering, "candidate_order", spy):
        bounded = eng.cycle(big, 3.0)
        assert keys == []
        with mock.patch.object(bounds, "SEARCH_SHORTCUTS", False):
            plain = eng.cycle(big, 3.0)
        assert sorted(keys) == ["b0", "b1", "b2", "b3"]
    assert bounded == plain
    assert not bounded.admitted and not bounded.preempted


def test_a_successful_search_runs_once() -> None:
    """Queue b borrows 4 GPUs of queue a's guarantee: a's 4-GPU job evicts four of b's jobs.
    The search runs once; after the wait check its releases are replayed, not searched again."""
    eng = _cluster({"a": 4, "b": 4})
    _run(eng, [_job(f"b{i}", "b", 1, 0.0) for i in range(8)], 0.0)
    calls: list[str] = []
    with _searches_into(calls):
        d = eng.cycle([_job("a0", "a", 4, 1.0)], 100.0)
    assert calls == ["a0"]
    assert d.admitted_names() == ["a0"] and len(d.victims()) == 4


@SETTINGS
@given(snapshots(), st.data())
def test_reach_bound_changes_no_decision(snap: Snapshot, data: st.DataObject) -> None:
    """On random clusters, with work running and new arrivals, the cycle decides exactly as
    without the bound on what a search could remove."""
    eng = Engine(snap)
    d = eng.cycle(snap.pending, 0.0)
    eng.apply(d, snap.pending, 0.0)
    admitted = set(d.admitted_names())
    leaves = [q.name for q in snap.queues if q.parent is not None]
    new = data.draw(workloads(leaves, len(snap.pending), data.draw(st.integers(1, 8))))
    pending = [w for w in snap.pending if w.name not in admitted] + list(new)
    bounded = eng.cycle(pending, 1.0)
    with mock.patch.object(bounds, "SEARCH_SHORTCUTS", False):
        plain = eng.cycle(pending, 1.0)
    assert bounded == plain


def test_a_queue_within_its_guarantee_is_blocked_when_the_borrowers_hold_too_little() -> None:
    """The node is full: c runs 5 GPUs within its guarantee, b 3 (1 borrowed). An 8-GPU job
    of queue a fits a's guarantee, so reclaim is open, but every workload reclaim could take
    frees 3 GPUs: it is shown blocked at the start (before, being within its guarantee was
    enough to count as able to preempt), and the cycle decides the same with the hint."""
    eng = _cluster({"a": 8, "b": 2, "c": 6})
    _run(eng, [_job(f"c{i}", "c", 1, 0.0) for i in range(5)], 0.0)
    _run(eng, [_job(f"b{i}", "b", 1, 1.0) for i in range(3)], 1.0)
    big = _job("big", "a", 8, 2.0)
    small = _job("small", "a", 3, 2.0)  # 3 GPUs: evicting b's work would make room
    assert eng.blocked_at_start(big, {})
    assert not eng.blocked_at_start(small, {})
    plain = eng.cycle([big], 3.0)
    hinted = eng.cycle([big], 3.0, blocked={"big"})
    assert not plain.admitted and not plain.preempted
    assert hinted.admitted == plain.admitted and hinted.preempted == plain.preempted
