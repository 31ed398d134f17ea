"""Liveness, readiness and the Prometheus metrics (no token for the first two)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from gpupool.auth import Role
from gpupool.service import openapi as oa
from gpupool.service.errors import ApiError
from gpupool.service.leader import readiness
from gpupool.service.metrics import Metrics
from gpupool.service.openapi import AUTH, doc
from gpupool.service.routes.base import Svc
from gpupool.store.schema import PHASES

router = APIRouter()


@router.get("/healthz", tags=["health"], **doc(oa.Health))
def healthz() -> dict[str, str]:
    """Liveness: the process answers."""
    return {"status": "ok"}


@router.get("/readyz", tags=["health"], **oa.READY_DOC)
def readyz(svc: Svc) -> JSONResponse:
    """Readiness: store reachable, controller recovered and running, backend healthy."""
    problems = []
    try:
        svc.store.ping()
    except Exception as exc:
        problems.append(f"store unreachable: {type(exc).__name__}")
    if svc.leader is not None and not svc.leader.is_leader:  # a standby: ready to serve reads
        return readiness(svc.leader, problems, svc.backend.health().detail)
    ctl = svc.controller
    if not ctl.ready:
        problems.append("controller has not finished recovery")
    if not ctl.alive:
        problems.append("controller loop is not running")
    if ctl.last_error:
        problems.append(f"last controller cycle failed: {ctl.last_error}")
    h = svc.backend.health()
    if not h.ok:
        problems.append("backend unhealthy")
    body = {"status": "ready" if not problems else "not ready", "problems": problems, "backend": h.detail}
    body.update(svc.leader.describe() if svc.leader is not None else {})
    return JSONResponse(body, status_code=200 if not problems else 503)


@router.get(
    "/metrics",
    tags=["health"],
    response_class=Response,
    responses={200: {"content": oa.METRICS_CONTENT}, **doc(None, *AUTH)["responses"]},
)
def metrics(request: Request, svc: Svc) -> Response:
    """Prometheus metrics (gpupool_ prefix). They name every queue and pool, so they need a
    platform-admin or cluster-wide viewer token unless the server runs with public metrics."""
    if not svc.config.metrics_public:
        p = svc.authenticate(request.headers.get("authorization"))
        if not (p.role is Role.PLATFORM_ADMIN or (p.role is Role.VIEWER and p.scope is None)):
            raise ApiError(
                403,
                "forbidden: metrics name every queue; they need a platform-admin or a cluster-wide "
                f"viewer token (caller is {p.role.value} {p.name!r})",
            )

    def refresh(m: Metrics) -> None:
        counts = svc.store.phase_counts()
        for p in PHASES:
            m.workloads.labels(p).set(counts.get(p, 0))
        for u in svc.read.pool_usage():
            m.gpu_allocated.labels(u.pool.name).set(u.allocated_gpu_milli / 1000)
            m.gpu_capacity.labels(u.pool.name).set(u.capacity_gpu_milli / 1000)

    return Response(svc.metrics.render(refresh), media_type="text/plain; version=0.0.4")
