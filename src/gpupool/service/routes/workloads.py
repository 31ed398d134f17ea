"""Workloads over HTTP: submit (the hot path), list, read, cancel, events, explain. The steps
of a submission (prepare, hand to the controller) are the submit use-case
(gpupool.service.usecases.submit), shared with ``POST /v1/apply`` and the Kubernetes source."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from gpupool.auth import Principal
from gpupool.model import WorkloadType
from gpupool.service import holders
from gpupool.service import openapi as oa
from gpupool.service.core import Service
from gpupool.service.errors import Denied
from gpupool.service.guard import PARSED_KEY
from gpupool.service.openapi import AUTH, BODY, READ, WRITE, doc
from gpupool.service.routes.base import MAX_ID, Caller, Svc, json_object, principal
from gpupool.service.routes.paging import Order, make_continue, read_continue
from gpupool.service.usecases.cancel import cancel_workload
from gpupool.service.usecases.scoped_names import rescope_if_foreign
from gpupool.service.usecases.submit import Prepared, after, failed, prepare, rate_limit
from gpupool.service.workload_names import written_name
from gpupool.store import Conflict, NotFound, WorkloadRecord
from gpupool.store.failure_events import history_view

router = APIRouter()


def workload_view(rec: WorkloadRecord) -> dict[str, Any]:
    return {
        "name": written_name(rec),
        "key": rec.name,
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
    try:
        rec, created = await _stored(svc, prep, p.name)
    except Conflict as clash:
        # the name is taken: stored under the caller's scoped key when its holder is a
        # workload the caller cannot read (gpupool.service.usecases.scoped_names)
        prep, rec, created = await _rescoped(svc, p, prep, clash)
    if created and prep.approval:
        rec = await run_in_threadpool(after, svc, prep, rec, created)
    else:
        rec = after(svc, prep, rec, created)
    # serialised directly: the view is plain JSON already
    body = json.dumps(workload_view(rec), separators=(",", ":"))
    return Response(body, status_code=201 if created else 200, media_type="application/json")


async def _rescoped(
    svc: Service, p: Principal, prep: Prepared, clash: Conflict
) -> tuple[Prepared, WorkloadRecord, bool]:
    """After a Conflict: ``prep`` under the caller's scoped key when the name's holder is
    unreadable to the caller, else the Conflict again (a readable clash keeps its 409)."""
    try:
        again = await run_in_threadpool(rescope_if_foreign, svc, p, prep)
    except BaseException:
        failed(svc, prep)
        raise
    if again is prep:
        failed(svc, prep)
        raise clash
    try:
        rec, created = await _stored(svc, again, p.name)
    except Conflict:
        failed(svc, again)
        raise
    return again, rec, created


async def _stored(svc: Service, prep: Prepared, owner: str) -> tuple[WorkloadRecord, bool]:
    """``prep`` through the group commit; on failure its pending reservation is released,
    except on a Conflict (the caller may store it under another key)."""
    fut = svc.batcher.submit(
        prep.body,
        owner=owner,
        phase="AwaitingApproval" if prep.approval else "Pending",
        audit=prep.audit,
        resolved_class=prep.model.priority_class or None,
    )
    try:
        return await asyncio.wrap_future(fut)
    except Conflict:
        raise
    except BaseException:
        failed(svc, prep)
        raise


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
    return {**workload_view(rec), **history_view(svc.store.list_events(rec.name))}


def _cancel(name: str, p: Principal, svc: Service) -> dict[str, Any]:
    return workload_view(cancel_workload(svc, p, name))


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
    rec = svc.visible_workload(p, name)
    return {
        "items": [
            {"type": e.type, "reason": e.reason, "message": e.message, "at": e.at.isoformat()}
            for e in svc.store.list_events(rec.name)
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
            for a in svc.store.list_approvals(workload=rec.name)
        ]
    return out
