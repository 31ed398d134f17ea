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

The parts, one idea a module of this package, each a field of ``Controller`` made here with
what it needs (the shared ``Context`` of gpupool.service.controller.context, and the other
parts it calls): ``config`` (configuration install and the queue-tree lookups),
``pending_set`` (the pending set and its stored reasons), ``commit`` (the write-ahead commit),
``finishing`` (finished runs and expiry), ``approvals`` (approvals, exceptions, cancels),
``cycler`` (the cycle and isolation), ``recovery``. This module keeps the loop and lifecycle,
drains, the read side, and the names callers use (each a property over the part that owns it).
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from gpupool.engine import Engine, Pending
from gpupool.engine.decay import DecayedUsage
from gpupool.engine.ordering import workload_order_key
from gpupool.manifests import Bundle
from gpupool.model import Node, Queue, ResourcePool, Running, Workload
from gpupool.service import holders, task_types
from gpupool.service.adoption import Adoption
from gpupool.service.backends import Backend, Capability, capability
from gpupool.service.controller.approvals import Approvals
from gpupool.service.controller.commit import Commit
from gpupool.service.controller.config import Configuration
from gpupool.service.controller.context import PENDING_CODES, Context, CycleStats, Hooks, _Queued
from gpupool.service.controller.cycle import Cycle
from gpupool.service.controller.finish import Finishing
from gpupool.service.controller.pending import PendingSet
from gpupool.service.controller.recovery import Recovery
from gpupool.service.failures.nodes import evict, on_node
from gpupool.service.failures.policy import BACKOFF_CODE, Fault, FaultState
from gpupool.service.windows import WindowStats
from gpupool.store import NotLeader, Store, WorkloadRecord

log = logging.getLogger("gpupool.controller")


class Controller:
    """Owns the engine, the pending set and every workload phase change, through its parts.

    A ``ConfigLookups`` (the routes judge a caller by the queue tree of one): each lookup is
    answered by the configuration's ``QueueTree`` (``config.tree``)."""

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
        self.ctx = ctx = Context(store, backend, clock, hooks)
        self.tick_s = tick_s
        self.min_interval_s = min_interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: runs the cluster holds that the store did not know at recovery (adoption.py)
        self.adoption = Adoption()
        self.pending_set = PendingSet(ctx, resync_s)
        self.config = Configuration(ctx, self.pending_set)
        self.commit = Commit(ctx, self.pending_set)
        self.approvals = Approvals(ctx, self.pending_set)
        self.finishing = Finishing(ctx, self.pending_set, self.approvals)
        self.cycler = Cycle(
            ctx,
            pending=self.pending_set,
            config=self.config,
            commit=self.commit,
            finishing=self.finishing,
            approvals=self.approvals,
            adoption=self.adoption,
            tick_s=tick_s,
            reason_interval_s=reason_interval_s,
        )
        self.recovery = Recovery(
            ctx,
            pending=self.pending_set,
            config=self.config,
            commit=self.commit,
            approvals=self.approvals,
            adoption=self.adoption,
        )
        self.ready = False
        self.last_error = ""

    # ------------------------------------------------------------------ lifecycle and loop
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
        self.ctx.wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def wake(self) -> None:
        """Ask for a cycle soon (an event happened)."""
        self.ctx.wake.set()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _loop(self) -> None:
        wake = self.ctx.wake
        while not self._stop.is_set():
            woke = wake.wait(self._sleep_for())
            wake.clear()
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
        nxt = capability(self.backend, Capability.NEXT_FINISH)
        wait = self.tick_s
        if callable(nxt):
            t = nxt()
            if t is not None:
                wait = min(wait, max(0.0, t - self.clock()))
        return wait

    # ------------------------------------------------------------- events, each to its part
    def cycle(self) -> CycleStats:
        """One pass: record finished runs, expire what is due, admit/preempt, apply durably."""
        return self.cycler.run()

    def recover(self) -> None:
        """Make store, backend and engine agree again after a (possibly unclean) stop."""
        with self.lock:
            self.ready = False
            self.recovery.recover()
            self.ready = True
        # what recovery built (configuration, engine indexes, the pending set) lives long: keep
        # it out of the collector's full passes, which otherwise stall every request (see the
        # same call in gpupool.service.api)
        gc.collect()
        gc.freeze()

    def load_view(self) -> None:
        """A standby's view: the configuration and the stored placements, from the store alone."""
        self.recovery.load_view()

    def submitted(self, rec: WorkloadRecord, model: Workload) -> None:
        """A new Pending workload was committed; schedule it soon."""
        self.pending_set.submitted(rec, model)

    def resync(self) -> None:
        """Reload the pending set from the store (after approvals)."""
        self.pending_set.resync()

    def queue_again(self, rec: WorkloadRecord) -> None:
        """Hold a workload requeued outside a cycle's decisions (a failure, an eviction) as pending."""
        self.pending_set.queue_again(rec)

    def config_manifests(self) -> list[dict[str, Any]]:
        return self.config.manifests()

    def reload_config(self) -> None:
        """Rebuild the engine from the stored configuration, keeping what runs (after a config change)."""
        with self.lock:
            bundle = self.config.reload()
            self.cycler.isolated.clear()  # the new configuration may decide them fine
            self.pending_set.remodel(bundle)  # priority classes may have changed
            self.ctx.wake.set()

    def nodes_changed(self) -> None:
        """The backend's observed nodes changed: rebuild the engine at the next cycle."""
        self.config.nodes_changed()

    def open_approval(self, w: WorkloadRecord, now: float) -> None:
        self.approvals.open_approval(w, now)

    def request_approval(self, w: WorkloadRecord, now: float, ttl_s: float = 7 * 86400) -> None:
        self.approvals.request_approval(w, now, ttl_s)

    def grant_exception(self, name: str, until: float) -> None:
        self.approvals.grant_exception(name, until)

    def cancel(self, name: str, actor: str) -> WorkloadRecord:
        """Cancel (write-ahead: Cancelled is committed before the backend stops it); idempotent."""
        with self.lock:
            rec, cancelled = self.approvals.cancel(name, actor)
            if cancelled:
                self.cycler.isolated.pop(name, None)
            return rec

    def cancel_many(self, names: Sequence[str], actor: str, chunk: int = 500) -> int:
        """Cancel many workloads, one transaction per chunk (each audited); returns how many."""
        with self.lock:
            return self.approvals.cancel_many(names, actor, chunk)

    def drain(self, node: str, reason: str, actor: str) -> list[str]:
        """Evict every workload on ``node`` with ``reason`` and requeue it (the caller cordons first)."""
        with self.lock:
            names = on_node(self.engine.running.values(), node)
            why = f"node {node} drained by {actor}" + (f": {reason}" if reason else "")
            faults = {n: Fault("Drained", why, counted=False) for n in names}
            evict(self.ctx, self.pending_set.queue_again, faults, self.clock(), actor)
            self.ctx.wake.set()
            return names

    # ------------------------------------------------------------------------ the read side
    def explain(self, rec: WorkloadRecord) -> dict[str, Any]:
        """Where a workload stands in its queue and, if it waits, the engine's reason why."""
        with self.lock:
            out: dict[str, Any] = {"name": rec.name, "queue": rec.queue, "phase": rec.phase}
            # what its type set, and from where; the pods admitted of those asked (partial admission)
            out["typeDefaults"] = task_types.explained(rec.manifest, self.bundle)
            out.update(task_types.pod_counts(rec.manifest, rec.placement))
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
                out["code"] = BACKOFF_CODE
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

    def waiting_on(self, name: str, code: str | None) -> holders.Wait | None:
        """What a pending workload waits for, with ``code`` as ``explain`` gave it: the scope,
        the running work holding it, the usage and the estimated start (gpupool.service.holders;
        expected ends on this controller's clock, the backend's time scale applied)."""
        with self.lock:
            q = self.pending.get(name)
            if q is None or code not in holders.CODES:
                return None
            scale = capability(self.backend, Capability.TIME_SCALE) or 1.0
            reader = holders.WaitReader(self.engine, float(scale) if isinstance(scale, int | float) else 1.0)
            return reader.read(q.model, code, self.clock())

    def running_view(self) -> dict[str, Running]:
        with self.lock:
            return dict(self.engine.running)

    def nodes(self) -> list[Node]:
        return list(self.bundle.nodes)

    # ------------------------------- the queue-tree lookups on the configuration in force
    def is_in_subtree(self, queue: str, root: str) -> bool:
        """Is ``queue`` ``root`` or below it? (for gpupool.auth.authorize)"""
        return self.config.tree.is_in_subtree(queue, root)

    def queue_path(self, queue: str) -> list[str]:
        return self.config.tree.queue_path(queue)

    def is_leaf(self, queue: str) -> bool:
        return self.config.tree.is_leaf(queue)

    def queue_limit_gpu_milli(self, queue: str, pool: str) -> int:
        """The most GPU (milli) a workload in ``queue`` can ever get in ``pool`` under its quotas."""
        return self.config.tree.queue_limit_gpu_milli(queue, pool)

    # --------------------------- the names callers read, each over the part that owns it
    @property
    def store(self) -> Store:
        return self.ctx.store

    @store.setter
    def store(self, store: Store) -> None:  # the leader elector fences it after construction
        self.ctx.store = store

    @property
    def backend(self) -> Backend:
        return self.ctx.backend

    @backend.setter
    def backend(self, backend: Backend) -> None:  # the leader elector guards it
        self.ctx.backend = backend

    @property
    def clock(self) -> Callable[[], float]:
        return self.ctx.clock

    @clock.setter
    def clock(self, clock: Callable[[], float]) -> None:
        self.ctx.clock = clock

    @property
    def hooks(self) -> Hooks:
        return self.ctx.hooks

    @property
    def lock(self) -> threading.RLock:
        return self.ctx.lock

    @property
    def faults(self) -> FaultState:
        return self.ctx.faults

    @property
    def engine(self) -> Engine:
        return self.ctx.engine

    @engine.setter
    def engine(self, engine: Engine) -> None:
        self.ctx.engine = engine

    @property
    def bundle(self) -> Bundle:
        return self.ctx.bundle

    @property
    def pending(self) -> dict[str, _Queued]:
        return self.pending_set.pending

    @property
    def reasons(self) -> dict[str, Pending]:
        return self.pending_set.reasons

    @property
    def inbox(self) -> deque[_Queued]:
        """Committed submissions not yet taken into ``pending`` (gpupool.service.limits counts them)."""
        return self.pending_set.inbox

    @property
    def parents(self) -> dict[str, str | None]:
        return self.config.tree.parents

    @property
    def children(self) -> dict[str, list[str]]:
        return self.config.tree.children

    @property
    def pools_by_name(self) -> dict[str, ResourcePool]:
        return self.config.pools_by_name

    @property
    def queues_by_name(self) -> dict[str, Queue]:
        return self.config.queues_by_name

    @property
    def usage_decay(self) -> DecayedUsage | None:
        return self.config.usage_decay

    @property
    def window_stats(self) -> WindowStats:
        return self.cycler.window_stats

    @property
    def cycles(self) -> int:
        return self.cycler.cycles

    @property
    def last_cycle_at(self) -> float:
        return self.cycler.last_cycle_at

    @property
    def reason_interval_s(self) -> float:
        return self.cycler.reason_interval_s

    @reason_interval_s.setter
    def reason_interval_s(self, seconds: float) -> None:
        self.cycler.reason_interval_s = seconds
