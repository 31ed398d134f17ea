"""The controller's state and the few primitives every part of it uses.

Why a module of its own: the controller (gpupool.service.controller) is split by idea into
mixins (configuration, pending set, cycle, commit, finishing, approvals, recovery); each needs
the same state (store, backend, engine, pending set, reasons, faults) and a few shared steps:
hold a workload as pending again, requeue durably, read a manifest, note run hints. They live
here, under the mixins, so that no mixin depends on another for them.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from gpupool.audit import AuditEntry
from gpupool.engine import Engine, Pending, PendingCode
from gpupool.engine.decay import DecayedUsage
from gpupool.engine.windowed import MixEngine
from gpupool.manifests import Bundle
from gpupool.model import Queue, ResourcePool, Snapshot, Workload
from gpupool.service import failures as flt
from gpupool.service.admission import is_exception
from gpupool.service.adoption import Adoption
from gpupool.service.backends import Backend
from gpupool.service.convert import workload_model
from gpupool.service.view import ConfigLookups
from gpupool.service.windows import Hopeless, WindowStats
from gpupool.store import PhaseChange, Store, WorkloadRecord

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


class ControllerState(ConfigLookups):
    """The controller's state (set up here, changed only under ``lock``) and shared steps."""

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
        #: workloads Unsatisfiable everywhere, kept out of cycles until the engine changes
        self.hopeless = Hopeless()
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
        #: decayed GPU-seconds per queue, when the Cluster sets a usage half-life (usage_decay.py)
        self.usage_decay: DecayedUsage | None = None
        #: runs the cluster holds that the store did not know at recovery (adoption.py)
        self.adoption = Adoption()
        self.ready = False
        self.cycles = 0
        self.last_cycle_at = 0.0
        self.last_error = ""

    @property
    def inbox(self) -> deque[_Queued]:
        """Committed submissions not yet taken into ``pending`` (gpupool.service.limits counts them)."""
        return self._inbox

    def _manifest_of(self, name: str) -> Mapping[str, Any]:
        return self.store.get_workload(name).manifest

    def _note_hints(self, name: str, manifest: Mapping[str, Any]) -> None:
        hints = flt.run_hints(manifest)
        if hints:
            self.faults.hints[name] = hints

    def queue_again(self, rec: WorkloadRecord) -> None:
        """Hold a workload requeued outside a cycle's decisions (a failure, an eviction) as pending."""
        model = workload_model(
            rec.manifest,
            self.bundle.priority_classes,
            float(rec.seq),
            strict=False,
            types=self.bundle.task_types,
        )
        at = rec.submitted_at.timestamp()
        exc = is_exception(rec.manifest)
        self.pending[rec.name] = _Queued(rec.name, rec.seq, rec.queue, rec.owner, at, model, exc)
        self._stored_reasons[rec.name] = rec.reason
        self.reasons.pop(rec.name, None)

    def _requeue(self, names: Sequence[str], reason: str, now: float) -> None:
        self.store.apply_transitions(
            [PhaseChange(n, "Pending", reason) for n in names],
            audit=[
                AuditEntry(SCHEDULER, "workload.requeue", "Workload", n, {"reason": reason}) for n in names
            ],
            at=_dt(now),
        )

    def _backend_down(self, now: float) -> dict[str, str]:
        report = getattr(self.backend, "down_nodes", None)
        return dict(report(now)) if callable(report) else {}
