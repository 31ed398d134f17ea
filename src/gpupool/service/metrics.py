"""Prometheus metrics (``gpupool_`` prefix), one registry per app so tests can run several apps.

Why two ways of filling them: events (admissions, preemptions, failures, finished runs) arrive
through the controller's :class:`Hooks` and count at once; state (per-queue usage and guarantee,
pending work, fragmentation, cost) is read from the controller's read model after a cycle, at
most once per ``refresh_s`` (fragmentation at most once per ``frag_refresh_s``), so a scrape
only renders what is there and a burst of cycles does not repeat the same reads.

Labels are the low-cardinality ones only: queue, pool, task type, reason code and phase. A
workload's name never becomes a label here (each name would be a new series that lives forever in
Prometheus); the measured-utilisation gauges (gpupool.service.utilisation) carry it only while
the workload runs and remove its series when it ends.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from gpupool.model import UNLIMITED, Node, Running
from gpupool.service.backends import Capability, capability
from gpupool.service.controller import CycleStats, Hooks

if TYPE_CHECKING:
    from gpupool.service.controller import Controller
    from gpupool.service.readmodel import ControllerReadModel

log = logging.getLogger(__name__)

#: admission waits run from milliseconds (an idle cluster) to days (a queue far over its share)
WAIT_BUCKETS = (
    0.1, 1, 5, 15, 30, 60, 120, 300, 600, 900, 1800, 3600,
    2 * 3600, 4 * 3600, 8 * 3600, 12 * 3600, 86400, 2 * 86400, 4 * 86400, 7 * 86400,
)  # fmt: skip

#: the reason code of a pending workload the engine has not looked at yet
NEW_REASON = "New"


@dataclass(slots=True)
class _Admitted:
    """One admission seen by ``on_admit``, waiting for its task type (matched after the cycle)."""

    queue: str
    wait_s: float


class Metrics:
    """The service's metrics, the hooks that feed them and the per-cycle state refresh."""

    def __init__(self, refresh_s: float = 2.0, frag_refresh_s: float = 5.0) -> None:
        self.refresh_s = refresh_s
        self.frag_refresh_s = frag_refresh_s
        self.registry = CollectorRegistry()
        self._lock = threading.Lock()  # a scrape never sees a family half refreshed
        self._read: ControllerReadModel | None = None
        self._ctl: Controller | None = None
        self._last_refresh = float("-inf")
        self._last_frag = float("-inf")
        self._last_cost_at: float | None = None
        self._admits: list[_Admitted] = []
        self._admits_lock = threading.Lock()  # an approval may admit from a request thread
        self._known: dict[str, None] = {}  # running names at the last look (ordered)
        self._dirty = True  # the running set changed by a preemption or a finish
        self._event_families()
        self._state_families()

    # ------------------------------------------------------------------ families
    def _event_families(self) -> None:
        r = self.registry
        self.wait = Histogram(
            "gpupool_admission_wait_time_seconds",
            "Time from submit (or requeue) to admission, by queue and task type",
            ["queue", "type"],
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        self.workloads = Gauge("gpupool_workloads", "Workloads by phase", ["phase"], registry=r)
        self.gpu_allocated = Gauge("gpupool_gpu_allocated", "GPUs allocated, by pool", ["pool"], registry=r)
        self.gpu_capacity = Gauge("gpupool_gpu_capacity", "GPUs in the pool", ["pool"], registry=r)
        self.pending = Gauge(
            "gpupool_pending_workloads", "Workloads the scheduler holds as pending", registry=r
        )
        self.admissions = Counter("gpupool_admissions", "Admissions", ["queue"], registry=r)
        self.preemptions = Counter("gpupool_preemptions", "Workloads preempted", ["queue"], registry=r)
        self.moves = Counter(
            "gpupool_consolidation_moves",
            "Running workloads moved by consolidation (restarted where reserved)",
            ["queue", "pool"],
            registry=r,
        )
        self.moves_lost = Counter(
            "gpupool_consolidation_gpu_seconds_lost",
            "GPU-seconds of work lost to consolidation moves (the moved runs restarted)",
            ["queue", "pool"],
            registry=r,
        )
        self.finished = Counter(
            "gpupool_finished_workloads", "Workloads finished", ["queue", "outcome"], registry=r
        )
        self.failures = Counter(
            "gpupool_workload_failures",
            "Failed runs (abnormal exits, node failures, unhealthy devices), by cause",
            ["queue", "reason"],
            registry=r,
        )
        self.leader = Gauge("gpupool_leader", "1 while this replica holds the leader lease", registry=r)
        self.overbooked = Gauge(
            "gpupool_devices_overbooked",
            "Devices held by more pods than they can take, read from the pods' device annotations "
            "(Kubernetes backend; always 0 elsewhere, and anything else is a bug)",
            registry=r,
        )
        self.submits = Counter(
            "gpupool_submits", "Accepted submissions (new workloads)", ["queue"], registry=r
        )
        self.cycle = Histogram(
            "gpupool_scheduling_cycle_seconds",
            "Duration of one controller cycle",
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5),
            registry=r,
        )
        self.last_cycle = Gauge(
            "gpupool_last_cycle_timestamp_seconds",
            "Unix time the controller finished its last cycle (stale: the controller stopped)",
            registry=r,
        )

    def _state_families(self) -> None:
        r = self.registry
        qp = ["queue", "pool"]
        self.q_used = Gauge(
            "gpupool_queue_gpu_used", "GPUs the queue's subtree holds in the pool", qp, registry=r
        )
        self.q_guarantee = Gauge(
            "gpupool_queue_gpu_guarantee", "GPUs guaranteed to the queue in the pool", qp, registry=r
        )
        self.q_limit = Gauge(
            "gpupool_queue_gpu_limit",
            "Guarantee plus borrowing limit (absent where borrowing is unlimited)",
            qp,
            registry=r,
        )
        qtr = ["queue", "type", "reason"]
        self.q_pending = Gauge(
            "gpupool_queue_pending_workloads", "Pending workloads by queue, type and reason code", qtr,
            registry=r,
        )  # fmt: skip
        self.q_pending_gpus = Gauge(
            "gpupool_queue_pending_gpus", "GPUs requested by pending workloads", qtr, registry=r
        )
        self.oldest = Gauge(
            "gpupool_queue_oldest_pending_seconds",
            "Age of the queue's oldest pending workload (the wait histogram sees a wait only once it ends)",
            ["queue"],
            registry=r,
        )
        self.frag = Gauge(
            "gpupool_pool_fragmentation_ratio",
            "Share of the pool's free GPU capacity not on wholly free nodes (0: none free or all whole)",
            ["pool"],
            registry=r,
        )
        self.stranded = Gauge(
            "gpupool_pool_gpu_free_partial",
            "Free GPU capacity on partly allocated devices (only fractional requests can use it)",
            ["pool"],
            registry=r,
        )
        self.gpu_seconds = Counter(
            "gpupool_allocated_gpu_seconds", "GPU-seconds allocated, by queue and pool", qp, registry=r
        )
        self.cost = Counter(
            "gpupool_allocated_cost",
            "Cost of the allocated GPU time at the pool's pricePerGPUHour (currency units)",
            qp,
            registry=r,
        )

    # ------------------------------------------------------------------ wiring
    def bind(self, read: ControllerReadModel, controller: Controller) -> None:
        """Give the per-cycle refresh its sources (the controller is built after the hooks)."""
        self._read, self._ctl = read, controller

    def hooks(self) -> Hooks:
        def on_cycle(s: CycleStats) -> None:
            self.cycle.observe(s.seconds)
            self.pending.set(s.pending)
            self.last_cycle.set(time.time())
            self.after_cycle()

        def on_admit(queue: str, wait_s: float) -> None:
            with self._admits_lock:
                self._admits.append(_Admitted(queue, wait_s))
            self.admissions.labels(queue).inc()

        def on_preempt(queue: str, rule: str) -> None:
            self._dirty = True
            self.preemptions.labels(queue or "unknown").inc()

        def on_move(queue: str, pool: str, gpu_s_lost: float) -> None:
            self._dirty = True
            self.moves.labels(queue or "unknown", pool).inc()
            self.moves_lost.labels(queue or "unknown", pool).inc(gpu_s_lost)

        def on_finish(queue: str, outcome: str) -> None:
            self._dirty = True
            self.finished.labels(queue, outcome).inc()

        return Hooks(
            on_admit=on_admit,
            on_preempt=on_preempt,
            on_cycle=on_cycle,
            on_finish=on_finish,
            on_move=on_move,
            on_failure=lambda queue, reason: self.failures.labels(queue, reason).inc(),
        )

    def render(self, refresh: Callable[[Metrics], None]) -> bytes:
        with self._lock:
            refresh(self)
            return generate_latest(self.registry)

    # ------------------------------------------------------------------ after each cycle
    def after_cycle(self, now: float | None = None) -> None:
        """Observe the waits of this cycle's admissions, then refresh the state families if
        ``refresh_s`` has passed. Never raises: metrics must not fail a controller cycle."""
        ctl, read = self._ctl, self._read
        if ctl is None or read is None:
            with self._admits_lock:
                self._admits.clear()
            return
        try:
            self._observe_waits(ctl)
            mono = time.monotonic() if now is None else now
            if mono - self._last_refresh >= self.refresh_s:
                self._last_refresh = mono
                with self._lock:
                    self._refresh_state(ctl, read, mono)
        except Exception:  # a metrics bug must never stop scheduling
            log.warning("metrics refresh failed", exc_info=True)

    def _observe_waits(self, ctl: Controller) -> None:
        """Why the pairing: ``on_admit`` carries the queue and the wait but not the task type,
        so after the cycle the newly running workloads (in admission order) give each queue's
        admissions their types, in the same order. A wait with no match counts as ``unknown``."""
        if not self._admits and not self._dirty:
            return
        with self._admits_lock:
            admits, self._admits = self._admits, []
        running = ctl.running_view()
        fresh: dict[str, list[str]] = defaultdict(list)
        for name, r in running.items():
            if name not in self._known:
                fresh[r.workload.queue].append(str(r.workload.type))
        self._known = dict.fromkeys(running)
        self._dirty = False
        for a in admits:
            types = fresh.get(a.queue)
            self.wait.labels(a.queue, types.pop(0) if types else "unknown").observe(a.wait_s)

    def _refresh_state(self, ctl: Controller, read: ControllerReadModel, mono: float) -> None:
        self._refresh_quota(read)
        self._refresh_pending(ctl)
        running = ctl.running_view()
        self._count_cost(ctl, read, running)
        check = capability(ctl.backend, Capability.OVERBOOKED)
        self.overbooked.set(len(check()) if callable(check) else 0)
        if mono - self._last_frag >= self.frag_refresh_s:
            self._last_frag = mono
            self._refresh_fragmentation(read)

    def _refresh_quota(self, read: ControllerReadModel) -> None:
        rows = read.quota()
        for g in (self.q_used, self.q_guarantee, self.q_limit):
            g.clear()  # a queue or pool removed from the configuration leaves no stale series
        for row in rows:
            self.q_used.labels(row.queue, row.pool).set(row.used[0] / 1000)
            self.q_guarantee.labels(row.queue, row.pool).set(row.guarantee[0] / 1000)
            if row.limit[0] < UNLIMITED:
                self.q_limit.labels(row.queue, row.pool).set(row.limit[0] / 1000)
        for u in read.pool_usage():
            self.gpu_allocated.labels(u.pool.name).set(u.allocated_gpu_milli / 1000)
            self.gpu_capacity.labels(u.pool.name).set(u.capacity_gpu_milli / 1000)

    def _refresh_pending(self, ctl: Controller) -> None:
        counts: dict[tuple[str, str, str], list[float]] = defaultdict(lambda: [0, 0.0])
        oldest: dict[str, float] = {}
        with ctl.lock:
            now = ctl.clock()
            for name, q in ctl.pending.items():
                oldest[q.queue] = min(oldest.get(q.queue, q.submitted_at), q.submitted_at)
                p = ctl.reasons.get(name)
                key = (q.queue, str(q.model.type), str(p.code) if p is not None else NEW_REASON)
                c = counts[key]
                c[0] += 1
                c[1] += q.model.quota_vec()[0] / 1000
        self.q_pending.clear()
        self.q_pending_gpus.clear()
        self.oldest.clear()
        for queue, at in oldest.items():
            self.oldest.labels(queue).set(max(0.0, now - at))
        for key, (n, gpus) in counts.items():
            self.q_pending.labels(*key).set(n)
            self.q_pending_gpus.labels(*key).set(gpus)

    def _count_cost(self, ctl: Controller, read: ControllerReadModel, running: dict[str, Running]) -> None:
        """GPU-seconds and cost since the last refresh, for what runs now (the running set
        changes between refreshes by at most ``refresh_s`` of a workload's time)."""
        now = ctl.clock()
        last, self._last_cost_at = self._last_cost_at, now
        if last is None or now <= last:
            return
        dt = now - last
        price = {u.pool.name: u.pool.price_per_gpu_hour for u in read.pool_usage()}
        for (queue, pool), gpus in _allocated(running.values()).items():
            self.gpu_seconds.labels(queue, pool).inc(gpus * dt)
            self.cost.labels(queue, pool).inc(gpus * dt / 3600 * price.get(pool, 0.0))

    def _refresh_fragmentation(self, read: ControllerReadModel) -> None:
        used: dict[str, dict[int, int]] = {
            node: {d: sum(u.gpu_milli for u in us) for d, us in devs.items()}
            for node, devs in read.device_uses().items()
        }
        for pool, (free, whole_free, partial) in _fragmentation(read.nodes(), used).items():
            self.frag.labels(pool).set(0.0 if free <= 0 else 1 - whole_free / free)
            self.stranded.labels(pool).set(partial / 1000)


def _allocated(running: Iterable[Running]) -> dict[tuple[str, str], float]:
    """GPUs held per (queue, pool) by the running set."""
    out: dict[tuple[str, str], float] = defaultdict(float)
    for r in running:
        gpu_milli = sum(p.gpu_milli * len(p.devices) for p in r.admission.pods)
        out[(r.workload.queue, r.admission.pool)] += gpu_milli / 1000
    return out


def _fragmentation(
    nodes: Iterable[tuple[Node, str | None]], used: dict[str, dict[int, int]]
) -> dict[str, tuple[int, int, int]]:
    """Per pool: free GPU milli, free milli on wholly free nodes, free milli on partly used
    devices. Why this figure and not FGD: FGD needs the expected task-shape distribution and
    numpy per node; this one is a sum over devices, cheap enough for every few seconds, and
    says what a whole-node training job sees (free GPUs it cannot use because they are split)."""
    out: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for node, pool in nodes:
        if pool is None:
            continue
        devs = used.get(node.name, {})
        free = [1000 - min(1000, devs.get(i, 0)) for i in range(node.gpu_count)]
        acc = out[pool]
        acc[0] += sum(free)
        if not any(devs.values()):
            acc[1] += sum(free)
        acc[2] += sum(f for f in free if 0 < f < 1000)
    return {k: (v[0], v[1], v[2]) for k, v in out.items()}
