"""The controller's recovery: make store, backend and engine agree after a (possibly unclean)
stop, and a standby's read-only view.

Why apart: recovery is the other half of the write-ahead commit (gpupool.service.controller.commit):
it finishes whatever a kill -9 interrupted, in an order that never runs a workload twice.
"""

from __future__ import annotations

import gc
import logging

from gpupool.audit import AuditEntry
from gpupool.manifests import Bundle
from gpupool.model import Running
from gpupool.service import failures as flt
from gpupool.service.controller.approvals import Approvals
from gpupool.service.controller.commit import Commit
from gpupool.service.controller.config import ConfigInstall
from gpupool.service.controller.state import ACTIVE, SCHEDULER, _dt
from gpupool.service.convert import bundle_from_manifests, running_from_json, workload_model
from gpupool.store import PhaseChange

log = logging.getLogger("gpupool.controller")


class Recovery(Approvals, Commit, ConfigInstall):
    """Recovery after a restart (or a new leader), and the standby's view."""

    def load_view(self) -> None:
        """A standby's view: the configuration and the stored placements, from the store alone.

        Why: a standby answers reads (nodes, quota, authorization by queue subtree) from this
        view, but must neither reconcile the backend nor write (the leader does both)."""
        bundle = self._observed(bundle_from_manifests(self.config_manifests(), skip_invalid=True))
        running = [
            running_from_json(
                workload_model(
                    w.manifest, bundle.priority_classes, float(w.seq), strict=False, types=bundle.task_types
                ),
                w.placement,
            )
            for w in self.store.list_workloads(phases=list(ACTIVE))
            if w.placement
        ]
        with self.lock:
            self._install(bundle, running)

    def recover(self) -> None:
        """Make store, backend and engine agree again after a (possibly unclean) stop."""
        with self.lock:
            self.ready = False
            manifests = self.config_manifests()
            self.faults.unhealthy, self.faults.reported = flt.unhealthy_devices(manifests), {}
            bundle = self._observed(bundle_from_manifests(manifests, skip_invalid=True))
            self.bundle = bundle
            self.backend.set_nodes(bundle.nodes)
            runs = self.backend.runs()
            now = self.clock()
            # 1. evictions decided but maybe not carried out: stop first, so nothing overlaps
            preempted = self.store.list_workloads(phases=["Preempted"])
            if preempted:
                self.backend.stop([w.name for w in preempted])
                self._requeue([w.name for w in preempted], "requeued after preemption (recovered)", now)
            active = {w.name: w for w in self.store.list_workloads(phases=list(ACTIVE))}
            # 2. the backend runs something the store does not consider active: stop it
            stray = [n for n in runs if n not in active]
            stray = self.adoption.hold(self.backend, stray, runs, now)  # what the cluster vouches for waits
            if stray:
                self.backend.stop(stray)
            # 3. the store says Running but the backend has no trace: the run was lost, requeue it
            lost = [w.name for w in active.values() if w.phase == "Running" and w.name not in runs]
            if lost:
                self.store.apply_transitions(
                    [
                        PhaseChange(n, "Preempted", "lost by the backend while the controller was down")
                        for n in lost
                    ],
                    audit=[
                        AuditEntry(
                            SCHEDULER, "workload.lost", "Workload", n, {"reason": "backend has no run"}
                        )
                        for n in lost
                    ],
                    at=_dt(now),
                )
                self._requeue(lost, "requeued: the backend lost the run", now)
                for n in lost:
                    active.pop(n)
            # 4. admitted but maybe never started: start now (idempotent), then mark Running
            admitted = [w for w in active.values() if w.phase == "Admitted"]
            self._start_in_backend(admitted, now)
            # 5. the engine charges exactly what is admitted or running
            running = self._stored_running(bundle, now)
            self.faults.down = self._backend_down(now)
            self._install(bundle, flt.fault_evictions(self, bundle.nodes, running, now))
            # 6. approvals opened by a submit that crashed before requesting one
            for w in self.store.list_workloads(phases=["AwaitingApproval"]):
                if not self.store.list_approvals(state="Pending", workload=w.name):
                    self.open_approval(w, now)
            self._load_exceptions()
            self.pending.clear()
            self._resync = True
            self._sync_pending(now)
            flt.load_holds(self, self._stored_reasons, now)
            self.ready = True
        # what recovery built (configuration, engine indexes, the pending set) lives long: keep
        # it out of the collector's full passes, which otherwise stall every request (see the
        # same call in gpupool.service.api)
        gc.collect()
        gc.freeze()

    def _stored_running(self, bundle: Bundle, now: float) -> list[Running]:
        """The admitted placements as the engine's running set; one unreadable row never stops
        recovery: its workload is stopped and requeued with the reason (its devices are then
        free in both the backend and the engine)."""
        out: list[Running] = []
        bad: list[str] = []
        for w in self.store.list_workloads(phases=list(ACTIVE)):
            if not w.placement:
                continue
            try:
                model = workload_model(
                    w.manifest, bundle.priority_classes, float(w.seq), strict=False, types=bundle.task_types
                )
                out.append(running_from_json(model, w.placement))
            except Exception:
                log.exception("recovery: cannot read the placement of %s; requeuing it", w.name)
                bad.append(w.name)
        if bad:
            self.backend.stop(bad)
            self._requeue(bad, "requeued: its stored placement could not be read", now)
        return out
