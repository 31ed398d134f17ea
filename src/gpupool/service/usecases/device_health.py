"""The device-health use-case: mark one GPU of a node unhealthy (no new work; what runs on it
is requeued by its retry policy) or healthy again.

Who calls it: ``POST /v1/nodes/{name}/devices/{index}/health`` (gpupool.service.routes.faults)
and the local backend's health check (gpupool.service.backends.local_host), which marks a
device that stopped answering. The mark lives on the Cluster object that defines the node
(gpupool.service.failures.policy.UNHEALTHY_ANNOTATION), so it survives a restart.
"""

from __future__ import annotations

import json
from typing import Any

from gpupool.audit import AuditEntry
from gpupool.auth import Action, Principal, Resource
from gpupool.manifests.convert import bundle_from_manifests, object_manifest
from gpupool.service.core import Service
from gpupool.service.errors import ApiError
from gpupool.service.failures.policy import UNHEALTHY_ANNOTATION


def _no_node(name: str) -> ApiError:
    return ApiError(404, f"node {name!r} not found", [{"field": "name", "problem": "no such node"}])


def set_device_health(
    svc: Service, p: Principal, name: str, index: int, healthy: bool, reason: str = ""
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
            if healthy:
                marks.pop(key, None)
            else:
                marks[key] = reason or "marked unhealthy"
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
            detail = {"device": index, "healthy": healthy, "reason": reason}
            svc.store.apply_object(m, audit=AuditEntry(p.name, "device.health", "Node", name, detail))
            ctl.reload_config()  # evicts what runs on it (by the failure policy), holds the device
            requeued = [] if healthy else hit
            return {
                "node": name,
                "index": index,
                "healthy": healthy,
                "reason": reason,
                "requeued": requeued,
            }
    raise _no_node(name)
