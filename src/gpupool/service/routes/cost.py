"""Cost reports (成本复盘): usage, chargeback and the weekly review, over the store's history.

Authorization: every authenticated caller may ask; what comes back is cut to the queues it may
read (a team's member or queue-admin: its subtree; a platform admin or an unscoped viewer:
everything), the same rule as reading workloads. Pool totals, idle and the operations review
are only in a cluster-wide answer: they are about everyone's use.

The CostPolicy (docs/cost.md) is read on every request from ``$GPUPOOL_COST_POLICY`` or
``<state dir>/cost.yaml``, so a new price list needs no restart.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from fastapi.responses import HTMLResponse, Response
from pydantic import BaseModel, Field

from gpupool.auth import Principal
from gpupool.cost import policy as cost_policy
from gpupool.cost.metering import Window
from gpupool.cost.render import render
from gpupool.cost.reports import chargeback_report, load_store, parse_time, usage_report
from gpupool.cost.weekly import weekly_report
from gpupool.service.core import Service
from gpupool.service.errors import ApiError
from gpupool.service.openapi import AUTH, doc
from gpupool.service.routes.base import Caller, Svc

router = APIRouter()

Kind = Literal["usage", "chargeback", "weekly"]
Format = Literal["json", "csv", "html"]
TimeQ = Annotated[str | None, Query(alias="from", max_length=64)]
ToQ = Annotated[str | None, Query(alias="to", max_length=64)]


class ReportTable(BaseModel):
    name: str
    title: str
    columns: list[str]
    rows: list[list[Any]]


class CostReport(BaseModel):
    """A report: its window, headline figures and titled tables (docs/cost.md)."""

    kind: str
    from_: str = Field(alias="from")
    to: str
    currency: str
    scope: str
    summary: dict[str, Any]
    tables: list[ReportTable]


def _window(start: str | None, end: str | None) -> Window:
    """``to`` defaults to now, ``from`` to a week before ``to``; bad values are a located 422."""
    try:
        to = parse_time(end, "to", datetime.now(UTC))
        frm = parse_time(start, "from", to - timedelta(days=7))
        return Window(frm, to)
    except ValueError as exc:
        field = str(exc).split(":", 1)[0]
        raise ApiError(422, f"invalid request: {exc}", [{"field": field, "problem": str(exc)}]) from None


def _visible(svc: Service, p: Principal) -> Any:
    queues = svc.visible_queues(p)
    if queues is None:
        return None
    allowed = set(queues)
    return allowed.__contains__


def policy_path(svc: Service) -> Path:
    """``$GPUPOOL_COST_POLICY``, else ``cost.yaml`` in the state directory (not the configuration
    directory: everything there is applied as cluster objects, and CostPolicy is not one)."""
    env = os.environ.get("GPUPOOL_COST_POLICY")
    return Path(env) if env else svc.config.state_dir / "cost.yaml"


def _policy(svc: Service) -> cost_policy.CostPolicySpec:
    try:
        return cost_policy.load_policy(policy_path(svc))
    except cost_policy.PolicyError as exc:
        problem = str(exc)
        raise ApiError(
            422,
            f"the service's cost policy is invalid: {problem}",
            [{"field": "costPolicy", "problem": problem}],
        ) from None


def build(svc: Service, p: Principal, kind: str, start: str | None, end: str | None) -> dict[str, Any]:
    """One report for this caller (sync: it reads the whole history, so it runs off the loop)."""
    data = load_store(svc.store, _window(start, end), _policy(svc), _visible(svc, p))
    if kind == "usage":
        return usage_report(data)
    if kind == "chargeback":
        return chargeback_report(data)
    return weekly_report(data, svc.store)


@router.get(
    "/v1/reports/{kind}",
    tags=["reports"],
    response_class=Response,
    responses={
        200: {
            "model": CostReport,
            "content": {
                "text/csv": {"schema": {"type": "string"}},
                "text/html": {"schema": {"type": "string"}},
            },
            "description": "the report (JSON by default; CSV or HTML with format)",
        },
        **doc(None, *AUTH, 422)["responses"],
    },
)
def cost_report(
    kind: Kind,
    p: Caller,
    svc: Svc,
    start: TimeQ = None,
    end: ToQ = None,
    format: Format = "json",
) -> Response:
    """The usage, chargeback or weekly report over ``[from, to)`` (ISO-8601; default: the last
    7 days), cut to the caller's queue subtree; JSON, CSV or HTML (the weekly HTML is the
    offline page with its charts)."""
    rep = build(svc, p, kind, start, end)
    if format == "html":
        return HTMLResponse(render(rep, "html"))
    if format == "csv":
        return Response(render(rep, "csv"), media_type="text/csv")
    return Response(render(rep, "json"), media_type="application/json")
