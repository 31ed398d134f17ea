"""``POST /v1/onboard``: a team from a TeamTemplate — its queues and tokens in one atomic step,
previewed first, recorded as one audit entry (``gpupool onboard``).

Why through the same checks as ``/v1/apply``: the queues a template renders are validated
against the configuration they join (a guarantee the parent cannot give is refused naming the
field) and previewed on the work running now; only then does one store transaction create the
queues, issue the tokens and record the OIDC group grants (gpupool.store.onboarding).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, Field

from gpupool.audit import AuditEntry
from gpupool.auth import Action, Resource
from gpupool.manifests.templates import Onboarding, TeamTemplateSpec, TemplateError, render
from gpupool.service import preview as pv
from gpupool.service.convert import parse_manifest
from gpupool.service.openapi import BODY, doc
from gpupool.service.routes.base import ApiError, Caller, Service, Svc
from gpupool.service.routes.config import _check_config, _parse_set

router = APIRouter()


class OnboardRequest(BaseModel):
    template: dict[str, Any] = Field(description="a TeamTemplate manifest")
    team: str = Field(min_length=1, max_length=63, description="the team's name ({team} in the template)")
    set: dict[str, str] = Field(default_factory=dict, description="template parameters (--set key=value)")
    dryRun: bool = Field(False, description="preview only; create nothing")
    reason: str = Field("", max_length=2000)


def _render(body: OnboardRequest) -> tuple[str, Onboarding]:
    doc_ = parse_manifest(body.template, "template")
    if doc_.kind != "TeamTemplate":
        raise ApiError(
            422,
            f"template: expected a TeamTemplate, got {doc_.kind}",
            [{"field": "template.kind", "problem": "not a TeamTemplate"}],
        )
    spec: TeamTemplateSpec = doc_.spec
    try:
        return doc_.name, render(spec, body.team, body.set)
    except TemplateError as exc:
        raise ApiError(422, str(exc), [{"field": "set", "problem": str(exc)}]) from exc


@router.post("/v1/onboard", tags=["config"], **doc(None, *BODY))
def onboard(body: OnboardRequest, p: Caller, svc: Svc) -> dict[str, Any]:
    """Create a team's queues and tokens from a template, whole or not at all (platform-admin)."""
    svc.check(p, Action.MANAGE_TOKENS, Resource("Token", body.team))
    name, plan = _render(body)
    ctl = svc.controller
    with ctl.lock:
        docs = _parse_set(plan.queues)
        taken = [d.name for _, d in docs if d.name in ctl.parents]
        if taken:
            raise ApiError(
                409,
                f"queue {taken[0]!r} already exists; team {body.team!r} may be onboarded already",
                [{"field": "team", "problem": "queue exists"}],
            )
        view = _check_config(svc, p, docs)
        report = pv.simulate(svc, view.bundle)
        if body.dryRun:
            out = pv.record(svc, p, plan.queues, report, body.reason)
            return {
                **out,
                "objects": plan.queues,
                "tokens": [list(t) for t in plan.tokens],
                **_groups(svc, plan),
            }
        detail = {"template": name, "team": body.team, "set": body.set, "preview": pv.summary(report)}
        if body.reason:
            detail["reason"] = body.reason
        recs, issued = svc.store.onboard_team(
            plan.queues,
            plan.tokens,
            AuditEntry(p.name, "team.onboard", "Team", body.team, detail),
            groups=plan.groups,
        )
        ctl.reload_config()
        if plan.groups and svc.oidc is not None:
            svc.oidc.forget_grants()  # the team's groups may sign in at once
    return {
        "team": body.team,
        "template": name,
        "created": [{"kind": r.kind, "name": r.name} for r in recs],
        "tokens": [
            {"name": t.record.name, "role": t.record.role, "scope": t.record.scope, "token": t.token}
            for t in issued
        ],
        **_groups(svc, plan),
        "preview": report,
    }


def _groups(svc: Service, plan: Onboarding) -> dict[str, Any]:
    """The OIDC group grants, and a note when single sign-on is off (they wait for it)."""
    if not plan.groups:
        return {}
    out: dict[str, Any] = {"oidcGroups": [{"group": g, "role": r, "scope": sc} for g, r, sc in plan.groups]}
    if svc.oidc is None:
        out["note"] = (
            "single sign-on is off (GPUPOOL_OIDC_CONFIG unset): the group grants apply once it is on"
        )
    return out


__all__ = ["router"]
