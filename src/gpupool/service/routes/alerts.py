"""Incidents over the API (platform-admin): list (after evaluating the alert conditions, on the
leader), one with its notifications' deliveries, acknowledge with an owner, resolve with a note
(``gpupool alerts``). An acknowledgement or a resolution is notified like an opening
(gpupool.service.notify), after it is stored.

The server evaluates the conditions in the background as well (gpupool.service.alerts.AlertLoop);
a list evaluates once more so that what it shows is of now, through the same loop (one pass at
a time, leader only: a standby lists what the leader recorded)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Path, Query, Request
from pydantic import BaseModel, Field

from gpupool.auth import Action, Resource
from gpupool.service import alerts
from gpupool.service.openapi import AUTH, BODY, doc
from gpupool.service.routes.base import Caller, Svc

router = APIRouter()

#: an incident id (bounded: the database's integers are 32-bit somewhere)
IncidentId = Path(ge=1, le=2**31 - 1, description="the incident's id")


class Ack(BaseModel):
    owner: str = Field("", max_length=253, description="who handles it (default: the caller)")


class Resolve(BaseModel):
    note: str = Field(min_length=1, max_length=4000, description="what was done")


@router.get("/v1/alerts", tags=["alerts"], **doc(None, *AUTH, 403, 422))
def list_alerts(
    request: Request,
    p: Caller,
    svc: Svc,
    open_only: bool = Query(False, alias="open", description="open incidents only"),
    evaluate: bool = Query(True, description="evaluate the conditions first (false: as last recorded)"),
) -> dict[str, Any]:
    """Evaluate the alert conditions now (on the leader), then the incidents, newest first."""
    svc.check(p, Action.READ_AUDIT, Resource("Incident"), mutating=False)
    loop = alerts.loop_of(request.app.state)
    opened = resolved = 0
    if evaluate:  # the dashboard, polling, reads what the background loop recorded instead
        opened, resolved = loop.evaluate_now() if loop is not None else alerts.refresh(svc)
    return {"opened": opened, "resolved": resolved, "items": svc.store.list_incidents(open_only=open_only)}


@router.get("/v1/alerts/{incident}", tags=["alerts"], **doc(None, *AUTH, 403, 404, 422))
def describe(p: Caller, svc: Svc, incident: int = IncidentId) -> dict[str, Any]:
    """One incident and each delivery of its notifications (sink, attempts, outcome, last error)."""
    svc.check(p, Action.READ_AUDIT, Resource("Incident", str(incident)), mutating=False)
    return svc.store.get_incident(incident)


def _notified(request: Request, incident: dict[str, Any]) -> dict[str, Any]:
    notifier = getattr(request.app.state, "notifier", None)
    if notifier is not None:
        notifier.notify(incident)
    return incident


@router.post("/v1/alerts/{incident}/ack", tags=["alerts"], **doc(None, *BODY, 404))
def ack(request: Request, body: Ack, p: Caller, svc: Svc, incident: int = IncidentId) -> dict[str, Any]:
    """Acknowledge: someone owns it now."""
    svc.check(p, Action.READ_AUDIT, Resource("Incident", str(incident)))
    return _notified(request, svc.store.ack_incident(incident, p.name, body.owner))


@router.post("/v1/alerts/{incident}/resolve", tags=["alerts"], **doc(None, *BODY, 404))
def resolve(
    request: Request, body: Resolve, p: Caller, svc: Svc, incident: int = IncidentId
) -> dict[str, Any]:
    """Resolve with a note of what was done (it reopens if the condition still holds)."""
    svc.check(p, Action.READ_AUDIT, Resource("Incident", str(incident)))
    return _notified(request, svc.store.resolve_incident(incident, p.name, body.note))


__all__ = ["router"]
