"""The delete-configuration use-case: remove a pool, queue, priority class or cluster, refused
(409, naming what still refers to it) while any workload or object uses it.

Who calls it: ``DELETE /v1/config/{plural}/{name}`` (gpupool.service.routes.config) and the
Kubernetes configuration source when a kubectl-applied object is deleted
(gpupool.kube.adapters.config_source).
"""

from __future__ import annotations

from typing import Any

from gpupool.audit import AuditEntry
from gpupool.auth import Action, Principal
from gpupool.manifests import ManifestError
from gpupool.manifests.convert import bundle_from_manifests, error_items, object_manifest
from gpupool.service.core import Service
from gpupool.service.errors import ApiError
from gpupool.service.usecases.apply import CONFIG_ACTIONS, config_resource
from gpupool.store import ObjectRecord


def delete_object(svc: Service, p: Principal, kind: str, name: str) -> dict[str, Any]:
    """Delete ``kind``/``name`` for ``p``; the deleted result with its last resourceVersion."""
    svc.check(p, Action.DELETE, config_resource(kind, name, None, svc))
    ctl = svc.controller
    with ctl.lock:
        rec: ObjectRecord = svc.store.get_object(kind, name)
        if kind == "Queue":
            live = svc.store.list_workloads(
                queues=[name],
                phases=["Pending", "AwaitingApproval", "Admitted", "Running", "Preempted"],
                limit=1,
            )
            if live:
                raise ApiError(
                    409,
                    f"queue {name!r} still has workloads (e.g. {live[0].name}); cancel or finish them first",
                    [{"field": "metadata.name", "problem": "queue in use"}],
                )
        if kind == "ResourcePool":
            used = svc.read.running_in_pool(name)
            if used:
                raise ApiError(
                    409,
                    f"pool {name!r} still runs workloads (e.g. {used[0]})",
                    [{"field": "metadata.name", "problem": "pool in use"}],
                )
        rest = [object_manifest(r) for r in svc.store.list_objects() if (r.kind, r.name) != (kind, name)]
        try:
            bundle_from_manifests(rest, skip_invalid=True)
        except ManifestError as exc:
            raise ApiError(
                409, f"{kind} {name!r} is still referenced; nothing was deleted", error_items(exc)
            ) from exc
        svc.store.delete_object(
            kind, name, audit=AuditEntry(p.name, f"{CONFIG_ACTIONS[kind]}.delete", kind, name)
        )
        ctl.reload_config()
        svc.forget_tokens()  # tokens scoped to a deleted queue were revoked with it
    return {"kind": kind, "name": name, "result": "deleted", "resourceVersion": rec.resource_version}
