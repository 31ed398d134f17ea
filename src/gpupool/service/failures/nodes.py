"""Node faults and device health: which running work a removed node, an untolerated
``NoExecute`` taint, a failed node or an unhealthy device displaces, and the evictions that follow.

Why apart (from ``record``, which records the failures among them): evictions are write-ahead
like preemptions (``Preempted`` committed, the backend stops the run, then requeued or failed by
policy); unhealthy devices are held whole in the engine so the pure engine needs no field for them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from gpupool.audit import AuditEntry
from gpupool.model import Node, Running
from gpupool.store import PhaseChange, WorkloadRecord

if TYPE_CHECKING:
    from gpupool.engine import Engine
    from gpupool.service.controller.context import Context
from gpupool.service.failures.policy import (
    SCHEDULER,
    UNHEALTHY_ANNOTATION,
    Fault,
    FaultState,
)
from gpupool.service.failures.record import _dt, record_failures


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


def merge_reported(state: Any, reported: Mapping[str, Mapping[int, str]]) -> bool:
    """Fold the devices the backend reports unhealthy into ``state.unhealthy`` (a device marked
    through the API keeps its own reason); a device the backend no longer reports, and that it
    alone had marked, is healthy again. True when anything changed."""
    before = {n: dict(d) for n, d in state.unhealthy.items()}
    for node, devs in state.reported.items():
        for d, why in devs.items():
            if d not in reported.get(node, {}) and state.unhealthy.get(node, {}).get(d) == why:
                del state.unhealthy[node][d]
                if not state.unhealthy[node]:
                    del state.unhealthy[node]
    for node, devs in reported.items():
        for d, why in devs.items():
            state.unhealthy.setdefault(node, {}).setdefault(d, why)
    state.reported = {n: dict(d) for n, d in reported.items()}
    return before != state.unhealthy


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
    if unhealthy:
        engine.withhold_devices(unhealthy)


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
    ctl: Context,
    queue_again: Callable[[WorkloadRecord], None],
    nodes: Sequence[Node],
    running: Sequence[Running],
    now: float,
) -> list[Running]:
    """Evict the running work that a node fault displaces; returns what may keep running
    (``queue_again`` holds each requeued workload as pending again, as in ``evict``)."""
    by_name = {n.name: n for n in nodes}
    out: dict[str, Fault] = {}
    keep: list[Running] = []
    for r in running:
        f = fault_of(r, by_name, ctl.faults)
        if f is None:
            keep.append(r)
        else:
            out[r.name] = f
    evict(ctl, queue_again, out, now)
    return keep


def evict(
    ctl: Context,
    queue_again: Callable[[WorkloadRecord], None],
    out: Mapping[str, Fault],
    now: float,
    actor: str = SCHEDULER,
) -> None:
    """Stop workloads that must leave their nodes (write-ahead), then requeue or fail them by
    policy; ``queue_again`` (the controller's pending set) holds each requeued one as pending."""
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
    record_failures(ctl, queue_again, counted, now)
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
            queue_again(new)


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
