"""The controller's approvals, exceptions and cancels.

Why apart: these are the events that come from people (an approval requested or granted, an
exception window, a cancel) rather than from the scheduler; each is durable before it acts.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from gpupool.audit import AuditEntry
from gpupool.quantity import QuantityError
from gpupool.service.admission import approval_reason, exception_duration_s, is_exception
from gpupool.service.controller.context import (
    ACTIVE,
    DEFAULT_EXCEPTION_S,
    EXCEPTION_EVENT,
    SCHEDULER,
    Context,
    _dt,
)
from gpupool.service.controller.pending import PendingSet
from gpupool.store import TERMINAL_PHASES, PhaseChange, WorkloadRecord

log = logging.getLogger("gpupool.controller")


class Approvals:
    """Approval requests, exception windows and cancels (write-ahead, idempotent).

    Owns ``exceptions``: the approved exception windows, workload -> end (epoch seconds)."""

    def __init__(self, ctx: Context, pending: PendingSet) -> None:
        self.ctx = ctx
        self.pending = pending
        self.exceptions: dict[str, float] = {}

    def open_approval(self, w: WorkloadRecord, now: float) -> None:
        """Open a workload's approval request (at submit, or at recovery when a crashed submit
        left it out); if that cannot be stored, reject the workload with the reason rather than
        leave it waiting for a request nobody can see, or fail recovery for everyone."""
        try:
            self.request_approval(w, now)
        except Exception as exc:
            log.exception("recovery: cannot open the approval request of %s", w.name)
            try:
                self.ctx.store.transition_workload(
                    w.name,
                    "Rejected",
                    reason=f"its approval request could not be stored ({type(exc).__name__}); resubmit it",
                    audit=AuditEntry(
                        SCHEDULER, "workload.reject", "Workload", w.name, {"error": type(exc).__name__}
                    ),
                    at=_dt(now),
                )
            except Exception:
                log.exception("recovery: cannot reject %s either; it stays waiting", w.name)

    def request_approval(self, w: WorkloadRecord, now: float, ttl_s: float = 7 * 86400) -> None:
        why = approval_reason(w.manifest, self.ctx.bundle)
        self.ctx.store.request_approval(
            w.name,
            w.owner,
            expires_at=_dt(now + ttl_s),
            reason=why,
            audit=AuditEntry(w.owner, "approval.request", "Workload", w.name, {"reason": why}),
            at=_dt(now),
        )

    def load_exceptions(self) -> None:
        """The exception windows, from the stored events (and approvals, for a window granted
        but not yet recorded when the server stopped)."""
        store = self.ctx.store
        self.exceptions.clear()
        for w in store.list_workloads(phases=["Pending", *ACTIVE]):
            if not is_exception(w.manifest):
                continue
            for ev in store.list_events(w.name):
                if ev.reason == EXCEPTION_EVENT:
                    try:
                        self.exceptions[w.name] = float(ev.message.split("until-epoch=")[1].split()[0])
                    except (IndexError, ValueError):
                        continue
            if w.name not in self.exceptions:
                # approved, but the server died before it recorded the window: grant the default one
                for a in store.list_approvals(state="Approved", workload=w.name):
                    try:
                        dur = exception_duration_s(w.manifest) or DEFAULT_EXCEPTION_S
                    except QuantityError:
                        dur = DEFAULT_EXCEPTION_S
                    if a.decided_at is not None:
                        self.grant_exception(w.name, a.decided_at.timestamp() + dur)

    def grant_exception(self, name: str, until: float) -> None:
        with self.ctx.lock:
            iso = _dt(until).isoformat()
            self.ctx.store.add_event(
                name, "Normal", EXCEPTION_EVENT, f"exception granted until {iso} until-epoch={until}"
            )
            self.exceptions[name] = until
            self.pending.resync()

    def cancel(self, name: str, actor: str) -> tuple[WorkloadRecord, bool]:
        """Cancel (write-ahead: Cancelled is committed before the backend stops it); idempotent.
        The record, and whether this call cancelled it (False: it had already ended)."""
        ctx = self.ctx
        rec = ctx.store.get_workload(name)
        if rec.phase in TERMINAL_PHASES:
            return rec, False
        rec = ctx.store.transition_workload(
            name,
            "Cancelled",
            reason=f"cancelled by {actor}",
            audit=AuditEntry(actor, "workload.cancel", "Workload", name, {"from": rec.phase}),
            at=_dt(ctx.clock()),
        )
        ctx.backend.stop([name])
        ctx.engine.remove_running(name)
        self.pending.forget(name)
        self.exceptions.pop(name, None)
        ctx.wake.set()
        return rec, True

    def cancel_many(self, names: Sequence[str], actor: str, chunk: int = 500) -> int:
        """Cancel many workloads, one transaction per chunk (each audited); returns how many.

        Why: cancelling a large set one request at a time costs a transaction each; the write-
        ahead order is the same as ``cancel`` (Cancelled committed, then the backend stopped).
        Finished or unknown names are skipped.
        """
        ctx = self.ctx
        done = 0
        for i in range(0, len(names), chunk):
            live = [
                w
                for w in ctx.store.list_workloads(names=names[i : i + chunk])
                if w.phase not in TERMINAL_PHASES
            ]
            if not live:
                continue
            ctx.store.apply_transitions(
                [PhaseChange(w.name, "Cancelled", f"cancelled by {actor}") for w in live],
                audit=[
                    AuditEntry(actor, "workload.cancel", "Workload", w.name, {"from": w.phase}) for w in live
                ],
                at=_dt(ctx.clock()),
            )
            active = [w.name for w in live if w.phase in (*ACTIVE, "Preempted")]
            if active:
                ctx.backend.stop(active)
            for w in live:
                ctx.engine.remove_running(w.name)
                self.pending.forget(w.name)
                self.exceptions.pop(w.name, None)
            done += len(live)
        ctx.wake.set()
        return done
