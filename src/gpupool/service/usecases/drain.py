"""The cordon and drain use-cases: stop placing work on a node, and evict what runs there.

Who calls them: ``POST /v1/nodes/{name}/cordon``, ``/uncordon`` and ``/drain``
(gpupool.service.routes.cluster, routes.faults). The cordon mark lives on the Cluster object
that defines the node (gpupool.manifests.convert.CORDON_ANNOTATION), so it survives a restart;
a drain cordons first, then the controller evicts and requeues each workload with the reason.
"""

from __future__ import annotations

from typing import Any

from gpupool.audit import AuditEntry
from gpupool.auth import Action, Principal, Resource
from gpupool.manifests.convert import CORDON_ANNOTATION, bundle_from_manifests, object_manifest
from gpupool.service.core import Service
from gpupool.service.errors import ApiError


def set_cordon(svc: Service, p: Principal, name: str, cordon: bool) -> dict[str, Any]:
    """Cordon (``cordon``) or uncordon a node: stored on the Cluster object that defines it, a
    node change the controller sees at once; 404 for a node no Cluster object defines."""
    ctl = svc.controller
    if name not in {n.name for n in ctl.nodes()}:
        raise ApiError(404, f"node {name!r} not found", [{"field": "name", "problem": "no such node"}])
    svc.check(p, Action.UPDATE, Resource("Cluster", name))
    with ctl.lock:
        for rec in svc.store.list_objects("Cluster"):
            m = object_manifest(rec)
            nodes_here = {n.name for n in bundle_from_manifests([m]).nodes}
            if name not in nodes_here:
                continue
            ann = dict(m["metadata"].get("annotations") or {})
            cur = {x for x in ann.get(CORDON_ANNOTATION, "").split(",") if x}
            cur = cur | {name} if cordon else cur - {name}
            if cur:
                ann[CORDON_ANNOTATION] = ",".join(sorted(cur))
            else:
                ann.pop(CORDON_ANNOTATION, None)
            m["metadata"]["annotations"] = ann
            svc.store.apply_object(
                m, audit=AuditEntry(p.name, "node.cordon" if cordon else "node.uncordon", "Node", name)
            )
            ctl.reload_config()
            return {"name": name, "schedulable": not cordon}
    raise ApiError(
        404,
        f"node {name!r} is not defined by any Cluster object",
        [{"field": "name", "problem": "no such node"}],
    )


def drain(
    svc: Service,
    p: Principal,
    name: str,
    reason: str,
) -> dict[str, Any]:
    """Cordon the node, then evict every workload on it with the reason; they are requeued."""
    set_cordon(svc, p, name, True)  # 404/403 as cordon
    ctl = svc.controller
    with ctl.lock:
        evicted = ctl.drain(name, reason, p.name)
        svc.store.append_audit(
            AuditEntry(p.name, "node.drain", "Node", name, {"reason": reason, "evicted": evicted})
        )
    return {"name": name, "schedulable": False, "evicted": evicted}
