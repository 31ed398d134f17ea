"""The controller's cycle: one pass from events to decisions, and the isolation of workloads
the engine fails on.

Why apart: the cycle is the controller's outline of work (finish, expire, sync, refresh nodes,
decide, commit, store reasons); isolating a bad workload belongs with it, since it is how one
workload never stops the cycle for everyone. It calls the parts it sequences through the
references it is given, never through a common base.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import replace

from gpupool.audit import AuditEntry
from gpupool.engine import Decisions, Engine, Pending, PendingCode
from gpupool.manifests.convert import running_from_json
from gpupool.model import PoolQuota, Workload, vmax
from gpupool.service import usage_decay
from gpupool.service.adoption import Adoption
from gpupool.service.controller.approvals import Approvals
from gpupool.service.controller.commit import Commit
from gpupool.service.controller.config import Configuration
from gpupool.service.controller.context import SCHEDULER, Context, CycleStats, _dt
from gpupool.service.controller.finish import Finishing
from gpupool.service.controller.pending import PendingSet
from gpupool.service.failures.culprits import find_culprits
from gpupool.service.failures.nodes import occupy_unhealthy
from gpupool.service.failures.record import held
from gpupool.service.windows import Hopeless, WindowStats, windowed_cycle

log = logging.getLogger("gpupool.controller")


class Cycle:
    """One scheduling cycle, its windows, approved exceptions and isolated workloads.

    Owns what lives from one cycle to the next: the isolated workloads, the windows' figures
    and hopeless set, and when expiry and the reasons' write last ran."""

    def __init__(
        self,
        ctx: Context,
        *,
        pending: PendingSet,
        config: Configuration,
        commit: Commit,
        finishing: Finishing,
        approvals: Approvals,
        adoption: Adoption,
        tick_s: float = 1.0,
        reason_interval_s: float = 1.0,
    ) -> None:
        self.ctx = ctx
        self.pending = pending
        self.config = config
        self.commit = commit
        self.finishing = finishing
        self.approvals = approvals
        self.adoption = adoption
        self.tick_s = tick_s
        #: at most one write of changed pending reasons per this many seconds (a submit storm
        #: runs a cycle every few tens of ms, and each write takes the store's write lock)
        self.reason_interval_s = reason_interval_s
        self._last_reason_write = float("-inf")
        self._last_expire = 0.0
        #: reasons of the pending workloads the last cycle's windows left out, and its figures
        self._left_out: dict[str, Pending] = {}
        self.window_stats = WindowStats()
        #: workloads Unsatisfiable everywhere, kept out of cycles until the engine changes
        self.hopeless = Hopeless()
        #: workloads a cycle failed on, held out of scheduling: name -> the error
        self.isolated: dict[str, str] = {}
        self.cycles = 0
        self.last_cycle_at = 0.0

    def run(self) -> CycleStats:
        """One pass: record finished runs, expire what is due, admit/preempt, apply durably."""
        t0 = time.perf_counter()
        stats = CycleStats()
        ctx, pending = self.ctx, self.pending
        with ctx.lock:
            now = ctx.clock()
            stats.finished = self.finishing.process_finished(now)
            if now - self._last_expire >= self.tick_s:
                self._last_expire = now
                self.finishing.expire(now)
            pending.sync(now)
            if self._adopt_held(now):  # runs the cluster holds may still be claimed: wait
                stats.pending = len(pending.pending)
                return stats
            self.config.refresh_nodes(now)
            self.config.node_faults(now)
            self._decide(now, stats)
            if now - self._last_reason_write >= self.reason_interval_s:
                pending.store_reasons()
                self._last_reason_write = now
            stats.pending = len(pending.pending)
            self.cycles += 1
            self.last_cycle_at = now
        stats.seconds = time.perf_counter() - t0
        ctx.hooks.on_cycle(stats)
        return stats

    def _decide(self, now: float, stats: CycleStats) -> None:
        """Decide and commit the normal pending work, then the approved exceptions apart."""
        ctx, queued, exceptions = self.ctx, self.pending.pending, self.approvals.exceptions
        backoff = held(ctx.faults, queued, now)  # in backoff after a failure
        normal = [q.model for q in queued.values() if not q.exception and q.name not in backoff]
        exc = [
            q.model
            for q in queued.values()
            if q.exception and exceptions.get(q.name, 0) > now and q.name not in backoff
        ]
        usage_decay.step(self.config.usage_decay, ctx.engine, now)  # recent use, when configured
        if not (normal or exc):
            return
        reasons = self.pending.reasons
        normal = self._decidable(normal)
        d = self._isolating(normal, lambda ws: self._windowed(ws, now), now)
        self.commit.commit(d, normal, now, stats)
        reasons.update(self._left_out)  # members a window left out: their class's reason
        if exc:
            exc = self._decidable(exc)
            ed = self._isolating(exc, lambda ws: self._exception_cycle(ws, now), now)
            self.commit.commit(ed, exc, now, stats)
        for q in self.pending.pending.values():
            if q.exception and q.name not in exceptions:
                reasons[q.name] = Pending(
                    q.name, q.queue, PendingCode.SKIPPED, "waiting for approval of its exception"
                )

    def _adopt_held(self, now: float) -> bool:
        """Admit the held runs whose workloads are pending again, with the cluster's placement
        (gpupool.service.adoption); True while the rest may still be claimed (the cycle then
        schedules nothing: the engine does not charge their devices yet)."""
        if not self.adoption.held:
            return False
        ctx = self.ctx
        recs = self.adoption.claim(
            self.pending.pending, ctx.store, ctx.engine.add_running, running_from_json, now, SCHEDULER
        )
        for r in recs:
            self.pending.pending.pop(r.name, None)
            self.pending.reasons.pop(r.name, None)
        self.commit.start_in_backend(recs, now)
        if self.adoption.waiting(ctx.backend, now):
            return True
        gone = self.adoption.release()
        if gone:
            log.warning("recovery: %d held runs were claimed by no workload; stopping them", len(gone))
            ctx.backend.stop(gone)
        return False

    def _decidable(self, ws: list[Workload]) -> list[Workload]:
        return [w for w in ws if w.name not in self.isolated] if self.isolated else ws

    def _isolating(
        self, ws: list[Workload], run: Callable[[list[Workload]], Decisions], now: float
    ) -> Decisions:
        """``run(ws)``; when it raises, hold out the workloads it fails on and decide for the rest.

        Why: one workload the engine cannot handle must never stop scheduling for everyone
        (see gpupool.service.failures.culprits). A failure that does not depend on the workloads is
        raised as before, so the loop reports it and retries."""
        if not ws:
            return Decisions()
        try:
            return run(ws)
        except Exception:
            log.exception("scheduling cycle failed; looking for the workloads it fails on")
            self.config.rebuild_engine()
            bad = find_culprits(ws, run, self.config.rebuild_engine)
            if not bad:
                raise
        self._isolate(bad, now)
        return run([w for w in ws if w.name not in bad])

    def _windowed(self, ws: list[Workload], now: float) -> Decisions:
        """The cycle over windows of the pending set (gpupool.service.windows): the same
        decisions as over all of it, at the cost of the few workloads that can move."""
        eng = self.ctx.engine
        d, self._left_out = windowed_cycle(eng, ws, now, self.window_stats, self.hopeless.of(eng))
        self.hopeless.learn(eng, d, ws)
        return d

    def _isolate(self, bad: Mapping[str, str], now: float) -> None:
        """Keep each culprit Pending with the error as its reason, recorded in the audit log."""
        for name, err in bad.items():
            self.isolated[name] = err
            q = self.pending.pending.get(name)
            why = (
                f"the scheduler failed on this workload ({err}); it is held out of scheduling "
                "until the configuration changes or the server restarts: fix and resubmit it, or cancel it"
            )
            self.pending.reasons[name] = Pending(name, q.queue if q else "", PendingCode.INVALID, why)
        for n, e in bad.items():  # rare: one record each is fine
            self.ctx.store.append_audit(
                AuditEntry(SCHEDULER, "workload.isolate", "Workload", n, {"error": e}), at=_dt(now)
            )
        self._last_reason_write = float("-inf")  # show the reason at once

    def _exception_cycle(self, ws: list[Workload], now: float) -> Decisions:
        """Place approved exceptions with their queue's limits lifted, for them alone."""
        ctx = self.ctx
        lifted = {n for w in ws for n in self.config.tree.queue_path(w.queue)}
        cap = ctx.engine.quota.capacity
        queues = []
        for q in ctx.bundle.queues:
            if q.name not in lifted:
                queues.append(q)
                continue
            quotas = []
            for pq in q.quotas:
                g = pq.guarantee
                if q.parent is None:  # a cohort root's limit is its guarantee: raise it to the pool
                    c = cap.get(pq.pool, g)
                    g = vmax(g, c)
                quotas.append(PoolQuota(pq.pool, g, None, pq.lending_limit))
            queues.append(replace(q, quotas=tuple(quotas)))
        eng = Engine(self.config.snapshot(ctx.bundle, list(ctx.engine.running.values()), queues))
        occupy_unhealthy(eng, ctx.faults.unhealthy)
        d = eng.cycle(ws, now)
        d.preempted = []  # an exception never evicts anyone
        d.admitted = [a for a in d.admitted if not a.after_evicting and not a.after_shrinking]
        return d
