"""Approvals: approve (an exception for a while), reject with a reason, list requests."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from gpupool.audit import AuditEntry
from gpupool.auth import Action, Principal, Resource
from gpupool.quantity import QuantityError, parse_duration
from gpupool.service import openapi as oa
from gpupool.service.admission import (
    exception_duration_s,
    is_exception,
)
from gpupool.service.core import Service
from gpupool.service.errors import ApiError
from gpupool.service.openapi import AUTH, BODY, doc
from gpupool.service.routes.base import Caller, Svc
from gpupool.service.routes.paging import make_continue, read_continue
from gpupool.service.routes.workloads import workload_view
from gpupool.store import NotFound

router = APIRouter()


class ApproveRequest(BaseModel):
    reason: str = Field(default="", max_length=2000)
    until: datetime | None = Field(
        default=None, description="end of an exception window (exception requests only)"
    )
    duration: str | None = Field(
        default=None, description="exception window length, e.g. '2h' (instead of until)"
    )


class RejectRequest(BaseModel):
    reason: str = Field(min_length=1, max_length=2000, description="why the request is rejected (required)")


def _decide(
    name: str, p: Principal, svc: Service, approve: bool, reason: str, until: float | None
) -> dict[str, Any]:
    rec = svc.visible_workload(p, name)
    name = rec.name  # the stored key (gpupool.service.usecases.scoped_names)
    svc.check(p, Action.APPROVE, Resource("Workload", name, queue=rec.queue, owner=rec.owner))
    pending = svc.store.list_approvals(state="Pending", workload=name)
    if not pending:
        raise ApiError(
            409,
            f"workload {name!r} has no pending approval (phase {rec.phase})",
            [{"field": "name", "problem": "nothing to approve"}],
        )
    exc = is_exception(rec.manifest)
    if until is not None and not exc:
        raise ApiError(
            422,
            "until/duration only apply to exception requests (spec.exception)",
            [{"field": "until", "problem": "not an exception request"}],
        )
    if approve and exc and until is None:
        until = time.time() + (exception_duration_s(rec.manifest) or 3600.0)
    if until is not None and until <= time.time():
        raise ApiError(422, "until: must be in the future", [{"field": "until", "problem": "in the past"}])
    detail: dict[str, Any] = {"approval": pending[0].id, "reason": reason}
    if until is not None:
        detail["until"] = datetime.fromtimestamp(until, UTC).isoformat()
    a = svc.store.decide_approval(
        pending[0].id,
        approver=p.name,
        approve=approve,
        reason=reason,
        audit=AuditEntry(
            p.name, "workload.approve" if approve else "workload.reject", "Workload", name, detail
        ),
    )
    if approve and exc and until is not None:
        svc.controller.grant_exception(name, until)
    svc.controller.resync()
    out = workload_view(svc.store.get_workload(name))
    out["approval"] = {
        "id": a.id,
        "state": a.state,
        "approver": a.approver,
        "reason": a.reason,
        "until": detail.get("until"),
    }
    return out


@router.post("/v1/workloads/{name}/approve", tags=["approvals"], **doc(oa.WorkloadView, *BODY, 404))
def approve(name: str, p: Caller, svc: Svc, body: ApproveRequest | None = None) -> dict[str, Any]:
    """Approve a workload waiting for approval; for an exception, optionally until a time."""
    body = body or ApproveRequest()
    until = body.until.timestamp() if body.until is not None else None
    if body.duration is not None:
        try:
            until = time.time() + parse_duration(body.duration)
        except QuantityError as exc:
            raise ApiError(422, f"duration: {exc}", [{"field": "duration", "problem": str(exc)}]) from exc
    return _decide(name, p, svc, True, body.reason, until)


@router.post("/v1/workloads/{name}/reject", tags=["approvals"], **doc(oa.WorkloadView, *BODY, 404))
def reject(name: str, body: RejectRequest, p: Caller, svc: Svc) -> dict[str, Any]:
    """Reject a workload waiting for approval, with a reason."""
    return _decide(name, p, svc, False, body.reason, None)


@router.get("/v1/approvals", tags=["approvals"], **doc(oa.ApprovalList, *AUTH, 422))
def approvals(
    p: Caller,
    svc: Svc,
    state: Literal["Pending", "Approved", "Rejected", "Expired"] | None = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 500,
    cont: Annotated[
        str | None, Query(alias="continue", max_length=200, description="from the last page")
    ] = None,
) -> dict[str, Any]:
    """Approval requests for workloads the caller may see, newest first, one page at a time."""
    newest, last = read_continue(cont) if cont is not None else (True, None)
    out: list[dict[str, Any]] = []
    more = False
    for a in reversed(svc.store.list_approvals(state=state)):
        if last is not None and a.id >= last:
            continue
        try:
            rec = svc.store.get_workload(a.workload)
        except NotFound:
            continue
        if not svc.can_read_workload(p, rec.queue):
            continue
        if len(out) == limit:
            more = True
            break
        out.append(
            {
                "id": a.id,
                "workload": a.workload,
                "queue": rec.queue,
                "state": a.state,
                "requestedBy": a.requested_by,
                "approver": a.approver,
                "reason": a.reason,
                "requestedAt": a.requested_at.isoformat(),
                "expiresAt": a.expires_at.isoformat(),
            }
        )
    token = make_continue(newest, out[-1]["id"]) if more else None
    return {"items": out, "metadata": {"continue": token}}
