"""The ``gpupool get`` table of each kind: one small row builder per kind, looked up by resource.

Why a table of builders: each kind's columns read on their own, and a new kind is one function
and one entry, not another branch in a long chain.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from gpupool.cli.client.output import Rows, table
from gpupool.cli.client.pools import pool_wide_rows

Items = list[dict[str, Any]]


def age(iso: str | None, now: datetime | None = None) -> str:
    """How long ago ``iso`` was, as kubectl's AGE column writes it (``45s``, ``3m``, ``5h``, ``2d``)."""
    if not iso:
        return ""
    try:
        t = datetime.fromisoformat(iso)
    except ValueError:
        return ""
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    s = max(0, int(((now or datetime.now(UTC)) - t).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size * (2 if unit != "m" else 1):
            return f"{s // size}{unit}"
    return f"{s}s"


def _gpu_guarantees(spec: Mapping[str, Any]) -> str:
    """A queue's GPU guarantee per pool, as ``pool=N pool=M``."""
    out = []
    for q in spec.get("quotas", []):
        g = (q.get("guarantee") or {}).get("nvidia.com/gpu", 0)
        out.append(f"{q.get('pool')}={g}")
    return " ".join(out)


def _selector(spec: Mapping[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in (spec.get("nodeSelector") or {}).items())


def pool_rows(items: Items) -> Rows:
    return table(
        ["name", "selector", "preemptible", "approval", "price/gpu-h"],
        [
            (
                i["metadata"]["name"],
                _selector(i["spec"]),
                i["spec"].get("preemptible", True),
                i["spec"].get("requiresApproval", False),
                i["spec"].get("pricePerGPUHour", ""),
            )
            for i in items
        ],
    )


def queue_rows(items: Items) -> Rows:
    return table(
        ["name", "parent", "weight", "strategy", "guarantees (gpu)", "approval"],
        [
            (
                i["metadata"]["name"],
                i["spec"].get("parent", ""),
                i["spec"].get("weight", 1),
                i["spec"].get("queueingStrategy", "BestEffortFIFO"),
                _gpu_guarantees(i["spec"]),
                i["spec"].get("requiresApproval", False),
            )
            for i in items
        ],
    )


def priority_class_rows(items: Items) -> Rows:
    return table(
        ["name", "value", "preemptible", "description"],
        [
            (
                i["metadata"]["name"],
                i["spec"].get("value"),
                i["spec"].get("preemptible", True),
                i["spec"].get("description", ""),
            )
            for i in items
        ],
    )


def cluster_rows(items: Items) -> Rows:
    return table(
        ["name", "node groups", "nodes"],
        [
            (i["metadata"]["name"], len(i["spec"].get("nodeGroups", [])), len(i["spec"].get("nodes", [])))
            for i in items
        ],
    )


def workload_rows(items: Items) -> Rows:
    return table(
        ["name", "queue", "phase", "owner", "pool", "age", "reason"],
        [
            (
                w["name"],
                w["queue"],
                w["phase"],
                w["owner"],
                (w.get("placement") or {}).get("pool", ""),
                age(w.get("submittedAt")),
                w.get("reason") or "",
            )
            for w in items
        ],
    )


def _nodes_of(w: Mapping[str, Any]) -> str:
    return ",".join(sorted({p["node"] for p in (w.get("placement") or {}).get("pods", [])}))


def workload_wide_rows(items: Items) -> Rows:
    """``-o wide``: the priority class, the nodes and the GPUs placed, before the reason."""
    return table(
        ["name", "queue", "phase", "owner", "priority", "pool", "nodes", "age", "reason"],
        [
            (
                w["name"],
                w["queue"],
                w["phase"],
                w["owner"],
                w.get("priorityClass") or "",
                (w.get("placement") or {}).get("pool", ""),
                _nodes_of(w),
                age(w.get("submittedAt")),
                w.get("reason") or "",
            )
            for w in items
        ],
    )


def health_text(h: Any) -> str:
    """A node's health as a person reads it: ``ok``, ``failed: WHY`` or ``GPU 3 unhealthy``
    (``healthy`` alone hid an unhealthy device on a node that is up)."""
    if not isinstance(h, dict):
        return str(h or "")
    if h.get("failed"):
        return f"failed: {h['failed']}"
    bad = h.get("unhealthyDevices") or []
    if bad:
        return f"GPU {','.join(str(d) for d in bad)} unhealthy"
    return "ok" if h.get("healthy", True) else "unhealthy"


def node_wide_rows(items: Items) -> Rows:
    """``-o wide``: the rack and the NVLink domain besides the usual columns."""
    return table(
        ["name", "pool", "model", "gpus", "allocated", "schedulable", "health", "rack", "nvlink"],
        [
            (
                n["name"],
                n["pool"],
                n["gpuModel"],
                n["gpus"],
                f"{n['gpuAllocated']:g}",
                n["schedulable"],
                health_text(n.get("health")),
                n.get("rack") or "",
                n.get("nvlinkDomain") or "",
            )
            for n in items
        ],
    )


def node_rows(items: Items) -> Rows:
    return table(
        ["name", "pool", "model", "gpus", "allocated", "schedulable", "health"],
        [
            (
                n["name"],
                n["pool"],
                n["gpuModel"],
                n["gpus"],
                f"{n['gpuAllocated']:g}",
                n["schedulable"],
                health_text(n.get("health")),
            )
            for n in items
        ],
    )


def approval_rows(items: Items) -> Rows:
    return table(
        ["id", "workload", "queue", "state", "requested by", "approver", "age", "reason"],
        [
            (
                a["id"],
                a["workload"],
                a["queue"],
                a["state"],
                a["requestedBy"],
                a.get("approver") or "",
                age(a.get("requestedAt")),
                a["reason"],
            )
            for a in items
        ],
    )


def token_rows(items: Items) -> Rows:
    return table(
        ["id", "name", "role", "scope", "revoked", "age"],
        [
            (t["id"], t["name"], t["role"], t.get("scope") or "", t["revoked"], age(t.get("createdAt")))
            for t in items
        ],
    )


def _gpu_amount(v: Mapping[str, Any] | None) -> str:
    """A quota's GPU amount; no figure means no limit."""
    x = (v or {}).get("gpu")
    return "unlimited" if x is None else f"{x:g}"


def quota_rows(items: Items) -> Rows:
    return table(
        ["queue", "pool", "gpu used", "guarantee", "limit"],
        [
            (
                q["queue"],
                q["pool"],
                _gpu_amount(q["used"]),
                _gpu_amount(q["guarantee"]),
                _gpu_amount(q["limit"]),
            )
            for q in items
        ],
    )


def json_rows(items: Items) -> Rows:
    """Any kind without its own table: one JSON item per row."""
    return table(["item"], [(json.dumps(i),) for i in items])


#: the table builder of each resource (the names ``RESOURCES`` maps the user's kinds to)
ROW_BUILDERS: dict[str, Callable[[Items], Rows]] = {
    "pools": pool_rows,
    "queues": queue_rows,
    "priorityclasses": priority_class_rows,
    "clusters": cluster_rows,
    "workloads": workload_rows,
    "nodes": node_rows,
    "approvals": approval_rows,
    "tokens": token_rows,
    "quota": quota_rows,
}


#: the ``-o wide`` builders; a kind without one prints its usual table
WIDE_BUILDERS: dict[str, Callable[[Items], Rows]] = {
    "pools": pool_wide_rows,
    "workloads": workload_wide_rows,
    "nodes": node_wide_rows,
}


def rows_for(res: str, data: dict[str, Any], wide: bool = False) -> Rows:
    """The table of a list answer (``{"items": [...]}``) of resource ``res``."""
    build = (wide and WIDE_BUILDERS.get(res)) or ROW_BUILDERS.get(res, json_rows)
    return build(data.get("items", []))
