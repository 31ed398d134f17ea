"""Who am I, and API tokens: issue, list, revoke (platform-admin)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path
from pydantic import BaseModel, Field

from gpupool.audit import AuditEntry
from gpupool.auth import Action, Resource, Role
from gpupool.service import openapi as oa
from gpupool.service.errors import ApiError
from gpupool.service.openapi import AUTH, BODY, WRITE, doc
from gpupool.service.routes.base import MAX_ID, Caller, Svc
from gpupool.store import NotFound

router = APIRouter()


class TokenRequest(BaseModel):
    name: str = Field(min_length=1, max_length=253, description="who the token is for")
    role: Role
    scope: str | None = Field(
        default=None, description="root queue of the subtree (queue-admin, member, viewer)"
    )


@router.get("/v1/whoami", tags=["auth"], **doc(oa.WhoAmI, *AUTH))
def whoami(p: Caller) -> dict[str, Any]:
    """Who the presented token belongs to."""
    return {"name": p.name, "role": p.role.value, "scope": p.scope}


@router.post("/v1/tokens", tags=["auth"], status_code=201, **doc(oa.IssuedToken, *BODY, status=201))
def create_token(body: TokenRequest, p: Caller, svc: Svc) -> dict[str, Any]:
    """Issue an API token (platform-admin). The token is shown once."""
    svc.check(p, Action.MANAGE_TOKENS, Resource("Token", body.name))
    if body.scope is not None and body.scope not in svc.controller.parents:
        raise ApiError(
            422,
            f"scope: queue {body.scope!r} does not exist",
            [{"field": "scope", "problem": "no such queue"}],
        )
    issued = svc.store.create_token(
        body.name, body.role, body.scope, audit=AuditEntry(p.name, "token.create", "Token", body.name)
    )
    r = issued.record
    return {"id": r.id, "name": r.name, "role": r.role, "scope": r.scope, "token": issued.token}


@router.get("/v1/tokens", tags=["auth"], **doc(oa.TokenList, *AUTH, 403))
def list_tokens(p: Caller, svc: Svc) -> dict[str, Any]:
    """Token metadata, never the tokens (platform-admin)."""
    svc.check(p, Action.MANAGE_TOKENS, Resource("Token"), mutating=False)
    return {
        "items": [
            {
                "id": t.id,
                "name": t.name,
                "role": t.role,
                "scope": t.scope,
                "revoked": t.revoked,
                "createdAt": t.created_at.isoformat(),
            }
            for t in svc.store.list_tokens()
        ]
    }


@router.delete("/v1/tokens/{token_id}", tags=["auth"], **doc(oa.RevokedToken, *WRITE, 404))
def revoke_token(token_id: Annotated[int, Path(ge=1, le=MAX_ID)], p: Caller, svc: Svc) -> dict[str, Any]:
    """Revoke a token (platform-admin); takes effect at once on this server."""
    svc.check(p, Action.MANAGE_TOKENS, Resource("Token", str(token_id)))
    try:
        t = svc.store.revoke_token(token_id, audit=AuditEntry(p.name, "token.revoke", "Token", str(token_id)))
    except NotFound:
        raise ApiError(
            404, f"token {token_id} not found", [{"field": "token_id", "problem": "no token has this id"}]
        ) from None
    svc.forget_tokens()
    return {"id": t.id, "name": t.name, "revoked": t.revoked}
