"""The last hours as series for the dashboard's charts: GPUs allocated per pool and workloads
pending per queue, sampled at even steps.

Why from the workloads' own timestamps: every admission and finish is already in the store, so
the charts are right after a restart and need no second database; a workload preempted and
admitted again counts from its latest admission (the store keeps that one), so the series are
what the store knows now, not a metrics archive.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Query

from gpupool.service import openapi as oa
from gpupool.service.openapi import AUTH, doc
from gpupool.service.routes.base import Caller, Svc
from gpupool.store import WorkloadRecord

router = APIRouter()

#: samples per series (an even step over the window)
POINTS = 60


def gpus_of(placement: Mapping[str, Any] | None) -> float:
    """The GPUs a placement holds (fractional shares counted as their fraction)."""
    pods = (placement or {}).get("pods") or []
    return sum(len(p.get("devices") or []) * float(p.get("gpuMilli", 1000)) / 1000 for p in pods)


def series(
    recs: list[WorkloadRecord], start: datetime, end: datetime, points: int = POINTS
) -> dict[str, Any]:
    """Allocation per pool and pending count per queue at ``points`` instants in [start, end]."""
    step = (end - start) / max(1, points - 1)
    times = [start + step * i for i in range(points)]
    pools: dict[str, list[float]] = defaultdict(lambda: [0.0] * points)
    pending: dict[str, list[int]] = defaultdict(lambda: [0] * points)
    for r in recs:
        gone = r.finished_at or end + step
        waited_until = r.admitted_at or gone
        pool = (r.placement or {}).get("pool")
        held = gpus_of(r.placement)
        for i, t in enumerate(times):
            if r.submitted_at <= t < waited_until:
                pending[r.queue][i] += 1
            elif pool and r.admitted_at is not None and r.admitted_at <= t < gone:
                pools[pool][i] += held
    return {
        "times": [t.isoformat() for t in times],
        "pools": {k: [round(v, 3) for v in vs] for k, vs in sorted(pools.items())},
        "pending": dict(sorted(pending.items())),
    }


@router.get("/v1/history", tags=["cluster"], **doc(oa.History, *AUTH, 422))
def history(
    p: Caller, svc: Svc, hours: Annotated[float, Query(gt=0, le=168, description="window length")] = 6.0
) -> dict[str, Any]:
    """GPUs allocated per pool and workloads pending per queue over the last ``hours``."""
    end = datetime.now(UTC)
    start = end - timedelta(hours=hours)
    visible = svc.visible_queues(p)
    recs = [
        r
        for r in svc.store.list_workloads(queues=visible)
        if (r.finished_at is None or r.finished_at >= start) and r.submitted_at <= end
    ]
    return {"hours": hours, **series(recs, start, end)}
