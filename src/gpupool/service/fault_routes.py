"""REST verbs for node faults: drain a node, mark a device unhealthy (or healthy again).

Why here and not in api.py: they are a unit (one policy, gpupool.service.failures) and api.py is
shared by many routes; ``routes.cluster`` registers these with its cordon helper.

Both are platform-admin verbs (the same check as cordon: update of the Cluster object) and are
audited. Device health is stored like cordon, as an annotation on the Cluster object that
defines the node (``gpupool.io/unhealthy-devices``, JSON ``{"<node>/<index>": "<reason>"}``), so
it survives a restart and is part of the configuration the controller rebuilds from.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Body
from pydantic import BaseModel, Field

from gpupool.audit import AuditEntry
from gpupool.auth import Action, Principal, Resource
from gpupool.service.convert import bundle_from_manifests, object_manifest
from gpupool.service.core import Service
from gpupool.service.errors import ApiError
from gpupool.service.failures import UNHEALTHY_ANNOTATION
from gpupool.service.openapi import BODY, doc
from gpupool.service.routes.base import Caller, Svc


class DeviceHealthRequest(BaseModel):
    healthy: bool = Field(description="false: take the device out of placement and requeue its work")
    reason: str = Field(default="", max_length=2000, description="why (shown on the node and in events)")


class DrainRequest(BaseModel):
    reason: str = Field(default="", max_length=2000, description="why the node is drained")


class DeviceHealth(BaseModel):
    node: str
    index: int
    healthy: bool
    reason: str
    requeued: list[str]


class Drained(BaseModel):
    name: str
    schedulable: bool
    evicted: list[str]


def _no_node(name: str) -> ApiError:
    return ApiError(404, f"node {name!r} not found", [{"field": "name", "problem": "no such node"}])


def set_device_health(
    svc: Service, p: Principal, name: str, index: int, body: DeviceHealthRequest
) -> dict[str, Any]:
    """Store the device's health on its Cluster object and let the controller act on it."""
    ctl = svc.controller
    node = next((n for n in ctl.nodes() if n.name == name), None)
    if node is None:
        raise _no_node(name)
    svc.check(p, Action.UPDATE, Resource("Cluster", name))
    if not 0 <= index < node.gpu_count:
        raise ApiError(
            422,
            f"node {name!r} has devices 0..{node.gpu_count - 1}, not {index}",
            [{"field": "index", "problem": f"must be between 0 and {node.gpu_count - 1}"}],
        )
    with ctl.lock:
        for rec in svc.store.list_objects("Cluster"):
            m = object_manifest(rec)
            if name not in {n.name for n in bundle_from_manifests([m]).nodes}:
                continue
            ann = dict(m["metadata"].get("annotations") or {})
            try:
                marks = json.loads(ann.get(UNHEALTHY_ANNOTATION) or "{}")
            except ValueError:
                marks = {}
            marks = marks if isinstance(marks, dict) else {}
            key = f"{name}/{index}"
            if body.healthy:
                marks.pop(key, None)
            else:
                marks[key] = body.reason or "marked unhealthy"
            if marks:
                ann[UNHEALTHY_ANNOTATION] = json.dumps(marks, sort_keys=True)
            else:
                ann.pop(UNHEALTHY_ANNOTATION, None)
            m["metadata"]["annotations"] = ann
            hit = [
                r.name
                for r in ctl.engine.running.values()
                if any(pod.node == name and index in pod.devices for pod in r.admission.pods)
            ]
            detail = {"device": index, "healthy": body.healthy, "reason": body.reason}
            svc.store.apply_object(m, audit=AuditEntry(p.name, "device.health", "Node", name, detail))
            ctl.reload_config()  # evicts what runs on it (by the failure policy), holds the device
            requeued = [] if body.healthy else hit
            return {
                "node": name,
                "index": index,
                "healthy": body.healthy,
                "reason": body.reason,
                "requeued": requeued,
            }
    raise _no_node(name)


def drain(
    svc: Service,
    p: Principal,
    name: str,
    reason: str,
    cordon: Callable[[str, bool, Principal, Service], dict[str, Any]],
) -> dict[str, Any]:
    """Cordon the node, then evict every workload on it with the reason; they are requeued."""
    cordon(name, True, p, svc)  # 404/403 as cordon
    ctl = svc.controller
    with ctl.lock:
        evicted = ctl.drain(name, reason, p.name)
        svc.store.append_audit(
            AuditEntry(p.name, "node.drain", "Node", name, {"reason": reason, "evicted": evicted})
        )
    return {"name": name, "schedulable": False, "evicted": evicted}


def add_routes(app: APIRouter, cordon: Callable[[str, bool, Principal, Service], dict[str, Any]]) -> None:
    """Register the drain and device-health verbs (``cordon`` is api's cordon helper)."""

    @app.post("/v1/nodes/{name}/drain", tags=["cluster"], **doc(Drained, *BODY, 404))
    def drain_node(
        name: str, p: Caller, svc: Svc, body: DrainRequest | None = Body(default=None)
    ) -> dict[str, Any]:
        """Cordon a node, then evict its workloads with the reason and requeue them (platform-admin)."""
        return drain(svc, p, name, body.reason if body else "", cordon)

    @app.post("/v1/nodes/{name}/devices/{index}/health", tags=["cluster"], **doc(DeviceHealth, *BODY, 404))
    def device_health(
        name: str, index: int, body: DeviceHealthRequest, p: Caller, svc: Svc
    ) -> dict[str, Any]:
        """Mark a device unhealthy (no new work; its workloads requeued by their retry policy) or healthy."""
        return set_device_health(svc, p, name, index, body)


__all__ = ["add_routes", "drain", "set_device_health"]
