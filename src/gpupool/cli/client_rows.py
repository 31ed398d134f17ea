"""The ``gpupool get`` table of each kind: one small row builder per kind, looked up by resource.

Why a table of builders: each kind's columns read on their own, and a new kind is one function
and one entry, not another branch in a long chain.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from rich.table import Table

from gpupool.cli.client_output import table

Items = list[dict[str, Any]]


def _gpu_guarantees(spec: Mapping[str, Any]) -> str:
    """A queue's GPU guarantee per pool, as ``pool=N pool=M``."""
    out = []
    for q in spec.get("quotas", []):
        g = (q.get("guarantee") or {}).get("nvidia.com/gpu", 0)
        out.append(f"{q.get('pool')}={g}")
    return " ".join(out)


def _selector(spec: Mapping[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in (spec.get("nodeSelector") or {}).items())


def pool_rows(items: Items) -> Table:
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


def queue_rows(items: Items) -> Table:
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


def priority_class_rows(items: Items) -> Table:
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


def cluster_rows(items: Items) -> Table:
    return table(
        ["name", "node groups", "nodes"],
        [
            (i["metadata"]["name"], len(i["spec"].get("nodeGroups", [])), len(i["spec"].get("nodes", [])))
            for i in items
        ],
    )


def workload_rows(items: Items) -> Table:
    return table(
        ["name", "queue", "phase", "owner", "pool", "reason"],
        [
            (
                w["name"],
                w["queue"],
                w["phase"],
                w["owner"],
                (w.get("placement") or {}).get("pool", ""),
                (w.get("reason") or "")[:70],
            )
            for w in items
        ],
    )


def node_rows(items: Items) -> Table:
    return table(
        ["name", "pool", "model", "gpus", "allocated", "schedulable"],
        [
            (n["name"], n["pool"], n["gpuModel"], n["gpus"], f"{n['gpuAllocated']:g}", n["schedulable"])
            for n in items
        ],
    )


def approval_rows(items: Items) -> Table:
    return table(
        ["id", "workload", "queue", "state", "requested by", "approver", "reason"],
        [
            (
                a["id"],
                a["workload"],
                a["queue"],
                a["state"],
                a["requestedBy"],
                a.get("approver") or "",
                a["reason"],
            )
            for a in items
        ],
    )


def token_rows(items: Items) -> Table:
    return table(
        ["id", "name", "role", "scope", "revoked"],
        [(t["id"], t["name"], t["role"], t.get("scope") or "", t["revoked"]) for t in items],
    )


def _gpu_amount(v: Mapping[str, Any] | None) -> str:
    """A quota's GPU amount; no figure means no limit."""
    x = (v or {}).get("gpu")
    return "unlimited" if x is None else f"{x:g}"


def quota_rows(items: Items) -> Table:
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


def json_rows(items: Items) -> Table:
    """Any kind without its own table: one JSON item per row."""
    return table(["item"], [(json.dumps(i),) for i in items])


#: the table builder of each resource (the names ``RESOURCES`` maps the user's kinds to)
ROW_BUILDERS: dict[str, Callable[[Items], Table]] = {
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


def rows_for(res: str, data: dict[str, Any]) -> Table:
    """The table of a list answer (``{"items": [...]}``) of resource ``res``."""
    return ROW_BUILDERS.get(res, json_rows)(data.get("items", []))
