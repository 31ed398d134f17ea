"""Property tests: scheduling invariants hold on random clusters, queues and workloads, cycle after cycle."""

from __future__ import annotations

import random
from dataclasses import replace
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpupool.engine import Engine, apply_decisions, decide
from gpupool.engine.invariants import check_cycle, check_state
from gpupool.engine.preemption.slots import WholeSlots
from gpupool.model import (
    UNLIMITED,
    Node,
    PodGroup,
    PodRequest,
    PoolQuota,
    Queue,
    ResourcePool,
    Snapshot,
    Workload,
)
from tests.strategies import snapshots, workloads

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _run_cycles(snap: Snapshot, data: st.DataObject, cycles: int = 4) -> None:
    leaves = [q.name for q in snap.queues if q.parent is not None]
    by_name = {w.name: w for w in snap.pending}
    nxt = len(snap.pending)
    for c in range(cycles):
        d = decide(snap)
        after = apply_decisions(snap, d, now=float(c))
        problems = check_cycle(snap, d, after)
        assert not problems, problems
        # determinism: same snapshot, same decisions; the pending list's order does not matter
        assert decide(snap) == d
        shuffled = list(snap.pending)
        random.Random(c).shuffle(shuffled)
        assert decide(replace(snap, pending=tuple(shuffled))) == d
        # every pending workload is accounted for exactly once
        seen = [a.workload for a in d.admitted] + [p.workload for p in d.pending]
        assert sorted(seen) == sorted(w.name for w in snap.pending)
        # next cycle: victims requeue, some running work finishes, new work arrives
        victims = [by_name[v] for v in d.victims()]
        running = list(after.running)
        finish = data.draw(
            st.sets(st.sampled_from(range(len(running))) if running else st.nothing(), max_size=len(running))
        )
        running = [r for i, r in enumerate(running) if i not in finish]
        new = data.draw(workloads(leaves, nxt, data.draw(st.integers(0, 4))))
        nxt += len(new)
        for w in new:
            by_name[w.name] = w
        snap = replace(after, running=tuple(running), pending=after.pending + tuple(victims) + tuple(new))


@SETTINGS
@given(snapshots(), st.data())
def test_invariants_hold_every_cycle(snap: Snapshot, data: st.DataObject) -> None:
    _run_cycles(snap, data)


@SETTINGS
@given(snapshots())
def test_engine_leaves_its_state_untouched(snap: Snapshot) -> None:
    """A cycle rolls back everything it tried: the incremental state is exactly what it was given."""
    eng = Engine(snap)
    before = (
        list(eng.cluster.free_cpu),
        [list(d) for d in eng.cluster.dev_milli],
        dict(eng.quota.E),
        dict(eng.quota.U),
    )
    d1 = eng.cycle(snap.pending)
    after = (
        list(eng.cluster.free_cpu),
        [list(d) for d in eng.cluster.dev_milli],
        dict(eng.quota.E),
        dict(eng.quota.U),
    )
    assert before == after
    assert eng.cycle(snap.pending) == d1 == decide(snap)


@SETTINGS
@given(snapshots())
def test_incremental_apply_matches_a_fresh_engine(snap: Snapshot) -> None:
    eng = Engine(snap)
    d = eng.cycle(snap.pending)
    eng.apply(d, snap.pending, 1.0)
    after = apply_decisions(snap, d, now=1.0)
    fresh = Engine(after)
    assert fresh.cluster.dev_milli == eng.cluster.dev_milli
    assert fresh.cluster.free_whole == eng.cluster.free_whole
    assert fresh.quota.E == eng.quota.E
    assert fresh.cluster.pool_used == eng.cluster.pool_used
    assert fresh.cluster.pool_used == {
        p.name: fresh.cluster.used_gpu_milli(p.name) for p in snap.pools if p.name in fresh.cluster.pool_used
    } or any(not n.schedulable for n in snap.nodes)
    assert not check_state(after)


@SETTINGS
@given(snapshots())
def test_gang_is_all_or_nothing(snap: Snapshot) -> None:
    d = decide(snap)
    pending = {w.name: w for w in snap.pending}
    for a in d.admitted:
        w = pending[a.workload]
        assert w.min_pods <= len(a.pods) <= w.pod_count
    placed = {a.workload for a in d.admitted}
    for p in d.pending:
        assert p.workload not in placed


def test_checker_catches_overcommit() -> None:
    """The invariant checker itself must be able to fail."""
    from tests.scenario_runner import _bundle

    b = _bundle(
        {
            "manifests": """
apiVersion: gpupool.io/v1alpha1
kind: Queue
metadata: {name: team-a}
spec: {parent: org, quotas: [{pool: gpu, guarantee: {nvidia.com/gpu: 16}}]}
---
{apiVersion: gpupool.io/v1alpha1, kind: Workload, metadata: {name: x}, spec: {queue: team-a, podGroups: [{resources: {nvidia.com/gpu: 8}}]}}
---
{apiVersion: gpupool.io/v1alpha1, kind: Workload, metadata: {name: y}, spec: {queue: team-a, podGroups: [{resources: {nvidia.com/gpu: 8}}]}}
""",
            "cycles": [],
        }
    )
    snap = Snapshot(
        tuple(b.nodes), tuple(b.pools), tuple(b.queues), tuple(b.priority_classes), tuple(b.workloads)
    )
    d = decide(snap)
    after = apply_decisions(snap, d)
    assert not check_cycle(snap, d, after)
    # move y onto x's node and devices: the checker must notice
    x, y = sorted(after.running, key=lambda r: r.name)
    bad_y = replace(y, admission=replace(y.admission, pods=x.admission.pods))
    broken = replace(after, running=(x, bad_y))
    assert any("over-committed" in e for e in check_state(broken))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    snapshots(),
    st.sampled_from(("fifo", "fair-share")),
    st.sampled_from(("binpack", "spread", "fragmentation")),
    st.sampled_from(("default", "none")),
    st.booleans(),
)
def test_invariants_hold_for_every_policy(
    snap: Snapshot, order: str, score: str, preempt: str, one_head: bool
) -> None:
    from gpupool.model import EngineConfig

    snap = replace(
        snap, config=EngineConfig(order=order, score=score, preempt=preempt, one_head_per_queue=one_head)
    )
    d = decide(snap)
    assert not check_cycle(snap, d, apply_decisions(snap, d))
    if preempt == "none":
        assert not d.preempted


def test_unknown_policy_names_the_field() -> None:
    import pytest

    from gpupool.model import EngineConfig

    snap = Snapshot((), (), (), config=EngineConfig(score="magic"))
    with pytest.raises(
        ValueError, match="engine config score: unknown policy 'magic'; choose one of binpack, spread"
    ):
        decide(snap)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots())
def test_one_head_per_queue_considers_one_workload_per_queue(snap: Snapshot) -> None:
    from gpupool.engine import PendingCode
    from gpupool.model import EngineConfig

    d = decide(replace(snap, config=EngineConfig(one_head_per_queue=True)))
    per_queue: dict[str, int] = {}
    for a in d.admitted:
        per_queue[a.queue] = per_queue.get(a.queue, 0) + 1
    for p in d.pending:
        if p.code not in (PendingCode.SKIPPED, PendingCode.BLOCKED):
            per_queue[p.queue] = per_queue.get(p.queue, 0) + 1
    assert all(n == 1 for n in per_queue.values()), per_queue


def _second_round(
    snap: Snapshot, data: st.DataObject, arrivals: tuple[int, int]
) -> tuple[Engine, list[Workload]]:
    """An engine that has admitted what it could of the snapshot, and the next cycle's pending
    work: what was left plus a drawn number of new arrivals (so that work is running)."""
    eng = Engine(snap)
    d = eng.cycle(snap.pending, 0.0)
    eng.apply(d, snap.pending, 0.0)
    admitted = set(d.admitted_names())
    leaves = [q.name for q in snap.queues if q.parent is not None]
    new = data.draw(workloads(leaves, len(snap.pending), data.draw(st.integers(*arrivals))))
    return eng, [w for w in snap.pending if w.name not in admitted] + list(new)


@SETTINGS
@given(snapshots(), st.data())
def test_blocked_hint_changes_no_decision(snap: Snapshot, data: st.DataObject) -> None:
    """Workloads shown blocked at the start state may be skipped by the engine; every admission,
    preemption and hold stays exactly what it is without the hint."""
    eng, pending = _second_round(snap, data, (0, 6))
    memo: dict[object, bool] = {}
    blocked = {w.name for w in pending if eng.blocked_at_start(w, memo)}
    plain = eng.cycle(pending, 1.0)
    held = eng.placer.holds.key()
    hinted = eng.cycle(pending, 1.0, blocked=blocked)
    assert bool(hinted.preempted) == bool(plain.preempted)
    if plain.preempted:  # the hint is exact only for cycles that preempt nothing
        assert hinted.preempted[0] == plain.preempted[0]
        return
    assert hinted.admitted == plain.admitted
    assert eng.placer.holds.key() == held
    assert set(hinted.pending) <= set(plain.pending)
    assert len(hinted.pending) + hinted.skipped == len(plain.pending)
    assert {p.workload for p in plain.pending} - {p.workload for p in hinted.pending} <= blocked
    if not plain.preempted:  # the proof itself: nothing shown blocked gets in
        assert not blocked & set(plain.admitted_names())


@SETTINGS
@given(snapshots(), st.data())
def test_preemption_device_count_bound_changes_no_decision(snap: Snapshot, data: st.DataObject) -> None:
    """The preemption search skips placement trials that a count of free whole devices shows
    must fail; with the bound switched off, every decision is the same."""
    eng, pending = _second_round(snap, data, (1, 8))
    bounded = eng.cycle(pending, 1.0)
    with mock.patch.object(WholeSlots, "of", staticmethod(lambda *a: None)):
        plain = eng.cycle(pending, 1.0)
    assert bounded == plain


@pytest.mark.parametrize("gang", [2, 3])
def test_preemption_device_count_bound_on_a_full_cluster(gang: int) -> None:
    """Three 8-GPU nodes full of low-priority 4-GPU work, one of them pinned by work that may
    not be preempted: a 2-pod gang of 8-GPU pods evicts exactly what a bound-free search evicts,
    and a 3-pod gang (more whole nodes than eviction can free) is refused by both alike."""
    nodes = tuple(Node(f"n{i}", "A", 8, 81920, 64000, 524288, labels=(("pool", "p0"),)) for i in range(3))
    pools = (ResourcePool("p0", (("pool", "p0"),)),)
    queues = (Queue("q", quotas=(PoolQuota("p0", (UNLIMITED,) * 5),)),)
    eng = Engine(Snapshot(nodes, pools, queues))

    def job(name: str, gpus: int, replicas: int, prio: int, preemptible: bool, t: float) -> Workload:
        req = PodRequest(gpus=gpus, cpu_milli=1000, memory_mib=1024)
        return Workload(name, "q", (PodGroup("main", replicas, req),), "c", prio, preemptible, arrival=t)

    low = [job(f"low{i}", 4, 1, 10, i != 0, float(i)) for i in range(6)]
    d = eng.cycle(low, 0.0)
    eng.apply(d, low, 0.0)
    assert len(d.admitted) == 6
    big = [job("big", 8, gang, 100, True, 10.0)]
    bounded = eng.cycle(big, 1.0)
    with mock.patch.object(WholeSlots, "of", staticmethod(lambda *a: None)):
        plain = eng.cycle(big, 1.0)
    assert bounded == plain
    assert bool(bounded.admitted) == (gang == 2)
    if gang == 2:
        assert len(bounded.victims()) == 4


@SETTINGS
@given(snapshots(), st.booleans())
def test_auto_score_is_fragmentation_where_it_can_matter_else_binpack(snap: Snapshot, uniform: bool) -> None:
    """The default score ``auto`` decides exactly as ``fragmentation`` when GPU nodes differ in
    model or size or a pod shares a GPU, and exactly as ``binpack`` otherwise."""
    from gpupool.engine.fragscore import varied_nodes

    if uniform:  # one node kind: the case where auto must be binpack unless GPUs are shared
        n0 = snap.nodes[0]
        nodes = tuple(replace(n, gpu_model=n0.gpu_model, gpu_count=n0.gpu_count) for n in snap.nodes)
        snap = replace(snap, nodes=nodes)
    shared = any(g.request.fractional for w in snap.pending for g in w.pod_groups)
    expect = "fragmentation" if varied_nodes(snap.nodes) or shared else "binpack"

    def run(score: str) -> tuple[object, ...]:
        eng = Engine(replace(snap, config=replace(snap.config, score=score)))
        d = eng.cycle(snap.pending, 0.0)
        return (
            d.admitted,
            d.preempted,
            sorted(d.pending, key=lambda p: p.workload),
            eng.placer.holds.key(),
        )

    assert run("auto") == run(expect)
