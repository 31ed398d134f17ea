"""Prometheus metrics (``gpupool_`` prefix), one registry per app so tests can run several apps.

Why gauges are filled at scrape time: counts by phase and GPU allocation are facts of the store
and the engine; recomputing them on scrape can never drift from the truth.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from gpupool.service.controller import CycleStats, Hooks

WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600, 4 * 3600, 24 * 3600)


class Metrics:
    """The service's metrics and the hooks that feed them."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.wait = Histogram(
            "gpupool_admission_wait_time_seconds",
            "Time from submit to admission",
            ["queue"],
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
        self.submits = Counter(
            "gpupool_submits", "Accepted submissions (new workloads)", ["queue"], registry=r
        )
        self.cycle = Histogram(
            "gpupool_scheduling_cycle_seconds",
            "Duration of one controller cycle",
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5),
            registry=r,
        )

    def hooks(self) -> Hooks:
        def on_cycle(s: CycleStats) -> None:
            self.cycle.observe(s.seconds)
            self.pending.set(s.pending)

        def on_admit(queue: str, wait_s: float) -> None:
            self.wait.labels(queue).observe(wait_s)
            self.admissions.labels(queue).inc()

        return Hooks(
            on_admit=on_admit,
            on_preempt=lambda queue, rule: self.preemptions.labels(queue or "unknown").inc(),
            on_cycle=on_cycle,
            on_finish=lambda queue, outcome: self.finished.labels(queue, outcome).inc(),
            on_failure=lambda queue, reason: self.failures.labels(queue, reason).inc(),
        )

    def render(self, refresh: Callable[[Metrics], None]) -> bytes:
        refresh(self)
        return generate_latest(self.registry)
