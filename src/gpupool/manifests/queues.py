"""Queue and priority class manifests: quotas per pool, preemption policy, and the defaults.

Why quotas are vectors of (devices, CPU, memory, ephemeral storage, network bandwidth): the
engine compares them per dimension; an unset dimension of a guarantee means no guarantee of it
(of the devices: a guarantee of none), of a limit no limit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Annotated, Literal

from pydantic import Field, StrictFloat, StrictInt, StrictStr, WithJsonSchema, field_validator

from gpupool import quantity as qty
from gpupool.manifests.base import Document, ManifestErrors, StrictModel
from gpupool.manifests.task_types import TaskTypeSpec
from gpupool.model import (
    ACCELERATORS,
    CPU,
    D_CPU,
    D_DEVICE,
    D_MEMORY,
    D_NETWORK,
    D_STORAGE,
    MEMORY,
    NETWORK,
    NO_LIMIT,
    STORAGE,
    UNLIMITED,
    FairSharingMode,
    PendingLimits,
    PoolQuota,
    PreemptionPolicy,
    PriorityClass,
    Queue,
    QueueingStrategy,
    ReclaimPolicy,
    Vec,
    devices_only,
)


class QuotaSpec(StrictModel):
    pool: str = Field(min_length=1)
    guarantee: dict[str, str | int | float] = Field(default_factory=dict)
    borrowingLimit: dict[str, str | int | float] | None = None
    lendingLimit: dict[str, str | int | float] | None = None


class BorrowWithinCohortSpec(StrictModel):
    """Kueue's object form: ``{policy: LowerPriority, maxPriorityThreshold: 100}``."""

    policy: Literal["Never", "LowerPriority"] = "Never"
    #: while borrowing, evict only work of at most this priority
    maxPriorityThreshold: int | None = Field(default=None, ge=-(10**9), le=10**9)


#: what a client may write: the string or the object form (the CRD keeps it free-form)
_BORROW_SCHEMA = {
    "anyOf": [
        {"type": "string", "enum": ["Never", "LowerPriority"]},
        {
            "type": "object",
            "properties": {
                "policy": {"type": "string", "enum": ["Never", "LowerPriority"]},
                "maxPriorityThreshold": {"type": "integer"},
            },
            "additionalProperties": False,
        },
    ]
}


class PreemptionSpec(StrictModel):
    withinQueue: Literal["Never", "LowerPriority", "LowerOrNewerEqualPriority"] = "LowerPriority"
    reclaimWithinCohort: Literal["Never", "LowerPriority", "LowerOrEqualPriority", "Any"] = "Any"
    #: another queue's preemption never takes this queue below its guarantee (YuniKorn)
    guaranteeFloor: bool = False
    #: ``Never``, ``LowerPriority``, or the object form with a priority threshold
    borrowWithinCohort: Annotated[BorrowWithinCohortSpec, WithJsonSchema(_BORROW_SCHEMA)] = Field(
        default_factory=BorrowWithinCohortSpec
    )

    @field_validator("borrowWithinCohort", mode="before")
    @classmethod
    def _short_form(cls, v: object) -> object:
        """The string form is the object form's policy (one type, so errors name one field)."""
        return {"policy": v} if isinstance(v, str) else v


class FairSharingSpec(StrictModel):
    #: preempt borrowers whose weighted share is above the preemptor's, down to equal shares
    preemption: bool = False
    #: the share measure of the whole tree: usage / guarantee / weight (the default), or usage /
    #: fair share, deserved quota first and the surplus by overQuotaWeight (docs/engine.md)
    mode: FairSharingMode = FairSharingMode.GUARANTEE_WEIGHTED


class LimitsSpec(StrictModel):
    """What may be Pending at once in the queue's subtree, and per user in it (unset: no limit;
    the server's ``--pending-limit`` defaults apply to a leaf queue that sets none)."""

    maxPendingWorkloads: StrictInt | None = Field(default=None, ge=0, le=10**9)
    maxPendingPods: StrictInt | None = Field(default=None, ge=0, le=10**9)
    maxPendingWorkloadsPerUser: StrictInt | None = Field(default=None, ge=0, le=10**9)
    maxPendingPodsPerUser: StrictInt | None = Field(default=None, ge=0, le=10**9)

    def model(self) -> PendingLimits:
        return PendingLimits(
            self.maxPendingWorkloads,
            self.maxPendingPods,
            self.maxPendingWorkloadsPerUser,
            self.maxPendingPodsPerUser,
        )


class QueueSpec(StrictModel):
    parent: str | None = None
    description: str = ""
    weight: float = Field(default=1.0, gt=0, le=1e6)
    #: its part of the cohort's surplus under fairSharing.mode OverQuota (0: its guarantee only)
    overQuotaWeight: float = Field(default=1.0, ge=0, le=1e6)
    queueingStrategy: QueueingStrategy = QueueingStrategy.BEST_EFFORT_FIFO
    preemption: PreemptionSpec = Field(default_factory=PreemptionSpec)
    requiresApproval: bool = False
    quotas: list[QuotaSpec] = Field(default_factory=list)
    #: a cohort root only: fair-sharing preemption for its whole tree (docs/engine.md)
    fairSharing: FairSharingSpec | None = None
    #: this queue's defaults by workload type, over the Cluster's (docs/engine.md, "Task types")
    typeDefaults: dict[str, TaskTypeSpec] = Field(default_factory=dict)
    #: pending limits (gpupool.service.limits, docs/service.md "Pending limits")
    limits: LimitsSpec = Field(default_factory=LimitsSpec)


class PriorityClassSpec(StrictModel):
    value: int = Field(ge=-(10**9), le=10**9)
    preemptible: bool = True
    description: str = ""
    #: the longest its workloads wait for running work about to end before they evict (a
    #: duration; 0s: evict at once; unset: the engine's default, docs/engine.md "Preemption cost")
    preemptionWait: StrictStr | StrictInt | StrictFloat | None = None  # strict: YAML's true is no duration


def _quota_vec(m: Mapping[str, object], where: str, err: ManifestErrors, default_unset: Vec) -> Vec:
    """A quota's resources as a vector. Any accelerator kind's resource name fills the device
    dimension (a pool's devices are of one kind), so one quota may name one kind only."""
    vals = list(default_unset)
    kind: str | None = None
    for k, v in m.items():
        try:
            if k in ACCELERATORS:
                if kind is not None:
                    err.add(f"{where}.{k}", f"a quota counts one accelerator kind; {kind} is already set")
                kind = k
                vals[D_DEVICE] = qty.gpu_milli(v)
            elif k in _PARSERS:
                d, parse = _PARSERS[k]
                vals[d] = parse(v)
            else:
                err.add(f"{where}.{k}", f"unknown quota resource; use {_KNOWN}")
        except qty.QuantityError as exc:
            err.add(f"{where}.{k}", str(exc))
    return (vals[0], vals[1], vals[2], vals[3], vals[4])


_PARSERS: dict[str, tuple[int, Callable[[object], int]]] = {
    CPU: (D_CPU, qty.cpu_milli),
    MEMORY: (D_MEMORY, qty.memory_mib),
    STORAGE: (D_STORAGE, qty.storage_mib),
    NETWORK: (D_NETWORK, qty.bandwidth_mbps),
}
_KNOWN = ", ".join([*ACCELERATORS, CPU, MEMORY, STORAGE, NETWORK])


def build_queue(doc: Document, err: ManifestErrors) -> Queue:
    """The model queue of a Queue document: its quota vectors per pool and its preemption policy."""
    s: QueueSpec = doc.spec
    quotas = []
    for i, q in enumerate(s.quotas):
        where = f"{doc.source}: spec.quotas[{i}]"
        g = _quota_vec(q.guarantee, f"{where}.guarantee", err, devices_only(0))
        b = (
            None
            if q.borrowingLimit is None
            else _quota_vec(q.borrowingLimit, f"{where}.borrowingLimit", err, NO_LIMIT)
        )
        lend = (
            None
            if q.lendingLimit is None
            else _quota_vec(q.lendingLimit, f"{where}.lendingLimit", err, NO_LIMIT)
        )
        if lend is not None and any(lend[d] > g[d] and g[d] < UNLIMITED for d in range(len(g))):
            err.add(f"{where}.lendingLimit", "must not exceed the guarantee")
        quotas.append(PoolQuota(q.pool, g, b, lend))
    borrow = s.preemption.borrowWithinCohort
    if borrow.maxPriorityThreshold is not None and borrow.policy == "Never":
        err.add(
            f"{doc.source}: spec.preemption.borrowWithinCohort.maxPriorityThreshold",
            "applies only with policy: LowerPriority",
        )
    pol = PreemptionPolicy(
        ReclaimPolicy(s.preemption.withinQueue),
        ReclaimPolicy(s.preemption.reclaimWithinCohort),
        ReclaimPolicy(borrow.policy),
        borrow.maxPriorityThreshold,
        s.preemption.guaranteeFloor,
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
        fair_sharing_preemption=_fair_sharing(doc, err),
        pending_limits=s.limits.model(),
        fair_sharing_mode=s.fairSharing.mode
        if s.fairSharing is not None
        else FairSharingMode.GUARANTEE_WEIGHTED,
        over_quota_weight=s.overQuotaWeight,
    )


def _fair_sharing(doc: Document, err: ManifestErrors) -> bool:
    """``spec.fairSharing.preemption``, which only a cohort root may set (it governs the tree)."""
    s: QueueSpec = doc.spec
    if s.fairSharing is None:
        return False
    if s.parent is not None:
        err.add(f"{doc.source}: spec.fairSharing", "only a cohort root (a queue without parent) sets it")
    return s.fairSharing.preemption


def default_priority_classes() -> tuple[PriorityClass, ...]:
    """Priority bound to business value: inference first, evaluation last."""
    return (
        PriorityClass("inference-critical", 1000, False, "Online inference with an SLA; never preempted"),
        PriorityClass("training", 500, True, "Production training"),
        PriorityClass("fine-tuning", 400, True, "Fine-tuning of production models"),
        PriorityClass("experiment", 200, True, "Research experiments; reclaimable"),
        PriorityClass("evaluation", 100, True, "Evaluation and benchmarks; first to yield"),
    )


def preemption_wait(spec: PriorityClassSpec, source: str, err: ManifestErrors) -> float | None:
    """A class's ``spec.preemptionWait`` in seconds (None: unset, the engine's default); a bad
    value is an error at that field, and the class then takes the default."""
    if spec.preemptionWait is None:
        return None
    try:
        return qty.parse_duration(spec.preemptionWait)
    except qty.QuantityError as exc:
        err.add(f"{source}: spec.preemptionWait", f"{exc} (e.g. 0s: evict at once, 30s, 5m)")
        return None
