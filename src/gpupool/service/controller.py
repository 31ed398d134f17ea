"""The controller: turns events (submit, cancel, finish, node change, tick) into engine cycles,
and carries every decision out through the backend, durably.

Why it is built this way (write-ahead): each cycle first commits its decisions to the store
(Admitted with the placement, Preempted with the rule, plus their audit records) in one
transaction, then changes the backend, then records the outcome (Running, requeued). A kill -9
at any point leaves the store at least as far as the backend, so ``recover`` can finish the
job: stop what was preempted or cancelled, start what was admitted (backend starts are
idempotent by name), requeue what the backend lost, and rebuild the engine from the admitted
placements. Nothing accepted is lost (submits are committed before they are acknowledged), no
workload runs twice and no device is handed out twice.

All workload phase changes go through this object under one lock; the API threads only insert
new submissions and approval decisions, which the controller picks up.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from gpupool.audit import AuditEntry
from gpupool.engine import Decisions, Engine, Pending, PendingCode
from gpupool.engine.core import workload_order_key
from gpupool.engine.windowed import MixEngine
from gpupool.manifests import Bundle, ManifestError
from gpupool.model import (
    Node,
    PoolQuota,
    Queue,
    ResourcePool,
    Running,
    Snapshot,
    Workload,
)
from gpupool.quantity import QuantityError
from gpupool.service import failures as flt
from gpupool.service.admission import approval_reason, exception_duration_s, is_exception
from gpupool.service.backends import Backend, BackendError, RunSpec, pod_commands
from gpupool.service.convert import (
    bundle_from_manifests,
    object_manifest,
    placement_json,
    running_from_json,
    workload_model,
)
from gpupool.service.isolation import find_culprits
from gpupool.service.view import ConfigLookups, tree_of
from gpupool.service.windows import WindowStats, windowed_cycle
from gpupool.store import TERMINAL_PHASES, NotFound, NotLeader, PhaseChange, Store, WorkloadRecord

log = logging.getLogger("gpupool.controller")

SCHEDULER = "scheduler"
ACTIVE = ("Admitted", "Running")
EXCEPTION_EVENT = "ExceptionGranted"
PENDING_CODES = frozenset(str(c) for c in PendingCode)
DEFAULT_EXCEPTION_S = 3600.0


def _dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


@dataclass(slots=True)
class _Queued:
    """A pending workload as the controller holds it between cycles."""

    name: str
    seq: int
    queue: str
    owner: str
    submitted_at: float
    model: Workload
    exception: bool = False


@dataclass(slots=True)
class CycleStats:
    admitted: int = 0
    preempted: int = 0
    pending: int = 0
    finished: int = 0
    seconds: float = 0.0


@dataclass(slots=True)
class Hooks:
    """Metrics callbacks (kept abstract so the controller has no Prometheus dependency)."""

    on_admit: Callable[[str, float], None] = lambda queue, wait_s: None
    on_preempt: Callable[[str, str], None] = lambda queue, rule: None
    on_cycle: Callable[[CycleStats], None] = lambda stats: None
    on_finish: Callable[[str, str], None] = lambda queue, outcome: None
    on_failure: Callable[[str, str], None] = lambda queue, reason: None
    extra: dict[str, Any] = field(default_factory=dict)


class Controller(ConfigLookups):
    """Owns the engine, the pending set and every workload phase change."""

    def __init__(
        self,
        store: Store,
        backend: Backend,
        *,
        tick_s: float = 1.0,
        min_interval_s: float = 0.02,
        resync_s: float = 15.0,
        reason_interval_s: float = 1.0,
        clock: Callable[[], float] = time.time,
        hooks: Hooks | None = None,
    ) -> None:
        self.store = store
        self.backend = backend
        self.tick_s = tick_s
        self.min_interval_s = min_interval_s
        self.resync_s = resync_s
        #: at most one write of changed pending reasons per this many seconds (a submit storm
        #: runs a cycle every few tens of ms, and each write takes the store's write lock)
        self.reason_interval_s = reason_interval_s
        self._last_reason_write = float("-inf")
        self.clock = clock
        self.hooks = hooks or Hooks()
        self.lock = threading.RLock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._inbox: deque[_Queued] = deque()
        self._resync = True
        self._last_resync = 0.0
        self._last_expire = 0.0
        self.bundle = Bundle()
        self.engine: Engine = MixEngine(Snapshot((), (), ()))
        #: reasons of the pending workloads the last cycle's windows left out, and its figures
        self._left_out: dict[str, Pending] = {}
        self.window_stats = WindowStats()
        self.parents: dict[str, str | None] = {}
        self.children: dict[str, list[str]] = {}
        #: per-configuration lookups for the submit path (rebuilt in ``_install``)
        self.pools_by_name: dict[str, ResourcePool] = {}
        self.queues_by_name: dict[str, Queue] = {}
        self._limit_cache: dict[tuple[str, str], int] = {}
        self.pending: dict[str, _Queued] = {}
        #: the engine's latest reason for every pending workload (what ``explain`` shows)
        self.reasons: dict[str, Pending] = {}
        #: the reason text last stored for each pending workload (written only when it changes)
        self._stored_reasons: dict[str, str] = {}
        #: approved exceptions: workload -> end of its window (epoch seconds)
        self.exceptions: dict[str, float] = {}
        #: backoffs, unhealthy devices, failed nodes, run hints (gpupool.service.failures)
        self.faults = flt.FaultState()
        #: the backend's observed nodes changed since the engine was built (``nodes_changed``)
        self._nodes_dirty = False
        #: workloads a cycle failed on, held out of scheduling: name -> the error
        self.isolated: dict[str, str] = {}
        self.ready = False
        self.cycles = 0
        self.last_cycle_at = 0.0
        self.last_error = ""

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Recover from whatever state the last run left, then run the loop in a thread."""
        self.recover()
        self.run_loop()

    def run_loop(self) -> None:
        """Run the cycle loop in a thread (after ``recover``; gpupool.service.leader calls the two
        separately so that a lease lost during recovery never starts the loop)."""
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="gpupool-controller", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def wake(self) -> None:
        """Ask for a cycle soon (an event happened)."""
        self._wake.set()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _loop(self) -> None:
        while not self._stop.is_set():
            woke = self._wake.wait(self._sleep_for())
            self._wake.clear()
            if self._stop.is_set():
                break
            cost = 0.0
            try:
                cost = self.cycle().seconds
                self.last_error = ""
            except NotLeader as exc:  # deposed (fenced write refused): stop deciding at once
                log.warning("controller stepping down: %s", exc)
                self.ready = False
                self.last_error = f"NotLeader: {exc.problem}"
                break
            except (
                Exception
            ) as exc:  # the loop must survive anything; the cause is logged and shown in /readyz
                log.exception("controller cycle failed")
                self.last_error = f"{type(exc).__name__}: {exc}"
                time.sleep(min(self.tick_s, 1.0))
            if woke:
                # batch a burst of events into the next cycle, and never spend more than about a
                # fifth of the time scheduling: under a submit storm, cycles get rarer, not longer
                pause = max(self.min_interval_s, 4.0 * cost)
                if pause:
                    self._stop.wait(min(pause, self.tick_s))

    def _sleep_for(self) -> float:
        nxt = getattr(self.backend, "next_finish", None)
        wait = self.tick_s
        if callable(nxt):
            t = nxt()
            if t is not None:
                wait = min(wait, max(0.0, t - self.clock()))
        return wait

    # ------------------------------------------------------------------ configuration
    def config_manifests(self) -> list[dict[str, Any]]:
        return [object_manifest(r) for r in self.store.list_objects()]

    def reload_config(self) -> None:
        """Rebuild the engine from the stored configuration, keeping what runs (after a config change)."""
        with self.lock:
            manifests = self.config_manifests()
            bundle = self._observed(bundle_from_manifests(manifests, skip_invalid=True))
            self.faults.unhealthy = flt.unhealthy_devices(manifests)
            running = list(self.engine.running.values())
            self._install(bundle, flt.fault_evictions(self, bundle.nodes, running, self.clock()))
            self.isolated.clear()  # the new configuration may decide them fine
            for q in self.pending.values():  # priority classes may have changed
                q.model = workload_model(
                    self._manifest_of(q.name), bundle.priority_classes, float(q.seq), strict=False
                )
            self._wake.set()

    def _manifest_of(self, name: str) -> Mapping[str, Any]:
        return self.store.get_workload(name).manifest

    def _observed(self, bundle: Bundle) -> Bundle:
        """On a backend that observes its nodes (Kubernetes: ``observed_nodes()``), the cluster's
        nodes replace the configured ones; the virtual backend has none and keeps them."""
        observe = getattr(self.backend, "observed_nodes", None)
        if callable(observe):
            if bundle.nodes and bundle is not self.bundle:  # a configuration (re)load, not a refresh
                log.info("%d configured nodes ignored: the backend observes its nodes", len(bundle.nodes))
            bundle.nodes = list(observe())
        return bundle

    def nodes_changed(self) -> None:
        """The backend's observed nodes changed: rebuild the engine at the next cycle (once,
        however many changes arrive before it)."""
        self._nodes_dirty = True
        self._wake.set()

    def _refresh_nodes(self, now: float) -> None:
        if not self._nodes_dirty:
            return
        self._nodes_dirty = False
        self._observed(self.bundle)
        running = list(self.engine.running.values())
        self._install(self.bundle, flt.fault_evictions(self, self.bundle.nodes, running, now))

    def _install(self, bundle: Bundle, running: Sequence[Running]) -> None:
        self.bundle = bundle
        self.parents, self.children = tree_of(bundle.queues)
        self.engine = MixEngine(self._snapshot(bundle, running))
        flt.occupy_unhealthy(self.engine, self.faults.unhealthy)
        self.pools_by_name = {p.name: p for p in bundle.pools}
        self.queues_by_name = {q.name: q for q in bundle.queues}
        self._limit_cache = {}
        self.backend.set_nodes(bundle.nodes)

    def _snapshot(
        self, bundle: Bundle, running: Sequence[Running], queues: Sequence[Queue] | None = None
    ) -> Snapshot:
        return Snapshot(
            flt.effective_nodes(bundle.nodes, self.faults.down),
            tuple(bundle.pools),
            tuple(queues if queues is not None else bundle.queues),
            tuple(bundle.priority_classes),
            running=tuple(running),
            now=self.clock(),
        )

    # ------------------------------------------------------------------ recovery
    def load_view(self) -> None:
        """A standby's view: the configuration and the stored placements, from the store alone.

        Why: a standby answers reads (nodes, quota, authorization by queue subtree) from this
        view, but must neither reconcile the backend nor write (the leader does both)."""
        bundle = self._observed(bundle_from_manifests(self.config_manifests(), skip_invalid=True))
        running = [
            running_from_json(
                workload_model(w.manifest, bundle.priority_classes, float(w.seq), strict=False), w.placement
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
            bundle = self._observed(bundle_from_manifests(manifests, skip_invalid=True))
            self.faults.unhealthy = flt.unhealthy_devices(manifests)
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
                model = workload_model(w.manifest, bundle.priority_classes, float(w.seq), strict=False)
                out.append(running_from_json(model, w.placement))
            except Exception:
                log.exception("recovery: cannot read the placement of %s; requeuing it", w.name)
                bad.append(w.name)
        if bad:
            self.backend.stop(bad)
            self._requeue(bad, "requeued: its stored placement could not be read", now)
        return out

    def open_approval(self, w: WorkloadRecord, now: float) -> None:
        """Open a workload's approval request (at submit, or at recovery when a crashed submit
        left it out); if that cannot be stored, reject the workload with the reason rather than
        leave it waiting for a request nobody can see, or fail recovery for everyone."""
        try:
            self.request_approval(w, now)
        except Exception as exc:
            log.exception("recovery: cannot open the approval request of %s", w.name)
            try:
                self.store.transition_workload(
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

    def _load_exceptions(self) -> None:
        self.exceptions.clear()
        for w in self.store.list_workloads(phases=["Pending", *ACTIVE]):
            if not is_exception(w.manifest):
                continue
            for ev in self.store.list_events(w.name):
                if ev.reason == EXCEPTION_EVENT:
                    try:
                        self.exceptions[w.name] = float(ev.message.split("until-epoch=")[1].split()[0])
                    except (IndexError, ValueError):
                        continue
            if w.name not in self.exceptions:
                # approved, but the server died before it recorded the window: grant the default one
                for a in self.store.list_approvals(state="Approved", workload=w.name):
                    try:
                        dur = exception_duration_s(w.manifest) or DEFAULT_EXCEPTION_S
                    except QuantityError:
                        dur = DEFAULT_EXCEPTION_S
                    if a.decided_at is not None:
                        self.grant_exception(w.name, a.decided_at.timestamp() + dur)

    def request_approval(self, w: WorkloadRecord, now: float, ttl_s: float = 7 * 86400) -> None:
        why = approval_reason(w.manifest, self.bundle)
        self.store.request_approval(
            w.name,
            w.owner,
            expires_at=_dt(now + ttl_s),
            reason=why,
            audit=AuditEntry(w.owner, "approval.request", "Workload", w.name, {"reason": why}),
            at=_dt(now),
        )

    # ------------------------------------------------------------------ events from the API
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

    def cancel(self, name: str, actor: str) -> WorkloadRecord:
        """Cancel (write-ahead: Cancelled is committed before the backend stops it); idempotent."""
        with self.lock:
            rec = self.store.get_workload(name)
            if rec.phase in TERMINAL_PHASES:
                return rec
            rec = self.store.transition_workload(
                name,
                "Cancelled",
                reason=f"cancelled by {actor}",
                audit=AuditEntry(actor, "workload.cancel", "Workload", name, {"from": rec.phase}),
                at=_dt(self.clock()),
            )
            self.backend.stop([name])
            self.engine.remove_running(name)
            self.pending.pop(name, None)
            self.reasons.pop(name, None)
            self._stored_reasons.pop(name, None)
            self.exceptions.pop(name, None)
            self.isolated.pop(name, None)
            self._wake.set()
            return rec

    def cancel_many(self, names: Sequence[str], actor: str, chunk: int = 500) -> int:
        """Cancel many workloads, one transaction per chunk (each audited); returns how many.

        Why: cancelling a large set one request at a time costs a transaction each; the write-
        ahead order is the same as ``cancel`` (Cancelled committed, then the backend stopped).
        Finished or unknown names are skipped.
        """
        done = 0
        with self.lock:
            for i in range(0, len(names), chunk):
                live = [
                    w
                    for w in self.store.list_workloads(names=names[i : i + chunk])
                    if w.phase not in TERMINAL_PHASES
                ]
                if not live:
                    continue
                self.store.apply_transitions(
                    [PhaseChange(w.name, "Cancelled", f"cancelled by {actor}") for w in live],
                    audit=[
                        AuditEntry(actor, "workload.cancel", "Workload", w.name, {"from": w.phase})
                        for w in live
                    ],
                    at=_dt(self.clock()),
                )
                active = [w.name for w in live if w.phase in (*ACTIVE, "Preempted")]
                if active:
                    self.backend.stop(active)
                for w in live:
                    self.engine.remove_running(w.name)
                    self.pending.pop(w.name, None)
                    self.reasons.pop(w.name, None)
                    self._stored_reasons.pop(w.name, None)
                    self.exceptions.pop(w.name, None)
                done += len(live)
            self._wake.set()
        return done

    def grant_exception(self, name: str, until: float) -> None:
        with self.lock:
            iso = _dt(until).isoformat()
            self.store.add_event(
                name, "Normal", EXCEPTION_EVENT, f"exception granted until {iso} until-epoch={until}"
            )
            self.exceptions[name] = until
            self.resync()

    # ------------------------------------------------------------------ the cycle
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
            model = workload_model(w.manifest, self.bundle.priority_classes, float(w.seq), strict=False)
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
            self._refresh_nodes(now)
            self._node_faults(now)
            held = flt.held(self.faults, self.pending, now)  # in backoff after a failure
            normal = [q.model for q in self.pending.values() if not q.exception and q.name not in held]
            exc = [
                q.model
                for q in self.pending.values()
                if q.exception and self.exceptions.get(q.name, 0) > now and q.name not in held
            ]
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

    # ------------------------------------------------------------------ isolating bad workloads
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
        d, self._left_out = windowed_cycle(self.engine, ws, now, self.window_stats)
        return d

    def _rebuild_engine(self) -> None:
        self.engine = MixEngine(self._snapshot(self.bundle, list(self.engine.running.values())))
        flt.occupy_unhealthy(self.engine, self.faults.unhealthy)  # unhealthy devices stay held

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
                    g = (max(g[0], c[0]), max(g[1], c[1]), max(g[2], c[2]))
                quotas.append(PoolQuota(pq.pool, g, None, pq.lending_limit))
            queues.append(replace(q, quotas=tuple(quotas)))
        eng = Engine(self._snapshot(self.bundle, list(self.engine.running.values()), queues))
        flt.occupy_unhealthy(eng, self.faults.unhealthy)
        d = eng.cycle(ws, now)
        d.preempted = []  # an exception never evicts anyone
        d.admitted = [a for a in d.admitted if not a.after_evicting]
        return d

    def _commit(self, d: Decisions, models: Iterable[Workload], now: float, stats: CycleStats) -> None:
        """Carry a cycle's decisions out, write-ahead: (1) the decisions are durable before
        anything changes in the backend, (2) victims are stopped before the admitted start, so
        they never overlap, (3) the victims are requeued as pending work."""
        by_name = {w.name: w for w in models}
        for p in d.pending:
            self.reasons[p.workload] = p
        if not d.admitted and not d.preempted:
            return
        changes, audits, victims = self._preemption_records(d)
        placements = self._admission_records(d, now, changes, audits)
        self.store.apply_transitions(changes, audit=audits, at=_dt(now))
        self.engine.apply(d, by_name.values(), now)
        if victims:
            self.backend.stop(list(victims))
            stats.preempted += len(victims)
            for r in victims.values():
                self.hooks.on_preempt(r.workload.queue, "")
        self._start_admitted(d, by_name, placements, now)
        stats.admitted += len(d.admitted)
        if victims:
            self._requeue_victims(victims, now)

    def _preemption_records(
        self, d: Decisions
    ) -> tuple[list[PhaseChange], list[AuditEntry], dict[str, Running]]:
        changes: list[PhaseChange] = []
        audits: list[AuditEntry] = []
        victims: dict[str, Running] = {}
        for pre in d.preempted:
            for v in pre.victims:
                r = self.engine.running.get(v.workload)
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
    def _admission_records(
        d: Decisions, now: float, changes: list[PhaseChange], audits: list[AuditEntry]
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
            q = self.pending.pop(a.workload, None)
            self.reasons.pop(a.workload, None)
            self._stored_reasons.pop(a.workload, None)
            if q is not None:
                self.hooks.on_admit(q.queue, max(0.0, now - q.submitted_at))
            admitted_recs.append((a.workload, by_name[a.workload], placements[a.workload]))
        self._start_specs(admitted_recs, now)

    def _requeue_victims(self, victims: Mapping[str, Running], now: float) -> None:
        self._requeue(list(victims), "requeued after preemption", now)
        for name, r in victims.items():
            rec = self.store.get_workload(name)
            self.pending[name] = _Queued(
                name,
                rec.seq,
                rec.queue,
                rec.owner,
                rec.submitted_at.timestamp(),
                r.workload,
                is_exception(rec.manifest),
            )
            self._stored_reasons[name] = rec.reason

    def _start_in_backend(self, recs: Sequence[WorkloadRecord], now: float) -> None:
        for w in recs:
            self._note_hints(w.name, w.manifest)
        specs = [
            (
                w.name,
                workload_model(w.manifest, self.bundle.priority_classes, float(w.seq), strict=False),
                dict(w.placement or {}),
            )
            for w in recs
        ]
        self._start_specs(specs, now)

    def _start_specs(self, specs: Sequence[tuple[str, Workload, dict[str, Any]]], now: float) -> None:
        if not specs:
            return
        hints = self.faults.hints
        # the local backend runs each pod group's command: read only where a backend needs it
        cmds = getattr(self.backend, "needs_commands", False) is True
        runs = [
            RunSpec(
                n,
                p,
                w.expected_duration_s,
                str(w.type),
                hints.get(n, {}),
                pod_commands(self._manifest_of(n)) if cmds else {},
            )
            for n, w, p in specs
        ]
        failed: dict[str, str] = {}
        try:
            self.backend.start(runs)
        except NotLeader:  # deposed (gpupool.service.leader): not the runs' fault, fail none of them
            raise
        except Exception as exc:  # a BackendError, or a backend bug on one run: never all of them
            # start each separately to learn which ones the backend refused
            for r in runs:
                try:
                    self.backend.start([r])
                except NotLeader:
                    raise
                except Exception as one:
                    failed[r.name] = (
                        str(one) if isinstance(one, BackendError) else f"{type(one).__name__}: {one}"
                    )
            log.error("backend refused runs: %s", exc)
        ok = [n for n, _, _ in specs if n not in failed]
        changes = [PhaseChange(n, "Running", "started by the backend") for n in ok]
        changes += [
            PhaseChange(n, "Failed", f"backend refused to start it: {why}") for n, why in failed.items()
        ]
        audits = [
            AuditEntry(SCHEDULER, "workload.fail", "Workload", n, {"reason": why})
            for n, why in failed.items()
        ]
        self.store.apply_transitions(changes, audit=audits, at=_dt(now))
        for n in failed:
            self.engine.remove_running(n)

    def _requeue(self, names: Sequence[str], reason: str, now: float) -> None:
        self.store.apply_transitions(
            [PhaseChange(n, "Pending", reason) for n in names],
            audit=[
                AuditEntry(SCHEDULER, "workload.requeue", "Workload", n, {"reason": reason}) for n in names
            ],
            at=_dt(now),
        )

    def _process_finished(self, now: float) -> int:
        done = self.backend.poll(now)
        if not done:
            return 0
        changes, audits, forget = [], [], []
        failed: list[tuple[WorkloadRecord, flt.Fault]] = []
        for r in done:
            try:
                rec = self.store.get_workload(r.name)
            except NotFound:
                forget.append(r.name)
                continue
            if rec.phase in ACTIVE and r.outcome == "Failed":  # retried by its policy
                fault = flt.Fault(r.reason or "Error", r.message or "the run failed", r.exit_code)
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
                        {"outcome": outcome, "message": r.message},
                    )
                )
                self.hooks.on_finish(rec.queue, outcome)
            forget.append(r.name)
        if changes:
            self.store.apply_transitions(changes, audit=audits, at=_dt(now))
        flt.record_failures(self, failed, now)
        for n in forget:
            self.engine.remove_running(n)
            self.exceptions.pop(n, None)
            if n not in self.pending:
                self.faults.hints.pop(n, None)
        self.backend.forget(forget)
        return len(changes) + len(failed)

    def _expire(self, now: float) -> None:
        expired = self.store.expire_approvals(at=_dt(now))
        if expired:
            self._resync = True
        ended = [n for n, until in self.exceptions.items() if until <= now]
        if not ended:
            return
        active = [n for n in ended if n in self.engine.running]
        for n in ended:
            self.exceptions.pop(n, None)
        if active:
            self.store.apply_transitions(
                [PhaseChange(n, "Preempted", "its approved exception window ended") for n in active],
                audit=[
                    AuditEntry(
                        SCHEDULER, "workload.exception-expired", "Workload", n, {"reason": "window ended"}
                    )
                    for n in active
                ],
                at=_dt(now),
            )
            self.backend.stop(active)
            for n in active:
                self.engine.remove_running(n)
            self._requeue(active, "requeued: its exception window ended", now)
            self._resync = True

    # ------------------------------------------------------------------ failures and node faults
    def _note_hints(self, name: str, manifest: Mapping[str, Any]) -> None:
        hints = flt.run_hints(manifest)
        if hints:
            self.faults.hints[name] = hints

    def queue_again(self, rec: WorkloadRecord) -> None:
        """Hold a workload requeued outside a cycle's decisions (a failure, an eviction) as pending."""
        model = workload_model(rec.manifest, self.bundle.priority_classes, float(rec.seq), strict=False)
        at = rec.submitted_at.timestamp()
        exc = is_exception(rec.manifest)
        self.pending[rec.name] = _Queued(rec.name, rec.seq, rec.queue, rec.owner, at, model, exc)
        self._stored_reasons[rec.name] = rec.reason
        self.reasons.pop(rec.name, None)

    def _backend_down(self, now: float) -> dict[str, str]:
        report = getattr(self.backend, "down_nodes", None)
        return dict(report(now)) if callable(report) else {}

    def _node_faults(self, now: float) -> None:
        """Nodes the backend reports failed (or repaired): requeue their work, rebuild the engine."""
        down = self._backend_down(now)
        if down == self.faults.down:
            return
        self.faults.down = down
        running = list(self.engine.running.values())
        self._install(self.bundle, flt.fault_evictions(self, self.bundle.nodes, running, now))

    def drain(self, node: str, reason: str, actor: str) -> list[str]:
        """Evict every workload on ``node`` with ``reason`` and requeue it (the caller cordons first)."""
        with self.lock:
            names = flt.on_node(self.engine.running.values(), node)
            why = f"node {node} drained by {actor}" + (f": {reason}" if reason else "")
            flt.evict(self, {n: flt.Fault("Drained", why, counted=False) for n in names}, self.clock(), actor)
            self._wake.set()
            return names

    # ------------------------------------------------------------------ views
    def explain(self, rec: WorkloadRecord) -> dict[str, Any]:
        """Where a workload stands in its queue and, if it waits, the engine's reason why."""
        with self.lock:
            out: dict[str, Any] = {"name": rec.name, "queue": rec.queue, "phase": rec.phase}
            if rec.phase != "Pending":
                out["reason"] = rec.reason or rec.phase
                if rec.phase == "AwaitingApproval":
                    out["code"] = "AwaitingApproval"
                    out["reason"] = rec.reason or "waiting for an approver"
                return out
            same = sorted(
                (q for q in self.pending.values() if q.queue == rec.queue),
                key=lambda q: workload_order_key(q.model),
            )
            names = [q.name for q in same]
            out["position"] = names.index(rec.name) + 1 if rec.name in names else None
            out["queueLength"] = len(names)
            out["ahead"] = names[: (out["position"] or 1) - 1][:20]
            if self.faults.holds.get(rec.name, 0.0) > self.clock():  # backoff after a failure
                out["code"] = flt.BACKOFF_CODE
                out["reason"] = rec.reason.partition(": ")[2] or rec.reason
                return out
            p = self.reasons.get(rec.name)
            code, _, why = rec.reason.partition(": ")
            if p is None and code in PENDING_CODES and why:
                out["code"], out["reason"] = code, why  # stored by an earlier cycle (or run)
            elif p is None:
                out["code"] = "NotConsidered"
                out["reason"] = "not yet considered by the scheduler (it runs within a second)"
            else:
                out["code"] = str(p.code)
                out["reason"] = p.reason
            return out

    def running_view(self) -> dict[str, Running]:
        with self.lock:
            return dict(self.engine.running)

    def nodes(self) -> list[Node]:
        return list(self.bundle.nodes)


__all__ = [
    "Controller",
    "CycleStats",
    "Hooks",
    "ManifestError",
    "QuantityError",
]
