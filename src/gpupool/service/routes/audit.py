"""The audit log: verify the hash chain, export, page through (platform-admin)."""

from __future__ import annotations

import io
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from fastapi.responses import Response

from gpupool.auth import Action, Resource
from gpupool.service import openapi as oa
from gpupool.service.openapi import AUTH, doc
from gpupool.service.routes.base import MAX_ID, Caller, Svc

router = APIRouter()


@router.get("/v1/audit/verify", tags=["audit"], **doc(oa.AuditVerify, *AUTH, 403, 422))
def audit_verify(
    p: Caller,
    svc: Svc,
    expected_count: Annotated[int | None, Query(ge=0, le=MAX_ID)] = None,
    expected_head: Annotated[str | None, Query(max_length=128)] = None,
    checkpoint_count: Annotated[int | None, Query(ge=0, le=MAX_ID)] = None,
    checkpoint_head: Annotated[str | None, Query(max_length=128)] = None,
) -> dict[str, Any]:
    """Verify the hash chain; names the first bad record (platform-admin). With a checkpoint
    (count and head hash taken earlier, see ``gpupool audit checkpoint``) the record at that
    count must still carry that hash, however many records came after."""
    svc.check(p, Action.READ_AUDIT, Resource("Audit"), mutating=False)
    cp = None
    if checkpoint_count is not None and checkpoint_head is not None:
        cp = (checkpoint_count, checkpoint_head)
    r = svc.store.verify_audit(expected_count=expected_count, expected_head=expected_head, checkpoint=cp)
    return {
        "ok": r.ok,
        "count": r.count,
        "headHash": r.head_hash,
        "firstBadSeq": r.first_bad_seq,
        "problem": r.problem,
    }


@router.get(
    "/v1/audit/export",
    tags=["audit"],
    response_class=Response,
    responses={200: {"content": oa.AUDIT_EXPORT_CONTENT}, **doc(None, *AUTH, 403, 422)["responses"]},
)
def audit_export(p: Caller, svc: Svc, format: Literal["jsonl", "csv"] = "jsonl") -> Response:
    """The audit log as JSONL or CSV (platform-admin)."""
    svc.check(p, Action.READ_AUDIT, Resource("Audit"), mutating=False)
    buf = io.StringIO()
    svc.store.export_audit(format, buf)
    media = "application/x-ndjson" if format == "jsonl" else "text/csv"
    return Response(buf.getvalue(), media_type=media)


@router.get("/v1/audit", tags=["audit"], **doc(oa.AuditList, *AUTH, 403, 422))
def audit_list(
    p: Caller,
    svc: Svc,
    after: Annotated[int, Query(ge=0, le=MAX_ID)] = 0,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
) -> dict[str, Any]:
    """Audit records after a seq (platform-admin)."""
    svc.check(p, Action.READ_AUDIT, Resource("Audit"), mutating=False)
    return {"items": [r.to_dict() for r in svc.store.audit_records(after_seq=after, limit=limit)]}
