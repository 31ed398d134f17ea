"""Measured GPU utilisation over the API: the running workloads' SM utilisation and GPU memory
as last sampled, and which are held idle (gpupool.service.utilisation; the dashboard's panel).

Why from the sampler's memory and not the store: the rollups are hourly sums for reports; this
is what the devices showed at the last pass. A caller sees the workloads of its queue subtree."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from gpupool.service.openapi import AUTH, doc
from gpupool.service.routes.base import Caller, Svc
from gpupool.service.utilisation_loop import UtilisationLoop

router = APIRouter()


@router.get("/v1/utilisation", tags=["utilisation"], **doc(None, *AUTH))
def utilisation(request: Request, p: Caller, svc: Svc) -> dict[str, Any]:
    """What the running workloads the caller may see compute now; ``source`` says what measures
    them (``none``: nothing can on this backend, and no Prometheus URL is set)."""
    loop = getattr(request.app.state, "utilisation", None)
    if not isinstance(loop, UtilisationLoop):
        return {"source": "none", "thresholdPercent": None, "items": []}
    return {
        "source": loop.source_name,
        "thresholdPercent": loop.settings.threshold_percent,
        "items": loop.tracker.rows(svc.visible_queues(p)),
    }
