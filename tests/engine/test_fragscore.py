"""The fragmentation Score plugin: its class index follows the state exactly, and a pick is the
best placement over every node (not only over a few best-fit candidates)."""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import replace

from hypothesis import HealthCheck, given, settings

from gpupool.engine import Engine, apply_decisions, decide
from gpupool.engine.fgd import PodShape
from gpupool.engine.fragscore import ClassIndex, FragAware, FragContext, add_shapes
from gpupool.engine.placement import _free_devices, _mem_for
from gpupool.engine.state.cluster import ClusterState
from gpupool.model import EngineConfig, Node, PodGroup, PodRequest, ResourcePool, Snapshot, Workload
from tests.strategies import snapshots

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _classes(index: ClassIndex) -> dict[object, dict[tuple[tuple[int, ...], int], list[int]]]:
    return {ix.model: {k: list(m) for k, m in c.members.items() if m} for ix, c in index.of.items()}


@SETTINGS
@given(snapshots())
def test_class_index_follows_cycles_rollbacks_and_applies(snap: Snapshot) -> None:
    snap = replace(snap, config=replace(snap.config, score="fragmentation"))
    eng = Engine(snap)
    d = eng.cycle(snap.pending)
    index = eng.cluster.frag_index
    if index is None:  # nothing pending: the plugin never looked
        return
    index.sync()
    assert _classes(index) == _classes(ClassIndex(eng.cluster))  # rolled back exactly
    eng.apply(d, snap.pending, 1.0)
    index.sync()
    assert _classes(index) == _classes(ClassIndex(eng.cluster))
    # a second cycle on the same engine (scores carried over when the mix is the same) decides
    # exactly what a fresh engine decides
    after = apply_decisions(snap, d, now=1.0)
    assert eng.cycle(after.pending) == decide(after)


def _brute_key(st: ClusterState, ctx: FragContext, i: int, d: int, req: PodRequest) -> tuple[object, ...]:
    """The documented preference, computed from scratch for one node (and device)."""
    dev = st.dev_milli[i]
    mix = ctx.model_ix[st.nodes[i].gpu_model]
    left = list(dev)
    if req.gpus:
        for j in _free_devices(st, i, req.gpus):
            left[j] = 0
        v = 1000
    elif req.gpu_milli:
        left[d] -= req.gpu_milli
        v = dev[d]
    else:
        v = 0
    before, after = ctx.measure(
        [
            (mix, tuple(sorted(dev)), st.free_cpu[i]),
            (mix, tuple(sorted(left)), st.free_cpu[i] - req.cpu_milli),
        ]
    )
    x = max(-50.0, min(50.0, (after - before) / 1000.0))
    band = math.floor(100.0 / (1.0 + math.exp(x)))
    return (-band, v, len(dev), sum(dev), st.free_cpu[i], tuple(sorted(dev)), mix, i, d)


def test_pick_is_the_best_over_every_node() -> None:
    rng = random.Random(7)
    models = ("A", "B")
    nodes = tuple(
        Node(f"n{i:03d}", models[i % 2], rng.choice((2, 4, 8)), 40960, rng.choice((32000, 64000)), 1 << 20)
        for i in range(60)
    )
    pool = ResourcePool("p", ())
    st = ClusterState(nodes, (pool,))
    # fill the cluster randomly so that node states differ
    for i in range(len(nodes)):
        for d in range(nodes[i].gpu_count):
            take = rng.choice((0, 0, 250, 500, 1000))
            if take and st.free_cpu[i] >= 2000:
                st.allocate(i, (d,), take, take * 40, 2000, 1024, 0)
    st.commit()
    shapes = [
        PodRequest(gpus=1, cpu_milli=4000),
        PodRequest(gpus=2, cpu_milli=8000),
        PodRequest(gpu_milli=250, cpu_milli=2000),
        PodRequest(gpu_milli=500, cpu_milli=6000),
        PodRequest(cpu_milli=3000),
    ]
    pending = [Workload(f"w{j}", "q", (PodGroup("main", 1 + j % 3, r),)) for j, r in enumerate(shapes)]
    running: Counter[PodShape] = Counter()
    add_shapes(running, pending[:2])
    st.frag = FragContext(st, pending, running)
    idxs = st.pool_indexes("p", ())
    scorer = FragAware()

    def ok(i: int) -> bool:
        return i % 7 != 3  # a filter that excludes some nodes

    placed = 0
    for step in range(120):
        req = shapes[step % len(shapes)]
        n0 = len(st.log)
        cands = []
        for i in range(len(nodes)):
            if not (ok(i) and st.free_cpu[i] >= req.cpu_milli and st.free_mem[i] >= req.memory_mib):
                continue
            if req.gpus:
                if st.free_whole[i] >= req.gpus:
                    cands.append(_brute_key(st, st.frag, i, -1, req))
            elif req.gpu_milli:
                for d, f in enumerate(st.dev_milli[i]):
                    if f >= req.gpu_milli and st.dev_mem[i][d] >= _mem_for(st, i, req):
                        cands.append(_brute_key(st, st.frag, i, d, req))
            else:
                cands.append(_brute_key(st, st.frag, i, -1, req))
        if req.gpus:
            got = scorer.pick_whole(st, idxs, req.gpus, req, ok)
            want = min(cands)[7] if cands else None
            assert got == want, step
            if got is not None:
                st.allocate(got, tuple(_free_devices(st, got, req.gpus)), 1000, 40960, req.cpu_milli, 0, 0)
        elif req.gpu_milli:
            pick = scorer.pick_fraction(st, idxs, req, ok)
            best = min(cands) if cands else None
            # the device with the same free milli on the same node is as good as the brute one
            assert (pick is None) == (best is None), step
            if pick is not None and best is not None:
                assert pick[0] == best[7] and st.dev_milli[pick[0]][pick[1]] == best[1], step
                m = req.gpu_milli
                st.allocate(pick[0], (pick[1],), m, _mem_for(st, pick[0], req), req.cpu_milli, 0, 0)
        else:
            got = scorer.pick_cpu(st, idxs, req, ok)
            assert got == (min(cands)[7] if cands else None), step
            if got is not None:
                st.allocate(got, (), 0, 0, req.cpu_milli, 0, 0)
        placed += len(st.log) > n0
        if step % 10 == 9:  # give some capacity back, as finishing work does
            st.rollback(max(0, len(st.log) - 4))
    assert placed > 60


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots())
def test_fragmentation_decisions_are_deterministic(snap: Snapshot) -> None:
    snap = replace(snap, config=EngineConfig(score="fragmentation"))
    d = decide(snap)
    shuffled = list(snap.pending)
    random.Random(1).shuffle(shuffled)
    assert decide(replace(snap, pending=tuple(shuffled))) == d
    eng = Engine(snap)
    assert eng.cycle(snap.pending) == d
    assert eng.cycle(snap.pending) == d


def test_a_pod_that_runs_anywhere_leaves_the_scarce_model_to_pods_pinned_there() -> None:
    """The measure weighs a shape by its demand per GPU it can run on (issue 11).

    One 8-GPU G2 node with 12 cores per GPU, one 2-GPU T4 node with plenty of CPU; four
    unpinned 16-core pods run somewhere and a T4-pinned pod waits. A 32-core unpinned pod on
    the G2 node strands CPU for the 16-core shape, so with pod-share weights (80% unpinned) the
    capacity-aware half sent it to the T4 node, taking one of the only two GPUs the pinned pods
    can use. Per GPU they can use, the pinned pods want a T4 GPU five times as much as the
    unpinned ones want any GPU: the pod goes to the G2 node."""
    nodes = (Node("g2", "G2", 8, 16384, 96000, 1 << 20), Node("t4", "T4", 2, 16384, 104000, 1 << 20))
    st = ClusterState(nodes, (ResourcePool("p", ()),))
    pinned = Workload(
        "pinned", "q", (PodGroup("main", 1, PodRequest(gpus=1, cpu_milli=4000)),), gpu_models=("T4",)
    )
    running: Counter[PodShape] = Counter()
    add_shapes(running, [Workload("free", "q", (PodGroup("main", 4, PodRequest(gpus=1, cpu_milli=16000)),))])
    st.frag = FragContext(st, [pinned], running)
    got = FragAware().pick_whole(
        st, st.pool_indexes("p", ()), 1, PodRequest(gpus=1, cpu_milli=32000), lambda i: True
    )
    assert got == 0
