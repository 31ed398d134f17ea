"""What the controller's parts share: the ports, the lock, the fault state and the
configuration in force, and the few steps every part uses.

Why one small object: the parts (gpupool.service.controller's modules) each own their state,
but all of them talk to the same store and backend, read the same clock, change state under
the same lock and schedule onto the same engine. Those live here, and only those. The store,
the backend and the clock are read through this object on every use, never copied by a part:
the leader elector swaps in a fenced store and a guarded backend after construction, and tests
swap the clock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from gpupool.audit import AuditEntry
from gpupool.engine import Engine, PendingCode
from gpupool.manifests import Bundle
from gpupool.manifests.convert import workload_model
from gpupool.model import Snapshot, Workload
from gpupool.service.backends import Backend, Capability, capability
from gpupool.service.failures.policy import FaultState, run_hints
from gpupool.store import PhaseChange, Store

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
    #: a consolidation move carried out: the moved workload's queue, its pool and the
    #: GPU-seconds of work it lost
    on_move: Callable[[str, str, float], None] = lambda queue, pool, gpu_s_lost: None
    extra: dict[str, Any] = field(default_factory=dict)


class Context:
    """The ports and the shared state of the controller's parts (changed only under ``lock``).

    ``bundle`` and ``engine`` are the configuration in force and the engine built from it:
    gpupool.service.controller.config replaces them, every other part reads them."""

    def __init__(
        self, store: Store, backend: Backend, clock: Callable[[], float], hooks: Hooks | None = None
    ) -> None:
        self.store = store
        self.backend = backend
        self.clock = clock
        self.hooks = hooks or Hooks()
        self.lock = threading.RLock()
        #: set to ask the controller's loop for a cycle soon
        self.wake = threading.Event()
        #: backoffs, unhealthy devices, failed nodes, run hints (gpupool.service.failures.policy)
        self.faults = FaultState()
        self.bundle = Bundle()
        self.engine: Engine = Engine(Snapshot((), (), ()))

    def model_of(self, manifest: Mapping[str, Any], seq: int, bundle: Bundle | None = None) -> Workload:
        """A stored workload's model under ``bundle`` (default: the configuration in force)."""
        b = bundle if bundle is not None else self.bundle
        m = workload_model(manifest, b.priority_classes, float(seq), strict=False, types=b.task_types)
        movable = capability(self.backend, Capability.MOVABLE)
        if movable is not None and not movable(manifest):
            m = replace(m, movable=False)  # consolidation would only stop it whole
        return m

    def manifest_of(self, name: str) -> Mapping[str, Any]:
        return self.store.get_workload(name).manifest

    def note_hints(self, name: str, manifest: Mapping[str, Any]) -> None:
        hints = run_hints(manifest)
        if hints:
            self.faults.hints[name] = hints

    def requeue(self, names: Sequence[str], reason: str, now: float) -> None:
        """Make ``names`` Pending again with ``reason``, durably and audited."""
        self.store.apply_transitions(
            [PhaseChange(n, "Pending", reason) for n in names],
            audit=[
                AuditEntry(SCHEDULER, "workload.requeue", "Workload", n, {"reason": reason}) for n in names
            ],
            at=_dt(now),
        )

    def backend_down(self, now: float) -> dict[str, str]:
        report = capability(self.backend, Capability.DOWN_NODES)
        return dict(report(now)) if callable(report) else {}
