"""The controller's pending set: what waits to be scheduled, and the stored reasons why.

Why apart: the pending set is filled from two sides (submits through the inbox, the store on a
resync) and its reasons are written back at most every ``reason_interval_s``; the rules for
both are one idea, read here at once.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from gpupool.model import Workload
from gpupool.service.admission import is_exception
from gpupool.service.controller.state import ControllerState, _Queued
from gpupool.service.convert import workload_model
from gpupool.store import WorkloadRecord

log = logging.getLogger("gpupool.controller")


class PendingSet(ControllerState):
    """The inbox of new submissions, the resync from the store, and the stored reasons."""

    def submitted(self, rec: WorkloadRecord, model: Workload) -> None:
        """A new Pending workload was committed; schedule it soon."""
        self._inbox.append(
            _Queued(
                rec.name,
                rec.seq,
                rec.queue,
                rec.owner,
                rec.submitted_at.timestamp(),
                replace(model, arrival=float(rec.seq)),
                is_exception(rec.manifest),
            )
        )
        self._note_hints(rec.name, rec.manifest)
        self._wake.set()

    def resync(self) -> None:
        """Reload the pending set from the store (after approvals)."""
        self._resync = True
        self._wake.set()

    def _sync_pending(self, now: float) -> None:
        drained: list[_Queued] = []
        while self._inbox:
            q = self._inbox.popleft()
            if q.name not in self.pending:
                drained.append(q)
        if drained:
            # only what is still Pending: a workload cancelled between its commit and this cycle
            # must not be scheduled (admitting it would fail the whole cycle's transaction)
            still = self.store.pending_reasons(names=[q.name for q in drained])
            for q in drained:
                if q.name in still:
                    self.pending[q.name] = q
                    self._stored_reasons[q.name] = still[q.name]
        if not self._resync and now - self._last_resync < self.resync_s:
            return
        self._resync = False
        self._last_resync = now
        # names and stored reasons only: with a large backlog, reloading every pending manifest
        # each resync cost more than a scheduling cycle; only workloads not yet held are loaded
        stored = self.store.pending_reasons()
        fresh: dict[str, _Queued] = {}
        unknown = [n for n in stored if n not in self.pending]
        if len(unknown) > 500:  # e.g. at start-up: one scan beats a huge IN list
            loaded = [w for w in self.store.list_workloads(phases=["Pending"]) if w.name not in self.pending]
        else:
            loaded = self.store.list_workloads(names=unknown, phases=["Pending"]) if unknown else []
        for w in loaded:
            model = workload_model(
                w.manifest,
                self.bundle.priority_classes,
                float(w.seq),
                strict=False,
                types=self.bundle.task_types,
            )
            self._note_hints(w.name, w.manifest)
            fresh[w.name] = _Queued(
                w.name, w.seq, w.queue, w.owner, w.submitted_at.timestamp(), model, is_exception(w.manifest)
            )
        for n in stored:
            old = self.pending.get(n)
            if old is not None:
                fresh[n] = old
        self.pending = dict(sorted(fresh.items(), key=lambda kv: kv[1].seq))
        self._stored_reasons = {n: r for n, r in stored.items() if n in self.pending}
        for n in list(self.reasons):
            if n not in fresh:
                del self.reasons[n]

    def _store_reasons(self) -> None:
        """Persist the reasons whose text changed this cycle, in one transaction.

        Why: ``get``/``list`` read the store, and a restart must not forget why work waits; but
        the engine re-derives every reason each cycle, so only changed texts are written. The
        text is ``<code>: <reason>`` so ``explain`` can recover the code after a restart. Called
        at most every ``reason_interval_s`` (what changed meanwhile is written together).
        """
        changed: dict[str, str] = {}
        for name in self.pending:
            p = self.reasons.get(name)
            if p is None:
                continue
            text = f"{p.code}: {p.reason}"
            if self._stored_reasons.get(name) != text:
                changed[name] = text
        if not changed:
            return
        try:
            self.store.set_pending_reasons(changed)
        except Exception:  # advisory status: never fail a cycle for it; retried next cycle
            log.warning("could not store %d pending reasons", len(changed), exc_info=True)
            return
        self._stored_reasons.update(changed)
