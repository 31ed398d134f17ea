"""Whole-device counting: a necessary condition for placing a one-shape whole-GPU workload.

Why its own module: the preemption search (``preemption/search.py``, ``bounds.py``) and the
cost model's wait check (``preemption/victim_cost.py``) both bound their placement trials with it, and the
cost model is imported by the search.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpupool.engine.preemption.candidates import Candidate
    from gpupool.engine.state.cluster import ClusterState
    from gpupool.model import Running, Workload


class WholeSlots:
    """How many pods of a one-shape, whole-GPU workload the pool's free devices could hold, by
    count alone (a necessary condition for a placement): a preemption search checks it before
    every placement trial, and gives up at once when even evicting every candidate falls short."""

    __slots__ = ("free", "k", "n", "nodes", "st", "total")

    def __init__(self, cluster: ClusterState, k: int, n: int, nodes: list[int]) -> None:
        self.st = cluster
        self.k, self.n, self.nodes = k, n, nodes
        fw = self.st.free_whole
        self.free = {i: fw[i] for i in nodes}
        self.total = sum(f // k for f in self.free.values())

    @staticmethod
    def of(cluster: ClusterState, w: Workload, pool: str) -> WholeSlots | None:
        """The count for ``w`` in ``pool``, or None where it does not apply (several pod
        shapes, or no GPUs)."""
        if len(w.pod_groups) != 1:
            return None
        g = w.pod_groups[0]
        k = g.request.gpus
        if k <= 0:
            return None
        n = g.replicas if w.gang_min is None else min(w.gang_min, g.replicas)
        nodes = [i for ix in cluster.pool_indexes(pool, w.gpu_models) for i in ix.nodes]
        return WholeSlots(cluster, k, n, nodes)

    def could_fit_without(self, cands: list[Candidate]) -> bool:
        """Even with every candidate gone (each device it touches counted free)?"""
        return self.could_fit_after([c.running for c in cands])

    def could_fit_after(self, gone: list[Running]) -> bool:
        """Even with every workload of ``gone`` ended (each device it holds counted free)?"""
        extra: dict[int, int] = {}
        index = self.st.index
        for r in gone:
            for p in r.admission.pods:
                if p.devices:
                    i = index.get(p.node)
                    if i is not None:
                        extra[i] = extra.get(i, 0) + len(p.devices)
        nodes = self.st.nodes
        k = self.k
        got = 0
        for i, f in self.free.items():
            got += min(nodes[i].gpu_count, f + extra.get(i, 0)) // k
        return got >= self.n

    def enough(self, c: Candidate) -> bool:
        """Refresh the nodes ``c`` runs on (just discharged or charged) and compare."""
        fw, index, k, free = self.st.free_whole, self.st.index, self.k, self.free
        for p in c.running.admission.pods:
            i = index.get(p.node)
            if i is not None and i in free:
                self.total += fw[i] // k - free[i] // k
                free[i] = fw[i]
        return self.total >= self.n
