"""The cluster: nodes and their devices, cordon (and, from routes.faults, drain and device
health), pools with capacity and allocation, quota per queue and pool."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from gpupool.auth import Principal
from gpupool.model import UNLIMITED
from gpupool.service import openapi as oa
from gpupool.service.core import Service
from gpupool.service.errors import ApiError
from gpupool.service.failures.nodes import device_health, node_health
from gpupool.service.openapi import AUTH, READ, WRITE, doc
from gpupool.service.routes.base import Caller, Svc
from gpupool.service.routes.faults import add_routes as add_fault_routes
from gpupool.service.usecases.drain import set_cordon

router = APIRouter()


def _vec(v: tuple[int, ...] | None) -> dict[str, float | None] | None:
    if v is None:
        return None

    def f(x: int, scale: float) -> float | None:
        return None if x >= UNLIMITED else x / scale

    return {
        "gpu": f(v[0], 1000),
        "cpu": f(v[1], 1000),
        "memoryMiB": f(v[2], 1),
        "ephemeralStorageMiB": f(v[3], 1),
        "networkMbps": f(v[4], 1),
    }


def _node_view(svc: Service, p: Principal, full: bool) -> list[dict[str, Any]]:
    """Nodes with their allocation; with ``full`` each device and who uses it (a workload the
    caller may not read is shown as "(another team)")."""
    ctl = svc.controller
    devs: dict[str, dict[int, list[dict[str, Any]]]] = {}
    for node, per_device in svc.read.device_uses().items():
        devs[node] = {
            i: [
                {
                    "workload": u.workload if svc.can_read_workload(p, u.queue) else "(another team)",
                    "gpuMilli": u.gpu_milli,
                }
                for u in uses
            ]
            for i, uses in per_device.items()
        }
    out = []
    for n, pool in svc.read.nodes():
        used = devs.get(n.name, {})
        alloc = sum(a["gpuMilli"] for lst in used.values() for a in lst)
        v: dict[str, Any] = {
            "name": n.name,
            "gpuModel": n.gpu_model,
            "gpus": n.gpu_count,
            "gpuAllocated": alloc / 1000,
            "pool": pool,
            "schedulable": n.schedulable,
            "health": node_health(ctl.faults, n.name),
            "rack": n.rack,
            "nvlinkDomain": n.nvlink_domain,
        }
        if full:
            v["devices"] = [
                {
                    "index": i,
                    "allocatedMilli": sum(a["gpuMilli"] for a in used.get(i, [])),
                    "workloads": used.get(i, []),
                    **device_health(ctl.faults, n.name, i),
                }
                for i in range(n.gpu_count)
            ]
        out.append(v)
    return out


@router.get("/v1/nodes", tags=["cluster"], **doc(oa.NodeList, *AUTH))
def nodes(p: Caller, svc: Svc) -> dict[str, Any]:
    """Nodes with their GPU allocation."""
    return {"items": _node_view(svc, p, False)}


@router.get("/v1/nodes/{name}", tags=["cluster"], **doc(oa.NodeView, *READ, 422))
def node(name: str, p: Caller, svc: Svc) -> dict[str, Any]:
    """One node and each of its devices (workloads of other teams are not named)."""
    for v in _node_view(svc, p, True):
        if v["name"] == name:
            return v
    raise ApiError(404, f"node {name!r} not found", [{"field": "name", "problem": "no such node"}])


@router.post("/v1/nodes/{name}/cordon", tags=["cluster"], **doc(oa.Cordoned, *WRITE, 404))
def cordon(name: str, p: Caller, svc: Svc) -> dict[str, Any]:
    """Stop placing new work on a node (platform-admin); a node change event."""
    return set_cordon(svc, p, name, True)


@router.post("/v1/nodes/{name}/uncordon", tags=["cluster"], **doc(oa.Cordoned, *WRITE, 404))
def uncordon(name: str, p: Caller, svc: Svc) -> dict[str, Any]:
    """Allow new work on a node again (platform-admin)."""
    return set_cordon(svc, p, name, False)


add_fault_routes(router)  # drain, device health: registered here to keep the route order


@router.get("/v1/cluster", tags=["cluster"], **doc(oa.ClusterView, *AUTH))
def cluster(p: Caller, svc: Svc) -> dict[str, Any]:
    """Pools with capacity and allocation, and the controller's state."""
    c = svc.read.cluster_summary()
    pools = [
        {
            "name": u.pool.name,
            "gpus": u.capacity_gpu_milli / 1000,
            "gpuAllocated": u.allocated_gpu_milli / 1000,
            "nodes": u.nodes,
            "preemptible": u.pool.preemptible,
            "requiresApproval": u.pool.requires_approval,
            "pricePerGPUHour": u.pool.price_per_gpu_hour,
        }
        for u in c.pools
    ]
    return {
        "nodes": c.nodes,
        "gpus": c.gpus,
        "pools": pools,
        "pending": c.pending,
        "running": c.running,
        "cycles": c.cycles,
        "backend": svc.backend.health().detail,
    }


@router.get("/v1/quota", tags=["cluster"], **doc(oa.QuotaList, *AUTH, 422))
def quota(p: Caller, svc: Svc, queue: str | None = None, pool: str | None = None) -> dict[str, Any]:
    """Quota per queue and pool: guarantee, limit (guarantee + borrowing), in use."""
    rows = svc.read.quota(queue, pool, svc.visible_queues(p))
    return {
        "items": [
            {
                "queue": r.queue,
                "pool": r.pool,
                "parent": r.parent,
                "guarantee": _vec(r.guarantee),
                "limit": _vec(r.limit),
                "used": _vec(r.used),
            }
            for r in rows
        ]
    }
