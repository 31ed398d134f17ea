"""Small clusters for the engine's unit tests: named nodes of 8 GPUs in one pool, and flat or
nested queues with GPU guarantees."""

from __future__ import annotations

from gpupool.engine import Engine
from gpupool.model import (
    Admission,
    EngineConfig,
    Node,
    PodGroup,
    PodPlacement,
    PodRequest,
    PoolQuota,
    Queue,
    ResourcePool,
    Running,
    Snapshot,
    Workload,
    devices_only,
)

POOL = ResourcePool("p0", (("pool", "p0"),))


def nodes(n: int, gpus: int = 8) -> tuple[Node, ...]:
    return tuple(Node(f"n{i}", "A", gpus, 81920, 64000, 524288, labels=(("pool", "p0"),)) for i in range(n))


def queues(guarantees: dict[str, int], root_gpus: int = 100) -> tuple[Queue, ...]:
    """A cohort root and one leaf per entry with that many GPUs guaranteed."""
    out = [Queue("root", quotas=(PoolQuota("p0", devices_only(root_gpus * 1000)),))]
    out += [
        Queue(q, parent="root", quotas=(PoolQuota("p0", devices_only(g * 1000)),))
        for q, g in guarantees.items()
    ]
    return tuple(out)


def job(
    name: str, queue: str, gpus: int, *, replicas: int = 1, prio: int = 0, t: float = 0.0, **kw: object
) -> Workload:
    req = PodRequest(gpus=gpus, cpu_milli=1000, memory_mib=1024)
    return Workload(name, queue, (PodGroup("main", replicas, req),), "c", prio, True, arrival=t, **kw)  # type: ignore[arg-type]


def running(w: Workload, node: str, devices: tuple[int, ...], at: float = 0.0) -> Running:
    """``w`` (one pod) running on ``devices`` of ``node`` since ``at``."""
    pod = PodPlacement("main", 0, node, devices, 1000, 81920, 1000, 1024)
    return Running(w, Admission("p0", (pod,), False, at))


def engine(
    n_nodes: int = 1,
    guarantees: dict[str, int] | None = None,
    config: EngineConfig | None = None,
    **kw: object,
) -> Engine:
    snap = Snapshot(
        nodes(n_nodes), (POOL,), queues(guarantees or {"a": 8}), config=config or EngineConfig(), **kw
    )  # type: ignore[arg-type]
    return Engine(snap)
