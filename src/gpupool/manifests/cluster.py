"""Cluster and resource pool manifests: their specs and their conversion to nodes and pools.

Why nodes are generated here: a node group is a count and a shape; the names, racks and
NVLink domains of its nodes follow from it the same way on every load.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from pydantic import Field, field_validator, model_validator

from gpupool import quantity as qty
from gpupool.manifests.base import (
    AMD_GPU,
    AMD_PRODUCT,
    AMD_VRAM,
    ASCEND_CHIP,
    ASCEND_LABEL,
    ASCEND_PREFIX,
    GFD_MEMORY,
    GFD_PRODUCT,
    Document,
    ManifestErrors,
    StrictModel,
)
from gpupool.manifests.limits import MAX_CLUSTER_NODES
from gpupool.manifests.task_types import TaskTypeSpec
from gpupool.model import (
    ACCELERATORS,
    GPU,
    Consolidation,
    Node,
    PlacementPolicy,
    ResourcePool,
    Taint,
    WorkloadType,
)


class TaintSpec(StrictModel):
    key: str
    value: str = ""
    effect: Literal["NoSchedule", "NoExecute", "PreferNoSchedule"] = "NoSchedule"


class GPUSpec(StrictModel):
    """A node's devices: all of one accelerator kind (``resource``, NVIDIA GPUs by default)."""

    resource: str = GPU
    model: str = Field(min_length=1)
    count: int = Field(ge=0, le=64)
    memory: str | int


class TopologySpec(StrictModel):
    racks: int = Field(default=1, ge=1, le=100_000)
    rackPrefix: str = "r"
    nodesPerNVLinkDomain: int = Field(default=1, ge=1, le=100_000)


class NodeGroupSpec(StrictModel):
    name: str = Field(min_length=1)
    count: int = Field(ge=1, le=100_000)
    namePrefix: str | None = None
    gpu: GPUSpec
    cpu: str | int | float
    memory: str | int
    rdma: int = Field(default=0, ge=0, le=1024)
    ephemeralStorage: str | int = 0
    networkBandwidth: str | int = 0
    labels: dict[str, str] = Field(default_factory=dict)
    taints: list[TaintSpec] = Field(default_factory=list)
    topology: TopologySpec = Field(default_factory=TopologySpec)


class NodeSpec(StrictModel):
    name: str = Field(min_length=1)
    gpu: GPUSpec
    cpu: str | int | float
    memory: str | int
    rdma: int = Field(default=0, ge=0, le=1024)
    ephemeralStorage: str | int = 0
    networkBandwidth: str | int = 0
    labels: dict[str, str] = Field(default_factory=dict)
    taints: list[TaintSpec] = Field(default_factory=list)
    rack: str = ""
    nvlinkDomain: str = ""
    schedulable: bool = True


class FairSharingSpec(StrictModel):
    #: fair share with usage decay (docs/engine.md, "Usage decay"): e.g. ``1h``; unset: off
    usageHalfLife: str | int | float | None = None


class ClusterSpec(StrictModel):
    nodeGroups: list[NodeGroupSpec] = Field(default_factory=list)
    nodes: list[NodeSpec] = Field(default_factory=list)
    fairSharing: FairSharingSpec = Field(default_factory=FairSharingSpec)
    #: defaults by workload type (docs/engine.md, "Task types"), over the packaged ones
    taskTypes: dict[str, TaskTypeSpec] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _bounded(self) -> ClusterSpec:
        """At most MAX_CLUSTER_NODES nodes: each is placed, watched and shown on every cycle."""
        total = sum(g.count for g in self.nodeGroups) + len(self.nodes)
        if total > MAX_CLUSTER_NODES:
            raise ValueError(
                f"{total:,} nodes (nodeGroups[].count plus nodes) is more than a Cluster may have: "
                f"{MAX_CLUSTER_NODES:,} (the limit MAX_CLUSTER_NODES)"
            )
        return self


class ConsolidationSpec(StrictModel):
    """``spec.consolidation``: move preemptible work so a blocked workload can start (KAI)."""

    enabled: bool = False
    maxMovesPerCycle: int = Field(default=1, ge=1, le=64)
    #: a duration (``10m``); unset: a tenth of the moved workload's declared duration
    cooldown: str | int | None = None

    @field_validator("cooldown")
    @classmethod
    def _duration(cls, v: str | int | None) -> str | int | None:
        if v is not None:
            try:
                qty.parse_duration(v)
            except qty.QuantityError as exc:
                raise ValueError(str(exc)) from None
        return v


class PoolSpec(StrictModel):
    description: str = ""
    nodeSelector: dict[str, str] = Field(default_factory=dict)
    gpuModels: list[str] = Field(default_factory=list)
    #: accelerator kinds (resource names) whose nodes the pool takes; empty: any kind
    accelerators: list[str] = Field(default_factory=list, max_length=16)
    preemptible: bool = True
    requiresApproval: bool = False
    pricePerGPUHour: float = Field(default=0.0, ge=0, le=1e6)
    placement: PlacementPolicy = PlacementPolicy.DEFAULT
    slaTier: str = ""
    environment: str = ""
    #: the task types the pool takes (spec.type of a workload); empty: every type
    allowedTaskTypes: list[WorkloadType] = Field(default_factory=list, max_length=16)
    consolidation: ConsolidationSpec | None = None
    #: how many blocked whole-GPU workloads get a planned start per cycle (Slurm's
    #: ``bf_max_job_test``); backfill delays none of them. 0: no holds in this pool
    reservations: int = Field(default=1, ge=0, le=1000)

    @field_validator("accelerators")
    @classmethod
    def _known_kinds(cls, kinds: list[str]) -> list[str]:
        unknown = [k for k in kinds if k not in ACCELERATORS]
        if unknown:
            raise ValueError(f"unknown accelerator kind {unknown[0]!r}; use one of {', '.join(ACCELERATORS)}")
        return kinds


def _taints(ts: list[TaintSpec]) -> tuple[Taint, ...]:
    return tuple(Taint(t.key, t.value, t.effect) for t in ts)


def _gpu_mem(v: str | int, where: str, err: ManifestErrors) -> int:
    try:
        return qty.mib_value(v) if isinstance(v, int) else qty.memory_mib(v)
    except qty.QuantityError as exc:
        err.add(where, str(exc))
        return 0


def _node_labels(
    base: Mapping[str, str], gpu: GPUSpec, mem: int, rack: str, nvl: str
) -> tuple[tuple[str, str], ...]:
    labels = kind_labels(gpu.resource, gpu.model, mem)
    if rack:
        labels["gpupool.io/rack"] = rack
    if nvl:
        labels["gpupool.io/nvlink-domain"] = nvl
    labels.update(base)
    return tuple(sorted(labels.items()))


def build_nodes(doc: Document, err: ManifestErrors) -> list[Node]:
    """The nodes of a Cluster document: every node group's generated nodes, then the listed ones."""
    spec: ClusterSpec = doc.spec
    out: list[Node] = []
    for gi, g in enumerate(spec.nodeGroups):
        out.extend(_group_nodes(g, f"{doc.source}: spec.nodeGroups[{gi}]", err))
    for ni, n in enumerate(spec.nodes):
        out.append(_listed_node(n, f"{doc.source}: spec.nodes[{ni}]", err))
    return out


def _group_nodes(g: NodeGroupSpec, where: str, err: ManifestErrors) -> list[Node]:
    """A node group's ``count`` nodes: numbered names, spread over its racks and NVLink domains."""
    mem = _gpu_mem(g.gpu.memory, f"{where}.gpu.memory", err)
    try:
        cpu = qty.cpu_milli(g.cpu)
    except qty.QuantityError as exc:
        err.add(f"{where}.cpu", str(exc))
        cpu = 0
    try:
        nmem = qty.memory_mib(g.memory)
    except qty.QuantityError as exc:
        err.add(f"{where}.memory", str(exc))
        nmem = 0
    sto, net = _extras(g, where, err)
    prefix = g.namePrefix if g.namePrefix is not None else f"{g.name}-"
    width = max(3, len(str(g.count)))
    per_rack = -(-g.count // g.topology.racks)
    out: list[Node] = []
    for i in range(g.count):
        name = f"{prefix}{i + 1:0{width}d}"
        rack = f"{g.topology.rackPrefix}{i // per_rack + 1}" if g.topology.racks > 1 else f"{g.name}-rack"
        nvl = (
            name
            if g.topology.nodesPerNVLinkDomain == 1
            else f"{g.name}-nvl{i // g.topology.nodesPerNVLinkDomain + 1}"
        )
        out.append(
            Node(
                name,
                g.gpu.model,
                g.gpu.count,
                mem,
                cpu,
                nmem,
                g.rdma,
                _node_labels(g.labels, g.gpu, mem, rack, nvl),
                _taints(g.taints),
                nvl,
                rack,
                accelerator=g.gpu.resource,
                ephemeral_storage_mib=sto,
                network_mbps=net,
            )
        )
    return out


def _listed_node(n: NodeSpec, where: str, err: ManifestErrors) -> Node:
    """One node the Cluster lists by name (its own NVLink domain unless it names one)."""
    mem = _gpu_mem(n.gpu.memory, f"{where}.gpu.memory", err)
    try:
        cpu = qty.cpu_milli(n.cpu)
        nmem = qty.memory_mib(n.memory)
    except qty.QuantityError as exc:
        err.add(where, str(exc))
        cpu = nmem = 0
    sto, net = _extras(n, where, err)
    return Node(
        n.name,
        n.gpu.model,
        n.gpu.count,
        mem,
        cpu,
        nmem,
        n.rdma,
        _node_labels(n.labels, n.gpu, mem, n.rack, n.nvlinkDomain),
        _taints(n.taints),
        n.nvlinkDomain or n.name,
        n.rack,
        n.schedulable,
        n.gpu.resource,
        sto,
        net,
    )


def _extras(n: NodeGroupSpec | NodeSpec, where: str, err: ManifestErrors) -> tuple[int, int]:
    """A node's accelerator kind checked, its ephemeral storage (MiB) and bandwidth (Mbit/s)."""
    if n.gpu.resource not in ACCELERATORS:
        err.add(f"{where}.gpu.resource", f"unknown accelerator kind; use one of {', '.join(ACCELERATORS)}")
    sto = net = 0
    try:
        sto = qty.storage_mib(n.ephemeralStorage)
    except qty.QuantityError as exc:
        err.add(f"{where}.ephemeralStorage", str(exc))
    try:
        net = qty.bandwidth_mbps(n.networkBandwidth)
    except qty.QuantityError as exc:
        err.add(f"{where}.networkBandwidth", str(exc))
    return sto, net


def kind_labels(resource: str, model: str, mem: int) -> dict[str, str]:
    """The labels a node of this kind carries on Kubernetes (what the vendor's plugin or
    labeller writes), so that generated nodes look like discovered ones."""
    if resource == AMD_GPU:
        return {AMD_PRODUCT: model, AMD_VRAM: f"{mem >> 10}G"}
    if resource.startswith(ASCEND_PREFIX):
        return {ASCEND_LABEL: "huawei-" + resource.removeprefix(ASCEND_PREFIX), ASCEND_CHIP: model}
    return {GFD_PRODUCT: model, GFD_MEMORY: str(mem)}


def usage_half_life(doc: Document, err: ManifestErrors) -> float | None:
    """A Cluster's ``spec.fairSharing.usageHalfLife`` in seconds (None: decay off)."""
    v = doc.spec.fairSharing.usageHalfLife
    if v is None:
        return None
    where = f"{doc.source}: spec.fairSharing.usageHalfLife"
    try:
        s = qty.parse_duration(v)
    except qty.QuantityError as exc:
        err.add(where, str(exc))
        return None
    if not s > 0:
        err.add(where, f"must be a positive duration (e.g. 1h), got {v!r}")
        return None
    return s


def build_pool(doc: Document) -> ResourcePool:
    """The model pool of a ResourcePool document (a pool spec has nothing to convert that can fail)."""
    s: PoolSpec = doc.spec
    return ResourcePool(
        doc.name,
        tuple(sorted(s.nodeSelector.items())),
        tuple(s.gpuModels),
        s.description,
        s.preemptible,
        s.requiresApproval,
        s.pricePerGPUHour,
        s.placement,
        s.slaTier,
        s.environment,
        accelerators=tuple(s.accelerators),
        allowed_types=tuple(str(t) for t in s.allowedTaskTypes),
        consolidation=_consolidation(s.consolidation),
        reservations=s.reservations,
    )


def _consolidation(c: ConsolidationSpec | None) -> Consolidation | None:
    """The model setting of ``spec.consolidation`` (its cooldown was checked by the spec)."""
    if c is None:
        return None
    cool = None if c.cooldown is None else qty.parse_duration(c.cooldown)
    return Consolidation(c.enabled, c.maxMovesPerCycle, cool)
