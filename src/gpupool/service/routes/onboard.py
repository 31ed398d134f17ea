"""``POST /v1/onboard``: a team from a TeamTemplate (``gpupool onboard``). The route parses the
request; the onboarding itself (checks, preview, one atomic store step) is the use-case
gpupool.service.usecases.onboard.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, Field

from gpupool.service.openapi import BODY, doc
from gpupool.service.routes.base import Caller, Svc
from gpupool.service.usecases.onboard import onboard_team

router = APIRouter()


class OnboardRequest(BaseModel):
    template: dict[str, Any] = Field(description="a TeamTemplate manifest")
    team: str = Field(min_length=1, max_length=63, description="the team's name ({team} in the template)")
    set: dict[str, str] = Field(default_factory=dict, description="template parameters (--set key=value)")
    dryRun: bool = Field(False, description="preview only; create nothing")
    reason: str = Field("", max_length=2000)


@router.post("/v1/onboard", tags=["config"], **doc(None, *BODY))
def onboard(body: OnboardRequest, p: Caller, svc: Svc) -> dict[str, Any]:
    """Create a team's queues and tokens from a template, whole or not at all (platform-admin)."""
    return onboard_team(svc, p, body.template, body.team, body.set, body.dryRun, body.reason)


__all__ = ["router"]
