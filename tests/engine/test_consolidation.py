"""Consolidation (KAI's consolidation action, ``engine/consolidation.py``): properties.

Why: a move stops running work and restarts it elsewhere. It is only worth that when it lets a
blocked workload start in the same cycle, and it must never overcommit a device (the moved work
lands on free capacity only), move non-preemptible work, or exceed the pool's budget.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.engine import apply_decisions, decide
from gpupool.engine.invariants import check_state
from gpupool.model import Consolidation, Snapshot
from tests.engine.clusters import POOL, job, nodes, queues, running

#: a running job: (GPUs, priority, preemptible)
_run = st.tuples(st.integers(1, 6), st.integers(0, 2), st.booleans())
#: a pending job: (GPUs, priority)
_pend = st.tuples(st.integers(1, 8), st.integers(0, 2))


def _snapshot(
    runs: list[tuple[int, int, bool]], pend: list[tuple[int, int]], budget: int, n: int
) -> Snapshot:
    """Running jobs first-fit on ``n`` 8-GPU nodes (those that do not fit are left out)."""
    free = {f"n{i}": list(range(8)) for i in range(n)}
    rs = []
    for i, (g, prio, pre) in enumerate(runs):
        node = next((x for x, devs in free.items() if len(devs) >= g), None)
        if node is None:
            continue
        devs = tuple(free[node][:g])
        del free[node][:g]
        rs.append(running(replace(job(f"r{i}", "a", g, prio=prio), preemptible=pre), node, devs))
    pool = replace(POOL, consolidation=Consolidation(True, budget))
    pending = tuple(job(f"p{i}", "a", g, prio=prio, t=float(i)) for i, (g, prio) in enumerate(pend))
    return Snapshot(nodes(n), (pool,), queues({"a": 100}), pending=pending, running=tuple(rs), now=1.0)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(_run, max_size=8),
    st.lists(_pend, min_size=1, max_size=3),
    st.integers(1, 3),
    st.integers(2, 3),
)
def test_a_move_never_overcommits_and_always_lets_its_beneficiary_start(
    runs: list[tuple[int, int, bool]], pend: list[tuple[int, int]], budget: int, n: int
) -> None:
    snap = _snapshot(runs, pend, budget, n)
    d = decide(snap)
    after = apply_decisions(snap, d)
    assert not check_state(after)  # no device, node or quota overcommitted
    admitted = set(d.admitted_names())
    by_name = {r.name: r for r in snap.running}
    assert len(d.moved) <= budget
    for m in d.moved:
        assert m.for_workload in admitted  # it starts in this cycle
        moved = by_name[m.workload]
        assert moved.workload.preemptible
        assert len(m.pods) == len(moved.admission.pods)
        assert m.reason.startswith(f"Consolidated: freed node {', '.join(m.from_nodes)} for {m.for_workload}")
    again = decide(snap)
    assert [(m.workload, m.pods) for m in again.moved] == [(m.workload, m.pods) for m in d.moved]


def test_off_by_default_nothing_moves() -> None:
    """The fragmented state of the KAI example with the setting off: the 8-GPU job waits."""
    snap = _snapshot([(4, 0, True), (4, 0, True), (4, 0, True)], [(8, 0)], 1, 2)
    snap = replace(snap, running=snap.running[1:], pools=(POOL,))
    d = decide(snap)
    assert not d.moved and not d.admitted
    on = decide(replace(snap, pools=(replace(POOL, consolidation=Consolidation(True, 1)),)))
    assert [m.for_workload for m in on.moved] == ["p0"] and on.admitted_names() == ["p0"]


def test_work_the_backend_cannot_move_is_left_in_place() -> None:
    """``Workload.movable`` False (on Kubernetes: not a batch/v1 Job): no move is planned for
    it, so the blocked job waits instead of the run being stopped whole and requeued."""
    snap = _snapshot([(4, 0, True), (4, 0, True), (4, 0, True)], [(8, 0)], 1, 2)
    snap = replace(
        snap, running=snap.running[1:], pools=(replace(POOL, consolidation=Consolidation(True, 1)),)
    )
    pinned = tuple(replace(r, workload=replace(r.workload, movable=False)) for r in snap.running)
    d = decide(replace(snap, running=pinned))
    assert not d.moved and "p0" not in d.admitted_names()
    one = (pinned[0], snap.running[1])  # the other one may still move
    assert [m.workload for m in decide(replace(snap, running=one)).moved] == [snap.running[1].name]
