"""The controller's pending set: what waits to be scheduled, and the stored reasons why.

Why apart: the pending set is filled from two sides (submits through the inbox, the store on a
resync) and its reasons are written back at most every ``reason_interval_s``; the rules for
both are one idea, read here at once. The other parts change it through the methods here
(``queue_again``, ``forget``) or its three maps.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import replace

from gpupool.engine import Pending
from gpupool.manifests import Bundle
from gpupool.model import Workload
from gpupool.service.admission import is_exception
from gpupool.service.controller.context import Context, _Queued
from gpupool.store import WorkloadRecord

log = logging.getLogger("gpupool.controller")


class PendingSet:
    """The inbox of new submissions, the resync from the store, and the stored reasons."""

    def __init__(self, ctx: Context, resync_s: float = 15.0) -> None:
        self.ctx = ctx
        self.resync_s = resync_s
        #: committed submissions not yet taken into ``pending`` (gpupool.service.limits counts them)
        self.inbox: deque[_Queued] = deque()
        self.pending: dict[str, _Queued] = {}
        #: the engine's latest reason for every pending workload (what ``explain`` shows)
        self.reasons: dict[str, Pending] = {}
        #: the reason text last stored for each pending workload (written only when it changes)
        self.stored_reasons: dict[str, str] = {}
        #: reload everything pending from the store at the next ``sync``
        self.resync_due = True
        self._last_resync = 0.0

    def submitted(self, rec: WorkloadRecord, model: Workload) -> None:
        """A new Pending workload was committed; schedule it soon."""
        self.inbox.append(
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
        self.ctx.note_hints(rec.name, rec.manifest)
        self.ctx.wake.set()

    def resync(self) -> None:
        """Reload the pending set from the store (after approvals)."""
        self.resync_due = True
        self.ctx.wake.set()

    def queue_again(self, rec: WorkloadRecord) -> None:
        """Hold a workload requeued outside a cycle's decisions (a failure, an eviction) as pending."""
        model = self.ctx.model_of(rec.manifest, rec.seq)
        at = rec.submitted_at.timestamp()
        exc = is_exception(rec.manifest)
        self.pending[rec.name] = _Queued(rec.name, rec.seq, rec.queue, rec.owner, at, model, exc)
        self.stored_reasons[rec.name] = rec.reason
        self.reasons.pop(rec.name, None)

    def forget(self, name: str) -> None:
        """``name`` waits no more (admitted, cancelled)."""
        self.pending.pop(name, None)
        self.reasons.pop(name, None)
        self.stored_reasons.pop(name, None)

    def remodel(self, bundle: Bundle) -> None:
        """Read every pending model again under ``bundle`` (its priority classes may have changed)."""
        for q in self.pending.values():
            q.model = self.ctx.model_of(self.ctx.manifest_of(q.name), q.seq, bundle)

    def sync(self, now: float) -> None:
        """Take the inbox in, and every ``resync_s`` (or when due) reload from the store."""
        store = self.ctx.store
        drained: list[_Queued] = []
        while self.inbox:
            q = self.inbox.popleft()
            if q.name not in self.pending:
                drained.append(q)
        if drained:
            # only what is still Pending: a workload cancelled between its commit and this cycle
            # must not be scheduled (admitting it would fail the whole cycle's transaction)
            still = store.pending_reasons(names=[q.name for q in drained])
            for q in drained:
                if q.name in still:
                    self.pending[q.name] = q
                    self.stored_reasons[q.name] = still[q.name]
        if not self.resync_due and now - self._last_resync < self.resync_s:
            return
        self.resync_due = False
        self._last_resync = now
        # names and stored reasons only: with a large backlog, reloading every pending manifest
        # each resync cost more than a scheduling cycle; only workloads not yet held are loaded
        stored = store.pending_reasons()
        fresh: dict[str, _Queued] = {}
        unknown = [n for n in stored if n not in self.pending]
        if len(unknown) > 500:  # e.g. at start-up: one scan beats a huge IN list
            loaded = [w for w in store.list_workloads(phases=["Pending"]) if w.name not in self.pending]
        else:
            loaded = store.list_workloads(names=unknown, phases=["Pending"]) if unknown else []
        for w in loaded:
            model = self.ctx.model_of(w.manifest, w.seq)
            self.ctx.note_hints(w.name, w.manifest)
            fresh[w.name] = _Queued(
                w.name, w.seq, w.queue, w.owner, w.submitted_at.timestamp(), model, is_exception(w.manifest)
            )
        for n in stored:
            old = self.pending.get(n)
            if old is not None:
                fresh[n] = old
        self.pending = dict(sorted(fresh.items(), key=lambda kv: kv[1].seq))
        self.stored_reasons = {n: r for n, r in stored.items() if n in self.pending}
        for n in list(self.reasons):
            if n not in fresh:
                del self.reasons[n]

    def store_reasons(self) -> None:
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
            if self.stored_reasons.get(name) != text:
                changed[name] = text
        if not changed:
            return
        try:
            self.ctx.store.set_pending_reasons(changed)
        except Exception:  # advisory status: never fail a cycle for it; retried next cycle
            log.warning("could not store %d pending reasons", len(changed), exc_info=True)
            return
        self.stored_reasons.update(changed)
