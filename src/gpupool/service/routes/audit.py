"""The audit log: verify the hash chain, export, page through (platform-admin)."""

from __future__ import annotations

import io
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from gpupool.audit_checkpoint import Checkpoint
from gpupool.auth import Action, Resource
from gpupool.service import openapi as oa
from gpupool.service.audit_witness import witness_of
from gpupool.service.openapi import AUTH, doc
from gpupool.service.routes.base import MAX_ID, Caller, Svc

router = APIRouter()


@router.get("/v1/audit/verify", tags=["audit"], **doc(oa.AuditVerify, *AUTH, 403, 422))
def audit_verify(
    request: Request,
    p: Caller,
    svc: Svc,
    expected_count: Annotated[int | None, Query(ge=0, le=MAX_ID)] = None,
    expected_head: Annotated[str | None, Query(max_length=128)] = None,
    checkpoint_count: Annotated[int | None, Query(ge=0, le=MAX_ID)] = None,
    checkpoint_head: Annotated[str | None, Query(max_length=128)] = None,
) -> dict[str, Any]:
    """Verify the hash chain; names the first bad record (platform-admin). With a checkpoint
    (count and head hash taken earlier, see ``gpupool audit checkpoint``) the record at that
    count must still carry that hash, however many records came after. Without one, and with
    the server's automatic witness on (``gpupool serve --audit-witness``), the newest signed
    checkpoint the witness holds is checked, and reported as ``witness``."""
    svc.check(p, Action.READ_AUDIT, Resource("Audit"), mutating=False)
    cp = None
    if checkpoint_count is not None and checkpoint_head is not None:
        cp = (checkpoint_count, checkpoint_head)
    witness = witness_of(request.app.state)
    seen = None
    if cp is None and witness is not None:
        r, seen = witness.verify()
    else:
        r = svc.store.verify_audit(checkpoint=cp)
    if r.ok and (expected_count is not None or expected_head is not None):
        r = svc.store.verify_audit(expected_count=expected_count, expected_head=expected_head, checkpoint=cp)
    return {
        "ok": r.ok,
        "count": r.count,
        "headHash": r.head_hash,
        "firstBadSeq": r.first_bad_seq,
        "problem": r.problem,
        "witness": None if seen is None or witness is None else _witness_view(seen, witness.sink.where),
    }


def _witness_view(cp: Checkpoint, where: str) -> dict[str, Any]:
    return {**cp.to_dict(), "where": where}


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
