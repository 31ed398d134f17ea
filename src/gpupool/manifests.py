"""Kubernetes-style YAML manifests -> model objects, with located, complete error reports.

A file is accepted whole or rejected whole: every error in every document is collected and
reported as ``file: document N (Kind/name): field.path: problem`` so nothing is half-applied.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gpupool import quantity as qty
from gpupool.model import (
    CPU,
    GPU,
    MEMORY,
    UNLIMITED,
    Node,
    PlacementPolicy,
    PodGroup,
    PodRequest,
    PoolQuota,
    PreemptionPolicy,
    PriorityClass,
    Queue,
    QueueingStrategy,
    ReclaimPolicy,
    ResourcePool,
    Taint,
    Toleration,
    Topology,
    TopologyMode,
    TopologyScope,
    Vec,
    Workload,
    WorkloadType,
)

API_VERSION = "gpupool.io/v1alpha1"
KINDS = ("Cluster", "ResourcePool", "Queue", "PriorityClass", "Workload")
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
GFD_PRODUCT = "nvidia.com/gpu.product"
GFD_MEMORY = "nvidia.com/gpu.memory"
HAMI_MEM = "nvidia.com/gpumem"
HAMI_CORES = "nvidia.com/gpucores"
KAI_FRACTION = "gpu-fraction"
KAI_MEMORY = "gpu-memory"
RDMA_KEYS = ("rdma", "rdma/hca", "rdma/rdma_shared_device_a", "nvidia.com/hca")


class ManifestError(ValueError):
    """Every problem found in a set of manifests; ``errors`` holds one located line each."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = errors
        super().__init__("\n".join(errors))


class _Strict(BaseModel):
    # floats must be finite: YAML's .inf would otherwise reach weights and prices
    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False)


#: object names: a DNS subdomain, as Kubernetes (and the store) require
NAME_PATTERN = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
#: characters no store backend can keep in text (PostgreSQL refuses NUL; UTF-8 has no lone surrogates)
_UNSTORABLE = {chr(0)} | {chr(c) for c in range(0xD800, 0xE000)}
MAX_TEXT_DEPTH = 32
_NAME_RE = re.compile(NAME_PATTERN)


class Metadata(_Strict):
    name: str = Field(min_length=1, max_length=253)

    @field_validator("name")
    @classmethod
    def _dns_name(cls, v: str) -> str:
        if not _NAME_RE.match(v):
            raise ValueError(
                f"{v!r} is not a valid name: lowercase letters, digits, '-' and '.', "
                "starting and ending with a letter or digit"
            )
        return v

    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    namespace: str | None = None


class TaintSpec(_Strict):
    key: str
    value: str = ""
    effect: Literal["NoSchedule", "NoExecute", "PreferNoSchedule"] = "NoSchedule"


class TolerationSpec(_Strict):
    key: str
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str | None = None
    effect: Literal["NoSchedule", "NoExecute", "PreferNoSchedule"] | None = None


class GPUSpec(_Strict):
    model: str = Field(min_length=1)
    count: int = Field(ge=0, le=64)
    memory: str | int


class TopologySpec(_Strict):
    racks: int = Field(default=1, ge=1, le=100_000)
    rackPrefix: str = "r"
    nodesPerNVLinkDomain: int = Field(default=1, ge=1, le=100_000)


class NodeGroupSpec(_Strict):
    name: str = Field(min_length=1)
    count: int = Field(ge=1, le=100_000)
    namePrefix: str | None = None
    gpu: GPUSpec
    cpu: str | int | float
    memory: str | int
    rdma: int = Field(default=0, ge=0, le=1024)
    labels: dict[str, str] = Field(default_factory=dict)
    taints: list[TaintSpec] = Field(default_factory=list)
    topology: TopologySpec = Field(default_factory=TopologySpec)


class NodeSpec(_Strict):
    name: str = Field(min_length=1)
    gpu: GPUSpec
    cpu: str | int | float
    memory: str | int
    rdma: int = Field(default=0, ge=0, le=1024)
    labels: dict[str, str] = Field(default_factory=dict)
    taints: list[TaintSpec] = Field(default_factory=list)
    rack: str = ""
    nvlinkDomain: str = ""
    schedulable: bool = True


class ClusterSpec(_Strict):
    nodeGroups: list[NodeGroupSpec] = Field(default_factory=list)
    nodes: list[NodeSpec] = Field(default_factory=list)


class PoolSpec(_Strict):
    description: str = ""
    nodeSelector: dict[str, str] = Field(default_factory=dict)
    gpuModels: list[str] = Field(default_factory=list)
    preemptible: bool = True
    requiresApproval: bool = False
    pricePerGPUHour: float = Field(default=0.0, ge=0, le=1e6)
    placement: PlacementPolicy = PlacementPolicy.DEFAULT
    slaTier: str = ""
    environment: str = ""


class QuotaSpec(_Strict):
    pool: str = Field(min_length=1)
    guarantee: dict[str, str | int | float] = Field(default_factory=dict)
    borrowingLimit: dict[str, str | int | float] | None = None
    lendingLimit: dict[str, str | int | float] | None = None


class PreemptionSpec(_Strict):
    withinQueue: Literal["Never", "LowerPriority"] = "LowerPriority"
    reclaimWithinCohort: ReclaimPolicy = ReclaimPolicy.ANY
    borrowWithinCohort: Literal["Never", "LowerPriority"] = "Never"


class QueueSpec(_Strict):
    parent: str | None = None
    description: str = ""
    weight: float = Field(default=1.0, gt=0, le=1e6)
    queueingStrategy: QueueingStrategy = QueueingStrategy.BEST_EFFORT_FIFO
    preemption: PreemptionSpec = Field(default_factory=PreemptionSpec)
    requiresApproval: bool = False
    quotas: list[QuotaSpec] = Field(default_factory=list)


class PriorityClassSpec(_Strict):
    value: int = Field(ge=-(10**9), le=10**9)
    preemptible: bool = True
    description: str = ""


class PodGroupSpec(_Strict):
    name: str = Field(default="main", min_length=1)
    replicas: int = Field(default=1, ge=1, le=100_000)
    resources: dict[str, str | int | float] = Field(default_factory=dict)
    #: what each pod runs (the local backend; on Kubernetes the pod template says it)
    command: list[str] | None = Field(default=None, max_length=4096)
    args: list[str] = Field(default_factory=list, max_length=4096)
    env: dict[str, str] = Field(default_factory=dict)
    workingDir: str | None = None


class GangSpec(_Strict):
    minMember: int | None = Field(default=None, ge=1, le=100_000)


class WorkloadTopologySpec(_Strict):
    scope: TopologyScope
    mode: TopologyMode = TopologyMode.REQUIRED


class WorkloadSpec(_Strict):
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


SPECS: dict[str, type[BaseModel]] = {
    "Cluster": ClusterSpec,
    "ResourcePool": PoolSpec,
    "Queue": QueueSpec,
    "PriorityClass": PriorityClassSpec,
    "Workload": WorkloadSpec,
}


@dataclass(slots=True)
class Document:
    """One validated manifest, still in its spec form (what the store persists)."""

    kind: str
    name: str
    metadata: Metadata
    spec: Any
    raw: dict[str, Any]
    source: str


@dataclass(slots=True)
class Bundle:
    """Model objects built from a set of documents."""

    nodes: list[Node] = field(default_factory=list)
    pools: list[ResourcePool] = field(default_factory=list)
    queues: list[Queue] = field(default_factory=list)
    priority_classes: list[PriorityClass] = field(default_factory=list)
    workloads: list[Workload] = field(default_factory=list)
    documents: list[Document] = field(default_factory=list)


def _loc(parts: Iterable[object]) -> str:
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        else:
            out += ("." if out else "") + str(p)
    return out


def parse_documents(text: str, source: str = "<input>") -> list[Document]:
    """Parse and validate YAML text; raises ManifestError listing every problem."""
    docs, errors = collect_documents(text, source)
    if errors:
        raise ManifestError(errors)
    return docs


def collect_documents(text: str, source: str = "<input>") -> tuple[list[Document], list[str]]:
    """The valid documents of a YAML text and the located problems of the others.

    Why both: a caller that reports problems can then also convert the valid documents and
    report their problems (quantities, durations) in the same round, instead of one round per
    kind of mistake."""
    errors: list[str] = []
    try:
        raw_docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        return [], [f"{source}:{where}: invalid YAML: {problem}"]
    docs: list[Document] = []
    for n, raw in enumerate(raw_docs, start=1):
        doc = validate_document(raw, f"{source}: document {n}", errors)
        if doc is not None:
            docs.append(doc)
    seen: dict[tuple[str, str], str] = {}
    for d in docs:
        key = (d.kind, d.name)
        if key in seen:
            errors.append(f"{d.source}: metadata.name: duplicate {d.kind} {d.name!r} (first in {seen[key]})")
        seen[key] = d.source
    return docs, errors


def unstorable_text(value: Any, path: str = "", depth: int = 0) -> tuple[str, str] | None:
    """The first string (key or value) a store cannot keep, as ``(field path, problem)``.

    Why: PostgreSQL refuses NUL in text and no encoder takes a lone surrogate; such a value
    must be refused when it is validated, never discovered by a failing transaction (one such
    workload once made the server unable to restart)."""
    if depth > MAX_TEXT_DEPTH:
        return path or "body", f"nested more than {MAX_TEXT_DEPTH} levels deep"
    if isinstance(value, str):
        bad = next((c for c in value if c in _UNSTORABLE), None)
        if bad is not None:
            what = "a NUL character" if bad == chr(0) else f"an unpaired surrogate U+{ord(bad):04X}"
            return path or "body", f"contains {what}, which cannot be stored"
        return None
    if isinstance(value, Mapping):
        for k, v in value.items():
            here = f"{path}.{k}" if path else str(k)
            hit = unstorable_text(k, path or "body", depth + 1) if isinstance(k, str) else None
            hit = hit or unstorable_text(v, here, depth + 1)
            if hit:
                return hit
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            hit = unstorable_text(v, f"{path}[{i}]", depth + 1)
            if hit:
                return hit
    return None


def validate_document(raw: Any, here: str, errors: list[str]) -> Document | None:
    """Check one manifest (a parsed YAML or JSON mapping); append located errors, or return it.

    The one validator for files (``gpupool validate``) and the API, so both accept and refuse
    the same manifests with the same messages."""
    if not isinstance(raw, dict):
        errors.append(f"{here}: expected a mapping with apiVersion, kind, metadata and spec")
        return None
    kind = raw.get("kind")
    md = raw.get("metadata")
    name = md.get("name") if isinstance(md, dict) else None
    ident = f"{here} ({kind if isinstance(kind, str) and kind else '?'}/{name if isinstance(name, str) and name else '?'})"
    bad = unstorable_text(raw)
    if bad is not None:
        errors.append(f"{ident}: {bad[0]}: {bad[1]}")
        return None
    if raw.get("apiVersion") != API_VERSION:
        errors.append(f"{ident}: apiVersion: must be {API_VERSION!r}, got {raw.get('apiVersion')!r}")
    if kind not in SPECS:
        errors.append(f"{ident}: kind: must be one of {', '.join(KINDS)}, got {kind!r}")
        return None
    for k in sorted(str(x) for x in set(raw) - {"apiVersion", "kind", "metadata", "spec", "status"}):
        errors.append(f"{ident}: {k}: unknown top-level field")
    if md is not None and not isinstance(md, dict):
        errors.append(f"{ident}: metadata: must be a mapping with at least a name")
        return None
    before = len(errors)
    meta = _validated(Metadata, md or {}, "metadata", ident, errors)
    spec_raw = raw.get("spec")
    spec = None
    if spec_raw is not None and not isinstance(spec_raw, dict):
        errors.append(f"{ident}: spec: must be a mapping")
    else:  # checked even when the metadata is bad: every problem is reported in one round
        spec = _validated(SPECS[str(kind)], spec_raw or {}, "spec", ident, errors)
    if meta is None or spec is None or len(errors) > before:
        return None
    return Document(str(kind), meta.name, meta, spec, raw, ident)


def _validated(model: type[Any], value: Any, prefix: str, ident: str, errors: list[str]) -> Any:
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        errors.extend(
            f"{ident}: {_loc([prefix, *e['loc']])}: {str(e['msg']).removeprefix('Value error, ')}"
            for e in exc.errors()
        )
        return None


def load_files(paths: Iterable[Path]) -> list[Document]:
    """Load every YAML file (directories are walked in name order); all-or-nothing across files."""
    docs: list[Document] = []
    errors: list[str] = []
    files: list[Path] = []
    for p in paths:
        if p.is_dir():
            files.extend(sorted(x for x in p.rglob("*") if x.suffix in (".yaml", ".yml")))
        else:
            files.append(p)
    for f in files:
        try:
            text = f.read_text(encoding="utf-8")
        except OSError as exc:
            errors.append(f"{f}: cannot read: {exc.strerror or exc}")
            continue
        try:
            docs.extend(parse_documents(text, str(f)))
        except ManifestError as exc:
            errors.extend(exc.errors)
    if errors:
        raise ManifestError(errors)
    return docs


# -- conversion to the model -------------------------------------------------------------------
class _Errors:
    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, where: str, msg: str) -> None:
        self.items.append(f"{where}: {msg}")


def _taints(ts: list[TaintSpec]) -> tuple[Taint, ...]:
    return tuple(Taint(t.key, t.value, t.effect) for t in ts)


def _gpu_mem(v: str | int, where: str, err: _Errors) -> int:
    try:
        return qty.mib_value(v) if isinstance(v, int) else qty.memory_mib(v)
    except qty.QuantityError as exc:
        err.add(where, str(exc))
        return 0


def _node_labels(
    base: Mapping[str, str], model: str, mem: int, rack: str, nvl: str
) -> tuple[tuple[str, str], ...]:
    labels = {GFD_PRODUCT: model, GFD_MEMORY: str(mem)}
    if rack:
        labels["gpupool.io/rack"] = rack
    if nvl:
        labels["gpupool.io/nvlink-domain"] = nvl
    labels.update(base)
    return tuple(sorted(labels.items()))


def build_nodes(doc: Document, err: _Errors) -> list[Node]:
    spec: ClusterSpec = doc.spec
    out: list[Node] = []
    for gi, g in enumerate(spec.nodeGroups):
        where = f"{doc.source}: spec.nodeGroups[{gi}]"
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
        prefix = g.namePrefix if g.namePrefix is not None else f"{g.name}-"
        width = max(3, len(str(g.count)))
        per_rack = -(-g.count // g.topology.racks)
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
                    _node_labels(g.labels, g.gpu.model, mem, rack, nvl),
                    _taints(g.taints),
                    nvl,
                    rack,
                )
            )
    for ni, n in enumerate(spec.nodes):
        where = f"{doc.source}: spec.nodes[{ni}]"
        mem = _gpu_mem(n.gpu.memory, f"{where}.gpu.memory", err)
        try:
            cpu = qty.cpu_milli(n.cpu)
            nmem = qty.memory_mib(n.memory)
        except qty.QuantityError as exc:
            err.add(where, str(exc))
            cpu = nmem = 0
        out.append(
            Node(
                n.name,
                n.gpu.model,
                n.gpu.count,
                mem,
                cpu,
                nmem,
                n.rdma,
                _node_labels(n.labels, n.gpu.model, mem, n.rack, n.nvlinkDomain),
                _taints(n.taints),
                n.nvlinkDomain or n.name,
                n.rack,
                n.schedulable,
            )
        )
    return out


def _quota_vec(m: Mapping[str, object], where: str, err: _Errors, default_unset: tuple[int, int, int]) -> Vec:
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


def build_queue(doc: Document, err: _Errors) -> Queue:
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


def build_pool(doc: Document) -> ResourcePool:
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
    )


def _pod_request(res: Mapping[str, object], ann: Mapping[str, str], where: str, err: _Errors) -> PodRequest:
    gpus = milli = gmem = cpu = mem = rdma = 0
    for k, v in res.items():
        try:
            if k == GPU:
                m = qty.gpu_milli(v)
                if m >= 1000:
                    if m % 1000:
                        err.add(
                            f"{where}.{k}",
                            "more than one GPU must be a whole number; a fraction must be below 1",
                        )
                    gpus = m // 1000
                else:
                    milli = m
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
                err.add(
                    f"{where}.{k}",
                    f"unknown resource; use {GPU}, {HAMI_CORES}, {HAMI_MEM}, {CPU}, {MEMORY} or rdma",
                )
        except qty.QuantityError as exc:
            err.add(f"{where}.{k}", str(exc))
    src = where.rsplit(": ", 1)[0]  # the document: annotation errors are located there too
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
        except qty.QuantityError as exc:
            err.add(f"{src}: metadata.annotations.{KAI_MEMORY}", str(exc))
    if gpus and (milli or gmem):
        err.add(where, "a pod takes whole GPUs or a fraction of one GPU, not both")
    if gmem and not milli and not gpus:
        err.add(
            where,
            f"a GPU memory request ({HAMI_MEM}) needs a compute share too: set {GPU} below 1 or {HAMI_CORES}",
        )
    return PodRequest(gpus, milli if not gpus else 0, gmem if not gpus else 0, cpu, mem, rdma)


def build_workload(
    doc: Document, classes: Mapping[str, PriorityClass], err: _Errors, arrival: float = 0.0
) -> Workload:
    s: WorkloadSpec = doc.spec
    md = doc.metadata
    queue = s.queue or md.labels.get(KUEUE_QUEUE_LABEL)
    if not queue:
        err.add(f"{doc.source}: spec.queue", f"required (or set the label {KUEUE_QUEUE_LABEL})")
        queue = ""
    groups = []
    names = set()
    for i, g in enumerate(s.podGroups):
        where = f"{doc.source}: spec.podGroups[{i}].resources"
        if g.name in names:
            err.add(f"{doc.source}: spec.podGroups[{i}].name", f"duplicate pod group {g.name!r}")
        names.add(g.name)
        groups.append(PodGroup(g.name, g.replicas, _pod_request(g.resources, md.annotations, where, err)))
    prio = 0
    preemptible = True
    cls = s.priorityClass or ""
    if cls:
        pc = classes.get(cls)
        if pc is None:
            err.add(
                f"{doc.source}: spec.priorityClass",
                f"unknown priority class {cls!r}; known: {', '.join(sorted(classes)) or 'none'}",
            )
        else:
            prio, preemptible = pc.value, pc.preemptible
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
    )


def build(docs: Iterable[Document], base: Bundle | None = None, *, references: bool = True) -> Bundle:
    """Turn documents into model objects and check references between them; all or nothing.
    ``references=False`` checks each document alone (when others of the set failed to parse,
    references to them would only add noise)."""
    err = _Errors()
    b = Bundle()
    if base is not None:
        b.nodes, b.pools, b.queues = list(base.nodes), list(base.pools), list(base.queues)
        b.priority_classes = list(base.priority_classes)
    docs = list(docs)
    b.documents = docs
    for d in docs:
        if d.kind == "Cluster":
            b.nodes.extend(build_nodes(d, err))
        elif d.kind == "ResourcePool":
            b.pools = [p for p in b.pools if p.name != d.name] + [build_pool(d)]
        elif d.kind == "Queue":
            b.queues = [q for q in b.queues if q.name != d.name] + [build_queue(d, err)]
        elif d.kind == "PriorityClass":
            s: PriorityClassSpec = d.spec
            b.priority_classes = [p for p in b.priority_classes if p.name != d.name] + [
                PriorityClass(d.name, s.value, s.preemptible, s.description)
            ]
    classes = {p.name: p for p in b.priority_classes}
    seq = 0
    for d in docs:
        if d.kind == "Workload":
            b.workloads.append(build_workload(d, classes, err, arrival=float(seq)))
            seq += 1
    if references:
        check_references(b, err, {d.name: d.source for d in docs})
    if err.items:
        raise ManifestError(err.items)
    return b


def check_references(b: Bundle, err: _Errors, sources: Mapping[str, str]) -> None:
    """Cross-object checks: parents exist, no cycles, quotas name real pools, pools don't overlap."""
    qnames = {q.name: q for q in b.queues}
    pnames = {p.name for p in b.pools}
    names: set[str] = set()
    for n in b.nodes:
        if n.name in names:
            err.add(f"node {n.name}", "duplicate node name")
        names.add(n.name)
    for q in b.queues:
        src = sources.get(q.name, f"Queue/{q.name}")
        if q.parent is not None and q.parent not in qnames:
            err.add(f"{src}: spec.parent", f"queue {q.parent!r} does not exist")
        seen = {q.name}
        cur = q
        while cur.parent is not None and cur.parent in qnames:
            if cur.parent in seen:
                err.add(f"{src}: spec.parent", f"queue tree has a cycle through {cur.parent!r}")
                break
            seen.add(cur.parent)
            cur = qnames[cur.parent]
        for i, pq in enumerate(q.quotas):
            if pnames and pq.pool not in pnames:
                err.add(
                    f"{src}: spec.quotas[{i}].pool",
                    f"pool {pq.pool!r} does not exist; known: {', '.join(sorted(pnames))}",
                )
    kids: dict[str, list[Queue]] = {}
    for q in b.queues:
        if q.parent:
            kids.setdefault(q.parent, []).append(q)
    for parent, cs in kids.items():
        parent_q = qnames.get(parent)
        if parent_q is None:
            continue
        for spec in parent_q.quotas:
            child_quotas = [c.quota(spec.pool) for c in cs]
            total = sum(cq.guarantee[0] for cq in child_quotas if cq is not None)
            if total > spec.guarantee[0]:
                err.add(
                    f"{sources.get(parent, parent)}: spec.quotas (pool {spec.pool})",
                    f"children guarantee {total / 1000:g} GPUs, more than this queue's {spec.guarantee[0] / 1000:g}",
                )
    for n in b.nodes:
        hits = [p.name for p in b.pools if p.selects(n)]
        if len(hits) > 1:
            err.add(
                f"node {n.name}",
                f"selected by more than one pool ({', '.join(hits)}); pools must not overlap",
            )
    for w in b.workloads:
        src = sources.get(w.name, f"Workload/{w.name}")
        if qnames and w.queue and w.queue not in qnames:
            err.add(f"{src}: spec.queue", f"queue {w.queue!r} does not exist")
        if w.pool is not None and pnames and w.pool not in pnames:
            err.add(f"{src}: spec.pool", f"pool {w.pool!r} does not exist")


def load_bundle(paths: Iterable[Path]) -> Bundle:
    """Load manifests from files and directories, adding the default priority classes."""
    docs = load_files(paths)
    base = Bundle(priority_classes=list(default_priority_classes()))
    return build(docs, base)


def default_priority_classes() -> tuple[PriorityClass, ...]:
    """Priority bound to business value: inference first, evaluation last."""
    return (
        PriorityClass("inference-critical", 1000, False, "Online inference with an SLA; never preempted"),
        PriorityClass("training", 500, True, "Production training"),
        PriorityClass("fine-tuning", 400, True, "Fine-tuning of production models"),
        PriorityClass("experiment", 200, True, "Research experiments; reclaimable"),
        PriorityClass("evaluation", 100, True, "Evaluation and benchmarks; first to yield"),
    )
