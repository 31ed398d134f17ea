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

Who evaluates: :class:`AlertLoop`, a thread the server starts with the app, every
``interval_s`` (``GPUPOOL_ALERTS_INTERVAL_S``, default 30 s), on the leader only — a standby's
view of the pending set is a copy reloaded every few seconds, and two replicas writing incidents
would race. Each rule runs on its own: one that raises is logged and counted
(``gpupool_alert_rule_errors_total``), the others still open and resolve their incidents, and
the failed rule's open incidents are left as they were (not resolved for want of an answer).
"""

from __future__ import annotations

import logging
import os
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client import Counter as PromCounter

from gpupool.service.core import Service
from gpupool.store.incidents import Firing

log = logging.getLogger("gpupool.alerts")

#: the environment variable that sets the background evaluation interval (seconds)
INTERVAL_ENV = "GPUPOOL_ALERTS_INTERVAL_S"
DEFAULT_INTERVAL_S = 30.0


@dataclass(frozen=True, slots=True)
class AlertPolicy:
    """Thresholds (defaults: those of deploy/prometheus/gpupool-rules.yaml)."""

    oldest_pending_s: float = 4 * 3600
    idle_fraction: float = 0.25
    idle_wait_s: float = 30 * 60
    failures_per_hour: int = 5
    #: how many over-limit workloads a WorkloadWaitedPastLimit message names
    named_workloads: int = 3


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
    marked = dict(svc.controller.faults.unhealthy)
    return [
        Firing("GPUUnhealthy", f"node/{node}/gpu/{i}", "critical", f"GPU {i} of node {node}: {why}")
        for node, devices in sorted(marked.items())
        for i, why in sorted(devices.items())
    ]


def _past_limit(svc: Service, policy: AlertPolicy, now: float) -> list[Firing]:
    """Pending work over its task type's wait limit: the controller's model's ``max_wait_s``
    (``Workload.max_wait_s``, resolved from the stored manifest and the task-type defaults;
    None: its type sets no limit)."""
    ctl = svc.controller
    with ctl.lock:
        pending = [(q.name, q.queue, q.submitted_at, q.model) for q in ctl.pending.values()]
    over: dict[str, list[tuple[float, str, float]]] = {}
    for name, queue, since, model in pending:
        limit = model.max_wait_s
        if limit is not None and limit > 0 and now - since > limit:
            over.setdefault(queue, []).append((now - since, name, float(limit)))
    out = []
    for queue, items in sorted(over.items()):
        items.sort(reverse=True)
        named = ", ".join(
            f"{n} ({w / 60:.0f} of {lim / 60:.0f} min)" for w, n, lim in items[: policy.named_workloads]
        )
        more = (
            f" and {len(items) - policy.named_workloads} more" if len(items) > policy.named_workloads else ""
        )
        out.append(
            Firing(
                "WorkloadWaitedPastLimit",
                f"queue/{queue}",
                "warning",
                f"{len(items)} pending workload(s) of queue {queue} waited longer than their task "
                f"type's limit: {named}{more}",
            )
        )
    return out


Rule = Callable[[Service, AlertPolicy, float], list[Firing]]
#: told of each incident a pass opened or resolved, after it is stored (gpupool.service.notify)
OnChange = Callable[[dict[str, Any]], None]

#: every rule gpupool evaluates, by name (the name an incident carries)
RULES: Mapping[str, Rule] = {
    "QueueOldestPendingAboveTarget": _queue_waits,
    "PoolIdleWhileWorkWaits": _idle_pools,
    "FailuresRising": _failures,
    "GPUUnhealthy": lambda svc, policy, now: _unhealthy(svc),
    "WorkloadWaitedPastLimit": _past_limit,
}


@dataclass(slots=True)
class Evaluation:
    """One pass over the rules: what fires, which rules answered, which raised (and why)."""

    firing: list[Firing] = field(default_factory=list)
    evaluated: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)


def evaluate_rules(
    svc: Service,
    policy: AlertPolicy | None = None,
    now: float | None = None,
    rules: Mapping[str, Rule] = RULES,
) -> Evaluation:
    """Every rule on its own: one that raises is logged and recorded in ``failed``; the rest go on."""
    pol = policy or AlertPolicy()
    t = svc.controller.clock() if now is None else now
    ev = Evaluation()
    for name, rule in rules.items():
        try:
            ev.firing += rule(svc, pol, t)
        except Exception as exc:  # a rule's bug or a database error must not silence the others
            log.exception("alert rule %s failed", name)
            ev.failed[name] = f"{type(exc).__name__}: {exc}"
        else:
            ev.evaluated.append(name)
    return ev


def evaluate(svc: Service, policy: AlertPolicy | None = None, now: float | None = None) -> list[Firing]:
    """Every condition that holds now (the rules that raised contribute nothing)."""
    return evaluate_rules(svc, policy, now).firing


def refresh(
    svc: Service,
    policy: AlertPolicy | None = None,
    now: float | None = None,
    rules: Mapping[str, Rule] = RULES,
) -> tuple[int, int]:
    """Evaluate and bring the incidents up to date: (opened, resolved). Written through the
    controller's store — the fenced view while this replica leads, so a deposed leader's
    evaluation is refused — and only the rules that answered resolve their incidents."""
    return _sync(svc, evaluate_rules(svc, policy, now, rules))


def _sync(svc: Service, ev: Evaluation, on_change: OnChange | None = None) -> tuple[int, int]:
    return svc.controller.store.sync_incidents(ev.firing, rules=ev.evaluated, on_change=on_change)


def interval_from_env(environ: Mapping[str, str] = os.environ) -> float:
    """``GPUPOOL_ALERTS_INTERVAL_S`` (seconds, > 0), else the default; a bad value is refused
    naming the variable."""
    raw = environ.get(INTERVAL_ENV)
    if raw is None or raw == "":
        return DEFAULT_INTERVAL_S
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{INTERVAL_ENV}: must be a number of seconds, got {raw!r}") from None
    if not 0 < value <= 86400:
        raise ValueError(f"{INTERVAL_ENV}: must be > 0 and at most 86400 seconds, got {raw!r}")
    return value


class AlertLoop:
    """Evaluates the rules in the background, so incidents open and resolve with nobody asking.

    Leader-only: a replica that does not hold the lease (``svc.leader`` set and not leading)
    skips its turn. A pass that fails as a whole (the database away) is logged and counted; the
    loop goes on at the next interval."""

    def __init__(
        self,
        svc: Service,
        interval_s: float | None = None,
        policy: AlertPolicy | None = None,
        registry: CollectorRegistry | None = None,
        rules: Mapping[str, Rule] = RULES,
        on_change: OnChange | None = None,
    ) -> None:
        self.svc = svc
        self.on_change = on_change
        self.interval_s = interval_from_env() if interval_s is None else interval_s
        self.policy = policy or AlertPolicy()
        self.rules = rules
        reg = registry if registry is not None else svc.metrics.registry
        self.rule_errors = PromCounter(
            "gpupool_alert_rule_errors", "Alert rule evaluations that raised, by rule", ["rule"], registry=reg
        )
        self.passes = PromCounter(
            "gpupool_alert_evaluations", "Background alert evaluation passes run", registry=reg
        )
        self.last_error = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._mu = threading.Lock()  # the loop and a GET /v1/alerts never sync at once

    def may_evaluate(self) -> bool:
        """This replica leads (or runs alone, without an election)."""
        leader = self.svc.leader
        return leader is None or leader.is_leader

    def evaluate_now(self) -> tuple[int, int]:
        """One pass if this replica may evaluate, else nothing: (opened, resolved)."""
        if not self.may_evaluate():
            return 0, 0
        with self._mu:
            ev = evaluate_rules(self.svc, self.policy, None, self.rules)
            for name in ev.failed:
                self.rule_errors.labels(name).inc()
            return _sync(self.svc, ev, self.on_change)

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="gpupool-alerts", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                if self.may_evaluate():
                    self.evaluate_now()
                    self.passes.inc()
                self.last_error = ""
            except Exception as exc:  # the loop must outlive a database outage or a lost lease
                log.warning("alert evaluation failed: %s", exc, exc_info=True)
                self.last_error = f"{type(exc).__name__}: {exc}"
                self.rule_errors.labels("*").inc()


def loop_of(app_state: Any) -> AlertLoop | None:
    """The app's background loop (``app.state.alerts``), if it runs."""
    found = getattr(app_state, "alerts", None)
    return found if isinstance(found, AlertLoop) else None


__all__ = [
    "DEFAULT_INTERVAL_S",
    "INTERVAL_ENV",
    "RULES",
    "AlertLoop",
    "AlertPolicy",
    "Evaluation",
    "evaluate",
    "evaluate_rules",
    "interval_from_env",
    "loop_of",
    "refresh",
]
