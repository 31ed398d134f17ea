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
    Victim,
)
from gpupool.model import Admission, Running, Snapshot

__all__ = [
    "Admit",
    "Decisions",
    "Engine",
    "Pending",
    "PendingCode",
    "Preempt",
    "PreemptRule",
    "Victim",
    "apply_decisions",
    "decide",
]


def apply_decisions(snapshot: Snapshot, decisions: Decisions, now: float | None = None) -> Snapshot:
    """The snapshot after a backend carried the decisions out: victims gone, admissions running.

    Victims leave the snapshot (a controller requeues them as new pending work if it wants).
    """
    t = snapshot.now if now is None else now
    victims = set(decisions.victims())
    admitted = {a.workload: a for a in decisions.admitted}
    running = [r for r in snapshot.running if r.name not in victims]
    pending = []
    for w in snapshot.pending:
        a = admitted.get(w.name)
        if a is None:
            pending.append(w)
        else:
            running.append(Running(w, Admission(a.pool, a.pods, a.borrowing, t)))
    return replace(snapshot, running=tuple(running), pending=tuple(pending), now=t)
