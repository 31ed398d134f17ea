"""Kubernetes admission webhooks (AdmissionReview v1): mutate workloads, validate gpupool's CRDs.

Why no token: the API server calls webhooks over TLS with no bearer token, so these two paths
take none. They are safe to leave open because they only compute: each answers an
AdmissionReview about the object it carries, reads no stored state and writes nothing (no
store, no controller, no backend), and refuses every body that is not an AdmissionReview with
a 400. A caller learns only what ``gpupool validate`` would tell it. In the chart they are served
over TLS by the webhook container, whose Service only the API server needs to reach.

``POST /webhooks/mutate`` changes Pods, Jobs, JobSets and PyTorchJobs bound for a gpupool queue
(:mod:`gpupool.manifests.mutate`): by label, or, at ``/webhooks/mutate/namespace`` (the webhook
entry whose namespaceSelector matches namespaces labelled ``gpupool.io/queue``), every object.
``POST /webhooks/validate`` refuses a ResourcePool, Queue or Workload with the located errors
``gpupool validate`` prints.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, FastAPI, Request

from gpupool.manifests import validate_document
from gpupool.manifests.mutate import MutationError, json_patch, mutate, queue_of
from gpupool.service.errors import ApiError
from gpupool.service.routes.base import install_errors

router = APIRouter()
REVIEW_API = "admission.k8s.io/v1"
_META_KEYS = ("name", "namespace", "labels", "annotations")  # what a gpupool manifest's metadata holds
#: namespace -> the queue its gpupool.io/queue label names (None: unlabelled or unknown)
NamespaceQueues = Callable[[str], str | None]


def _bad(field: str, problem: str) -> ApiError:
    return ApiError(
        400, f"not an AdmissionReview: {field}: {problem}", [{"field": field, "problem": problem}]
    )


async def read_review(request: Request) -> dict[str, Any]:
    """The ``request`` of an AdmissionReview v1 body, or a 400 naming the first thing wrong."""
    try:
        body = json.loads(await request.body())
    except (ValueError, UnicodeDecodeError):
        raise _bad("body", "must be a JSON AdmissionReview") from None
    if not isinstance(body, dict):
        raise _bad("body", "must be a JSON object")
    if body.get("apiVersion") != REVIEW_API or body.get("kind") != "AdmissionReview":
        raise _bad("apiVersion/kind", f"must be {REVIEW_API} AdmissionReview")
    req = body.get("request")
    if not isinstance(req, dict):
        raise _bad("request", "must be an object")
    if not isinstance(req.get("uid"), str) or not req["uid"]:
        raise _bad("request.uid", "must be a non-empty string")
    kind = req.get("kind")
    if not isinstance(kind, dict) or not isinstance(kind.get("kind"), str):
        raise _bad("request.kind", "must be an object with group, version and kind")
    if req.get("operation") not in ("CREATE", "UPDATE", "DELETE", "CONNECT"):
        raise _bad("request.operation", "must be CREATE, UPDATE, DELETE or CONNECT")
    if req["operation"] in ("CREATE", "UPDATE") and not isinstance(req.get("object"), dict):
        raise _bad("request.object", "must be an object")
    return req


def review(
    uid: str, allowed: bool, patch: list[dict[str, Any]] | None = None, message: str = ""
) -> dict[str, Any]:
    """An AdmissionReview response; a patch travels as base64 JSONPatch, a refusal as a 422 Status."""
    resp: dict[str, Any] = {"uid": uid, "allowed": allowed}
    if patch:
        resp["patchType"] = "JSONPatch"
        resp["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    if not allowed:
        resp["status"] = {"status": "Failure", "code": 422, "reason": "Invalid", "message": message}
    return {"apiVersion": REVIEW_API, "kind": "AdmissionReview", "response": resp}


@router.post("/webhooks/mutate", include_in_schema=False)
async def mutate_webhook(request: Request) -> dict[str, Any]:
    """Make an object labelled for a gpupool queue gpupool's (scheduler, suspension, toleration, shares)."""
    return _mutated(await read_review(request), by_namespace=False)


@router.post("/webhooks/mutate/namespace", include_in_schema=False)
async def mutate_namespace_webhook(request: Request) -> dict[str, Any]:
    """The same for every object of a namespace labelled ``gpupool.io/queue`` (the webhook entry's
    namespaceSelector chose it); an object naming no queue gets the namespace's as its label."""
    req = await read_review(request)
    lookup: NamespaceQueues | None = getattr(request.app.state, "namespace_queues", None)
    ns = req.get("namespace")
    queue = lookup(ns) if lookup is not None and isinstance(ns, str) and ns else None
    return _mutated(req, by_namespace=True, queue=queue)


def _mutated(req: dict[str, Any], by_namespace: bool, queue: str | None = None) -> dict[str, Any]:
    obj = req.get("object")
    if req["operation"] != "CREATE" or not isinstance(obj, dict):
        return review(req["uid"], True)
    if not by_namespace and queue_of(obj) is None:
        return review(req["uid"], True)
    kind = req["kind"]
    try:
        after = mutate(str(kind.get("group") or ""), kind["kind"], obj, queue)
    except MutationError as exc:
        return review(req["uid"], False, message=f"gpupool: {exc}")
    return review(req["uid"], True, json_patch(obj, after))


def manifest_of(obj: dict[str, Any]) -> dict[str, Any]:
    """A stored custom resource as the manifest a user wrote: the server's metadata left out."""
    meta = obj.get("metadata")
    out = dict(obj)
    if isinstance(meta, dict):
        out["metadata"] = {k: meta[k] for k in _META_KEYS if k in meta}
    return out


@router.post("/webhooks/validate", include_in_schema=False)
async def validate_webhook(request: Request) -> dict[str, Any]:
    """Refuse a gpupool custom resource ``gpupool validate`` would refuse, with the same messages."""
    req = await read_review(request)
    obj = req.get("object")
    if req["operation"] not in ("CREATE", "UPDATE") or not isinstance(obj, dict):
        return review(req["uid"], True)
    errors: list[str] = []
    validate_document(manifest_of(obj), "admission", errors)
    return review(req["uid"], not errors, message="\n".join(errors))


def webhook_app(namespace_queues: NamespaceQueues | None = None) -> FastAPI:
    """The webhooks alone (and ``/healthz``): what the chart's webhook container serves over TLS.
    ``namespace_queues`` reads a namespace's ``gpupool.io/queue`` label (None: not known here).

    Why apart from the API: the API server must reach a webhook on every replica, leader or
    standby, and before the store is up; these routes need neither."""
    from gpupool.service.guard import RequestGuard

    app = FastAPI(title="gpupool webhooks", openapi_url=None, docs_url=None, redoc_url=None)
    app.state.namespace_queues = namespace_queues
    install_errors(app)
    app.add_middleware(RequestGuard)
    app.include_router(router)

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app
