"""Server-side Tables for ``kubectl get``: the columns the real server prints for the kinds a
user looks at (pods, nodes, jobs, deployments...), custom resources' printer columns, else
NAME and AGE.

Why on the server: kubectl asks for ``as=Table`` and prints what it gets; without Tables every
kind shows only NAME and AGE, and a pod's STATUS and NODE are what one runs ``kubectl get`` for.
"""

from __future__ import annotations

import calendar
import functools
import time
from collections.abc import Callable
from typing import Any

from gpupool.kube.fake.resources import ResourceType
from gpupool.kube.fake.selectors import field_value

Obj = dict[str, Any]
Column = tuple[str, str, int, Callable[[Obj], Any]]  # name, type, priority (1: -o wide), cell


def age(ts: str | None) -> str:
    """A timestamp as kubectl's short age (``45s``, ``3m2s``, ``5h``, ``2d``)."""
    if not ts:
        return "<unknown>"
    try:
        secs = max(0, int(time.time() - calendar.timegm(time.strptime(ts[:19], "%Y-%m-%dT%H:%M:%S"))))
    except ValueError:
        return "<invalid>"
    if secs < 120:
        return f"{secs}s"
    mins = secs // 60
    if mins < 10:
        return f"{mins}m{secs % 60}s"
    if mins < 180:
        return f"{mins}m"
    hours = mins // 60
    if hours < 8:
        return f"{hours}h{mins % 60}m"
    return f"{hours}h" if hours < 48 else f"{hours // 24}d"


def _created(o: Obj) -> str:
    return age(o["metadata"].get("creationTimestamp"))


def _pod_status(p: Obj) -> str:
    if p["metadata"].get("deletionTimestamp"):
        return "Terminating"
    st = p.get("status") or {}
    for cs in st.get("containerStatuses") or []:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        term = (cs.get("state") or {}).get("terminated") or {}
        if waiting.get("reason") or (term.get("reason") and st.get("phase") == "Failed"):
            return str(waiting.get("reason") or term.get("reason"))
    if p.get("spec", {}).get("schedulingGates") and not p.get("spec", {}).get("nodeName"):
        return "SchedulingGated"
    return str(st.get("reason") or st.get("phase") or "Unknown")


def _pod_ready(p: Obj) -> str:
    cs = (p.get("status") or {}).get("containerStatuses") or []
    return f"{sum(1 for c in cs if c.get('ready'))}/{len(p.get('spec', {}).get('containers') or [])}"


def _node_status(n: Obj) -> str:
    ready: Obj = next(
        (c for c in (n.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"), {}
    )
    out = "Ready" if ready.get("status") == "True" else "NotReady"
    return out + (",SchedulingDisabled" if (n.get("spec") or {}).get("unschedulable") else "")


def _job_status(j: Obj) -> str:
    conds = {c.get("type"): c.get("status") for c in (j.get("status") or {}).get("conditions") or []}
    for t in ("Complete", "Failed", "Suspended"):
        if conds.get(t) == "True":
            return t
    return "Running"


def _f(path: str, default: Any = "") -> Callable[[Obj], Any]:
    return lambda o: field_value(o, path) or default


COLUMNS: dict[str, list[Column]] = {
    "pods": [
        ("Ready", "string", 0, _pod_ready),
        ("Status", "string", 0, _pod_status),
        (
            "Restarts",
            "string",
            0,
            lambda p: str(
                sum(
                    int(c.get("restartCount", 0))
                    for c in (p.get("status") or {}).get("containerStatuses") or []
                )
            ),
        ),
        ("Age", "string", 0, _created),
        ("IP", "string", 1, _f("status.podIP", "<none>")),
        ("Node", "string", 1, _f("spec.nodeName", "<none>")),
    ],
    "nodes": [
        ("Status", "string", 0, _node_status),
        ("Roles", "string", 0, lambda n: "<none>"),
        ("Age", "string", 0, _created),
        ("Version", "string", 0, _f("status.nodeInfo.kubeletVersion")),
        ("GPUs", "string", 1, _f("status.allocatable.nvidia.com/gpu", "0")),
    ],
    "jobs.batch": [
        ("Status", "string", 0, _job_status),
        (
            "Completions",
            "string",
            0,
            lambda j: (
                f"{(j.get('status') or {}).get('succeeded', 0)}/"
                f"{(j.get('spec') or {}).get('completions') or 1}"
            ),
        ),
        ("Age", "string", 0, _created),
    ],
    "deployments.apps": [
        (
            "Ready",
            "string",
            0,
            lambda d: (
                f"{(d.get('status') or {}).get('readyReplicas', 0)}/"
                f"{(d.get('spec') or {}).get('replicas', 1)}"
            ),
        ),
        ("Up-to-date", "integer", 0, lambda d: (d.get("status") or {}).get("updatedReplicas", 0)),
        ("Available", "integer", 0, lambda d: (d.get("status") or {}).get("availableReplicas", 0)),
        ("Age", "string", 0, _created),
    ],
    "replicasets.apps": [
        ("Desired", "integer", 0, lambda r: (r.get("spec") or {}).get("replicas", 0)),
        ("Current", "integer", 0, lambda r: (r.get("status") or {}).get("replicas", 0)),
        ("Ready", "integer", 0, lambda r: (r.get("status") or {}).get("readyReplicas", 0)),
        ("Age", "string", 0, _created),
    ],
    "events": [
        ("Type", "string", 0, _f("type")),
        ("Reason", "string", 0, _f("reason")),
        (
            "Object",
            "string",
            0,
            lambda e: (
                f"{field_value(e, 'involvedObject.kind').lower()}/{field_value(e, 'involvedObject.name')}"
            ),
        ),
        ("Message", "string", 0, _f("message")),
    ],
}


def _printer_columns(rt: ResourceType) -> list[Column]:
    cols: list[Column] = []
    for c in rt.printer_columns:
        path = str(c.get("jsonPath", "")).lstrip(".").replace("[-1:]", "")
        date = c.get("type") == "date"
        cell = functools.partial(_age_at, path) if date else functools.partial(_last, path)
        cols.append(
            (
                str(c.get("name")),
                "string" if date else str(c.get("type", "string")),
                int(c.get("priority", 0)),
                cell,
            )
        )
    return cols


def _age_at(path: str, obj: Obj) -> str:
    return age(field_value(obj, path))


def _last(path: str, obj: Obj) -> str:
    """A printer column path, where a list on the way means its last item (``conditions[-1:]``)."""
    cur: Any = obj
    for part in path.split("."):
        if isinstance(cur, list):
            cur = cur[-1] if cur else {}
        cur = cur.get(part) if isinstance(cur, dict) else None
    return "" if cur is None else str(cur)


def table(rt: ResourceType, items: list[Obj], md: Obj) -> Obj:
    """A ``meta.k8s.io/v1`` Table of ``items`` (rows carry the object's metadata)."""
    cols = COLUMNS.get(rt.key) or _printer_columns(rt) or [("Age", "string", 0, _created)]
    defs = [{"name": "Name", "type": "string", "format": "name", "description": "", "priority": 0}]
    defs += [{"name": n, "type": t, "format": "", "description": "", "priority": pr} for n, t, pr, _ in cols]
    rows = [
        {
            "cells": [o["metadata"]["name"], *(fn(o) for _, _, _, fn in cols)],
            "object": {
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": o["metadata"],
            },
        }
        for o in items
    ]
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": md,
        "columnDefinitions": defs,
        "rows": rows,
    }
