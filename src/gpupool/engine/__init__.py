"""The scheduling engine: ``decide(snapshot) -> Decisions``, pure and deterministic."""

from __future__ import annotations

from dataclasses import replace

from gpupool.engine.core import Engine, decide
from gpupool.engine.decisions import (
    Admit,
    Decisions,
    Pending,
    PendingCode,
    Preempt,
    PreemptRule,
    Shrink,
    Victim,
)
from gpupool.model import Admission, PodPlacement, Running, Snapshot

__all__ = [
    "Admit",
    "Decisions",
    "Engine",
    "Pending",
    "PendingCode",
    "Preempt",
    "PreemptRule",
    "Shrink",
    "Victim",
    "apply_decisions",
    "decide",
]


def apply_decisions(snapshot: Snapshot, decisions: Decisions, now: float | None = None) -> Snapshot:
    """The snapshot after a backend carried the decisions out: victims gone, admissions running.

    Victims leave the snapshot (a controller requeues them as new pending work if it wants);
    a shrunk elastic gang keeps running without the pods it lost.
    """
    t = snapshot.now if now is None else now
    victims = set(decisions.victims())
    gone = {s.workload: set(s.pods) for s in decisions.shrinks()}
    admitted = {a.workload: a for a in decisions.admitted}
    running = [_without(r, gone.get(r.name)) for r in snapshot.running if r.name not in victims]
    moved = {m.workload: m for m in decisions.moved}  # consolidation: restarted where reserved
    running = [
        Running(r.workload, replace(r.admission, pods=moved[r.name].pods, admitted_at=t))
        if r.name in moved
        else r
        for r in running
    ]
    pending = []
    for w in snapshot.pending:
        a = admitted.get(w.name)
        if a is None:
            pending.append(w)
        else:
            running.append(Running(w, Admission(a.pool, a.pods, a.borrowing, t)))
    return replace(snapshot, running=tuple(running), pending=tuple(pending), now=t)


def _without(r: Running, pods: set[PodPlacement] | None) -> Running:
    """``r`` less the pods a shrink took (``r`` itself when none)."""
    if not pods:
        return r
    return Running(r.workload, replace(r.admission, pods=tuple(p for p in r.admission.pods if p not in pods)))
