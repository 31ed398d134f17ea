"""Hypothesis strategies: random clusters, queue trees and workloads, small enough to shrink well."""

from __future__ import annotations

from hypothesis import strategies as st

from gpupool.manifests import default_priority_classes
from gpupool.model import (
    Node,
    PodGroup,
    PodRequest,
    PoolQuota,
    PreemptionPolicy,
    Queue,
    QueueingStrategy,
    ReclaimPolicy,
    ResourcePool,
    Snapshot,
    Taint,
    Toleration,
    Topology,
    TopologyMode,
    TopologyScope,
    Workload,
    devices_only,
)

MODELS = ("A", "B")
CLASSES = default_priority_classes()


@st.composite
def clusters(draw: st.DrawFn) -> tuple[tuple[Node, ...], tuple[ResourcePool, ...]]:
    n = draw(st.integers(1, 6))
    nodes = []
    for i in range(n):
        model = draw(st.sampled_from(MODELS))
        gpus = draw(st.sampled_from((1, 2, 4, 8)))
        taints = (Taint("dedicated", "x"),) if draw(st.booleans()) and i == 0 else ()
        nodes.append(
            Node(
                f"n{i}",
                model,
                gpus,
                draw(st.sampled_from((16384, 81920))),
                draw(st.sampled_from((8000, 64000))),
                draw(st.sampled_from((65536, 524288))),
                draw(st.integers(0, 2)),
                (("pool", "p0" if model == "A" or i % 2 == 0 else "p1"),),
                taints,
                f"nvl{i // 2}",
                f"r{i // 3}",
                schedulable=draw(st.booleans()) or i > 0,
            )
        )
    pools = (
        ResourcePool(
            "p0", (("pool", "p0"),), preemptible=True, reservations=draw(st.sampled_from([1, 1, 2, 4]))
        ),
        ResourcePool("p1", (("pool", "p1"),), preemptible=draw(st.booleans())),
    )
    return tuple(nodes), pools


def _limit(draw: st.DrawFn) -> tuple[int, int, int] | None:
    v = draw(st.one_of(st.none(), st.integers(0, 16)))
    return None if v is None else devices_only(v * 1000)


@st.composite
def queue_trees(draw: st.DrawFn) -> tuple[Queue, ...]:
    queues: list[Queue] = []
    for c in range(draw(st.integers(1, 2))):
        root = f"org{c}"
        leaves = draw(st.integers(1, 3))
        guarantees = [[draw(st.integers(0, 12)) for _ in range(2)] for _ in range(leaves)]
        queues.append(
            Queue(
                root,
                quotas=tuple(
                    PoolQuota(
                        p,
                        devices_only(sum(g[k] for g in guarantees) * 1000 + draw(st.integers(0, 8)) * 1000),
                    )
                    for k, p in enumerate(("p0", "p1"))
                ),
            )
        )
        for i in range(leaves):
            pol = PreemptionPolicy(
                draw(st.sampled_from((ReclaimPolicy.NEVER, ReclaimPolicy.LOWER_PRIORITY))),
                draw(st.sampled_from(tuple(ReclaimPolicy))),
                draw(st.sampled_from((ReclaimPolicy.NEVER, ReclaimPolicy.LOWER_PRIORITY))),
            )
            lend = _limit(draw)
            if lend is not None:
                lend = devices_only(min(lend[0], guarantees[i][0] * 1000))
            queues.append(
                Queue(
                    f"{root}-q{i}",
                    parent=root,
                    weight=draw(st.sampled_from((1.0, 2.0))),
                    strategy=draw(st.sampled_from(tuple(QueueingStrategy))),
                    preemption=pol,
                    quotas=(
                        PoolQuota("p0", devices_only(guarantees[i][0] * 1000), _limit(draw), lend),
                        PoolQuota("p1", devices_only(guarantees[i][1] * 1000), _limit(draw), None),
                    ),
                )
            )
    return tuple(queues)


@st.composite
def workloads(draw: st.DrawFn, leaves: list[str], start: int, count: int) -> list[Workload]:
    out = []
    for i in range(count):
        kind = draw(st.integers(0, 3))
        if kind == 0:
            req = PodRequest(
                gpu_milli=draw(st.sampled_from((100, 250, 500, 750))),
                gpu_memory_mib=draw(st.sampled_from((0, 8192, 40000))),
                cpu_milli=1000,
                memory_mib=4096,
            )
        elif kind == 3:
            req = PodRequest(cpu_milli=2000, memory_mib=8192)
        else:
            req = PodRequest(
                gpus=draw(st.sampled_from((1, 2, 4, 8))),
                cpu_milli=draw(st.sampled_from((1000, 16000))),
                memory_mib=16384,
                rdma=draw(st.integers(0, 1)),
            )
        replicas = draw(st.integers(1, 3))
        pc = draw(st.sampled_from(CLASSES))
        topo = None
        if draw(st.integers(0, 3)) == 0:
            topo = Topology(
                draw(st.sampled_from(tuple(TopologyScope))), draw(st.sampled_from(tuple(TopologyMode)))
            )
        out.append(
            Workload(
                f"w{start + i}",
                draw(st.sampled_from(leaves)),
                (PodGroup("main", replicas, req),),
                pc.name,
                pc.value,
                pc.preemptible,
                gpu_models=draw(st.sampled_from(((), ("A",), ("B",)))),
                gang_min=draw(st.one_of(st.none(), st.integers(1, replicas))),
                topology=topo,
                tolerations=(Toleration("dedicated"),) if draw(st.booleans()) else (),
                arrival=float(start + i),
            )
        )
    return out


@st.composite
def snapshots(draw: st.DrawFn) -> Snapshot:
    nodes, pools = draw(clusters())
    queues = draw(queue_trees())
    leaves = [q.name for q in queues if q.parent is not None]
    pending = draw(workloads(leaves, 0, draw(st.integers(1, 14))))
    return Snapshot(nodes, pools, queues, CLASSES, tuple(pending))
