"""Failures and node faults in the live service: the retry policy, and evictions for node faults.

Why a module of its own: the controller owns every phase change, but what to do with a failed run
(how long to back off, when to give up, what to record) and which running work a node fault must
displace are policies; keeping them here keeps the controller's cycle readable and lets the
policy be tested on its own.

Durability: every failure is one transaction that changes the phase (``Running -> Pending`` for a
retry, ``-> Failed`` when the retries are spent) and appends a ``RunFailed`` event and an audit
record. The event's message ends with a machine-readable tail (``[exit-code=137 retry-at=...]``),
so the attempt history and the backoff's "not before" are derived from stored events after a
restart: nothing about a backoff lives only in memory.

Node faults: a node removed from the configuration, a ``NoExecute`` taint a workload does not
tolerate and a drain are *evictions* (requeued at once, not counted against ``maxRetries``); a
node failure reported by the backend and an unhealthy device are *failures* of the run recorded
as such, but faults of the platform: requeued at once, not counted against ``maxRetries`` (up to
``MAX_PLATFORM_REQUEUES`` of them). Evictions are write-ahead like preemptions:
``Preempted`` with the reason is committed, the backend stops the run, then it is requeued.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from gpupool.audit import AuditEntry
from gpupool.model import Node, Running
from gpupool.quantity import QuantityError, parse_duration
from gpupool.store import EventRecord, PhaseChange, WorkloadRecord

if TYPE_CHECKING:
    from gpupool.engine import Engine
    from gpupool.service.controller import Controller

SCHEDULER = "scheduler"
FAILED_EVENT = "RunFailed"
#: faults of the platform, not of the job: requeued at once and not counted against the
#: workload's maxRetries (as Slurm requeues on node failure); past this many such requeues in a
#: row of one workload, it fails like any other (a fault that follows it is likely its own).
#: BindFailed: the Kubernetes backend could not bind a gang before its deadline (API server or
#: node trouble, never the job's code); UnexpectedAdmissionError: the kubelet refused the pod
#: at admission (device plugin out of step), again before any of the job's code ran.
PLATFORM_FAULTS = frozenset({"NodeFailure", "DeviceUnhealthy", "BindFailed", "UnexpectedAdmissionError"})
MAX_PLATFORM_REQUEUES = 10
BACKOFF_CODE = "Backoff"
#: per-workload annotations read by the virtual backend (a run that fails after this virtual time)
FAIL_AFTER_ANNOTATION = "gpupool.io/fail-after"
EXIT_CODE_ANNOTATION = "gpupool.io/exit-code"
#: per-workload overrides of the retry backoff (durations)
BACKOFF_ANNOTATION = "gpupool.io/retry-backoff"
MAX_BACKOFF_ANNOTATION = "gpupool.io/retry-max-backoff"
#: on a Cluster object: JSON {"<node>/<index>": "<reason>"} of devices marked unhealthy
UNHEALTHY_ANNOTATION = "gpupool.io/unhealthy-devices"
RUN_HINTS = (FAIL_AFTER_ANNOTATION, EXIT_CODE_ANNOTATION)
_TAIL = re.compile(r" \[exit-code=(?P<code>\S+) (?:retry-at=(?P<at>[0-9.]+)|final)\]$")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often a failed run is retried, and how long it waits before each retry."""

    max_retries: int
    backoff_s: float
    max_backoff_s: float
    factor: float = 2.0

    def delay(self, retry: int) -> float:
        """Wait before retry number ``retry`` (1-based): exponential, capped."""
        return min(self.max_backoff_s, self.backoff_s * self.factor ** max(0, retry - 1))


#: defaults by task type: serving comes back fast and often; long training waits longer
DEFAULT_POLICIES: Mapping[str, RetryPolicy] = {
    "inference": RetryPolicy(5, 5.0, 60.0),
    "training": RetryPolicy(3, 60.0, 1800.0),
    "fine-tuning": RetryPolicy(3, 30.0, 900.0),
    "evaluation": RetryPolicy(2, 10.0, 300.0),
    "batch": RetryPolicy(2, 30.0, 600.0),
}


@dataclass(frozen=True, slots=True)
class Fault:
    """Why one run ended abnormally or must leave its node."""

    code: str  # Error | OOMKilled | NodeFailure | DeviceUnhealthy | NodeRemoved | NoExecuteTaint | Drained
    reason: str
    exit_code: int | None = None
    counted: bool = True  # a failure under the retry policy (False: an eviction, requeued at once)

    @property
    def what(self) -> str:
        return f"exit code {self.exit_code}" if self.exit_code is not None else self.code


@dataclass(slots=True)
class FaultState:
    """What the controller knows about failures and faults between cycles."""

    #: workloads in backoff: name -> (not before, epoch seconds)
    holds: dict[str, float] = field(default_factory=dict)
    #: devices marked unhealthy through the API: node -> index -> reason
    unhealthy: dict[str, dict[int, str]] = field(default_factory=dict)
    #: nodes the backend reports failed: node -> reason
    down: dict[str, str] = field(default_factory=dict)
    #: run hints (fail-after annotations) of workloads that carry them, for the backend
    hints: dict[str, dict[str, str]] = field(default_factory=dict)
    #: base/cap of the backoff for every task type, when set (ServiceConfig)
    backoff_s: float | None = None
    max_backoff_s: float | None = None


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds")


# ---------------------------------------------------------------------- policy
def policy_for(manifest: Mapping[str, Any], state: FaultState) -> RetryPolicy:
    """The retry policy of a workload: its type's default, then ``spec.maxRetries`` and annotations."""
    spec = manifest.get("spec") if isinstance(manifest, Mapping) else None
    spec = spec if isinstance(spec, Mapping) else {}
    pol = DEFAULT_POLICIES.get(str(spec.get("type") or "batch"), DEFAULT_POLICIES["batch"])
    if state.backoff_s is not None:
        pol = replace(pol, backoff_s=state.backoff_s)
    if state.max_backoff_s is not None:
        pol = replace(pol, max_backoff_s=state.max_backoff_s)
    mr = spec.get("maxRetries")
    if isinstance(mr, int) and not isinstance(mr, bool) and mr >= 0:
        pol = replace(pol, max_retries=mr)
    md = manifest.get("metadata") if isinstance(manifest, Mapping) else None
    ann = md.get("annotations") if isinstance(md, Mapping) else None
    if isinstance(ann, Mapping):
        try:
            if BACKOFF_ANNOTATION in ann:
                pol = replace(pol, backoff_s=parse_duration(ann[BACKOFF_ANNOTATION]))
            if MAX_BACKOFF_ANNOTATION in ann:
                pol = replace(pol, max_backoff_s=parse_duration(ann[MAX_BACKOFF_ANNOTATION]))
        except QuantityError:
            pass  # a malformed override keeps the default (the workload still runs)
    return pol


def run_hints(manifest: Mapping[str, Any]) -> dict[str, str]:
    """The annotations a backend may act on (fail-after, exit-code); usually empty."""
    md = manifest.get("metadata") if isinstance(manifest, Mapping) else None
    ann = md.get("annotations") if isinstance(md, Mapping) else None
    if not isinstance(ann, Mapping):
        return {}
    return {k: str(ann[k]) for k in RUN_HINTS if k in ann}


def parse_failure_rates(values: Sequence[str]) -> dict[str, float]:
    """``--failure-rate`` values: ``TYPE=RATE`` or ``RATE`` (any type), abnormal exits per running hour."""
    out: dict[str, float] = {}
    for v in values:
        key, _, rate = v.rpartition("=")
        try:
            r = float(rate)
        except ValueError:
            raise ValueError(
                f"--failure-rate {v!r}: expected TYPE=RATE or RATE (exits per running hour)"
            ) from None
        if not 0 <= r < 1e6 or r != r:
            raise ValueError(f"--failure-rate {v!r}: the rate must be between 0 and 1e6")
        if key and key not in DEFAULT_POLICIES and key != "*":
            raise ValueError(
                f"--failure-rate {v!r}: unknown task type {key!r}; one of {', '.join(DEFAULT_POLICIES)}"
            )
        out[key or "*"] = r
    return out


# ---------------------------------------------------------------------- history
@dataclass(frozen=True, slots=True)
class FailureRecord:
    at: datetime
    code: str
    reason: str
    exit_code: int | None
    retry_at: float | None  # None: the final failure

    def view(self) -> dict[str, Any]:
        return {
            "at": self.at.isoformat(),
            "exitCode": self.exit_code,
            "reason": f"{self.code}: {self.reason}",
            "retryAt": _iso(self.retry_at) if self.retry_at is not None else None,
        }


def parse_failure(ev: EventRecord) -> FailureRecord | None:
    """A stored ``RunFailed`` event back as a record (None for any other event)."""
    if ev.reason != FAILED_EVENT:
        return None
    m = _TAIL.search(ev.message)
    head = ev.message[: m.start()] if m else ev.message
    code, _, why = head.partition(": ")
    exit_code = None
    if m and m["code"] != "none":
        try:
            exit_code = int(m["code"])
        except ValueError:
            exit_code = None
    retry_at = float(m["at"]) if m and m["at"] else None
    return FailureRecord(ev.at, code, why.split("; retry ")[0].split("; no retries")[0], exit_code, retry_at)


def failures(events: Iterable[EventRecord]) -> list[FailureRecord]:
    return [f for e in events if (f := parse_failure(e)) is not None]


def history_view(events: Sequence[EventRecord]) -> dict[str, Any]:
    """``attempts`` (runs started) and ``failures`` [{at, exitCode, reason, retryAt}] of a workload."""
    return {
        "attempts": sum(1 for e in events if e.reason == "Running"),
        "failures": [f.view() for f in failures(events)],
    }


# ---------------------------------------------------------------------- recording failures
@dataclass(frozen=True, slots=True)
class _Outcome:
    """What one failure becomes: the phase change, its audit record, the event, a backoff hold."""

    change: PhaseChange
    audit: AuditEntry
    event: tuple[str, str, str, str]
    hold: float | None = None


def record_failures(ctl: Controller, failed: Sequence[tuple[WorkloadRecord, Fault]], now: float) -> None:
    """Requeue each failed workload after its backoff, or end it Failed; one transaction for all.

    The caller has already stopped the runs in the backend (or the backend ended them itself).
    """
    if not failed:
        return
    outcomes = [
        _outcome(
            rec, fault, policy_for(rec.manifest, ctl.faults), failures(ctl.store.list_events(rec.name)), now
        )
        for rec, fault in failed
    ]
    done = ctl.store.apply_transitions(
        [o.change for o in outcomes],
        audit=[o.audit for o in outcomes],
        at=_dt(now),
        events=[o.event for o in outcomes],
    )
    for rec, fault in failed:
        ctl.hooks.on_failure(rec.queue, fault.code)
    ctl.faults.holds.update({o.change.name: o.hold for o in outcomes if o.hold is not None})
    for new in done:
        if new.phase == "Pending":
            ctl.queue_again(new)
        else:
            ctl.faults.hints.pop(new.name, None)
            ctl.hooks.on_finish(new.queue, new.phase)


def _outcome(
    rec: WorkloadRecord, fault: Fault, pol: RetryPolicy, past: Sequence[FailureRecord], now: float
) -> _Outcome:
    """A platform fault is requeued at once (up to MAX_PLATFORM_REQUEUES), the job's own failure
    after its backoff while retries remain; otherwise the workload ends Failed."""
    infra = fault.code in PLATFORM_FAULTS
    retry = sum(f.code not in PLATFORM_FAULTS for f in past) + (0 if infra else 1)
    platform_n = sum(f.code in PLATFORM_FAULTS for f in past) + 1
    detail: dict[str, Any] = {
        "code": fault.code,
        "reason": fault.reason,
        "exitCode": fault.exit_code,
        "attempt": retry,
        "maxRetries": pol.max_retries,
    }
    if infra and platform_n <= MAX_PLATFORM_REQUEUES:
        return _requeued_at_once(rec, fault, platform_n, detail, now)
    if not infra and retry <= pol.max_retries:
        return _backed_off(rec, fault, pol, retry, detail, now)
    return _final(rec, fault, pol, retry, past, detail, now)


def _tail(fault: Fault) -> str:
    return "none" if fault.exit_code is None else str(fault.exit_code)


def _requeued_at_once(
    rec: WorkloadRecord, fault: Fault, platform_n: int, detail: dict[str, Any], now: float
) -> _Outcome:
    why = (
        f"Requeued: {fault.what} at {_iso(now)}: {fault.reason}; a platform fault, not counted "
        f"against maxRetries ({platform_n} of {MAX_PLATFORM_REQUEUES} such requeues)"
    )
    msg = f"{fault.code}: {fault.reason}; retry at once, not counted against maxRetries "
    msg += f"[exit-code={_tail(fault)} retry-at={now:.3f}]"
    detail["counted"] = False
    return _Outcome(
        PhaseChange(rec.name, "Pending", why),
        AuditEntry(SCHEDULER, "workload.failure", "Workload", rec.name, detail),
        (rec.name, "Warning", FAILED_EVENT, msg),
    )


def _backed_off(
    rec: WorkloadRecord, fault: Fault, pol: RetryPolicy, retry: int, detail: dict[str, Any], now: float
) -> _Outcome:
    not_before = now + pol.delay(retry)
    why = (
        f"{BACKOFF_CODE}: retry {retry} of {pol.max_retries} after {fault.what} at {_iso(now)}; "
        f"not before {_iso(not_before)}"
    )
    msg = f"{fault.code}: {fault.reason}; retry {retry} of {pol.max_retries} not before "
    msg += f"{_iso(not_before)} [exit-code={_tail(fault)} retry-at={not_before:.3f}]"
    detail["retryAt"] = _iso(not_before)
    return _Outcome(
        PhaseChange(rec.name, "Pending", why),
        AuditEntry(SCHEDULER, "workload.failure", "Workload", rec.name, detail),
        (rec.name, "Warning", FAILED_EVENT, msg),
        not_before,
    )


def _final(
    rec: WorkloadRecord,
    fault: Fault,
    pol: RetryPolicy,
    retry: int,
    past: Sequence[FailureRecord],
    detail: dict[str, Any],
    now: float,
) -> _Outcome:
    attempts = [{"at": f.at.isoformat(), "exitCode": f.exit_code, "reason": f.code} for f in past]
    attempts.append({"at": _iso(now), "exitCode": fault.exit_code, "reason": fault.code})
    why = (
        f"RetriesExhausted: {fault.code} ({fault.what}): {fault.reason}; gave up after "
        f"{retry} failed attempts (maxRetries {pol.max_retries})"
    )
    msg = f"{fault.code}: {fault.reason}; no retries left after {retry} failed attempts "
    msg += f"[exit-code={_tail(fault)} final]"
    detail["final"] = True
    detail["attempts"] = attempts
    return _Outcome(
        PhaseChange(rec.name, "Failed", why),
        AuditEntry(SCHEDULER, "workload.fail", "Workload", rec.name, detail),
        (rec.name, "Warning", FAILED_EVENT, msg),
    )


def _dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


def load_holds(ctl: Controller, stored_reasons: Mapping[str, str], now: float) -> None:
    """After a restart: the backoff of every Pending workload whose stored reason says Backoff."""
    ctl.faults.holds.clear()
    for name, reason in stored_reasons.items():
        if not reason.startswith(f"{BACKOFF_CODE}:"):
            continue
        past = failures(ctl.store.list_events(name))
        if past and past[-1].retry_at is not None and past[-1].retry_at > now:
            ctl.faults.holds[name] = past[-1].retry_at


def held(state: FaultState, pending: Mapping[str, Any], now: float) -> set[str]:
    """Pending workloads still in backoff (expired or no longer pending holds are dropped)."""
    for n in [n for n, t in state.holds.items() if t <= now or n not in pending]:
        del state.holds[n]
    return set(state.holds)


# ---------------------------------------------------------------------- node faults
def unhealthy_devices(manifests: Iterable[Mapping[str, Any]]) -> dict[str, dict[int, str]]:
    """Devices marked unhealthy, from the Cluster objects' annotations (malformed entries skipped)."""
    out: dict[str, dict[int, str]] = {}
    for m in manifests:
        if m.get("kind") != "Cluster":
            continue
        raw = ((m.get("metadata") or {}).get("annotations") or {}).get(UNHEALTHY_ANNOTATION)
        try:
            marks = json.loads(raw) if raw else {}
        except ValueError:
            continue
        if not isinstance(marks, dict):
            continue
        for key, why in marks.items():
            node, _, idx = str(key).rpartition("/")
            if node and idx.isdigit():
                out.setdefault(node, {})[int(idx)] = str(why)
    return out


def effective_nodes(nodes: Sequence[Node], down: Mapping[str, str]) -> tuple[Node, ...]:
    """The configured nodes, with those the backend reports failed made unschedulable."""
    if not down:
        return tuple(nodes)
    return tuple(replace(n, schedulable=False) if n.name in down else n for n in nodes)


def occupy_unhealthy(engine: Engine, unhealthy: Mapping[str, Mapping[int, str]]) -> None:
    """Take unhealthy devices out of placement by holding them whole in the engine's cluster state.

    Why this way: the engine stays as it is (pure, no new field to honour, no cost when nothing
    is unhealthy); a held device looks fully used, so no pod is placed on it. Work still running
    on it must have been evicted first (``fault_evictions``), or the device would count twice.
    """
    if not unhealthy:
        return
    st = engine.cluster
    for node, devs in unhealthy.items():
        i = st.index.get(node)
        if i is None:
            continue
        for d in sorted(devs):
            if 0 <= d < len(st.dev_milli[i]) and st.dev_milli[i][d] == 1000:
                st.allocate(i, (d,), 1000, st.dev_mem[i][d], 0, 0, 0)
    st.commit()


def _untolerated_no_execute(r: Running, n: Node) -> str | None:
    for t in n.taints:
        if t.effect == "NoExecute" and not any(tol.tolerates(t) for tol in r.workload.tolerations):
            return f"{t.key}={t.value}:NoExecute" if t.value else f"{t.key}:NoExecute"
    return None


def fault_of(r: Running, nodes: Mapping[str, Node], state: FaultState) -> Fault | None:
    """Why a running workload must leave its node(s), or None when it may stay."""
    for p in r.admission.pods:
        n = nodes.get(p.node)
        if n is None:
            return Fault("NodeRemoved", f"node {p.node} was removed from the cluster", counted=False)
        taint = _untolerated_no_execute(r, n)
        if taint is not None:
            return Fault("NoExecuteTaint", f"node {p.node} has taint {taint}, not tolerated", counted=False)
        if p.node in state.down:
            return Fault("NodeFailure", f"node {p.node} failed: {state.down[p.node]}")
        bad = state.unhealthy.get(p.node, {})
        for d in p.devices:
            if d in bad:
                return Fault("DeviceUnhealthy", f"device {p.node}/{d} is unhealthy: {bad[d]}")
    return None


def fault_evictions(
    ctl: Controller, nodes: Sequence[Node], running: Sequence[Running], now: float
) -> list[Running]:
    """Evict the running work that a node fault displaces; returns what may keep running."""
    by_name = {n.name: n for n in nodes}
    out: dict[str, Fault] = {}
    keep: list[Running] = []
    for r in running:
        f = fault_of(r, by_name, ctl.faults)
        if f is None:
            keep.append(r)
        else:
            out[r.name] = f
    evict(ctl, out, now)
    return keep


def evict(ctl: Controller, out: Mapping[str, Fault], now: float, actor: str = SCHEDULER) -> None:
    """Stop workloads that must leave their nodes (write-ahead), then requeue or fail them by policy."""
    recs = [w for w in ctl.store.list_workloads(names=list(out)) if w.phase in ("Admitted", "Running")]
    if not recs:
        return
    ctl.store.apply_transitions(
        [PhaseChange(w.name, "Preempted", f"{out[w.name].code}: {out[w.name].reason}") for w in recs],
        audit=[
            AuditEntry(
                actor,
                "workload.evict",
                "Workload",
                w.name,
                {"code": out[w.name].code, "reason": out[w.name].reason, "counted": out[w.name].counted},
            )
            for w in recs
        ],
        at=_dt(now),
    )
    names = [w.name for w in recs]
    ctl.backend.stop(names)
    for n in names:
        ctl.engine.remove_running(n)
    counted = [(w, out[w.name]) for w in recs if out[w.name].counted]
    plain = [w for w in recs if not out[w.name].counted]
    record_failures(ctl, counted, now)
    if plain:
        done = ctl.store.apply_transitions(
            [PhaseChange(w.name, "Pending", f"requeued: {out[w.name].reason}") for w in plain],
            audit=[
                AuditEntry(SCHEDULER, "workload.requeue", "Workload", w.name, {"reason": out[w.name].reason})
                for w in plain
            ],
            at=_dt(now),
        )
        for new in done:
            ctl.queue_again(new)


def node_health(state: FaultState, node: str) -> dict[str, Any]:
    """A node's health for the node views: failed (and why), and its unhealthy devices."""
    bad = state.unhealthy.get(node, {})
    return {
        "healthy": node not in state.down and not bad,
        "failed": state.down.get(node),
        "unhealthyDevices": sorted(bad),
    }


def device_health(state: FaultState, node: str, index: int) -> dict[str, Any]:
    why = state.unhealthy.get(node, {}).get(index)
    return {"healthy": why is None and node not in state.down, "healthReason": why or state.down.get(node)}


def on_node(running: Iterable[Running], node: str) -> list[str]:
    """Names of the running workloads with a pod on ``node``."""
    return [r.name for r in running if any(p.node == node for p in r.admission.pods)]


__all__ = [
    "DEFAULT_POLICIES",
    "FAILED_EVENT",
    "FAIL_AFTER_ANNOTATION",
    "UNHEALTHY_ANNOTATION",
    "Fault",
    "FaultState",
    "RetryPolicy",
    "device_health",
    "effective_nodes",
    "evict",
    "fault_evictions",
    "history_view",
    "load_holds",
    "node_health",
    "occupy_unhealthy",
    "parse_failure_rates",
    "policy_for",
    "record_failures",
    "run_hints",
    "unhealthy_devices",
]
