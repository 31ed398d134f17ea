"""Alerts handled in the platform (告警处置): the conditions of the shipped Prometheus rules
(deploy/prometheus/gpupool-rules.yaml), evaluated by gpupool itself over what the controller
and the store know, each firing kept as an incident (gpupool.store.incidents).

Why inside as well as in Prometheus: a site without an alerting stack still gets the alerts,
and every one becomes a record with an owner, an acknowledgement and a resolution note — the
evidence of how exceptions were handled. The thresholds are the rules' own; a rule's ``for:``
is folded into its condition where the condition is itself a duration (work waiting 4 h, work
waiting 30 min beside an idle pool). What is left out: the rules' comparison with the same hour
a day earlier (failures) and the controller/leader rules (a stopped controller cannot report
itself).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from gpupool.service.routes.base import Service
from gpupool.store.incidents import Firing


@dataclass(frozen=True, slots=True)
class AlertPolicy:
    """Thresholds (defaults: those of deploy/prometheus/gpupool-rules.yaml)."""

    oldest_pending_s: float = 4 * 3600
    idle_fraction: float = 0.25
    idle_wait_s: float = 30 * 60
    failures_per_hour: int = 5


def _queue_waits(svc: Service, policy: AlertPolicy, now: float) -> list[Firing]:
    ctl = svc.controller
    with ctl.lock:
        oldest: dict[str, float] = {}
        for q in ctl.pending.values():
            oldest[q.queue] = min(oldest.get(q.queue, now), q.submitted_at)
    return [
        Firing(
            "QueueOldestPendingAboveTarget",
            f"queue/{queue}",
            "warning",
            f"the oldest pending workload of queue {queue} has waited {(now - t) / 3600:.1f} h "
            f"(target {policy.oldest_pending_s / 3600:g} h)",
        )
        for queue, t in sorted(oldest.items())
        if now - t > policy.oldest_pending_s
    ]


def _idle_pools(svc: Service, policy: AlertPolicy, now: float) -> list[Firing]:
    ctl = svc.controller
    with ctl.lock:
        waited = [now - q.submitted_at for q in ctl.pending.values()]
    if not waited or max(waited) < policy.idle_wait_s:
        return []
    out = []
    for u in svc.read.pool_usage():
        cap = u.capacity_gpu_milli
        idle = (cap - u.allocated_gpu_milli) / cap if cap else 0.0
        if idle > policy.idle_fraction:
            out.append(
                Firing(
                    "PoolIdleWhileWorkWaits",
                    f"pool/{u.pool.name}",
                    "warning",
                    f"{idle:.0%} of pool {u.pool.name} is unallocated while work has waited "
                    f"{max(waited) / 60:.0f} min",
                )
            )
    return out


def _failures(svc: Service, policy: AlertPolicy, now: float) -> list[Firing]:
    since = datetime.fromtimestamp(now, UTC) - timedelta(hours=1)
    recent = [
        w for w in svc.store.list_workloads(phases=["Failed"]) if w.finished_at and w.finished_at >= since
    ]
    counts = Counter(w.queue for w in recent)
    return [
        Firing(
            "FailuresRising",
            f"queue/{queue}",
            "warning",
            f"{n} workloads of queue {queue} failed in the last hour (more than {policy.failures_per_hour})",
        )
        for queue, n in sorted(counts.items())
        if n > policy.failures_per_hour
    ]


def _unhealthy(svc: Service) -> list[Firing]:
    faults = getattr(svc.controller, "faults", None)
    marked = dict(faults.unhealthy) if faults is not None else {}
    return [
        Firing("GPUUnhealthy", f"node/{node}/gpu/{i}", "critical", f"GPU {i} of node {node}: {why}")
        for node, devices in sorted(marked.items())
        for i, why in sorted(devices.items())
    ]


def evaluate(svc: Service, policy: AlertPolicy | None = None, now: float | None = None) -> list[Firing]:
    """Every condition that holds now."""
    pol = policy or AlertPolicy()
    t = svc.controller.clock() if now is None else now
    return _queue_waits(svc, pol, t) + _idle_pools(svc, pol, t) + _failures(svc, pol, t) + _unhealthy(svc)


def refresh(svc: Service, policy: AlertPolicy | None = None, now: float | None = None) -> tuple[int, int]:
    """Evaluate and bring the incidents up to date: (opened, resolved)."""
    return svc.store.sync_incidents(evaluate(svc, policy, now))


__all__ = ["AlertPolicy", "evaluate", "refresh"]
