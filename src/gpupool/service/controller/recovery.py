"""The controller's recovery: make store, backend and engine agree after a (possibly unclean)
stop, and a standby's read-only view.

Why apart: recovery is the other half of the write-ahead commit (gpupool.service.controller.commit):
it finishes whatever a kill -9 interrupted, in an order that never runs a workload twice.
"""

from __future__ import annotations

import logging

from gpupool.audit import AuditEntry
from gpupool.manifests import Bundle
from gpupool.manifests.convert import running_from_json
from gpupool.model import Running
from gpupool.service.adoption import Adoption
from gpupool.service.controller.approvals import Approvals
from gpupool.service.controller.commit import Commit
from gpupool.service.controller.config import Configuration
from gpupool.service.controller.context import ACTIVE, SCHEDULER, Context, _dt
from gpupool.service.controller.pending import PendingSet
from gpupool.service.failures.nodes import fault_evictions, unhealthy_devices
from gpupool.service.failures.record import load_holds
from gpupool.store import PhaseChange

log = logging.getLogger("gpupool.controller")


class Recovery:
    """Recovery after a restart (or a new leader), and the standby's view.

    No state of its own: it reconciles the store and the backend, then rebuilds the other
    parts' state (the engine through ``config``, the pending set, approvals and exceptions,
    the runs ``adoption`` holds for their workloads)."""

    def __init__(
        self,
        ctx: Context,
        *,
        pending: PendingSet,
        config: Configuration,
        commit: Commit,
        approvals: Approvals,
        adoption: Adoption,
    ) -> None:
        self.ctx = ctx
        self.pending = pending
        self.config = config
        self.commit = commit
        self.approvals = approvals
        self.adoption = adoption

    def load_view(self) -> None:
        """A standby's view: the configuration and the stored placements, from the store alone.

        Why: a standby answers reads (nodes, quota, authorization by queue subtree) from this
        view, but must neither reconcile the backend nor write (the leader does both)."""
        ctx = self.ctx
        bundle = self.config.load(self.config.manifests())
        running = [
            running_from_json(ctx.model_of(w.manifest, w.seq, bundle), w.placement)
            for w in ctx.store.list_workloads(phases=list(ACTIVE))
            if w.placement
        ]
        with ctx.lock:
            self.config.install(bundle, running)

    def recover(self) -> None:
        """Make store, backend and engine agree again after a (possibly unclean) stop (the
        caller holds the lock)."""
        ctx = self.ctx
        store, backend = ctx.store, ctx.backend
        manifests = self.config.manifests()
        ctx.faults.unhealthy, ctx.faults.reported = unhealthy_devices(manifests), {}
        bundle = self.config.load(manifests)
        ctx.bundle = bundle
        backend.set_nodes(bundle.nodes)
        runs = backend.runs()
        now = ctx.clock()
        # 1. evictions decided but maybe not carried out: stop first, so nothing overlaps
        preempted = store.list_workloads(phases=["Preempted"])
        if preempted:
            backend.stop([w.name for w in preempted])
            ctx.requeue([w.name for w in preempted], "requeued after preemption (recovered)", now)
        active = {w.name: w for w in store.list_workloads(phases=list(ACTIVE))}
        # 2. the backend runs something the store does not consider active: stop it
        stray = [n for n in runs if n not in active]
        stray = self.adoption.hold(backend, stray, runs, now)  # what the cluster vouches for waits
        if stray:
            backend.stop(stray)
        # 3. the store says Running but the backend has no trace: the run was lost, requeue it
        lost = [w.name for w in active.values() if w.phase == "Running" and w.name not in runs]
        if lost:
            store.apply_transitions(
                [
                    PhaseChange(n, "Preempted", "lost by the backend while the controller was down")
                    for n in lost
                ],
                audit=[
                    AuditEntry(SCHEDULER, "workload.lost", "Workload", n, {"reason": "backend has no run"})
                    for n in lost
                ],
                at=_dt(now),
            )
            ctx.requeue(lost, "requeued: the backend lost the run", now)
            for n in lost:
                active.pop(n)
        # 4. admitted but maybe never started: start now (idempotent), then mark Running
        self.commit.start_in_backend([w for w in active.values() if w.phase == "Admitted"], now)
        # 5. the engine charges exactly what is admitted or running
        running = self._stored_running(bundle, now)
        ctx.faults.down = ctx.backend_down(now)
        self.config.install(
            bundle, fault_evictions(ctx, self.pending.queue_again, bundle.nodes, running, now)
        )
        # 6. approvals opened by a submit that crashed before requesting one
        for w in store.list_workloads(phases=["AwaitingApproval"]):
            if not store.list_approvals(state="Pending", workload=w.name):
                self.approvals.open_approval(w, now)
        self.approvals.load_exceptions()
        self.pending.pending.clear()
        self.pending.resync_due = True
        self.pending.sync(now)
        load_holds(ctx, self.pending.stored_reasons, now)

    def _stored_running(self, bundle: Bundle, now: float) -> list[Running]:
        """The admitted placements as the engine's running set; one unreadable row never stops
        recovery: its workload is stopped and requeued with the reason (its devices are then
        free in both the backend and the engine)."""
        ctx = self.ctx
        out: list[Running] = []
        bad: list[str] = []
        for w in ctx.store.list_workloads(phases=list(ACTIVE)):
            if not w.placement:
                continue
            try:
                out.append(running_from_json(ctx.model_of(w.manifest, w.seq, bundle), w.placement))
            except Exception:
                log.exception("recovery: cannot read the placement of %s; requeuing it", w.name)
                bad.append(w.name)
        if bad:
            ctx.backend.stop(bad)
            ctx.requeue(bad, "requeued: its stored placement could not be read", now)
        return out
