"""Windowed cycles decide exactly as cycles given every pending workload (gpupool.service.windows).

Generated clusters, queue trees and backlogs in which each workload comes in several identical
copies (the case windows exist for), on an empty cluster and with lower-priority work running
(so that preemption and reclaim happen): admissions with their placements, preemptions with
their victims, and every pending workload's code must be the same.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpupool.engine import Engine, apply_decisions
from gpupool.model import (
    Node,
    PodGroup,
    PodRequest,
    PoolQuota,
    Queue,
    ResourcePool,
    Snapshot,
    Workload,
    devices_only,
)
from gpupool.service.windows import WindowStats, windowed_cycle
from tests.strategies import CLASSES, snapshots, workloads


def _copies(ws: list[Workload], counts: list[int], start: int) -> list[Workload]:
    out: list[Workload] = []
    n = start
    for w, k in zip(ws, counts, strict=False):
        for _ in range(k):
            out.append(replace(w, name=f"c{n}", arrival=float(n)))
            n += 1
    return out


def _same(snap: Snapshot, pending: list[Workload]) -> WindowStats:
    full = Engine(snap).cycle(pending, 10.0)
    stats = WindowStats()
    win, hidden = windowed_cycle(Engine(snap), pending, 10.0, stats)
    assert [(a.workload, a.pool, a.pods, a.after_evicting) for a in win.admitted] == [
        (a.workload, a.pool, a.pods, a.after_evicting) for a in full.admitted
    ]
    assert [(p.preemptor, [v.workload for v in p.victims]) for p in win.preempted] == [
        (p.preemptor, [v.workload for v in p.victims]) for p in full.preempted
    ]
    got = {p.workload: p.code for p in win.pending} | {n: p.code for n, p in hidden.items()}
    admitted = {a.workload for a in full.admitted}
    for p in full.pending:
        if p.workload in got:
            assert got[p.workload] == p.code, (p.workload, got[p.workload], p.code)
    assert not admitted & set(hidden)
    return stats


@settings(max_examples=100, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(snapshots(), st.lists(st.integers(1, 6), min_size=14, max_size=14))
def test_windows_decide_as_the_whole_backlog_on_an_empty_cluster(snap: Snapshot, counts: list[int]) -> None:
    _same(snap, _copies(list(snap.pending), counts, 0))


@settings(max_examples=100, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(snapshots(), st.data())
def test_windows_decide_as_the_whole_backlog_with_work_running(snap: Snapshot, data: st.DataObject) -> None:
    first = Engine(snap).cycle(list(snap.pending), 1.0)
    running = apply_decisions(snap, first, now=1.0)
    leaves = sorted({q.name for q in snap.queues if q.parent is not None})
    later = data.draw(workloads(leaves, 100, data.draw(st.integers(1, 8))))
    counts = data.draw(st.lists(st.integers(1, 6), min_size=len(later), max_size=len(later)))
    _same(replace(running, pending=()), _copies(later, counts, 100))


def test_a_burst_of_identical_workloads_is_decided_from_a_few() -> None:
    nodes = tuple(Node(f"n{i}", "A", 8, 81920, 96000, 1 << 20) for i in range(4))
    pools = (ResourcePool("p0"),)
    queues = (Queue("root", quotas=(PoolQuota("p0", devices_only(32000)),)), Queue("q", parent="root"))
    snap = Snapshot(nodes, pools, queues, CLASSES)
    burst = [
        Workload(f"b{i}", "q", (PodGroup("main", 1, PodRequest(gpus=1, cpu_milli=1000)),), arrival=float(i))
        for i in range(2000)
    ]
    stats = _same(snap, burst)
    # 32 GPUs: 32 admitted, the 33rd is the witness, 1,967 are never given to the engine
    assert stats.passed <= 40 and stats.hidden >= 1960, stats
