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

The parts, one idea a module of this package (each still a mixin of ``Controller``, over the
shared state of gpupool.service.controller.state): configuration install (config), the pending
set (pending), the cycle and isolation (cycle), the write-ahead commit (commit), finished runs
and expiry (finish), approvals, exceptions and cancels (approvals), recovery (recovery). This
module keeps the loop and lifecycle, drains, and the read side.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from gpupool.engine.ordering import workload_order_key
from gpupool.manifests import ManifestError
from gpupool.model import Node, Running
from gpupool.quantity import QuantityError
from gpupool.service import failures as flt
from gpupool.service import holders, task_types
from gpupool.service.controller.cycle import Cycle
from gpupool.service.controller.recovery import Recovery
from gpupool.service.controller.state import (
    ACTIVE,
    DEFAULT_EXCEPTION_S,
    EXCEPTION_EVENT,
    PENDING_CODES,
    SCHEDULER,
    CycleStats,
    Hooks,
)
from gpupool.store import NotLeader, WorkloadRecord

log = logging.getLogger("gpupool.controller")


class Controller(Cycle, Recovery):
    """Owns the engine, the pending set and every workload phase change."""

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

    def drain(self, node: str, reason: str, actor: str) -> list[str]:
        """Evict every workload on ``node`` with ``reason`` and requeue it (the caller cordons first)."""
        with self.lock:
            names = flt.on_node(self.engine.running.values(), node)
            why = f"node {node} drained by {actor}" + (f": {reason}" if reason else "")
            flt.evict(self, {n: flt.Fault("Drained", why, counted=False) for n in names}, self.clock(), actor)
            self._wake.set()
            return names

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

    def waiting_on(self, name: str, code: str | None) -> holders.Wait | None:
        """What a pending workload waits for, with ``code`` as ``explain`` gave it: the scope,
        the running work holding it, the usage and the estimated start (gpupool.service.holders;
        expected ends on this controller's clock, the backend's time scale applied)."""
        with self.lock:
            q = self.pending.get(name)
            if q is None or code not in holders.CODES:
                return None
            scale = getattr(self.backend, "time_scale", 1.0)
            reader = holders.WaitReader(self.engine, float(scale) if isinstance(scale, int | float) else 1.0)
            return reader.read(q.model, code, self.clock())

    def running_view(self) -> dict[str, Running]:
        with self.lock:
            return dict(self.engine.running)

    def nodes(self) -> list[Node]:
        return list(self.bundle.nodes)


__all__ = [
    "ACTIVE",
    "DEFAULT_EXCEPTION_S",
    "EXCEPTION_EVENT",
    "PENDING_CODES",
    "SCHEDULER",
    "Controller",
    "CycleStats",
    "Hooks",
    "ManifestError",
    "QuantityError",
]
