"""The service catalog (资源池 / 服务目录): each pool as the teams who choose one read it.

Why its own module: ``get pools`` shows the configuration as written (selector, price), but a
team lead choosing a pool asks other questions — what is it for (environment, SLA tier), what
does it cost, how much of it is promised to queues and how much is free now, which task types
go there by default, who may submit to it and what needs an approval. Those answers join the
configuration with the controller's live figures; this module joins them from the read model
and the bundle, so the API, the CLI and the dashboard show the same entry.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpupool.manifests import Bundle
from gpupool.manifests.task_types import resolve
from gpupool.model import ResourcePool, WorkloadType
from gpupool.service.readmodel import ControllerReadModel, PoolUsage, QuotaRow

#: how an exception request is asked for (docs/governance.md): it always needs an approval
EXCEPTION_RULE = "an exception request (annotation gpupool.io/exception) always needs approval"


@dataclass(frozen=True, slots=True)
class QueueAccess:
    """A leaf queue that may submit to the pool, with what it is guaranteed there."""

    queue: str
    guarantee_gpu_milli: int
    requires_approval: bool


@dataclass(frozen=True, slots=True)
class CatalogEntry:
    pool: ResourcePool
    usage: PoolUsage
    guaranteed_gpu_milli: int
    gpu_models: tuple[str, ...]
    preferred_by: tuple[str, ...]
    queues: tuple[QueueAccess, ...]
    approval_rules: tuple[str, ...] = field(default=())

    @property
    def free_gpu_milli(self) -> int:
        return max(0, self.usage.capacity_gpu_milli - self.usage.allocated_gpu_milli)


def preferring_types(pool: ResourcePool, bundle: Bundle) -> tuple[str, ...]:
    """The task types whose cluster-level defaults (the Cluster's ``taskTypes`` over the packaged
    ones) send work to ``pool`` first."""
    out = []
    for t in WorkloadType:
        prefs = resolve(t.value, {}, None, bundle.task_types.cluster).values.get("preferredPools") or ()
        if any(pool.answers_to(p) for p in prefs):
            out.append(t.value)
    return tuple(out)


def _leaf_access(
    pool: str, rows: list[QuotaRow], bundle: Bundle, path_approval: set[str]
) -> tuple[QueueAccess, ...]:
    parents = {q.parent for q in bundle.queues if q.parent}
    return tuple(
        QueueAccess(r.queue, r.guarantee[0], r.queue in path_approval)
        for r in rows
        if r.pool == pool and r.queue not in parents
    )


def _approving_queues(bundle: Bundle) -> set[str]:
    """Queues whose own or any ancestor's ``requiresApproval`` is set."""
    by_name = {q.name: q for q in bundle.queues}
    out = set()
    for q in bundle.queues:
        n: str | None = q.name
        while n is not None and n in by_name:
            if by_name[n].requires_approval:
                out.add(q.name)
                break
            n = by_name[n].parent
    return out


def _rules(pool: ResourcePool, access: tuple[QueueAccess, ...]) -> tuple[str, ...]:
    rules = (
        ["every workload placed in this pool (the pool's requiresApproval)"] if pool.requires_approval else []
    )
    gated = [a.queue for a in access if a.requires_approval]
    if gated:
        rules.append(f"workloads of queue(s) {', '.join(gated)} (requiresApproval on the queue or a parent)")
    rules.append(EXCEPTION_RULE)
    return tuple(rules)


def catalog(read: ControllerReadModel, bundle: Bundle) -> list[CatalogEntry]:
    """Every pool of the configuration in force, in configuration order."""
    usage = {u.pool.name: u for u in read.pool_usage()}
    rows = read.quota()
    roots = {q.name for q in bundle.queues if q.parent is None}
    gated = _approving_queues(bundle)
    out = []
    for pool in bundle.pools:
        access = _leaf_access(pool.name, rows, bundle, gated)
        models = sorted({n.gpu_model for n in bundle.nodes if pool.selects(n) and n.gpu_model})
        out.append(
            CatalogEntry(
                pool,
                usage[pool.name],
                sum(r.guarantee[0] for r in rows if r.pool == pool.name and r.queue in roots),
                tuple(models),
                preferring_types(pool, bundle),
                access,
                _rules(pool, access),
            )
        )
    return out


def entry_json(e: CatalogEntry) -> dict[str, Any]:
    """The API's form: GPUs as numbers of devices (fractions where shared)."""
    cap, alloc = e.usage.capacity_gpu_milli, e.usage.allocated_gpu_milli
    p = e.pool
    return {
        "name": p.name,
        "description": p.description,
        "environment": p.environment,
        "slaTier": p.sla_tier,
        "pricePerGPUHour": p.price_per_gpu_hour,
        "preemptible": p.preemptible,
        "placement": str(p.placement),
        "gpuModels": list(e.gpu_models),
        "nodes": e.usage.nodes,
        "gpus": cap / 1000,
        "gpuAllocated": alloc / 1000,
        "gpuFree": e.free_gpu_milli / 1000,
        "gpuGuaranteed": e.guaranteed_gpu_milli / 1000,
        "gpuUnpromised": max(0, cap - e.guaranteed_gpu_milli) / 1000,
        "preferredByTaskTypes": list(e.preferred_by),
        "allowedTaskTypes": list(p.allowed_types),
        "requiresApproval": p.requires_approval,
        "approvalRules": list(e.approval_rules),
        "queues": [
            {
                "queue": a.queue,
                "gpuGuarantee": a.guarantee_gpu_milli / 1000,
                "requiresApproval": a.requires_approval,
            }
            # the queues guaranteed a share first, then those that may only borrow
            for a in sorted(e.queues, key=lambda a: a.guarantee_gpu_milli == 0)
        ],
    }
