"""Plain typed data for the scheduling engine: nodes, pools, queues, priority classes, workloads.

Everything here is immutable and integer-valued (milli-GPU, milli-CPU, MiB) so that snapshots
can be shared, hashed and compared, and the engine stays deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final

GPU: Final = "nvidia.com/gpu"
CPU: Final = "cpu"
MEMORY: Final = "memory"
#: node-local scratch disk, in MiB (Kubernetes' own resource name)
STORAGE: Final = "ephemeral-storage"
#: network bandwidth a pod may use, in Mbit/s (gpupool's extended resource; see docs/engine.md)
NETWORK: Final = "gpupool.io/network-bandwidth"
#: Resources that quotas govern, in the order of a quota vector. The first dimension counts
#: the devices of the pool's accelerator kind (GPUs, NPUs), whatever its resource name.
QUOTA_RESOURCES: Final = (GPU, CPU, MEMORY, STORAGE, NETWORK)
#: Positions in a quota vector.
D_DEVICE, D_CPU, D_MEMORY, D_STORAGE, D_NETWORK = range(5)
#: A quota dimension that is not set is not governed.
UNLIMITED: Final = 1 << 62

#: a quota vector: device milli, CPU milli, memory MiB, ephemeral storage MiB, bandwidth Mbit/s
Vec = tuple[int, int, int, int, int]
ZERO: Final[Vec] = (0, 0, 0, 0, 0)
#: a vector that governs nothing (an unset guarantee of CPU, a missing limit)
NO_LIMIT: Final[Vec] = (UNLIMITED, UNLIMITED, UNLIMITED, UNLIMITED, UNLIMITED)


def devices_only(milli: int) -> Vec:
    """A quota of devices alone (milli-devices), every other dimension ungoverned: what an unset
    guarantee means for CPU, memory, storage and bandwidth."""
    return (milli, UNLIMITED, UNLIMITED, UNLIMITED, UNLIMITED)


# The vector helpers know nothing of what a dimension means; they are written out per position
# because they run for every admission attempt (a map/zip form is 2.5x slower).


def vadd(a: Vec, b: Vec) -> Vec:
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3], a[4] + b[4])


def vsub(a: Vec, b: Vec) -> Vec:
    return (a[0] - b[0], a[1] - b[1], a[2] - b[2], a[3] - b[3], a[4] - b[4])


def vmax(a: Vec, b: Vec) -> Vec:
    return (max(a[0], b[0]), max(a[1], b[1]), max(a[2], b[2]), max(a[3], b[3]), max(a[4], b[4]))


def vle(a: Vec, b: Vec) -> bool:
    return a[0] <= b[0] and a[1] <= b[1] and a[2] <= b[2] and a[3] <= b[3] and a[4] <= b[4]


@dataclass(frozen=True, slots=True)
class AcceleratorKind:
    """A kind of device a node offers (异构资源): its resource name, vendor and what it is called.

    ``shareable``: whether a pod may hold a fraction of one device (the engine's milli-device
    sharing, as HAMi offers for NVIDIA GPUs); a fraction of a kind that cannot be shared is
    refused when the workload is read, naming the field.
    """

    resource: str
    vendor: str
    noun: str  # what reasons call one device: "GPU", "NPU"
    shareable: bool = False


#: the accelerator kinds gpupool knows, by resource name (a node's devices are of one kind)
ACCELERATORS: Final[dict[str, AcceleratorKind]] = {
    k.resource: k
    for k in (
        AcceleratorKind(GPU, "NVIDIA", "GPU", shareable=True),
        AcceleratorKind("amd.com/gpu", "AMD", "GPU"),
        AcceleratorKind("huawei.com/Ascend910", "Huawei", "NPU"),
        AcceleratorKind("huawei.com/Ascend310", "Huawei", "NPU"),
        AcceleratorKind("huawei.com/Ascend310P", "Huawei", "NPU"),
    )
}


def device_noun(resource: str) -> str:
    """What one device of a kind is called in reasons ("GPU" for unknown kinds, as before)."""
    kind = ACCELERATORS.get(resource)
    return kind.noun if kind is not None else "GPU"


class WorkloadType(StrEnum):
    TRAINING = "training"
    FINE_TUNING = "fine-tuning"
    INFERENCE = "inference"
    EVALUATION = "evaluation"
    BATCH = "batch"


class QueueingStrategy(StrEnum):
    STRICT_FIFO = "StrictFIFO"
    BEST_EFFORT_FIFO = "BestEffortFIFO"


class TopologyScope(StrEnum):
    NODE = "node"
    NVLINK = "nvlink"
    RACK = "rack"


class TopologyMode(StrEnum):
    REQUIRED = "Required"
    PREFERRED = "Preferred"


class PlacementPolicy(StrEnum):
    #: the engine-wide score (``EngineConfig.score``, by default ``auto``)
    DEFAULT = "Default"
    BINPACK = "BinPack"
    SPREAD = "Spread"
    FRAGMENTATION = "Fragmentation"


class FairSharingMode(StrEnum):
    """A cohort root's fair-share measure (``spec.fairSharing.mode``, engine/over_quota.py)."""

    #: usage / guarantee / weight: spare capacity goes in proportion to guarantee x weight
    GUARANTEE_WEIGHTED = "GuaranteeWeighted"
    #: usage / fair share: deserved quota first, the surplus by ``overQuotaWeight`` (KAI, Volcano)
    OVER_QUOTA = "OverQuota"


class ReclaimPolicy(StrEnum):
    NEVER = "Never"
    LOWER_PRIORITY = "LowerPriority"
    ANY = "Any"
    #: ``withinQueue`` only (Kueue's ``withinClusterQueue``): lower priority, or equal priority
    #: and queued after the preemptor
    LOWER_OR_NEWER_EQUAL_PRIORITY = "LowerOrNewerEqualPriority"
    #: ``reclaimWithinCohort`` only: borrowers of lower or equal priority (not within a queue,
    #: where equals would evict each other back and forth)
    LOWER_OR_EQUAL_PRIORITY = "LowerOrEqualPriority"


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str
    value: str | None = None  # None: any value (operator Exists)
    effect: str | None = None

    def tolerates(self, t: Taint) -> bool:
        return (
            (self.key == t.key or self.key == "*")
            and (self.value is None or self.value == t.value)
            and (self.effect is None or self.effect == t.effect)
        )


@dataclass(frozen=True, slots=True)
class Node:
    """One machine. Devices are indexed 0..gpu_count-1; all devices on a node are the same model."""

    name: str
    gpu_model: str
    gpu_count: int
    gpu_memory_mib: int
    cpu_milli: int
    memory_mib: int
    rdma: int = 0
    labels: tuple[tuple[str, str], ...] = ()
    taints: tuple[Taint, ...] = ()
    nvlink_domain: str = ""
    rack: str = ""
    schedulable: bool = True
    #: the resource name of its devices' kind (``gpu_*`` fields describe these devices)
    accelerator: str = GPU
    ephemeral_storage_mib: int = 0
    network_mbps: int = 0

    @property
    def label_map(self) -> dict[str, str]:
        return dict(self.labels)

    def domain(self, scope: TopologyScope) -> str:
        if scope is TopologyScope.NODE:
            return self.name
        if scope is TopologyScope.NVLINK:
            return self.nvlink_domain or self.name
        return self.rack or self.nvlink_domain or self.name


@dataclass(frozen=True, slots=True)
class Consolidation:
    """A pool's consolidation setting (KAI's consolidation action, ``engine/consolidation.py``):
    move preemptible running work elsewhere at once so a blocked workload can start."""

    enabled: bool = False
    #: moves the engine may decide in this pool per cycle
    max_moves_per_cycle: int = 1
    #: a workload is not moved until it has run this long since it (re)started; None: a tenth
    #: of its declared duration (no declared duration: no cooldown)
    cooldown_s: float | None = None


@dataclass(frozen=True, slots=True)
class ResourcePool:
    """A service-catalog entry (资源池): which nodes, who may be preempted, what it costs."""

    name: str
    node_selector: tuple[tuple[str, str], ...] = ()
    gpu_models: tuple[str, ...] = ()
    description: str = ""
    preemptible: bool = True
    requires_approval: bool = False
    price_per_gpu_hour: float = 0.0
    placement: PlacementPolicy = PlacementPolicy.DEFAULT
    sla_tier: str = ""
    environment: str = ""
    #: the accelerator kinds (resource names) whose nodes it takes; empty: any kind
    accelerators: tuple[str, ...] = ()
    #: the task types (``Workload.type``) it takes; empty: every type (``spec.allowedTaskTypes``)
    allowed_types: tuple[str, ...] = ()
    #: consolidation (``spec.consolidation``); None: off
    consolidation: Consolidation | None = None
    #: how many blocked whole-GPU workloads get a planned start (a hold of nodes) per cycle, in
    #: rank order (``spec.reservations``, Slurm's ``bf_max_job_test``): backfill admits only work
    #: that delays none of them (``engine/holds.py``); 0: no holds in this pool
    reservations: int = 1

    def takes_type(self, wtype: str) -> bool:
        """A workload of type ``wtype`` may run here (an inference pool may refuse notebooks)."""
        return not self.allowed_types or str(wtype) in self.allowed_types

    def answers_to(self, preferred: str) -> bool:
        """A task type's ``preferredPools`` entry names this pool: by its name, or by its
        ``environment`` (so the packaged ``[inference]`` finds a pool named ``a100-inference``
        whose environment is ``inference``)."""
        return preferred == self.name or (bool(self.environment) and preferred == self.environment)

    def selects(self, node: Node) -> bool:
        labels = node.label_map
        if any(labels.get(k) != v for k, v in self.node_selector):
            return False
        if self.accelerators and node.accelerator not in self.accelerators:
            return False
        return not self.gpu_models or node.gpu_model in self.gpu_models


@dataclass(frozen=True, slots=True)
class PoolQuota:
    """A queue's quota in one pool, as quota vectors (device milli, cpu milli, memory MiB,
    ephemeral storage MiB, network Mbit/s).

    ``borrowing_limit`` / ``lending_limit`` of None mean unlimited / lend everything.
    """

    pool: str
    guarantee: Vec = ZERO
    borrowing_limit: Vec | None = None
    lending_limit: Vec | None = None


@dataclass(frozen=True, slots=True)
class PreemptionPolicy:
    within_queue: ReclaimPolicy = ReclaimPolicy.LOWER_PRIORITY
    reclaim_within_cohort: ReclaimPolicy = ReclaimPolicy.ANY
    borrow_within_cohort: ReclaimPolicy = ReclaimPolicy.NEVER
    #: Kueue's ``borrowWithinCohort.maxPriorityThreshold``: while borrowing, only victims of at
    #: most this priority (None: any lower priority)
    borrow_max_priority: int | None = None
    #: ``guaranteeFloor``: another queue's preemption never takes this queue below its
    #: guarantee (YuniKorn's rule; engine/preemption/floor.py)
    guarantee_floor: bool = False


@dataclass(frozen=True, slots=True)
class PendingLimits:
    """How much one queue (its whole subtree) or one user in it may have Pending at once
    (``spec.limits``, like Slurm's ``MaxSubmitJobs``; None: no limit). Why: a tenant's
    backlog costs every cycle and delays everyone; gpupool.service.limits counts and refuses."""

    workloads: int | None = None
    pods: int | None = None
    workloads_per_user: int | None = None
    pods_per_user: int | None = None


@dataclass(frozen=True, slots=True)
class Queue:
    """A node of the queue tree (队列): org -> team -> project. Workloads go to leaves."""

    name: str
    parent: str | None = None
    weight: float = 1.0
    strategy: QueueingStrategy = QueueingStrategy.BEST_EFFORT_FIFO
    preemption: PreemptionPolicy = PreemptionPolicy()
    quotas: tuple[PoolQuota, ...] = ()
    requires_approval: bool = False
    description: str = ""
    #: a cohort root only: preempt borrowers for fair sharing (``spec.fairSharing.preemption``,
    #: engine/preemption/fair_sharing.py)
    fair_sharing_preemption: bool = False
    #: ``spec.limits``: what may be Pending at once in this queue's subtree
    pending_limits: PendingLimits = PendingLimits()
    #: a cohort root only: the fair-share measure of its tree (``spec.fairSharing.mode``)
    fair_sharing_mode: FairSharingMode = FairSharingMode.GUARANTEE_WEIGHTED
    #: ``spec.overQuotaWeight``: its part of the surplus under ``OverQuota`` (0: none)
    over_quota_weight: float = 1.0

    def quota(self, pool: str) -> PoolQuota | None:
        for q in self.quotas:
            if q.pool == pool:
                return q
        return None


@dataclass(frozen=True, slots=True)
class PriorityClass:
    name: str
    value: int
    preemptible: bool = True
    description: str = ""
    #: the longest a workload of this class waits for running work about to end before it
    #: evicts (``spec.preemptionWait``; 0: evict at once; None: the engine's default horizon,
    #: ``engine/preemption/victim_cost.wait_horizon``)
    preemption_wait_s: float | None = None


@dataclass(frozen=True, slots=True)
class PodRequest:
    """Per-pod resources. ``gpus`` whole devices, or a fraction of one device (``gpu_milli`` < 1000)."""

    gpus: int = 0
    gpu_milli: int = 0
    gpu_memory_mib: int = 0
    cpu_milli: int = 0
    memory_mib: int = 0
    rdma: int = 0
    #: ephemeral storage (MiB) and network bandwidth (Mbit/s): node resources, like rdma
    storage_mib: int = 0
    network_mbps: int = 0
    #: the accelerator kind's resource name its devices are of (a pod lands only on that kind)
    accelerator: str = GPU

    @property
    def fractional(self) -> bool:
        return self.gpus == 0 and self.gpu_milli > 0

    @property
    def total_gpu_milli(self) -> int:
        return self.gpus * 1000 if self.gpus else self.gpu_milli

    def quota_vec(self) -> Vec:
        return (self.total_gpu_milli, self.cpu_milli, self.memory_mib, self.storage_mib, self.network_mbps)


@dataclass(frozen=True, slots=True)
class PodGroup:
    name: str
    replicas: int
    request: PodRequest


@dataclass(frozen=True, slots=True)
class Topology:
    scope: TopologyScope
    mode: TopologyMode = TopologyMode.REQUIRED


@dataclass(frozen=True, slots=True)
class Workload:
    """A unit of admission: all its pods are admitted together (gang) or not at all.

    ``arrival`` orders workloads within a queue (a submit sequence number or a timestamp).
    ``priority`` and ``preemptible`` are resolved from the priority class when the workload is built.
    """

    name: str
    queue: str
    pod_groups: tuple[PodGroup, ...]
    priority_class: str = ""
    priority: int = 0
    preemptible: bool = True
    type: WorkloadType = WorkloadType.BATCH
    pool: str | None = None
    gpu_models: tuple[str, ...] = ()
    gang_min: int | None = None
    topology: Topology | None = None
    tolerations: tuple[Toleration, ...] = ()
    node_selector: tuple[tuple[str, str], ...] = ()
    expected_duration_s: float | None = None
    arrival: float = 0.0
    #: pools tried first, in this order (its task type's default, docs/engine.md "Task types")
    preferred_pools: tuple[str, ...] = ()
    #: how long it may wait before an alert fires (its task type's default; None: no limit)
    max_wait_s: float | None = None
    #: how often this workload was preempted before (the caller counts; the preemption cost
    #: model protects work that already lost runs: ``engine/preemption/victim_cost.py``)
    evictions: int = 0
    #: its priority class's ``preemption_wait_s`` (None: the engine's default wait horizon)
    preemption_wait_s: float | None = None
    #: the backend can restart it elsewhere at once (a consolidation ``Move``); False: moving it
    #: would stop it whole (on Kubernetes anything but a batch/v1 Job), so consolidation leaves
    #: it in place (the caller says, ``Capability.MOVABLE``)
    movable: bool = True

    @property
    def pod_count(self) -> int:
        return sum(g.replicas for g in self.pod_groups)

    @property
    def min_pods(self) -> int:
        return self.pod_count if self.gang_min is None else min(self.gang_min, self.pod_count)

    def quota_vec(self) -> Vec:
        g = c = m = s = b = 0
        for pg in self.pod_groups:
            r = pg.request
            n = pg.replicas
            g += r.total_gpu_milli * n
            c += r.cpu_milli * n
            m += r.memory_mib * n
            s += r.storage_mib * n
            b += r.network_mbps * n
        return (g, c, m, s, b)

    @property
    def gpu_milli(self) -> int:
        return self.quota_vec()[0]


@dataclass(frozen=True, slots=True)
class PodPlacement:
    """Where one pod runs: the node and device indices, and the share of each device it holds."""

    group: str
    index: int
    node: str
    devices: tuple[int, ...]
    gpu_milli: int  # per device (1000 for a whole GPU)
    gpu_memory_mib: int  # per device (the isolation limit for a fractional pod)
    cpu_milli: int
    memory_mib: int
    rdma: int = 0
    storage_mib: int = 0
    network_mbps: int = 0


@dataclass(frozen=True, slots=True)
class Admission:
    pool: str
    pods: tuple[PodPlacement, ...]
    borrowing: bool = False
    admitted_at: float = 0.0
    #: ``quota_vec``, computed on first use: the engine reads it millions of times over a long
    #: replay (every candidate, bound and release), always of the same immutable pods
    _vec: Vec | None = field(default=None, init=False, repr=False, compare=False)

    def quota_vec(self) -> Vec:
        v = self._vec
        if v is None:
            g = c = m = s = b = 0
            for p in self.pods:
                g += p.gpu_milli * len(p.devices)
                c += p.cpu_milli
                m += p.memory_mib
                s += p.storage_mib
                b += p.network_mbps
            v = (g, c, m, s, b)
            object.__setattr__(self, "_vec", v)  # frozen: set once, never changed
        return v


@dataclass(frozen=True, slots=True)
class Running:
    """An admitted workload and where it sits."""

    workload: Workload
    admission: Admission

    @property
    def name(self) -> str:
        return self.workload.name


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Engine knobs: the plugin chosen at each extension point, and bounds on search effort.

    order: "fair-share" | "fifo"; score: "auto" (fragmentation-aware where nodes differ or GPUs
    are shared, else binpack) | "fragmentation" | "binpack" | "spread" (or a registered scorer);
    preempt: "default" | "none"; one_head_per_queue: consider only each queue's head per cycle
    (Kueue's behaviour, kept for comparisons).
    """

    order: str = "fair-share"
    score: str = "auto"
    preempt: str = "default"
    max_preemption_candidates: int = 512
    max_domain_tries: int = 64
    one_head_per_queue: bool = False
    #: hold nodes for the best-ranked blocked whole-GPU workload per pool (backfill around it)
    reserve: bool = True
    #: fair share with usage decay (``engine/decay.py``): the half-life of the decayed usage the
    #: caller passes in ``Snapshot.decayed_usage``; None (the default): off, usage is ignored
    usage_half_life_s: float | None = None
    #: cost-aware preemption (``engine/preemption/victim_cost.py``, docs/engine.md "Preemption cost"):
    #: off, victims go by priority and age only and nobody waits
    preemption_cost: bool = True
    #: a preemptor waits instead of evicting when running work expected to end within this share
    #: of its own expected run time frees enough for it (0: never; unknown duration: never)...
    preemption_wait_fraction: float = 0.3
    #: ... and within this many seconds at most, where the caller declares a cap (None, the
    #: default: no cap; the horizon is relative to the preemptor's duration alone, so scaling
    #: every time by k scales it by k: docs/engine.md "Time-scale invariance")
    preemption_wait_s: float | None = None
    #: ... and only for work evicted at least this many times before (0: any work)
    preemption_wait_after_evictions: int = 0
    #: a workload admitted less than this many seconds ago is not a victim (0: off)
    preemption_cooldown_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything the engine may look at. Same snapshot in, same decisions out."""

    nodes: tuple[Node, ...]
    pools: tuple[ResourcePool, ...]
    queues: tuple[Queue, ...]
    priority_classes: tuple[PriorityClass, ...] = ()
    pending: tuple[Workload, ...] = ()
    running: tuple[Running, ...] = ()
    now: float = 0.0
    config: EngineConfig = field(default_factory=EngineConfig)
    #: decayed GPU-seconds per queue (``engine/decay.DecayedUsage``), weighed by the fair-share
    #: order when ``config.usage_half_life_s`` is set; empty (the default): today's order exactly
    decayed_usage: tuple[tuple[str, float], ...] = ()
