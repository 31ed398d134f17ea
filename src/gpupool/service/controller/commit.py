"""The controller's commit: a cycle's decisions carried out write-ahead.

Why apart: the write-ahead order (decisions durable, victims stopped, admitted started, victims
requeued) is what makes a kill -9 at any point recoverable; its records and steps are read here
in that order. Starting runs in the backend is shared with recovery (admitted, not yet started).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from gpupool.audit import AuditEntry
from gpupool.engine import Decisions, Pending
from gpupool.manifests.convert import placement_json
from gpupool.model import Running, Workload
from gpupool.service.admission import is_exception
from gpupool.service.backends import BackendError, Capability, RunSpec, capability, pod_commands
from gpupool.service.controller.context import SCHEDULER, Context, CycleStats, _dt, _Queued
from gpupool.service.controller.moves import move_in_backend, move_records
from gpupool.service.controller.pending import PendingSet
from gpupool.service.controller.shrinks import shrink_in_backend, shrink_records
from gpupool.store import NotLeader, PhaseChange, WorkloadRecord

log = logging.getLogger("gpupool.controller")


class Commit:
    """Decisions to durable records, then to the backend, in the write-ahead order.

    Holds no state of its own: it changes the store, the backend, the engine (the context's)
    and the pending set it is given."""

    def __init__(self, ctx: Context, pending: PendingSet) -> None:
        self.ctx = ctx
        self.pending = pending

    def commit(self, d: Decisions, models: Iterable[Workload], now: float, stats: CycleStats) -> None:
        """Carry a cycle's decisions out, write-ahead: (1) the decisions are durable before
        anything changes in the backend, (2) victims are stopped, elastic gangs shrunk
        (``shrinks``) and moved work restarted where the engine reserved it (``moves``), before
        the admitted start, so they never overlap, (3) the victims are requeued as pending work."""
        ctx = self.ctx
        by_name = {w.name: w for w in models}
        for p in d.pending:
            self.pending.reasons[p.workload] = p
        if not d.admitted and not d.preempted:
            return
        changes, audits, victims = self._preemption_records(d)
        pod_events, shrunk = shrink_records(ctx, d, changes, audits)  # elastic gangs lose pods
        move_events, moved = move_records(ctx, d, now, changes, audits)  # consolidation
        waited = self.waited_for(d, self.pending.reasons, self.pending.stored_reasons)
        placements = self.admission_records(d, now, changes, audits, waited)
        ctx.store.apply_transitions(changes, audit=audits, at=_dt(now), events=pod_events + move_events)
        ctx.engine.apply(d, by_name.values(), now)
        victims.update(shrink_in_backend(ctx, shrunk, ctx.engine.running))
        victims.update(move_in_backend(ctx, moved))  # restarted where reserved, before the admitted
        if victims:
            ctx.backend.stop(list(victims))
            stats.preempted += len(victims)
            for r in victims.values():
                ctx.hooks.on_preempt(r.workload.queue, "")
        self._start_admitted(d, by_name, placements, now)
        stats.admitted += len(d.admitted)
        if victims:
            self.requeue_victims(victims, now)

    def _preemption_records(
        self, d: Decisions
    ) -> tuple[list[PhaseChange], list[AuditEntry], dict[str, Running]]:
        changes: list[PhaseChange] = []
        audits: list[AuditEntry] = []
        victims: dict[str, Running] = {}
        running = self.ctx.engine.running
        for pre in d.preempted:
            for v in pre.victims:
                r = running.get(v.workload)
                if r is not None:
                    victims[v.workload] = r
                changes.append(PhaseChange(v.workload, "Preempted", f"{v.rule}: {v.reason}"))
                detail = {
                    "rule": str(v.rule),
                    "reason": v.reason,
                    "preemptor": pre.preemptor,
                    "queue": v.queue,
                    "priority": v.priority,
                }
                audits.append(AuditEntry(SCHEDULER, "workload.preempt", "Workload", v.workload, detail))
        return changes, audits, victims

    @staticmethod
    def waited_for(
        d: Decisions, reasons: Mapping[str, Pending], stored_reasons: Mapping[str, str]
    ) -> dict[str, str]:
        """Why each admitted workload waited until now (its latest pending reason, as stored:
        ``code: reason``), for the admission record: the row's reason is overwritten on admission,
        so without it a report could not say what a finished wait was for."""
        out: dict[str, str] = {}
        for a in d.admitted:
            p = reasons.get(a.workload)
            text = f"{p.code}: {p.reason}" if p is not None else stored_reasons.get(a.workload, "")
            if text:
                out[a.workload] = text
        return out

    @staticmethod
    def admission_records(
        d: Decisions,
        now: float,
        changes: list[PhaseChange],
        audits: list[AuditEntry],
        waited_for: Mapping[str, str],
    ) -> dict[str, dict[str, Any]]:
        placements: dict[str, dict[str, Any]] = {}
        for a in d.admitted:
            placements[a.workload] = placement_json(a, now)
            changes.append(PhaseChange(a.workload, "Admitted", a.reason, placements[a.workload]))
            detail = {
                "queue": a.queue,
                "pool": a.pool,
                "borrowing": a.borrowing,
                "reason": a.reason,
                "afterEvicting": list(a.after_evicting),
                "nodes": sorted({p.node for p in a.pods}),
                "gpuMilli": sum(p.gpu_milli * len(p.devices) for p in a.pods),
            }
            detail["waitedFor"] = waited_for.get(a.workload, "")  # "": admitted when first considered
            audits.append(AuditEntry(SCHEDULER, "workload.admit", "Workload", a.workload, detail))
        return placements

    def _start_admitted(
        self,
        d: Decisions,
        by_name: Mapping[str, Workload],
        placements: Mapping[str, dict[str, Any]],
        now: float,
    ) -> None:
        admitted_recs = []
        for a in d.admitted:
            q = self.pending.pending.get(a.workload)
            self.pending.forget(a.workload)
            if q is not None:
                self.ctx.hooks.on_admit(q.queue, max(0.0, now - q.submitted_at))
            admitted_recs.append((a.workload, by_name[a.workload], placements[a.workload]))
        self.start_specs(admitted_recs, now)

    def requeue_victims(self, victims: Mapping[str, Running], now: float) -> None:
        """The evicted runs as pending work again, durably, each with one more eviction."""
        self.ctx.requeue(list(victims), "requeued after preemption", now)
        for name, r in victims.items():
            rec = self.ctx.store.get_workload(name)
            self.pending.pending[name] = _Queued(
                name,
                rec.seq,
                rec.queue,
                rec.owner,
                rec.submitted_at.timestamp(),
                # one more eviction: the preemption cost model protects work that lost runs
                # (counted in memory: a restart or a resync from the store starts at 0 again)
                replace(r.workload, evictions=r.workload.evictions + 1),
                is_exception(rec.manifest),
            )
            self.pending.stored_reasons[name] = rec.reason

    def start_in_backend(self, recs: Sequence[WorkloadRecord], now: float) -> None:
        """Start admitted workloads from their stored records (recovery, adopted runs)."""
        for w in recs:
            self.ctx.note_hints(w.name, w.manifest)
        specs = [(w.name, self.ctx.model_of(w.manifest, w.seq), dict(w.placement or {})) for w in recs]
        self.start_specs(specs, now)

    def start_specs(self, specs: Sequence[tuple[str, Workload, dict[str, Any]]], now: float) -> None:
        """Start runs in the backend and record each outcome: Running, or Failed with the
        backend's refusal (one refused run never fails the others)."""
        if not specs:
            return
        ctx = self.ctx
        hints = ctx.faults.hints
        # the local backend runs each pod group's command: read only where a backend needs it
        cmds = capability(ctx.backend, Capability.NEEDS_COMMANDS) is True
        runs = [
            RunSpec(
                n,
                p,
                w.expected_duration_s,
                str(w.type),
                hints.get(n, {}),
                pod_commands(ctx.manifest_of(n)) if cmds else {},
            )
            for n, w, p in specs
        ]
        failed = self._start(runs)
        ok = [n for n, _, _ in specs if n not in failed]
        changes = [PhaseChange(n, "Running", "started by the backend") for n in ok]
        changes += [
            PhaseChange(n, "Failed", f"backend refused to start it: {why}") for n, why in failed.items()
        ]
        audits = [
            AuditEntry(SCHEDULER, "workload.fail", "Workload", n, {"reason": why})
            for n, why in failed.items()
        ]
        ctx.store.apply_transitions(changes, audit=audits, at=_dt(now))
        for n in failed:
            ctx.engine.remove_running(n)

    def _start(self, runs: list[RunSpec]) -> dict[str, str]:
        """Start ``runs``; the ones the backend refused, with why."""
        backend = self.ctx.backend
        failed: dict[str, str] = {}
        try:
            backend.start(runs)
        except NotLeader:  # deposed (gpupool.service.leader): not the runs' fault, fail none of them
            raise
        except Exception as exc:  # a BackendError, or a backend bug on one run: never all of them
            # start each separately to learn which ones the backend refused
            for r in runs:
                try:
                    backend.start([r])
                except NotLeader:
                    raise
                except Exception as one:
                    failed[r.name] = (
                        str(one) if isinstance(one, BackendError) else f"{type(one).__name__}: {one}"
                    )
            log.error("backend refused runs: %s", exc)
        return failed
