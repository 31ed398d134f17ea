"""The pool catalog in the CLI: ``get pools -o wide`` and ``describe pool``.

Why apart from the other kinds' rows: a pool's catalog entry joins the configuration with live
figures (``GET /v1/catalog``), so these views read two answers where the others read one.
"""

from __future__ import annotations

import sys
from typing import Any

import yaml

from gpupool.cli.client.http import Api
from gpupool.cli.client.output import Rows, show, table

Items = list[dict[str, Any]]


def with_catalog(api: Api, data: dict[str, Any]) -> dict[str, Any]:
    """``data`` (a list of pools) with each pool's catalog entry under ``catalog``."""
    entries = {e["name"]: e for e in api.call("GET", "/v1/catalog")["items"]}
    items = [{**i, "catalog": entries.get(i["metadata"]["name"], {})} for i in data["items"]]
    return {**data, "items": items}


def _gpus(x: Any) -> str:
    return "" if x is None else f"{x:g}"


def pool_wide_rows(items: Items) -> Rows:
    """``-o wide``: what the pool is for, what it costs, promised and free capacity, who uses it."""
    return table(
        [
            "name",
            "env",
            "tier",
            "price/gpu-h",
            "gpus",
            "guaranteed",
            "free",
            "preemptible",
            "approval",
            "types first here",
            "queues",
        ],
        [
            (
                i["metadata"]["name"],
                i["spec"].get("environment", ""),
                i["spec"].get("slaTier", ""),
                i["spec"].get("pricePerGPUHour", ""),
                _gpus(c.get("gpus")),
                _gpus(c.get("gpuGuaranteed")),
                _gpus(c.get("gpuFree")),
                i["spec"].get("preemptible", True),
                i["spec"].get("requiresApproval", False),
                ",".join(c.get("preferredByTaskTypes") or []),
                ",".join(q["queue"] for q in c.get("queues") or []),
            )
            for i in items
            for c in [i.get("catalog") or {}]
        ],
    )


def describe_pool(entry: dict[str, Any]) -> None:
    """A pool's catalog entry: purpose and price, capacity, task types, queues, approval rules."""
    head = {
        k: entry[k]
        for k in (
            "name",
            "description",
            "environment",
            "slaTier",
            "pricePerGPUHour",
            "preemptible",
            "placement",
            "gpuModels",
            "nodes",
        )
    }
    sys.stdout.write(yaml.safe_dump(head, sort_keys=False))
    sys.stdout.write(
        f"capacity: {_gpus(entry['gpus'])} GPUs, {_gpus(entry['gpuAllocated'])} allocated, "
        f"{_gpus(entry['gpuFree'])} free; {_gpus(entry['gpuGuaranteed'])} guaranteed to queues, "
        f"{_gpus(entry['gpuUnpromised'])} unpromised\n"
    )
    first = ", ".join(entry["preferredByTaskTypes"]) or "(none)"
    allowed = ", ".join(entry["allowedTaskTypes"]) or "any"
    sys.stdout.write(f"task types: {allowed}; sent here first: {first}\n")
    sys.stdout.write("needs approval:\n" + "".join(f"  - {r}\n" for r in entry["approvalRules"]))
    show(
        table(
            ["queue", "guarantee (gpu)", "approval"],
            [(q["queue"], _gpus(q["gpuGuarantee"]), q["requiresApproval"]) for q in entry["queues"]],
        )
    )
