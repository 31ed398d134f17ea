"""The Scenario manifest's schema (pydantic): what a scenario file may say, field by field.

Why apart from ``gpupool.sim.scenario``: this is the file format, read by users and the docs;
resolving it into clusters, traces and faults is the other module's business.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gpupool.manifests import NodeGroupSpec, PreemptionSpec
from gpupool.model import WorkloadType

POLICIES = ("fifo-first-fit", "kueue-like", "gpupool", "gpupool-eager-preemption", "gpupool-no-preemption")
PolicyName = Literal[
    "fifo-first-fit", "kueue-like", "gpupool", "gpupool-eager-preemption", "gpupool-no-preemption"
]


def _all_policies() -> list[PolicyName]:
    return ["fifo-first-fit", "kueue-like", "gpupool"]


Duration = str | int | float


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class QueueSetSpec(_Strict):
    """``count`` identical leaf queues of each cohort (Kueue's ``queuesSets``)."""

    name: str = Field(default="cq", min_length=1)
    count: int = Field(ge=1, le=10_000)
    guarantee: dict[str, str | int | float] = Field(default_factory=dict)
    borrowingLimit: dict[str, str | int | float] | None = None
    preemption: PreemptionSpec = Field(default_factory=PreemptionSpec)


class CohortSetSpec(_Strict):
    """``count`` cohorts (root queues ``<name>-<i>``) with the same leaves ``<queues.name>-<i>-<j>``
    in one pool; a root's guarantee is the sum of its leaves' (Kueue: a cohort without quota of
    its own). A compact form of Kueue's performance-test ``cohorts`` list."""

    name: str = Field(default="cohort", min_length=1)
    count: int = Field(ge=1, le=10_000)
    pool: str = Field(min_length=1)
    queues: QueueSetSpec


class ClusterRefSpec(_Strict):
    files: list[str] = Field(default_factory=list)
    documents: list[dict[str, Any]] = Field(default_factory=list)
    cohorts: list[CohortSetSpec] = Field(default_factory=list)


class AutoQueuesSpec(_Strict):
    """One leaf queue per trace queue under a cohort root, guarantees sized by GPU-time share."""

    pool: str = Field(min_length=1)
    cohort: str = "cluster"
    guaranteeBy: Literal["gpuTime", "equal"] = "gpuTime"
    preemption: PreemptionSpec = Field(default_factory=PreemptionSpec)


class PhillySpec(_Strict):
    path: str
    gpusPerNode: int = Field(default=8, ge=1)
    cpuPerGPU: str | int | float = 0
    memoryPerGPU: str | int = 0
    maxJobs: int | None = Field(default=None, ge=1)
    autoQueues: AutoQueuesSpec | None = None


class OpenbSpec(_Strict):
    pods: str
    queue: str = "default"
    maxJobs: int | None = Field(default=None, ge=1)


class GenericSpec(_Strict):
    path: str
    format: Literal["csv", "jsonl"] = "csv"
    columns: dict[str, str]
    defaultQueue: str = "default"
    maxJobs: int | None = Field(default=None, ge=1)


class DiurnalSpec(_Strict):
    amplitude: float = Field(default=0.5, ge=0, le=1)
    peakHour: float = Field(default=14.0, ge=0, lt=24)


class TaskTypeSpec(_Strict):
    type: WorkloadType
    ratePerHour: float = Field(ge=0)
    queues: list[str] = Field(min_length=1)
    sizes: dict[str, float] = Field(min_length=1, description="GPUs per job -> weight; '0.5' is a fraction")
    meanDuration: Duration
    durationSigma: float = Field(default=1.0, ge=0, le=4)
    priorityClass: str = ""
    diurnal: DiurnalSpec | None = None
    gpuModels: list[str] = Field(default_factory=list)


class BurstSpec(_Strict):
    at: Duration
    count: int = Field(ge=1, le=1_000_000)
    type: WorkloadType = WorkloadType.TRAINING
    queue: str
    gpus: int = Field(default=8, ge=1)
    meanDuration: Duration
    priorityClass: str = ""


class GeneratorSpec(_Strict):
    duration: Duration
    types: list[TaskTypeSpec] = Field(default_factory=list)
    bursts: list[BurstSpec] = Field(default_factory=list)
    gpusPerNode: int = Field(default=8, ge=1)
    cpuPerGPU: str | int | float = 8
    memoryPerGPU: str | int = "64Gi"


class WorkloadSetSpec(_Strict):
    """``count`` identical workloads per matching queue, one every ``interval`` from ``start``
    (Kueue's performance-test generator: a compact spec instead of a 15,000-row trace).

    Durations accept seconds (``0.2``) or text (``200ms``, ``2m``); CPU is in cores."""

    className: str = Field(min_length=1, description="the class label reported per class")
    queues: list[str] = Field(min_length=1, description="leaf queue names or globs (cq-*)")
    count: int = Field(ge=1, le=1_000_000, description="workloads per queue")
    interval: Duration = Field(description="between two submissions to one queue")
    start: Duration = 0
    duration: Duration
    cpu: str | int | float = 0
    memory: str | int = 0
    gpus: int = Field(default=0, ge=0)
    replicas: int = Field(default=1, ge=1)
    priorityClass: str = ""
    type: WorkloadType = WorkloadType.BATCH


class WorkloadSourceSpec(_Strict):
    philly: PhillySpec | None = None
    openb: OpenbSpec | None = None
    csv: GenericSpec | None = None
    generator: GeneratorSpec | None = None
    sets: list[WorkloadSetSpec] | None = Field(default=None, min_length=1)


class NodeFailureSpec(_Strict):
    node: str
    at: Duration
    repairAfter: Duration = "1h"


class MTBFSpec(_Strict):
    hours: float = Field(gt=0, description="mean time between failures of one node")
    repairAfter: Duration = "2h"


class RetrySpec(_Strict):
    maxRetries: int = Field(default=3, ge=0)
    backoff: Duration = 60
    backoffFactor: float = Field(default=2.0, ge=1)
    maxBackoff: Duration = "1h"


class FaultsSpec(_Strict):
    nodeFailures: list[NodeFailureSpec] = Field(default_factory=list)
    mtbf: MTBFSpec | None = None
    jobFailuresPerHour: float = Field(default=0.0, ge=0, description="abnormal exits per running job-hour")
    retry: RetrySpec = Field(default_factory=RetrySpec)


class WhatIfSpec(_Strict):
    name: str = Field(min_length=1)
    addNodeGroups: list[NodeGroupSpec] = Field(default_factory=list)
    removeNodeGroups: list[str] = Field(default_factory=list)
    quotas: dict[str, dict[str, str | int | float]] = Field(
        default_factory=dict, description="queue -> pool -> guaranteed GPUs"
    )


class ScenarioSpec(_Strict):
    cluster: ClusterRefSpec = Field(default_factory=ClusterRefSpec)
    workload: WorkloadSourceSpec
    faults: FaultsSpec = Field(default_factory=FaultsSpec)
    horizon: Duration | None = None
    seed: int = 1
    policies: list[PolicyName] = Field(default_factory=_all_policies, min_length=1)
    whatIf: list[WhatIfSpec] = Field(default_factory=list)
    scheduleInterval: Duration = Field(
        default=0, description="0: a cycle at every event time; else at most one cycle per interval"
    )
    samples: int = Field(default=400, ge=10, le=100_000, description="points of the time series")
    checkInvariants: bool = False
