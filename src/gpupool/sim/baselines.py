"""The policies a simulation compares, and the first-fit scorer the no-scheduler baseline needs.

Why a module of its own: the baselines are not gpupool. They map other schedulers' behaviour
onto the unchanged engine (a config, and for FIFO a queue layout), so the event loop and the
window planner never test which policy runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpupool.engine.placement import SCORERS, NodeFilter, register_scorer
from gpupool.engine.scoring import fits_node, pick_cpu_only
from gpupool.engine.state.cluster import ClusterState, PoolIndex
from gpupool.model import EngineConfig, PodRequest


class FirstFit:
    """Score plugin for the no-scheduler baseline: the first node (in cluster order) that fits."""

    name = "first-fit"

    def pick_whole(
        self, st: ClusterState, idxs: list[PoolIndex], k: int, req: PodRequest, ok: NodeFilter
    ) -> int | None:
        best: int | None = None
        for ix in idxs:
            for i in ix.nodes:
                if best is not None and i >= best:
                    break
                if st.free_whole[i] >= k and fits_node(st, i, req) and ok(i):
                    best = i
                    break
        return best

    def pick_fraction(
        self, st: ClusterState, idxs: list[PoolIndex], req: PodRequest, ok: NodeFilter
    ) -> tuple[int, int] | None:
        m = req.gpu_milli
        best: tuple[int, int] | None = None
        for ix in idxs:
            for i in ix.nodes:
                if best is not None and i >= best[0]:
                    break
                if not (fits_node(st, i, req) and ok(i)):
                    continue
                mem = req.gpu_memory_mib or m * st.nodes[i].gpu_memory_mib // 1000
                for d, free in enumerate(st.dev_milli[i]):
                    if free >= m and st.dev_mem[i][d] >= mem:
                        best = (i, d)
                        break
                if best is not None and best[0] == i:
                    break
        return best

    def pick_cpu(
        self, st: ClusterState, idxs: list[PoolIndex], req: PodRequest, ok: NodeFilter
    ) -> int | None:
        return pick_cpu_only(st, idxs, req, ok)


if "first-fit" not in SCORERS:  # registered once, even if this module is imported again
    register_scorer(FirstFit())


@dataclass(frozen=True, slots=True)
class Policy:
    """How one policy maps onto the engine: its config, and whether it replaces the queues."""

    name: str
    config: EngineConfig
    #: one StrictFIFO queue over the whole cluster, no priorities (a cluster without a scheduler)
    single_fifo_queue: bool = False

    @staticmethod
    def named(name: str) -> Policy:
        """The policy a scenario names in ``spec.policies``."""
        if name == "fifo-first-fit":
            config = EngineConfig(score="first-fit", reserve=False, preempt="none")
            return Policy(name, config, single_fifo_queue=True)
        if name == "kueue-like":
            return Policy(name, EngineConfig(score="spread", one_head_per_queue=True, reserve=False))
        if name == "gpupool":
            return Policy(name, EngineConfig())
        if name == "gpupool-no-preemption":
            return Policy(name, EngineConfig(preempt="none"))
        if name == "gpupool-eager-preemption":  # preemption without its cost model (the old rule)
            return Policy(name, EngineConfig(preemption_cost=False))
        raise ValueError(f"unknown policy {name!r}")
