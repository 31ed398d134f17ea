"""The fragmentation experiment with gpupool's real scheduling engine as the placer.

Why: the published-table policies run in the benchmark's own vectorised simulator; this runs
the same arrivals through ``gpupool.engine.Engine`` (one cycle per arriving pod, incremental
state), so the figure is that of the placement the product actually ships.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gpupool.engine import Engine
from gpupool.fragbench.sim import MILLI, Cluster, PodTable, sample_arrivals
from gpupool.fragbench.trace import Node as TraceNode
from gpupool.fragbench.trace import Pod
from gpupool.model import (
    NO_LIMIT,
    EngineConfig,
    Node,
    PodGroup,
    PodRequest,
    PoolQuota,
    Queue,
    ResourcePool,
    Snapshot,
    Workload,
)

#: engine score plugins the experiment can run, as policy names "engine-<score>"; "engine-default"
#: is the engine's default configuration (what a pool without a placement setting gets)
ENGINE_POLICIES = ("engine-default", "engine-binpack", "engine-fragmentation")


def engine_snapshot(nodes: Sequence[TraceNode], score: str) -> Snapshot:
    """One pool over all trace nodes, one queue with unlimited quota: only placement decides
    (``score`` "default": the engine's default score plugin)."""
    if score == "default":
        score = EngineConfig().score
    ns = tuple(
        Node(n.name, n.model, n.num_gpu, 1 << 20, n.cpu_milli, n.memory_mib, labels=(("all", "1"),))
        for n in nodes
    )
    pool = ResourcePool("all", (("all", "1"),))
    queue = Queue("q", quotas=(PoolQuota("all", NO_LIMIT),))
    return Snapshot(ns, (pool,), (queue,), config=EngineConfig(score=score, reserve=False, preempt="none"))


def _workload(i: int, p: Pod) -> Workload:
    if p.num_gpu == 1 and p.gpu_milli < MILLI:
        req = PodRequest(gpu_milli=p.gpu_milli, cpu_milli=p.cpu_milli, memory_mib=p.memory_mib)
    else:
        req = PodRequest(gpus=p.num_gpu, cpu_milli=p.cpu_milli, memory_mib=p.memory_mib)
    return Workload(
        f"p{i}", "q", (PodGroup("main", 1, req),), gpu_models=tuple(sorted(p.gpu_spec)), arrival=float(i)
    )


def simulate_seed_engine(
    nodes: Sequence[TraceNode], pods: Sequence[Pod], table: PodTable, cluster: Cluster, seed: int, score: str
) -> tuple[float, int]:
    """Allocation ratio (percent) at 100% arrival with the engine placing, and pods skipped."""
    rng = np.random.default_rng(seed)
    capacity = cluster.gpu_capacity_milli
    arrivals = sample_arrivals(table, capacity, rng)
    eng = Engine(engine_snapshot(nodes, score))
    arrived = allocated = skipped = 0
    for n, idx in enumerate(arrivals):
        p = pods[int(idx)]
        arrived += p.num_gpu * p.gpu_milli
        w = _workload(n, p)
        d = eng.cycle([w], float(n))
        if d.admitted:
            eng.apply(d, [w], float(n))
            allocated += p.num_gpu * p.gpu_milli
        else:
            skipped += 1
        if arrived >= capacity:
            break
    return 100.0 * allocated / capacity, skipped
