"""The state every part of the engine works on, in one object handed to each part (KAI's
session: the snapshot's state, one ``Statement`` over it, and what the current cycle knows).

Why one object: the parts (``Attempt``, ``Preemptor``, ``PartialAdmitter``, ``BlockedHints``,
...) each read and change the same cluster, quota tree and running set, inside the same
transaction. Each part is given the session when it is made and reads only what it needs; none
of them reaches back into ``Engine``. The session lives as long as the engine (an incremental
caller reuses it over many cycles); ``begin`` gives it a fresh ``CycleState`` per cycle.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from gpupool.engine.decisions import Admit, Decisions
from gpupool.engine.placement import Placer
from gpupool.engine.state.cluster import ClusterState
from gpupool.engine.state.cycle import CycleState
from gpupool.engine.state.quota import QuotaState
from gpupool.engine.state.running import RunningSet, vec_of
from gpupool.engine.state.statement import Statement
from gpupool.model import (
    Admission,
    EngineConfig,
    PodPlacement,
    ResourcePool,
    Running,
    Snapshot,
    Workload,
)


class Session:
    """Cluster, quota tree and running set under one ``Statement``, the snapshot's fixed facts
    (config, pools, the queue tree's leaves), the clock, and the current ``CycleState``."""

    __slots__ = (
        "cluster",
        "config",
        "cs",
        "leaf",
        "leaves_of_root",
        "now",
        "placer",
        "pools",
        "quota",
        "runs",
        "stmt",
    )

    def __init__(self, snapshot: Snapshot) -> None:
        self.config: EngineConfig = snapshot.config
        self.cluster = ClusterState(snapshot.nodes, snapshot.pools)
        self.quota = QuotaState(snapshot.queues, [p.name for p in snapshot.pools], self.cluster.capacity)
        self.placer = Placer(self.cluster, snapshot.config.score)
        self.pools: dict[str, ResourcePool] = {p.name: p for p in snapshot.pools}
        self.runs = RunningSet()
        self.stmt = Statement(self.cluster, self.quota, self.runs)
        #: is the queue a leaf (only leaves take workloads)
        self.leaf: dict[str, bool] = {q: not kids for q, kids in self.quota.children.items()}
        #: the leaf queues under each cohort root (where preemption looks for victims)
        self.leaves_of_root: dict[str, list[str]] = {}
        for qn, is_leaf in self.leaf.items():
            if is_leaf:
                self.leaves_of_root.setdefault(self.quota.root[qn], []).append(qn)
        self.now = snapshot.now
        #: what the current (or last) cycle knows; replaced by every ``begin``
        self.cs = CycleState(frozenset(), None, self.runs.fresh, {})

    def begin(
        self, blocked: frozenset[str] | set[str], more: Callable[[Workload], Workload | None] | None
    ) -> CycleState:
        """A cycle starts: open the statement and start a fresh ``CycleState``."""
        self.stmt.open()
        self.cs = CycleState(blocked, more, self.runs.fresh, dict(self.quota.U))
        return self.cs

    def charge(self, r: Running) -> None:
        """``r`` runs: its pods take their devices, its queue its quota (nodes and pools the
        snapshot does not know are left out: the work still counts as running)."""
        for p in r.admission.pods:
            if p.node in self.cluster.index:
                self.cluster.allocate_pod(p)
        if r.workload.queue in self.quota.queues and r.admission.pool in self.pools:
            self.quota.add(r.workload.queue, r.admission.pool, r.admission.quota_vec())
        self.runs.set(r.name, r)

    def discharge(self, r: Running) -> None:
        """``r`` no longer runs: the exact reverse of ``charge``."""
        self.free_for_trial(r)
        self.runs.set(r.name, None)

    def free_for_trial(self, r: Running) -> None:
        """``r``'s devices and quota are freed for a trial that reads only cluster and quota
        (a placement and a quota check, then a rollback): ``discharge`` without the running
        set, whose indexes cost as much again to update and to undo. Why: the wait check
        (``victim_cost``) frees every workload about to end before one trial, dozens each time
        on long-running traces."""
        for p in r.admission.pods:
            if p.node in self.cluster.index:
                self.cluster.release_pod(p)
        if r.workload.queue in self.quota.queues and r.admission.pool in self.pools:
            self.quota.remove(r.workload.queue, r.admission.pool, r.admission.quota_vec())

    def discharge_part(self, part: Running) -> None:
        """Some pods of a running workload (``part``) no longer run; it keeps the others (an
        elastic shrink, ``preemption/shrink.py``). Its last pods gone, it no longer runs."""
        for p in part.admission.pods:
            if p.node in self.cluster.index:
                self.cluster.release_pod(p)
        if part.workload.queue in self.quota.queues and part.admission.pool in self.pools:
            self.quota.remove(part.workload.queue, part.admission.pool, part.admission.quota_vec())
        cur = self.runs.by_name[part.name]
        gone = set(part.admission.pods)
        left = tuple(p for p in cur.admission.pods if p not in gone)
        self.runs.set(part.name, Running(cur.workload, replace(cur.admission, pods=left)) if left else None)

    def charge_part(self, part: Running, full: Running) -> None:
        """The reverse of ``discharge_part``: ``part``'s pods run again, in ``full``'s order
        (all of them back: ``full`` itself runs again)."""
        for p in part.admission.pods:
            if p.node in self.cluster.index:
                self.cluster.allocate_pod(p)
        if part.workload.queue in self.quota.queues and part.admission.pool in self.pools:
            self.quota.add(part.workload.queue, part.admission.pool, part.admission.quota_vec())
        cur = self.runs.by_name.get(part.name)
        have = set(part.admission.pods) | (set(cur.admission.pods) if cur is not None else set())
        pods = tuple(p for p in full.admission.pods if p in have)
        whole = len(pods) == len(full.admission.pods)
        self.runs.set(
            part.name, full if whole else Running(full.workload, replace(full.admission, pods=pods))
        )

    def admit(
        self, w: Workload, pool: str, pods: tuple[PodPlacement, ...], borrowing: bool, out: Decisions
    ) -> None:
        """Charge and record ``w``'s admission with ``pods`` (fewer than it asks for, when partial)."""
        self.quota.add(w.queue, pool, vec_of(pods))
        self.runs.admit(Running(w, Admission(pool, pods, borrowing, self.now)))
        why = "borrowing idle quota from the cohort" if borrowing else "within guarantee"
        part = f" with {len(pods)} of {w.pod_count} pods" if len(pods) < w.pod_count else ""
        out.admitted.append(
            Admit(w.name, w.queue, pool, pods, borrowing, f"admitted to pool {pool}{part}, {why}")
        )
