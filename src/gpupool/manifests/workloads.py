"""Workload manifests: the spec, and its conversion to a model workload with each pod's request.

Why the request parser knows several vocabularies: a pod may ask for whole GPUs, a fraction
(``nvidia.com/gpu`` below 1, HAMi's cores and memory, or KAI's annotations); all of them become
one ``PodRequest`` so the engine sees one shape.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field

from gpupool import quantity as qty
from gpupool.manifests.base import (
    HAMI_CORES,
    HAMI_MEM,
    KAI_FRACTION,
    KAI_MEMORY,
    KUEUE_QUEUE_LABEL,
    RDMA_KEYS,
    Document,
    ManifestErrors,
    StrictModel,
    TaskTypeTable,
)
from gpupool.manifests.task_types import resolve_workload
from gpupool.manifests.utilisation import check_annotations
from gpupool.model import (
    ACCELERATORS,
    CPU,
    GPU,
    MEMORY,
    NETWORK,
    STORAGE,
    PodGroup,
    PodRequest,
    PriorityClass,
    Toleration,
    Topology,
    TopologyMode,
    TopologyScope,
    Workload,
    WorkloadType,
    device_noun,
)


class TolerationSpec(StrictModel):
    key: str
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str | None = None
    effect: Literal["NoSchedule", "NoExecute", "PreferNoSchedule"] | None = None


class PodGroupSpec(StrictModel):
    name: str = Field(default="main", min_length=1)
    replicas: int = Field(default=1, ge=1, le=100_000)
    resources: dict[str, str | int | float] = Field(default_factory=dict)
    #: what each pod runs (the local backend; on Kubernetes the pod template says it)
    command: list[str] | None = Field(default=None, max_length=4096)
    args: list[str] = Field(default_factory=list, max_length=4096)
    env: dict[str, str] = Field(default_factory=dict)
    workingDir: str | None = None


class GangSpec(StrictModel):
    minMember: int | None = Field(default=None, ge=1, le=100_000)


class WorkloadTopologySpec(StrictModel):
    scope: TopologyScope
    mode: TopologyMode = TopologyMode.REQUIRED


class WorkloadSpec(StrictModel):
    queue: str | None = None
    priorityClass: str | None = None
    type: WorkloadType = WorkloadType.BATCH
    pool: str | None = None
    gpuModels: list[str] = Field(default_factory=list)
    duration: str | int | float | None = None
    gang: GangSpec = Field(default_factory=GangSpec)
    topology: WorkloadTopologySpec | None = None
    tolerations: list[TolerationSpec] = Field(default_factory=list)
    nodeSelector: dict[str, str] = Field(default_factory=dict)
    podGroups: list[PodGroupSpec] = Field(min_length=1)
    maxRetries: int = Field(default=0, ge=0, le=1000)
    exception: dict[str, Any] | None = None
    #: task-type overrides (docs/engine.md, "Task types"); unset: the queue's, Cluster's or
    #: packaged default for ``type``
    preemptible: bool | None = None
    preferredPools: list[str] | None = Field(default=None, max_length=64)
    maxWait: str | int | float | None = None


def _pod_request(
    res: Mapping[str, object], ann: Mapping[str, str], where: str, err: ManifestErrors
) -> PodRequest:
    """One pod's request from its resources (whole GPUs, a share, HAMi's cores and memory) and
    the document's KAI annotations; located errors for what cannot be read or combined.
    GPU memory with no compute share (``nvidia.com/gpumem`` or KAI's ``gpu-memory`` alone) is a
    memory-only share: the engine counts it as a fraction of a device (``engine/memory_share.py``)."""
    gpus = milli = gmem = cpu = mem = rdma = storage = net = 0
    kind = GPU
    for k, v in res.items():
        try:
            if k in ACCELERATORS:
                if (gpus or milli) and k != kind:
                    err.add(f"{where}.{k}", f"a pod's devices are of one kind; it already asks for {kind}")
                kind = k
                gpus, milli = _devices(k, v, f"{where}.{k}", err)
            elif k == STORAGE:
                storage = qty.storage_mib(v)
            elif k == NETWORK:
                net = qty.bandwidth_mbps(v)
            elif k == HAMI_CORES:
                pct = qty.count(v)
                if not 0 < pct <= 100:
                    err.add(f"{where}.{k}", "must be a percentage of one GPU between 1 and 100")
                milli = pct * 10
            elif k == HAMI_MEM:
                gmem = qty.mib_value(v)
            elif k == CPU:
                cpu = qty.cpu_milli(v)
            elif k == MEMORY:
                mem = qty.memory_mib(v)
            elif k in RDMA_KEYS:
                rdma = qty.count(v)
            else:
                err.add(f"{where}.{k}", f"unknown resource; use {_KNOWN}")
        except qty.QuantityError as exc:
            err.add(f"{where}.{k}", str(exc))
    src = where.rsplit(": ", 1)[0]  # the document: annotation errors are located there too
    milli, gmem = _kai_share(ann, src, milli, gmem, err)
    if gpus and (milli or gmem):
        err.add(where, "a pod takes whole GPUs or a fraction of one GPU, not both")
    if kind != GPU and (milli or gmem) and not gpus:
        shared = "" if ACCELERATORS[kind].shareable else f" ({kind} cannot be shared)"
        err.add(where, f"a GPU share ({HAMI_CORES}, {HAMI_MEM} or KAI's annotations) is for {GPU}{shared}")
    return PodRequest(
        gpus, milli if not gpus else 0, gmem if not gpus else 0, cpu, mem, rdma, storage, net, kind
    )


def _devices(kind: str, v: object, where: str, err: ManifestErrors) -> tuple[int, int]:
    """(whole devices, milli of one device) of an accelerator request: more than one must be a
    whole number, and a fraction only of a kind that can be shared."""
    m = qty.gpu_milli(v)
    if m >= 1000:
        if m % 1000:
            noun = device_noun(kind)
            err.add(where, f"more than one {noun} must be a whole number; a fraction must be below 1")
        return m // 1000, 0
    if m and not ACCELERATORS[kind].shareable:
        err.add(where, f"{kind} cannot be shared: ask for whole devices (1, 2, ...), not {v!r}")
    return 0, m


_KNOWN = ", ".join([*ACCELERATORS, HAMI_CORES, HAMI_MEM, CPU, MEMORY, STORAGE, NETWORK, "rdma"])


def _kai_share(
    ann: Mapping[str, str], src: str, milli: int, gmem: int, err: ManifestErrors
) -> tuple[int, int]:
    """The GPU share and memory with KAI's annotations applied (they override the resources)."""
    if KAI_FRACTION in ann:
        try:
            f = qty.gpu_milli(ann[KAI_FRACTION])
            if not 0 < f < 1000:
                err.add(f"{src}: metadata.annotations.{KAI_FRACTION}", "must be a fraction between 0 and 1")
            milli = f
        except qty.QuantityError as exc:
            err.add(f"{src}: metadata.annotations.{KAI_FRACTION}", str(exc))
    if KAI_MEMORY in ann:
        try:
            gmem = qty.mib_value(ann[KAI_MEMORY])
            if gmem <= 0:
                err.add(
                    f"{src}: metadata.annotations.{KAI_MEMORY}",
                    "must be a positive amount of GPU memory (MiB)",
                )
        except qty.QuantityError as exc:
            err.add(f"{src}: metadata.annotations.{KAI_MEMORY}", str(exc))
    return milli, gmem


def build_workload(
    doc: Document,
    classes: Mapping[str, PriorityClass],
    err: ManifestErrors,
    arrival: float = 0.0,
    types: TaskTypeTable | None = None,
) -> Workload:
    """The model workload of a Workload document; ``classes`` are the priority classes known,
    ``types`` the configuration's task-type defaults (None: the packaged ones only).

    ``arrival`` orders workloads submitted together (their place in the set)."""
    s: WorkloadSpec = doc.spec
    queue = s.queue or doc.metadata.labels.get(KUEUE_QUEUE_LABEL)
    if not queue:
        err.add(f"{doc.source}: spec.queue", f"required (or set the label {KUEUE_QUEUE_LABEL})")
        queue = ""
    groups = _pod_groups(doc, err)
    check_annotations(doc.metadata.annotations, doc.source, err)  # idle-for, synthetic level
    tt = resolve_workload(doc, queue, types, err)
    cls = tt.values.get("priorityClass") or ""
    if tt.sources.get("priorityClass") not in (None, "workload") and cls not in classes:
        cls = ""  # a default naming a class this configuration lacks: no class (checked at apply)
    prio, preemptible = _priority(cls, classes, doc.source, err)
    # a non-preemptible class stays so; otherwise the type's (or the workload's) choice
    preemptible = preemptible and tt.values.get("preemptible", True) is not False
    total = sum(g.replicas for g in groups)
    if s.gang.minMember is not None and s.gang.minMember > total:
        err.add(
            f"{doc.source}: spec.gang.minMember",
            f"{s.gang.minMember} is more than the {total} pods of the workload",
        )
    duration = None
    if s.duration is not None:
        try:
            duration = qty.parse_duration(s.duration)
        except qty.QuantityError as exc:
            err.add(f"{doc.source}: spec.duration", str(exc))
    tols = tuple(
        Toleration(t.key, None if t.operator == "Exists" else (t.value or ""), t.effect)
        for t in s.tolerations
    )
    topo = Topology(s.topology.scope, s.topology.mode) if s.topology else None
    return Workload(
        doc.name,
        queue,
        tuple(groups),
        cls,
        prio,
        preemptible,
        s.type,
        s.pool,
        tuple(s.gpuModels),
        s.gang.minMember,
        topo,
        tols,
        tuple(sorted(s.nodeSelector.items())),
        duration,
        arrival,
        preferred_pools=tuple(tt.values.get("preferredPools") or ()),
        max_wait_s=tt.max_wait_s,
        preemption_wait_s=classes[cls].preemption_wait_s if cls in classes else None,
    )


def _pod_groups(doc: Document, err: ManifestErrors) -> list[PodGroup]:
    """The workload's pod groups with each pod's request; a repeated group name is an error."""
    s: WorkloadSpec = doc.spec
    groups = []
    names = set()
    for i, g in enumerate(s.podGroups):
        where = f"{doc.source}: spec.podGroups[{i}].resources"
        if g.name in names:
            err.add(f"{doc.source}: spec.podGroups[{i}].name", f"duplicate pod group {g.name!r}")
        names.add(g.name)
        groups.append(
            PodGroup(g.name, g.replicas, _pod_request(g.resources, doc.metadata.annotations, where, err))
        )
    return groups


def _priority(
    cls: str, classes: Mapping[str, PriorityClass], source: str, err: ManifestErrors
) -> tuple[int, bool]:
    """(priority, preemptible) of the named class; no class is priority 0, preemptible."""
    if not cls:
        return 0, True
    pc = classes.get(cls)
    if pc is None:
        err.add(
            f"{source}: spec.priorityClass",
            f"unknown priority class {cls!r}; known: {', '.join(sorted(classes)) or 'none'}",
        )
        return 0, True
    return pc.value, pc.preemptible
