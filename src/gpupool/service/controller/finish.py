"""The controller's finishing side: runs the backend reports done, and windows that expire.

Why apart: both end a workload's hold on its devices outside the engine's decisions (a run
finishes or fails; an approval or an exception window runs out), each durably and audited.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from gpupool.audit import AuditEntry
from gpupool.service.controller.approvals import Approvals
from gpupool.service.controller.context import ACTIVE, SCHEDULER, Context, _dt
from gpupool.service.controller.pending import PendingSet
from gpupool.service.failures.policy import Fault
from gpupool.service.failures.record import record_failures
from gpupool.store import NotFound, PhaseChange, WorkloadRecord


def _ended(ended_at: float | None, now: float) -> float | None:
    """The run's own end when the backend knows it and it is before now (a run that ended
    while the controller was down, or between two polls); None otherwise."""
    return ended_at if ended_at is not None and ended_at < now else None


def _ended_detail(ended_at: float | None, now: float) -> dict[str, Any]:
    at = _ended(ended_at, now)
    return {} if at is None else {"endedAt": datetime.fromtimestamp(at, UTC).isoformat()}


class Finishing:
    """Finished and failed runs, expired approvals and exception windows.

    No state of its own: it ends runs in the store, the engine and the backend, the exception
    windows of ``approvals``, and requeues failed work into ``pending``."""

    def __init__(self, ctx: Context, pending: PendingSet, approvals: Approvals) -> None:
        self.ctx = ctx
        self.pending = pending
        self.approvals = approvals

    def process_finished(self, now: float) -> int:
        """Record the runs the backend reports ended; how many changed phase."""
        ctx = self.ctx
        done = ctx.backend.poll(now)
        if not done:
            return 0
        changes, audits, forget = [], [], []
        failed: list[tuple[WorkloadRecord, Fault]] = []
        for r in done:
            try:
                rec = ctx.store.get_workload(r.name)
            except NotFound:
                forget.append(r.name)
                continue
            if rec.phase in ACTIVE and r.outcome == "Failed":  # retried by its policy
                fault = Fault(r.reason or "Error", r.message or "the run failed", r.exit_code)
                fault = replace(fault, ended_at=_ended(r.ended_at, now))
                failed.append((rec, fault))
                forget.append(r.name)
                continue
            if rec.phase in ACTIVE:
                outcome = r.outcome or "Succeeded"
                changes.append(PhaseChange(r.name, outcome, r.message))
                audits.append(
                    AuditEntry(
                        SCHEDULER,
                        "workload.finish",
                        "Workload",
                        r.name,
                        {"outcome": outcome, "message": r.message} | _ended_detail(r.ended_at, now),
                    )
                )
                ctx.hooks.on_finish(rec.queue, outcome)
            forget.append(r.name)
        if changes:
            ctx.store.apply_transitions(changes, audit=audits, at=_dt(now))
        record_failures(ctx, self.pending.queue_again, failed, now)
        for n in forget:
            ctx.engine.remove_running(n)
            self.approvals.exceptions.pop(n, None)
            if n not in self.pending.pending:
                ctx.faults.hints.pop(n, None)
        ctx.backend.forget(forget)
        return len(changes) + len(failed)

    def expire(self, now: float) -> None:
        """End the approval requests and the exception windows that are due."""
        ctx = self.ctx
        expired = ctx.store.expire_approvals(at=_dt(now))
        if expired:
            self.pending.resync_due = True
        exceptions = self.approvals.exceptions
        ended = [n for n, until in exceptions.items() if until <= now]
        if not ended:
            return
        active = [n for n in ended if n in ctx.engine.running]
        for n in ended:
            exceptions.pop(n, None)
        if active:
            ctx.store.apply_transitions(
                [PhaseChange(n, "Preempted", "its approved exception window ended") for n in active],
                audit=[
                    AuditEntry(
                        SCHEDULER, "workload.exception-expired", "Workload", n, {"reason": "window ended"}
                    )
                    for n in active
                ],
                at=_dt(now),
            )
            ctx.backend.stop(active)
            for n in active:
                ctx.engine.remove_running(n)
            ctx.requeue(active, "requeued: its exception window ended", now)
            self.pending.resync_due = True
