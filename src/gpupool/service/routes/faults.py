"""REST verbs for node faults: drain a node, mark a device unhealthy (or healthy again).

Why a module of their own: they are a unit (one policy, gpupool.service.failures);
``routes.cluster`` registers them after cordon. The routes parse and answer; the work is the
use-cases gpupool.service.usecases.drain and .device_health (the local backend's health check
calls the latter too).

Both are platform-admin verbs (the same check as cordon: update of the Cluster object) and are
audited. Device health is stored like cordon, as an annotation on the Cluster object that
defines the node (``gpupool.io/unhealthy-devices``, JSON ``{"<node>/<index>": "<reason>"}``), so
it survives a restart and is part of the configuration the controller rebuilds from.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body
from pydantic import BaseModel, Field

from gpupool.service.openapi import BODY, doc
from gpupool.service.routes.base import Caller, Svc
from gpupool.service.usecases.device_health import set_device_health
from gpupool.service.usecases.drain import drain


class DeviceHealthRequest(BaseModel):
    healthy: bool = Field(description="false: take the device out of placement and requeue its work")
    reason: str = Field(default="", max_length=2000, description="why (shown on the node and in events)")


class DrainRequest(BaseModel):
    reason: str = Field(default="", max_length=2000, description="why the node is drained")


class DeviceHealth(BaseModel):
    node: str
    index: int
    healthy: bool
    reason: str
    requeued: list[str]


class Drained(BaseModel):
    name: str
    schedulable: bool
    evicted: list[str]


def add_routes(app: APIRouter) -> None:
    """Register the drain and device-health verbs (on the cluster router, after cordon)."""

    @app.post("/v1/nodes/{name}/drain", tags=["cluster"], **doc(Drained, *BODY, 404))
    def drain_node(
        name: str, p: Caller, svc: Svc, body: DrainRequest | None = Body(default=None)
    ) -> dict[str, Any]:
        """Cordon a node, then evict its workloads with the reason and requeue them (platform-admin)."""
        return drain(svc, p, name, body.reason if body else "")

    @app.post("/v1/nodes/{name}/devices/{index}/health", tags=["cluster"], **doc(DeviceHealth, *BODY, 404))
    def device_health(
        name: str, index: int, body: DeviceHealthRequest, p: Caller, svc: Svc
    ) -> dict[str, Any]:
        """Mark a device unhealthy (no new work; its workloads requeued by their retry policy) or healthy."""
        return set_device_health(svc, p, name, index, body.healthy, body.reason)


__all__ = ["add_routes"]
