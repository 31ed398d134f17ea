"""``feasible.unsatisfiable``: a workload the pool can never host as it is now (issue 29: one
unhealthy GPU left 62 of 64 idle behind a StrictFIFO head, whose reason held nodes "when running
work ends" with nothing running)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.engine import Engine
from gpupool.engine.decisions import PendingCode
from gpupool.engine.feasible import unsatisfiable
from gpupool.model import QueueingStrategy, Snapshot, Topology, TopologyMode, TopologyScope
from tests.engine.clusters import POOL, engine, job, nodes, queues, running


def _strict(n_nodes: int) -> Engine:
    qs = tuple(
        replace(q, strategy=QueueingStrategy.STRICT_FIFO) if q.name == "a" else q
        for q in queues({"a": 8 * n_nodes + 8}, root_gpus=8 * n_nodes + 8)
    )
    return Engine(Snapshot(nodes(n_nodes), (POOL,), qs))


def test_one_unhealthy_gpu_makes_a_whole_pool_gang_unsatisfiable_and_it_does_not_block() -> None:
    eng = _strict(8)
    eng.withhold_devices({"n0": {5: "XID 79"}})
    big = job("big", "a", 8, replicas=8, t=0.0)
    small = job("small", "a", 1, t=1.0)
    d = eng.cycle([big, small], now=0.0)
    why = {p.workload: p for p in d.pending}
    assert why["big"].code is PendingCode.UNSATISFIABLE
    assert "7 node(s) there have 8 healthy GPUs" in why["big"].reason
    assert "n0 GPU 5 (XID 79)" in why["big"].reason and "holding" not in why["big"].reason
    assert [a.workload for a in d.admitted] == ["small"]  # the queue is not blocked behind it
    assert not eng.placer.holds  # no nodes held for a workload nothing can free room for


def test_the_same_gang_runs_when_every_gpu_is_healthy() -> None:
    eng = _strict(8)
    d = eng.cycle([job("big", "a", 8, replicas=8)], now=0.0)
    assert [a.workload for a in d.admitted] == ["big"]


def test_a_head_that_waits_for_running_work_still_blocks_a_strict_queue() -> None:
    eng = _strict(8)
    eng.add_running(running(job("r", "a", 1), "n0", (0,)))
    d = eng.cycle([job("big", "a", 8, replicas=8), job("small", "a", 1, t=1.0)], now=0.0)
    why = {p.workload: p.code for p in d.pending}
    assert why == {"big": PendingCode.CAPACITY, "small": PendingCode.BLOCKED}


def test_a_required_rack_smaller_than_the_gang_is_unsatisfiable() -> None:
    eng = engine(2, {"a": 16})
    rack = Topology(TopologyScope.NODE, TopologyMode.REQUIRED)
    w = job("w", "a", 8, replicas=2, topology=rack)
    got = unsatisfiable(w, "p0", eng.cluster, eng.placer.node_filter(w))
    assert got is not None and "16 GPUs in one node" in got and "largest there has 8" in got


@settings(max_examples=60, deadline=None)
@given(
    n_nodes=st.integers(1, 4),
    gpus=st.integers(1, 8),
    replicas=st.integers(1, 6),
    bad=st.sets(st.tuples(st.integers(0, 3), st.integers(0, 7)), max_size=6),
)
def test_never_hopeless_when_an_empty_pool_would_admit_it(
    n_nodes: int, gpus: int, replicas: int, bad: set[tuple[int, int]]
) -> None:
    """The check uses necessary conditions only: whatever it calls hopeless, an empty pool with
    the same unhealthy devices does not admit either."""
    eng = engine(n_nodes, {"a": 64})
    eng.withhold_devices({f"n{i}": {d: "x"} for i, d in bad if i < n_nodes})
    w = job("w", "a", gpus, replicas=replicas)
    hopeless = unsatisfiable(w, "p0", eng.cluster, eng.placer.node_filter(w))
    admitted = bool(eng.cycle([w], now=0.0).admitted)
    if hopeless is not None:
        assert not admitted, hopeless
    elif replicas * gpus <= 64:
        # not hopeless and within quota: an empty pool places it unless devices are missing
        assert admitted or sum(1 for i, _ in bad if i < n_nodes) > 0


def test_a_request_larger_than_the_pool_is_unsatisfiable_not_waiting_for_quota() -> None:
    """One 8-GPU host, an approved 2x8-GPU job: it said "capacity 8, in use 5, requested 16;
    3 idle" (QuotaExceeded), as if it could still run."""
    eng = Engine(Snapshot(nodes(1), (POOL,), queues({"a": 8}, root_gpus=8)))  # the quota refuses first
    eng.add_running(running(job("r", "a", 5), "n0", (0, 1, 2, 3, 4)))
    d = eng.cycle([job("two", "a", 8, replicas=2)], now=0.0)
    (p,) = d.pending
    assert p.code is PendingCode.UNSATISFIABLE, p
    assert "requests 16 GPUs and the pool has 8 healthy in all" in p.reason


def test_a_pool_that_takes_only_some_task_types_refuses_the_others() -> None:
    """spec.allowedTaskTypes (issue 29, the catalog's "allowed task types"): an inference pool
    takes inference only; training goes to the other pool, and a training job that names the
    inference pool waits saying why."""
    from gpupool.model import (
        PodGroup,
        PodRequest,
        PoolQuota,
        Queue,
        ResourcePool,
        Workload,
        WorkloadType,
        devices_only,
    )

    inf = ResourcePool("inf", (("pool", "p0"),), allowed_types=("inference",))
    train = ResourcePool("train", (("pool", "p1"),))
    ns = nodes(1) + tuple(replace(n, name="m0", labels=(("pool", "p1"),)) for n in nodes(1))
    q = Queue("a", quotas=(PoolQuota("inf", devices_only(8000)), PoolQuota("train", devices_only(8000))))
    eng = Engine(Snapshot(ns, (inf, train), (q,)))
    req = PodRequest(gpus=1, cpu_milli=100, memory_mib=64)

    def wl(name: str, t: WorkloadType, pool: str | None = None) -> Workload:
        return Workload(name, "a", (PodGroup("main", 1, req),), "c", 0, True, type=t, pool=pool)

    d = eng.cycle(
        [
            wl("srv", WorkloadType.INFERENCE),
            wl("tr", WorkloadType.TRAINING),
            wl("pin", WorkloadType.TRAINING, "inf"),
        ],
        now=0.0,
    )
    placed = {a.workload: a.pool for a in d.admitted}
    assert placed == {"srv": "inf", "tr": "train"}
    (p,) = d.pending
    assert (
        p.code is PendingCode.NO_POOL and "pool inf takes task types inference only, not training" in p.reason
    )


def test_a_device_withheld_after_a_cycle_makes_the_remembered_answer_new() -> None:
    """The answer is remembered per pool and shape across cycles (``feasible.Unsatisfiable``):
    a device withheld later must still turn a waiting gang unsatisfiable."""
    eng = _strict(8)
    eng.add_running(running(job("r", "a", 1), "n0", (0,)))
    big = job("big", "a", 8, replicas=8)
    first = eng.cycle([big], now=0.0)
    assert [p.code for p in first.pending] == [PendingCode.CAPACITY]  # waits for r: satisfiable
    eng.withhold_devices({"n1": {3: "XID 79"}})
    again = eng.cycle([big], now=1.0)
    assert [p.code for p in again.pending] == [PendingCode.UNSATISFIABLE]
    assert "n1 GPU 3 (XID 79)" in again.pending[0].reason
