"""``/v1/catalog``: the pools as a service catalog (``service/catalog.py`` says what and why)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, Field

from gpupool.service.catalog import catalog, entry_json
from gpupool.service.errors import ApiError
from gpupool.service.openapi import AUTH, READ, doc
from gpupool.service.routes.base import Caller, Svc

router = APIRouter()


class CatalogQueue(BaseModel):
    queue: str
    gpuGuarantee: float
    requiresApproval: bool


class CatalogEntryView(BaseModel):
    """One pool as a team choosing one reads it; GPU figures in devices (fractions where shared)."""

    name: str
    description: str
    environment: str
    slaTier: str
    pricePerGPUHour: float
    preemptible: bool
    placement: str
    gpuModels: list[str]
    nodes: int
    gpus: float
    gpuAllocated: float
    gpuFree: float = Field(description="devices not allocated now")
    gpuGuaranteed: float = Field(description="devices the root queues are guaranteed in the pool")
    gpuUnpromised: float = Field(description="capacity no queue is guaranteed (shared by borrowing)")
    preferredByTaskTypes: list[str] = Field(description="task types whose defaults send work here first")
    allowedTaskTypes: list[str] = Field(description="the task types the pool takes; empty: every type")
    requiresApproval: bool
    approvalRules: list[str]
    queues: list[CatalogQueue] = Field(
        description="the leaf queues (of those the caller may read) that may use it"
    )


class CatalogList(BaseModel):
    items: list[CatalogEntryView]


def _entries(p: Caller, svc: Svc) -> list[dict[str, Any]]:
    visible = svc.visible_queues(p)
    out = []
    for e in catalog(svc.read, svc.controller.bundle):
        j = entry_json(e)
        if visible is not None:
            j["queues"] = [q for q in j["queues"] if q["queue"] in visible]
        out.append(j)
    return out


@router.get("/v1/catalog", tags=["cluster"], **doc(CatalogList, *AUTH))
def list_catalog(p: Caller, svc: Svc) -> dict[str, Any]:
    """Every pool with its purpose, price, promised and free capacity, users and approval rules."""
    return {"items": _entries(p, svc)}


@router.get("/v1/catalog/{name}", tags=["cluster"], **doc(CatalogEntryView, *READ, 422))
def get_catalog(name: str, p: Caller, svc: Svc) -> dict[str, Any]:
    """One pool's catalog entry."""
    for j in _entries(p, svc):
        if j["name"] == name:
            return j
    raise ApiError(404, f"pool {name!r} not found", [{"field": "name", "problem": "no such pool"}])
