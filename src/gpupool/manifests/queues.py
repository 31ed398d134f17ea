"""Queue and priority class manifests: quotas per pool, preemption policy, and the defaults.

Why quotas are vectors of (GPU, CPU, memory): the engine compares them per dimension; an
unset dimension of a guarantee means no guarantee of it, of a limit no limit.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from pydantic import Field

from gpupool import quantity as qty
from gpupool.manifests.base import Document, ManifestErrors, StrictModel
from gpupool.model import (
    CPU,
    GPU,
    MEMORY,
    UNLIMITED,
    PoolQuota,
    PreemptionPolicy,
    PriorityClass,
    Queue,
    QueueingStrategy,
    ReclaimPolicy,
    Vec,
)


class QuotaSpec(StrictModel):
    pool: str = Field(min_length=1)
    guarantee: dict[str, str | int | float] = Field(default_factory=dict)
    borrowingLimit: dict[str, str | int | float] | None = None
    lendingLimit: dict[str, str | int | float] | None = None


class PreemptionSpec(StrictModel):
    withinQueue: Literal["Never", "LowerPriority"] = "LowerPriority"
    reclaimWithinCohort: ReclaimPolicy = ReclaimPolicy.ANY
    borrowWithinCohort: Literal["Never", "LowerPriority"] = "Never"


class QueueSpec(StrictModel):
    parent: str | None = None
    description: str = ""
    weight: float = Field(default=1.0, gt=0, le=1e6)
    queueingStrategy: QueueingStrategy = QueueingStrategy.BEST_EFFORT_FIFO
    preemption: PreemptionSpec = Field(default_factory=PreemptionSpec)
    requiresApproval: bool = False
    quotas: list[QuotaSpec] = Field(default_factory=list)


class PriorityClassSpec(StrictModel):
    value: int = Field(ge=-(10**9), le=10**9)
    preemptible: bool = True
    description: str = ""


def _quota_vec(
    m: Mapping[str, object], where: str, err: ManifestErrors, default_unset: tuple[int, int, int]
) -> Vec:
    vals = list(default_unset)
    for k, v in m.items():
        try:
            if k == GPU:
                vals[0] = qty.gpu_milli(v)
            elif k == CPU:
                vals[1] = qty.cpu_milli(v)
            elif k == MEMORY:
                vals[2] = qty.memory_mib(v)
            else:
                err.add(f"{where}.{k}", f"unknown quota resource; use {GPU}, {CPU} or {MEMORY}")
        except qty.QuantityError as exc:
            err.add(f"{where}.{k}", str(exc))
    return (vals[0], vals[1], vals[2])


def build_queue(doc: Document, err: ManifestErrors) -> Queue:
    """The model queue of a Queue document: its quota vectors per pool and its preemption policy."""
    s: QueueSpec = doc.spec
    quotas = []
    for i, q in enumerate(s.quotas):
        where = f"{doc.source}: spec.quotas[{i}]"
        g = _quota_vec(q.guarantee, f"{where}.guarantee", err, (0, UNLIMITED, UNLIMITED))
        b = (
            None
            if q.borrowingLimit is None
            else _quota_vec(q.borrowingLimit, f"{where}.borrowingLimit", err, (UNLIMITED,) * 3)
        )
        lend = (
            None
            if q.lendingLimit is None
            else _quota_vec(q.lendingLimit, f"{where}.lendingLimit", err, (UNLIMITED,) * 3)
        )
        if lend is not None and any(lend[d] > g[d] and g[d] < UNLIMITED for d in range(3)):
            err.add(f"{where}.lendingLimit", "must not exceed the guarantee")
        quotas.append(PoolQuota(q.pool, g, b, lend))
    pol = PreemptionPolicy(
        ReclaimPolicy(s.preemption.withinQueue),
        s.preemption.reclaimWithinCohort,
        ReclaimPolicy(s.preemption.borrowWithinCohort),
    )
    return Queue(
        doc.name,
        s.parent,
        s.weight,
        s.queueingStrategy,
        pol,
        tuple(quotas),
        s.requiresApproval,
        s.description,
    )


def default_priority_classes() -> tuple[PriorityClass, ...]:
    """Priority bound to business value: inference first, evaluation last."""
    return (
        PriorityClass("inference-critical", 1000, False, "Online inference with an SLA; never preempted"),
        PriorityClass("training", 500, True, "Production training"),
        PriorityClass("fine-tuning", 400, True, "Fine-tuning of production models"),
        PriorityClass("experiment", 200, True, "Research experiments; reclaimable"),
        PriorityClass("evaluation", 100, True, "Evaluation and benchmarks; first to yield"),
    )
