"""Configuration objects over HTTP (pools, queues, priority classes, clusters): list, read,
put, delete, and ``POST /v1/apply`` for a set of manifests, workloads included, whole or not
at all. The routes parse and shape; applying and deleting are the use-cases
gpupool.service.usecases.apply and .delete_config (the Kubernetes source calls them too)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Query
from pydantic import BaseModel, Field

from gpupool.manifests.limits import MAX_APPLY_OBJECTS
from gpupool.service import openapi as oa
from gpupool.service.errors import ApiError
from gpupool.service.openapi import BODY, READ, WRITE, doc
from gpupool.service.routes.base import Caller, Svc
from gpupool.service.usecases import delete_config
from gpupool.service.usecases.apply import apply_set, builtin_classes, preview_set
from gpupool.store import NotFound

router = APIRouter()

PLURALS = {
    "pools": "ResourcePool",
    "queues": "Queue",
    "priorityclasses": "PriorityClass",
    "clusters": "Cluster",
}


class ApplyRequest(BaseModel):
    items: list[dict[str, Any]] = Field(
        min_length=1, description="manifests, applied all-or-nothing after validation"
    )
    reason: str = Field("", max_length=2000, description="why: kept with each revision and audit record")
    dryRun: bool = Field(False, description="preview the change's effect; change nothing")


@router.post("/v1/apply", tags=["config"], **doc(oa.ApplyResults, *BODY, 404))
def apply(
    body: ApplyRequest,
    p: Caller,
    svc: Svc,
    dry_run: bool = Query(False, alias="dryRun", description="preview only (as the body's dryRun)"),
    reason: str = Query("", max_length=2000, description="why (as the body's reason)"),
) -> dict[str, Any]:
    """kubectl-apply a set of manifests, whole or not at all: every object is validated and
    authorized against the configuration the set leaves (a new Queue and a Workload in it may
    come together) before anything is written; then configuration objects are written in one
    transaction and the workloads submitted (idempotent by name). With ``dryRun`` nothing is
    written: the answer is the change's impact preview (gpupool.service.preview)."""
    if len(body.items) > MAX_APPLY_OBJECTS:  # before any validation: its cost grows with the set
        raise ApiError(
            413,
            f"{len(body.items):,} objects in one apply; at most {MAX_APPLY_OBJECTS:,} (the limit "
            f"MAX_APPLY_OBJECTS): split the set",
            [{"field": "items", "problem": f"more than {MAX_APPLY_OBJECTS:,} objects"}],
        )
    why = body.reason or reason
    if body.dryRun or dry_run:
        return preview_set(svc, p, body.items, why)
    return {"results": apply_set(svc, p, body.items, why)}


def _kind(plural: str) -> str:
    kind = PLURALS.get(plural)
    if kind is None:
        raise ApiError(
            404,
            f"unknown resource type {plural!r}; one of {', '.join(PLURALS)}",
            [{"field": "kind", "problem": "unknown"}],
        )
    return kind


@router.get("/v1/config/{plural}", tags=["config"], **doc(oa.ConfigList, *READ, 422))
def list_objects(plural: str, p: Caller, svc: Svc) -> dict[str, Any]:
    """List pools, queues, priorityclasses or clusters (every role may read configuration)."""
    kind = _kind(plural)
    items = [r.to_manifest() for r in svc.store.list_objects(kind)]
    if kind == "PriorityClass":
        stored = {i["metadata"]["name"] for i in items}
        items += [b for n, b in builtin_classes(svc).items() if n not in stored]
    return {"kind": kind, "items": items}


@router.get("/v1/config/{plural}/{name}", tags=["config"], **doc(oa.Manifest, *READ, 422))
def get_object(plural: str, name: str, p: Caller, svc: Svc) -> dict[str, Any]:
    """One configuration object (a built-in priority class too, as the list shows it)."""
    kind = _kind(plural)
    try:
        return svc.store.get_object(kind, name).to_manifest()
    except NotFound:
        builtin = builtin_classes(svc).get(name) if kind == "PriorityClass" else None
        if builtin is None:
            raise
        return builtin


@router.put("/v1/config/{plural}/{name}", tags=["config"], **doc(oa.ApplyResult, *BODY, 404))
def put_object(
    plural: str,
    name: str,
    p: Caller,
    svc: Svc,
    manifest: dict[str, Any] = Body(...),
    reason: str = Query("", max_length=2000, description="why: kept with the revision"),
) -> dict[str, Any]:
    """Create or update one object (the manifest's kind and name must match the path)."""
    kind = _kind(plural)
    raw_meta = manifest.get("metadata")
    meta: dict[str, Any] = raw_meta if isinstance(raw_meta, dict) else {}
    if manifest.get("kind") != kind or meta.get("name") != name:
        raise ApiError(
            422,
            f"the manifest must be a {kind} named {name!r}",
            [{"field": "kind/metadata.name", "problem": "does not match the URL"}],
        )
    return apply_set(svc, p, [manifest], reason)[0]


@router.delete("/v1/config/{plural}/{name}", tags=["config"], **doc(oa.Deleted, *WRITE, 404))
def delete_object(plural: str, name: str, p: Caller, svc: Svc) -> dict[str, Any]:
    """Delete an object; refused (409) while anything refers to it."""
    kind = _kind(plural)
    return delete_config.delete_object(svc, p, kind, name)
