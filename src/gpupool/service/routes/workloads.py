"""Workloads: submit (the hot path), list, read, cancel, events, explain; and the
submission steps ``POST /v1/apply`` shares (prepare, hand to the controller)."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from gpupool.audit import AuditEntry
from gpupool.auth import Action, Principal, Resource
from gpupool.manifests import KUEUE_QUEUE_LABEL
from gpupool.model import Workload, WorkloadType
from gpupool.service import holders
from gpupool.service import openapi as oa
from gpupool.service.admission import (
    backend_refusal,
    is_exception,
    needs_approval,
    pending_refusal,
    queue_refusal,
    request_refusal,
)
from gpupool.service.controller import Controller
from gpupool.service.convert import (
    parse_manifest,
    workload_model,
)
from gpupool.service.core import Service
from gpupool.service.errors import ApiError, Denied, refusal_error
from gpupool.service.failures import history_view
from gpupool.service.guard import PARSED_KEY
from gpupool.service.limits import TokenBuckets
from gpupool.service.openapi import AUTH, BODY, READ, WRITE, doc
from gpupool.service.routes.base import MAX_ID, Caller, Svc, json_object, principal
from gpupool.service.routes.paging import Order, make_continue, read_continue
from gpupool.service.view import ConfigView
from gpupool.store import NotFound, StoreError, WorkloadRecord

router = APIRouter()


def workload_view(rec: WorkloadRecord) -> dict[str, Any]:
    return {
        "name": rec.name,
        "queue": rec.queue,
        "priorityClass": rec.priority_class,
        "owner": rec.owner,
        "phase": rec.phase,
        "reason": rec.reason,
        "placement": rec.placement,
        "submittedAt": rec.submitted_at.isoformat(),
        "admittedAt": rec.admitted_at.isoformat() if rec.admitted_at else None,
        "finishedAt": rec.finished_at.isoformat() if rec.finished_at else None,
        "resourceVersion": rec.resource_version,
        "seq": rec.seq,
        "manifest": rec.manifest,
    }


def normalise_workload(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The stored form: the Kueue queue-name label becomes spec.queue (so lookups by queue work)."""
    m = {k: v for k, v in manifest.items() if k != "status"}
    spec = dict(m.get("spec") or {})
    labels = (m.get("metadata") or {}).get("labels") or {}
    if not spec.get("queue") and isinstance(labels, Mapping) and labels.get(KUEUE_QUEUE_LABEL):
        spec["queue"] = labels[KUEUE_QUEUE_LABEL]
        m["spec"] = spec
    return m


@dataclass(slots=True)
class Prepared:
    body: dict[str, Any]
    model: Workload
    queue: str
    approval: bool
    audit: AuditEntry


def prepare(svc: Service, p: Principal, body: Mapping[str, Any], view: ConfigView | None = None) -> Prepared:
    """Validate and authorize a submission from memory only (safe on the event loop);
    against ``view`` (a configuration about to be applied) instead of the one in force."""
    doc = parse_manifest(body)
    if doc.kind != "Workload":
        raise ApiError(
            422,
            f"kind: expected Workload, got {doc.kind}",
            [{"field": "kind", "problem": "must be Workload"}],
        )
    body = normalise_workload(body)
    ctl: Controller | ConfigView = view or svc.controller
    bundle = ctl.bundle
    model = workload_model(body, bundle.priority_classes, 0.0, doc=doc, types=bundle.task_types)
    queue = model.queue
    refused = queue_refusal(queue, ctl)
    if refused is None:
        svc.check(
            p,
            Action.SUBMIT,
            Resource("Workload", doc.name, queue=queue, owner=p.name),
            defer=True,
            tree=ctl,
        )
        refused = request_refusal(model, body, ctl)
    if refused is None:
        refused = backend_refusal(doc.name, p.name, svc.controller.backend)
    if refused is None:  # last: it reserves the workload's place until ``after`` or ``failed``
        refused = pending_refusal(doc.name, model, p.name, svc.pending_limits, ctl)
    if refused is not None:
        raise refusal_error(refused)
    exception = is_exception(body)
    approval = needs_approval(model, body, bundle, ctl)
    audit = AuditEntry(
        p.name,
        "workload.submit",
        "Workload",
        doc.name,
        {"queue": queue, "approval": approval, "exception": exception},
    )
    return Prepared(dict(body), model, queue, approval, audit)


def after(svc: Service, prep: Prepared, rec: WorkloadRecord, created: bool) -> WorkloadRecord:
    """Hand a committed submission to the controller (or open its approval request)."""
    try:
        out = _handed(svc, prep, rec, created)
    except BaseException:
        failed(svc, prep)
        raise
    if created and not prep.approval:
        svc.pending_limits.handed(prep.model.name)  # counted until the controller holds it
    else:
        failed(svc, prep)  # unchanged, or awaiting approval: not new pending work
    return out


def failed(svc: Service, prep: Prepared) -> None:
    """A prepared submission adds no pending work (not committed, unchanged, or awaiting
    approval): it no longer counts against the limits."""
    svc.pending_limits.release(prep.model.name)


def _handed(svc: Service, prep: Prepared, rec: WorkloadRecord, created: bool) -> WorkloadRecord:
    if not created:
        return rec
    svc.metrics.submits.labels(prep.queue).inc()
    if prep.approval:
        # the workload is committed: a failure to open its request must not answer 500 for
        # an accepted submission; it is rejected with the reason instead (never left waiting)
        with svc.controller.lock:
            svc.controller.open_approval(rec, time.time())
        return svc.store.get_workload(rec.name)
    svc.controller.submitted(rec, prep.model)
    return rec


def submit_many(svc: Service, p: Principal, preps: Sequence[Prepared]) -> list[dict[str, str]]:
    """Submit checked workloads together; one apply result each, in order.

    Why all queued at once: the group commit then writes them in batches of its
    ``max_batch``, each batch one transaction; submitted one after another, 10,000 workloads
    were 10,000 transactions (over a minute). A failure fails its item alone."""
    queued: list[tuple[Prepared, Future[tuple[WorkloadRecord, bool]] | StoreError]] = []
    for prep in preps:
        try:
            fut: Future[tuple[WorkloadRecord, bool]] | StoreError = svc.batcher.submit(
                prep.body,
                owner=p.name,
                phase="AwaitingApproval" if prep.approval else "Pending",
                audit=prep.audit,
                resolved_class=prep.model.priority_class or None,
            )
        except StoreError as exc:
            fut = exc
        queued.append((prep, fut))
    out: list[dict[str, str]] = []
    for i, (prep, fut) in enumerate(queued):
        try:
            if isinstance(fut, StoreError):
                raise fut
            rec, created = fut.result()
        except StoreError as exc:
            failed(svc, prep)
            out.append({"kind": "Workload", "name": prep.model.name, "result": "failed", "error": str(exc)})
            continue
        except BaseException:  # the database is away: nothing after it counts as pending work
            for rest, _ in queued[i:]:
                failed(svc, rest)
            raise
        after(svc, prep, rec, created)
        out.append({"kind": "Workload", "name": rec.name, "result": "created" if created else "unchanged"})
    return out


def rate_limit(buckets: TokenBuckets, p: Principal) -> None:
    """429 with Retry-After (whole seconds, rounded up) when this token's bucket is empty."""
    wait = buckets.take(p.token_id if p.token_id is not None else p.name)
    if wait is None:
        return
    secs = max(1, math.ceil(wait))
    problem = (
        f"this token may submit {buckets.rate:g} workloads a second (a burst of {buckets.burst}); "
        f"try again in {secs} s"
    )
    raise ApiError(
        429,
        f"submit rate limit: {problem}",
        [{"field": "submit-rate", "problem": problem}],
        headers={"Retry-After": str(secs)},
    )


@router.post(
    "/v1/workloads",
    tags=["workloads"],
    status_code=201,
    response_model=None,
    responses={
        **doc(oa.WorkloadView, *BODY, status=201, description="created")["responses"],
        200: {"model": oa.WorkloadView, "description": "already submitted, unchanged"},
        429: {
            "model": oa.ErrorBody,
            "description": "the token's submit rate (Retry-After says when) or a pending limit of the "
            "queue or user is reached; the limit is named",
        },
    },
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"type": "object", "title": "Workload manifest"}}},
        }
    },
)
async def submit(request: Request) -> Response:
    """Submit a Workload manifest; idempotent by name (200 with the existing workload).

    Acknowledged only once durable: concurrent submits share one commit (group commit).
    The hot path: it reads the token and the body itself instead of through FastAPI's
    dependency and body models, which cost as much CPU as the rest of the request."""
    svc: Service = request.app.state.svc
    p = await principal(request)
    if svc.submit_rate is not None:
        rate_limit(svc.submit_rate, p)
    parsed = request.scope.get(PARSED_KEY)  # the guard parsed it already
    manifest = (
        parsed
        if isinstance(parsed, dict)
        else json_object(await request.body(), request.headers.get("content-type"))
    )
    try:
        prep = prepare(svc, p, manifest)
    except Denied as d:
        await run_in_threadpool(svc.store.append_audit, d.entry)
        raise
    phase = "AwaitingApproval" if prep.approval else "Pending"
    fut = svc.batcher.submit(
        prep.body,
        owner=p.name,
        phase=phase,
        audit=prep.audit,
        resolved_class=prep.model.priority_class or None,
    )
    try:
        rec, created = await asyncio.wrap_future(fut)
    except BaseException:
        failed(svc, prep)
        raise
    if created and prep.approval:
        rec = await run_in_threadpool(after, svc, prep, rec, created)
    else:
        rec = after(svc, prep, rec, created)
    # serialised directly: the view is plain JSON already
    body = json.dumps(workload_view(rec), separators=(",", ":"))
    return Response(body, status_code=201 if created else 200, media_type="application/json")


@router.get("/v1/workloads", tags=["workloads"], **doc(oa.WorkloadList, *AUTH, 422))
def list_workloads(
    p: Caller,
    svc: Svc,
    queue: str | None = None,
    phase: Annotated[list[str] | None, Query()] = None,
    owner: str | None = None,
    types: Annotated[
        list[WorkloadType] | None, Query(alias="type", description="workload types, e.g. training")
    ] = None,
    order: Annotated[Order, Query(description="newest (the default) or oldest first")] = "newest",
    limit: Annotated[int, Query(ge=1, le=10_000)] = 500,
    cont: Annotated[
        str | None, Query(alias="continue", max_length=200, description="from the last page")
    ] = None,
    after: Annotated[int, Query(ge=0, le=MAX_ID, description="seq to page after (oldest first)")] = 0,
) -> dict[str, Any]:
    """Workloads the caller may see, one page at a time: ``metadata.continue`` asks for the next.

    Newest first by default, so the work just submitted is on the first page; ``after`` keeps
    the older arrival-order paging by seq."""
    visible = svc.visible_queues(p)
    queues = visible
    if queue is not None:
        queues = [queue] if visible is None or queue in visible else []
    newest, start = order == "newest" and not after, after or None
    if cont is not None:
        newest, start = read_continue(cont)
    recs, more = svc.store.page_workloads(
        queues=queues,
        phases=phase,
        owner=owner,
        types=[t.value for t in types] if types else None,
        newest_first=newest,
        from_seq=start,
        limit=limit,
    )
    token = make_continue(newest, recs[-1].seq) if more and recs else None
    return {"items": [workload_view(r) for r in recs], "metadata": {"continue": token}}


@router.get("/v1/workloads/{name}", tags=["workloads"], **doc(oa.WorkloadView, *READ, 422))
def get_workload(name: str, p: Caller, svc: Svc) -> dict[str, Any]:
    """One workload (404 when it is not visible to the caller), with its attempts and failures."""
    rec = svc.visible_workload(p, name)
    return {**workload_view(rec), **history_view(svc.store.list_events(name))}


def _cancel(name: str, p: Principal, svc: Service) -> dict[str, Any]:
    rec = svc.visible_workload(p, name)
    svc.check(p, Action.CANCEL, Resource("Workload", name, queue=rec.queue, owner=rec.owner))
    return workload_view(svc.controller.cancel(name, p.name))


@router.post("/v1/workloads/{name}/cancel", tags=["workloads"], **doc(oa.WorkloadView, *WRITE, 404))
def cancel(name: str, p: Caller, svc: Svc) -> dict[str, Any]:
    """Cancel (idempotent: a finished workload is returned as it is)."""
    return _cancel(name, p, svc)


@router.delete("/v1/workloads/{name}", tags=["workloads"], **doc(oa.WorkloadView, *WRITE, 404))
def delete_workload(name: str, p: Caller, svc: Svc) -> dict[str, Any]:
    """Same as cancel: workloads are kept for the record."""
    return _cancel(name, p, svc)


@router.get("/v1/workloads/{name}/events", tags=["workloads"], **doc(oa.EventList, *READ, 422))
def events(name: str, p: Caller, svc: Svc) -> dict[str, Any]:
    """The workload's event stream, oldest first."""
    svc.visible_workload(p, name)
    return {
        "items": [
            {"type": e.type, "reason": e.reason, "message": e.message, "at": e.at.isoformat()}
            for e in svc.store.list_events(name)
        ]
    }


def _owner(svc: Service, name: str) -> str | None:
    try:
        return svc.store.get_workload(name).owner
    except NotFound:  # finished and forgotten since the controller's read
        return None


@router.get("/v1/workloads/{name}/explain", tags=["workloads"], **doc(oa.Explanation, *READ, 422))
def explain(name: str, p: Caller, svc: Svc) -> dict[str, Any]:
    """Position in its queue and the engine's reason it waits; for a quota, capacity or
    topology wait also its scope, the running work holding what it needs and the estimated
    start (gpupool.service.holders)."""
    rec = svc.visible_workload(p, name)
    out = svc.controller.explain(rec)
    wait = svc.controller.waiting_on(rec.name, out.get("code")) if rec.phase == "Pending" else None
    if wait is not None:  # who holds what it needs, and when it should start
        out.update(holders.present(wait, lambda q: svc.can_read_workload(p, q), lambda n: _owner(svc, n)))
    if rec.phase == "AwaitingApproval":
        out["approvals"] = [
            {"id": a.id, "state": a.state, "reason": a.reason, "expiresAt": a.expires_at.isoformat()}
            for a in svc.store.list_approvals(workload=name)
        ]
    return out
