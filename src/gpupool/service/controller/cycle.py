"""The controller's cycle: one pass from events to decisions, and the isolation of workloads
the engine fails on.

Why apart: the cycle is the controller's outline of work (finish, expire, sync, refresh nodes,
decide, commit, store reasons); isolating a bad workload belongs with it, since it is how one
workload never stops the cycle for everyone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import replace

from gpupool.audit import AuditEntry
from gpupool.engine import Decisions, Engine, Pending, PendingCode
from gpupool.model import PoolQuota, Workload, vmax
from gpupool.service import failures as flt
from gpupool.service import usage_decay
from gpupool.service.controller.commit import Commit
from gpupool.service.controller.config import ConfigInstall
from gpupool.service.controller.finish import Finishing
from gpupool.service.controller.pending import PendingSet
from gpupool.service.controller.state import SCHEDULER, CycleStats, _dt
from gpupool.service.convert import running_from_json
from gpupool.service.isolation import find_culprits
from gpupool.service.windows import windowed_cycle

log = logging.getLogger("gpupool.controller")


class Cycle(Finishing, PendingSet, Commit, ConfigInstall):
    """One scheduling cycle, its windows, approved exceptions and isolated workloads."""

    def cycle(self) -> CycleStats:
        """One pass: record finished runs, expire what is due, admit/preempt, apply durably."""
        t0 = time.perf_counter()
        stats = CycleStats()
        with self.lock:
            now = self.clock()
            stats.finished = self._process_finished(now)
            if now - self._last_expire >= self.tick_s:
                self._last_expire = now
                self._expire(now)
            self._sync_pending(now)
            if self._adopt_held(now):  # runs the cluster holds may still be claimed: wait
                stats.pending = len(self.pending)
                return stats
            self._refresh_nodes(now)
            self._node_faults(now)
            held = flt.held(self.faults, self.pending, now)  # in backoff after a failure
            normal = [q.model for q in self.pending.values() if not q.exception and q.name not in held]
            exc = [
                q.model
                for q in self.pending.values()
                if q.exception and self.exceptions.get(q.name, 0) > now and q.name not in held
            ]
            usage_decay.step(self.usage_decay, self.engine, now)  # recent use, when configured
            if normal or exc:
                normal = self._decidable(normal)
                d = self._isolating(normal, lambda ws: self._windowed(ws, now), now)
                self._commit(d, normal, now, stats)
                self.reasons.update(self._left_out)  # members a window left out: their class's reason
                if exc:
                    exc = self._decidable(exc)
                    ed = self._isolating(exc, lambda ws: self._exception_cycle(ws, now), now)
                    self._commit(ed, exc, now, stats)
                for q in self.pending.values():
                    if q.exception and q.name not in self.exceptions:
                        self.reasons[q.name] = Pending(
                            q.name, q.queue, PendingCode.SKIPPED, "waiting for approval of its exception"
                        )
            if now - self._last_reason_write >= self.reason_interval_s:
                self._store_reasons()
                self._last_reason_write = now
            stats.pending = len(self.pending)
            self.cycles += 1
            self.last_cycle_at = now
        stats.seconds = time.perf_counter() - t0
        self.hooks.on_cycle(stats)
        return stats

    def _adopt_held(self, now: float) -> bool:
        """Admit the held runs whose workloads are pending again, with the cluster's placement
        (gpupool.service.adoption); True while the rest may still be claimed (the cycle then
        schedules nothing: the engine does not charge their devices yet)."""
        if not self.adoption.held:
            return False
        recs = self.adoption.claim(
            self.pending, self.store, self.engine.add_running, running_from_json, now, SCHEDULER
        )
        for r in recs:
            self.pending.pop(r.name, None)
            self.reasons.pop(r.name, None)
        self._start_in_backend(recs, now)
        if self.adoption.waiting(self.backend, now):
            return True
        gone = self.adoption.release()
        if gone:
            log.warning("recovery: %d held runs were claimed by no workload; stopping them", len(gone))
            self.backend.stop(gone)
        return False

    def _decidable(self, ws: list[Workload]) -> list[Workload]:
        return [w for w in ws if w.name not in self.isolated] if self.isolated else ws

    def _isolating(
        self, ws: list[Workload], run: Callable[[list[Workload]], Decisions], now: float
    ) -> Decisions:
        """``run(ws)``; when it raises, hold out the workloads it fails on and decide for the rest.

        Why: one workload the engine cannot handle must never stop scheduling for everyone
        (see gpupool.service.isolation). A failure that does not depend on the workloads is
        raised as before, so the loop reports it and retries."""
        if not ws:
            return Decisions()
        try:
            return run(ws)
        except Exception:
            log.exception("scheduling cycle failed; looking for the workloads it fails on")
            self._rebuild_engine()
            bad = find_culprits(ws, run, self._rebuild_engine)
            if not bad:
                raise
        self._isolate(bad, now)
        return run([w for w in ws if w.name not in bad])

    def _windowed(self, ws: list[Workload], now: float) -> Decisions:
        """The cycle over windows of the pending set (gpupool.service.windows): the same
        decisions as over all of it, at the cost of the few workloads that can move."""
        eng = self.engine
        d, self._left_out = windowed_cycle(eng, ws, now, self.window_stats, self.hopeless.of(eng))
        self.hopeless.learn(eng, d, ws)
        return d

    def _isolate(self, bad: Mapping[str, str], now: float) -> None:
        """Keep each culprit Pending with the error as its reason, recorded in the audit log."""
        for name, err in bad.items():
            self.isolated[name] = err
            q = self.pending.get(name)
            why = (
                f"the scheduler failed on this workload ({err}); it is held out of scheduling "
                "until the configuration changes or the server restarts: fix and resubmit it, or cancel it"
            )
            self.reasons[name] = Pending(name, q.queue if q else "", PendingCode.INVALID, why)
        for n, e in bad.items():  # rare: one record each is fine
            self.store.append_audit(
                AuditEntry(SCHEDULER, "workload.isolate", "Workload", n, {"error": e}), at=_dt(now)
            )
        self._last_reason_write = float("-inf")  # show the reason at once

    def _exception_cycle(self, ws: list[Workload], now: float) -> Decisions:
        """Place approved exceptions with their queue's limits lifted, for them alone."""
        lifted = {n for w in ws for n in self.queue_path(w.queue)}
        cap = self.engine.quota.capacity
        queues = []
        for q in self.bundle.queues:
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
        eng = Engine(self._snapshot(self.bundle, list(self.engine.running.values()), queues))
        flt.occupy_unhealthy(eng, self.faults.unhealthy)
        d = eng.cycle(ws, now)
        d.preempted = []  # an exception never evicts anyone
        d.admitted = [a for a in d.admitted if not a.after_evicting]
        return d
