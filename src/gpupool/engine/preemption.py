"""Preemption: who may be evicted for a workload, in which order, and the cheap bounds a search
checks before any placement trial.

The order is one function, ``candidate_order``, as in Kueue's
``pkg/scheduler/preemption/common/ordering.go`` (``CandidatesOrdering``): the candidate search
(``Engine.preemption_candidates``) collects the legal victims and sorts them by it; nothing else
decides who goes first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpupool.engine.decisions import PreemptRule
from gpupool.model import Running, Workload

if TYPE_CHECKING:
    from gpupool.engine.state import ClusterState


def candidate_order(victim: Running, preemptor_queue: str) -> tuple[int, int, float, str]:
    """Sort key of a preemption candidate: the smallest key is evicted first.

    1. Work of *other* queues (reclaimed or borrowed capacity) before work of the preemptor's own
       queue: taking back what others borrow leaves the preemptor's queue its own work (Kueue's
       criterion "other ClusterQueues first").
    2. Lower priority first: the least important work goes.
    3. Most recently admitted first: it has lost the least progress.
    4. The name: a total order, so the choice never depends on how the candidates were found.
    """
    v = victim.workload
    return (int(v.queue == preemptor_queue), v.priority, -victim.admission.admitted_at, v.name)


@dataclass(slots=True)
class Candidate:
    """A running workload that may be evicted for ``preemptor`` in ``pool``, and by which rule."""

    running: Running
    rule: PreemptRule
    preemptor: Workload
    pool: str
    cohort: str

    @property
    def reason(self) -> str:
        """Why this victim (formatted only for victims actually chosen)."""
        w, v = self.preemptor, self.running.workload
        if self.rule is PreemptRule.WITHIN_QUEUE:
            return f"preempted by {w.name} (priority {w.priority} > {v.priority}) within queue {w.queue}"
        if self.rule is PreemptRule.RECLAIM:
            return f"queue {w.queue} reclaims its guarantee in pool {self.pool}; queue {v.queue} is borrowing"
        return (
            f"preempted by {w.name} (priority {w.priority} > {v.priority}) borrowing in cohort {self.cohort}; "
            f"queue {v.queue} is borrowing"
        )


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
        extra: dict[int, int] = {}
        index = self.st.index
        for c in cands:
            for p in c.running.admission.pods:
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
