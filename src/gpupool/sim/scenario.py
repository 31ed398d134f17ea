"""The ``Scenario`` manifest resolved: cluster variants, trace, faults, horizon, seed, policies.

Validated with pydantic like the other manifests (the schema: ``gpupool.sim.manifest``); every
problem is reported as ``file: spec.field.path: problem`` and nothing runs until the whole
scenario is valid.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from gpupool import quantity as qty
from gpupool.manifests import (
    API_VERSION,
    Document,
    ManifestError,
    Metadata,
    QueueSpec,
    QuotaSpec,
    build,
    default_priority_classes,
    load_files,
    parse_documents,
)
from gpupool.model import (
    Node,
    PoolQuota,
    PriorityClass,
    Queue,
    ResourcePool,
)
from gpupool.sim.manifest import (
    AutoQueuesSpec,
    Duration,
    FaultsSpec,
    GeneratorSpec,
    ScenarioSpec,
    TaskTypeSpec,
    WhatIfSpec,
)
from gpupool.sim.sets import cohort_documents, expand_sets, resolve_sets
from gpupool.sim.sources import (
    BurstGen,
    SimInputError,
    TaskTypeGen,
    Trace,
    generate,
    load_generic,
    load_openb,
    load_philly,
)


@dataclass(frozen=True, slots=True)
class Faults:
    node_failures: tuple[tuple[str, float, float], ...] = ()  # (node, at, repair after)
    mtbf_s: float | None = None
    mtbf_repair_s: float = 7200.0
    job_failures_per_s: float = 0.0
    max_retries: int = 3
    backoff_s: float = 60.0
    backoff_factor: float = 2.0
    max_backoff_s: float = 3600.0

    def backoff(self, attempt: int) -> float:
        """Delay before retry number ``attempt`` (1-based): exponential, capped."""
        return min(self.max_backoff_s, self.backoff_s * self.backoff_factor ** max(0, attempt - 1))


@dataclass(slots=True)
class Variant:
    """One cluster configuration: the baseline, or a what-if."""

    name: str
    nodes: tuple[Node, ...]
    pools: tuple[ResourcePool, ...]
    queues: tuple[Queue, ...]
    priority_classes: tuple[PriorityClass, ...]


@dataclass(slots=True)
class Scenario:
    name: str
    source: str
    variants: list[Variant]
    trace: Trace
    faults: Faults
    horizon: float | None
    seed: int
    policies: list[str]
    samples: int = 400
    check_invariants: bool = False
    schedule_interval: float = 0.0
    notes: list[str] = field(default_factory=list)


def _loc(parts: tuple[int | str, ...]) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else ("." if out else "") + str(p)
    return out


def _dur(v: Duration, where: str, errors: list[str]) -> float:
    try:
        return qty.parse_duration(v)
    except qty.QuantityError as exc:
        errors.append(f"{where}: {exc}")
        return 0.0


def _resolve(base: Path, p: str) -> Path:
    q = Path(p).expanduser()
    return q if q.is_absolute() else (base / q)


def parse_scenario(text: str, source: str, base: Path) -> ScenarioSpec:
    """Validate the YAML text of a Scenario; raises SimInputError with located messages."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise SimInputError(
            f"{source}:{where}: invalid YAML: {getattr(exc, 'problem', None) or exc}"
        ) from None
    if not isinstance(raw, dict):
        raise SimInputError(f"{source}: expected a mapping with apiVersion, kind, metadata and spec")
    errors: list[str] = []
    if raw.get("apiVersion") != API_VERSION:
        errors.append(f"{source}: apiVersion: must be {API_VERSION!r}, got {raw.get('apiVersion')!r}")
    if raw.get("kind") != "Scenario":
        errors.append(f"{source}: kind: must be 'Scenario', got {raw.get('kind')!r}")
    for k in sorted(set(raw) - {"apiVersion", "kind", "metadata", "spec"}):
        errors.append(f"{source}: {k}: unknown top-level field")
    try:
        Metadata.model_validate(raw.get("metadata") or {})
    except ValidationError as exc:
        errors.extend(f"{source}: metadata.{_loc(e['loc'])}: {e['msg']}" for e in exc.errors())
    try:
        spec = ScenarioSpec.model_validate(raw.get("spec") or {})
    except ValidationError as exc:
        errors.extend(f"{source}: spec.{_loc(e['loc'])}: {e['msg']}" for e in exc.errors())
        raise SimInputError(errors) from None
    if errors:
        raise SimInputError(errors)
    kinds = ("philly", "openb", "csv", "generator", "sets")
    chosen = [k for k in kinds if getattr(spec.workload, k) is not None]
    if len(chosen) != 1:
        raise SimInputError(
            f"{source}: spec.workload: set exactly one of {', '.join(kinds)} (got {chosen or 'none'})"
        )
    return spec


def load_scenario(path: Path) -> Scenario:
    """Read, validate and resolve a scenario file: cluster variants, trace, faults."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SimInputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    base = path.resolve().parent
    src = str(path)
    spec = parse_scenario(text, src, base)
    raw = yaml.safe_load(text)
    name = str((raw.get("metadata") or {}).get("name", path.stem))
    docs = _cluster_documents(spec, base, src)
    errors: list[str] = []
    trace = _trace(spec, base, src, docs, errors)
    faults = _faults(spec.faults, f"{src}: spec.faults", errors)
    horizon = _dur(spec.horizon, f"{src}: spec.horizon", errors) if spec.horizon is not None else None
    interval = _dur(spec.scheduleInterval, f"{src}: spec.scheduleInterval", errors)
    if errors:
        raise SimInputError(errors)
    variants = _variants(spec, docs, src, faults)
    return Scenario(
        name=name,
        source=src,
        variants=variants,
        trace=trace,
        faults=faults,
        horizon=horizon,
        seed=spec.seed,
        policies=list(dict.fromkeys(spec.policies)),
        samples=spec.samples,
        check_invariants=spec.checkInvariants,
        schedule_interval=interval,
    )


def _cluster_documents(spec: ScenarioSpec, base: Path, src: str) -> list[Document]:
    """The cluster's manifests: the files named, then the documents inline."""
    errors: list[str] = []
    docs: list[Document] = []
    try:
        files = [_resolve(base, f) for f in spec.cluster.files]
        for i, f in enumerate(files):
            if not f.exists():
                errors.append(f"{src}: spec.cluster.files[{i}]: {f}: no such file or directory")
        if not errors:
            docs.extend(load_files(files))
        if spec.cluster.documents:
            docs.extend(
                parse_documents(yaml.safe_dump_all(spec.cluster.documents), f"{src}: spec.cluster.documents")
            )
        if spec.cluster.cohorts:
            raw = cohort_documents(spec.cluster.cohorts, f"{src}: spec.cluster.cohorts")
            docs.extend(parse_documents(yaml.safe_dump_all(raw), f"{src}: spec.cluster.cohorts"))
    except ManifestError as exc:
        errors.extend(exc.errors)
    if errors:
        raise SimInputError(errors)
    return docs


def _trace(spec: ScenarioSpec, base: Path, src: str, docs: list[Document], errors: list[str]) -> Trace:
    """The one workload source the scenario names (Philly's auto queues are added to ``docs``)."""
    w = spec.workload
    where = f"{src}: spec.workload"
    if w.philly is not None:
        p = w.philly
        trace = load_philly(
            _checked(base, p.path, f"{where}.philly.path"),
            p.gpusPerNode,
            _cpu(p.cpuPerGPU, f"{where}.philly.cpuPerGPU"),
            _mem(p.memoryPerGPU, f"{where}.philly.memoryPerGPU"),
            p.maxJobs,
        )
        if p.autoQueues is not None:
            docs.extend(_auto_queues(trace, p.autoQueues, docs, f"{where}.philly.autoQueues"))
        return trace
    if w.openb is not None:
        return load_openb(_checked(base, w.openb.pods, f"{where}.openb.pods"), w.openb.queue, w.openb.maxJobs)
    if w.csv is not None:
        g = w.csv
        return load_generic(
            _checked(base, g.path, f"{where}.csv.path"), g.columns, g.format, g.defaultQueue, g.maxJobs
        )
    if w.sets is not None:
        queues = [d for d in docs if d.kind == "Queue"]
        parents = {d.spec.parent for d in queues if isinstance(d.spec, QueueSpec)}
        leaves = [d.name for d in queues if d.name not in parents]
        return expand_sets(resolve_sets(w.sets, leaves, f"{where}.sets"))
    assert w.generator is not None
    return _generated(w.generator, spec.seed, f"{where}.generator", errors)


def _generated(gen: GeneratorSpec, seed: int, where: str, errors: list[str]) -> Trace:
    """A synthetic trace: Poisson arrivals per task type, and bursts."""
    horizon_gen = _dur(gen.duration, f"{where}.duration", errors)
    types = [_task_type(t, f"{where}.types[{i}]", errors) for i, t in enumerate(gen.types)]
    bursts = [
        BurstGen(
            at_s=_dur(b.at, f"{where}.bursts[{i}].at", errors),
            count=b.count,
            type=b.type,
            queue=b.queue,
            gpus=b.gpus,
            duration_mean_s=_dur(b.meanDuration, f"{where}.bursts[{i}].meanDuration", errors),
            priority_class=b.priorityClass,
        )
        for i, b in enumerate(gen.bursts)
    ]
    if errors:
        raise SimInputError(errors)
    return generate(
        types,
        bursts,
        horizon_gen,
        seed,
        gen.gpusPerNode,
        _cpu(gen.cpuPerGPU, f"{where}.cpuPerGPU"),
        _mem(gen.memoryPerGPU, f"{where}.memoryPerGPU"),
    )


def _task_type(t: TaskTypeSpec, where: str, errors: list[str]) -> TaskTypeGen:
    sizes = []
    for k, wt in t.sizes.items():
        try:
            s = float(k)
        except ValueError:
            errors.append(f"{where}.sizes.{k}: not a number of GPUs")
            continue
        if s <= 0 or (s >= 1 and s != int(s)):
            errors.append(f"{where}.sizes.{k}: a fraction below 1 or whole GPUs")
            continue
        sizes.append((s, float(wt)))
    return TaskTypeGen(
        type=t.type,
        rate_per_hour=t.ratePerHour,
        queues=tuple(t.queues),
        sizes=tuple(sizes),  # type: ignore[arg-type]
        duration_mean_s=_dur(t.meanDuration, f"{where}.meanDuration", errors),
        duration_sigma=t.durationSigma,
        priority_class=t.priorityClass,
        diurnal_amplitude=t.diurnal.amplitude if t.diurnal else 0.0,
        peak_hour=t.diurnal.peakHour if t.diurnal else 14.0,
        gpu_models=tuple(t.gpuModels),
    )


def _faults(fs: FaultsSpec, fw: str, errors: list[str]) -> Faults:
    return Faults(
        node_failures=tuple(
            (
                nf.node,
                _dur(nf.at, f"{fw}.nodeFailures[{i}].at", errors),
                _dur(nf.repairAfter, f"{fw}.nodeFailures[{i}].repairAfter", errors),
            )
            for i, nf in enumerate(fs.nodeFailures)
        ),
        mtbf_s=fs.mtbf.hours * 3600.0 if fs.mtbf else None,
        mtbf_repair_s=_dur(fs.mtbf.repairAfter, f"{fw}.mtbf.repairAfter", errors) if fs.mtbf else 7200.0,
        job_failures_per_s=fs.jobFailuresPerHour / 3600.0,
        max_retries=fs.retry.maxRetries,
        backoff_s=_dur(fs.retry.backoff, f"{fw}.retry.backoff", errors),
        backoff_factor=fs.retry.backoffFactor,
        max_backoff_s=_dur(fs.retry.maxBackoff, f"{fw}.retry.maxBackoff", errors),
    )


def _variants(spec: ScenarioSpec, docs: list[Document], src: str, faults: Faults) -> list[Variant]:
    """The baseline cluster and each what-if; failures must name nodes of the baseline."""
    errors: list[str] = []
    variants = [_variant("baseline", docs, src)]
    for i, wi in enumerate(spec.whatIf):
        variants.append(_variant(wi.name, _what_if(docs, wi, f"{src}: spec.whatIf[{i}]"), src))
    node_names = {n.name for n in variants[0].nodes}
    for i, (node, _, _) in enumerate(faults.node_failures):
        if node not in node_names:
            errors.append(
                f"{src}: spec.faults.nodeFailures[{i}].node: node {node!r} does not exist in the cluster"
            )
    if not variants[0].nodes:
        errors.append(f"{src}: spec.cluster: the cluster has no nodes")
    if errors:
        raise SimInputError(errors)
    return variants


def _checked(base: Path, p: str, where: str) -> Path:
    path = _resolve(base, p)
    if not path.exists():
        raise SimInputError(f"{where}: {path}: no such file")
    return path


def _cpu(v: str | int | float, where: str) -> int:
    try:
        return qty.cpu_milli(v)
    except qty.QuantityError as exc:
        raise SimInputError(f"{where}: {exc}") from None


def _mem(v: str | int, where: str) -> int:
    try:
        return qty.memory_mib(v) if isinstance(v, str) else int(v)
    except qty.QuantityError as exc:
        raise SimInputError(f"{where}: {exc}") from None


def _auto_queues(trace: Trace, spec: AutoQueuesSpec, docs: list[Document], where: str) -> list[Document]:
    """A cohort root with the whole pool and a leaf per trace queue; guarantees by GPU-time share."""
    tmp = build([d for d in docs if d.kind in ("Cluster", "ResourcePool")])
    pool = next((p for p in tmp.pools if p.name == spec.pool), None)
    if pool is None:
        raise SimInputError(f"{where}.pool: pool {spec.pool!r} does not exist")
    cap = sum(n.gpu_count for n in tmp.nodes if pool.selects(n))
    queues = sorted(trace.gpu_time_by_queue) or ["default"]
    total = sum(trace.gpu_time_by_queue.values()) or 1.0
    raw: list[dict[str, Any]] = [
        {
            "apiVersion": API_VERSION,
            "kind": "Queue",
            "metadata": {"name": spec.cohort},
            # the root does not cap the cohort (capacity does), so what-if node groups count
            "spec": {"quotas": [{"pool": spec.pool, "guarantee": {"nvidia.com/gpu": 1_000_000}}]},
        }
    ]
    shares = {
        q: (trace.gpu_time_by_queue.get(q, 0.0) / total if spec.guaranteeBy == "gpuTime" else 1 / len(queues))
        for q in queues
    }
    given = {q: int(cap * s) for q, s in shares.items()}
    for q in queues:
        raw.append(
            {
                "apiVersion": API_VERSION,
                "kind": "Queue",
                "metadata": {"name": q},
                "spec": {
                    "parent": spec.cohort,
                    "preemption": spec.preemption.model_dump(mode="json"),
                    "quotas": [{"pool": spec.pool, "guarantee": {"nvidia.com/gpu": given[q]}}],
                },
            }
        )
    try:
        return parse_documents(yaml.safe_dump_all(raw), where)
    except ManifestError as exc:
        raise SimInputError(exc.errors) from None


def _what_if(docs: list[Document], wi: WhatIfSpec, where: str) -> list[Document]:
    """The cluster documents with node groups added/removed and queue guarantees changed."""
    out: list[Document] = []
    removed: set[str] = set()
    added = False
    queues_seen: set[str] = set()
    for d in docs:
        if d.kind == "Cluster":
            spec = d.spec.model_copy(deep=True)
            keep = [g for g in spec.nodeGroups if g.name not in wi.removeNodeGroups]
            removed.update(g.name for g in spec.nodeGroups if g.name in wi.removeNodeGroups)
            if not added:
                keep.extend(wi.addNodeGroups)
                added = True
            spec.nodeGroups = keep
            out.append(Document(d.kind, d.name, d.metadata, spec, d.raw, d.source))
        elif d.kind == "Queue" and d.name in wi.quotas:
            queues_seen.add(d.name)
            spec = d.spec.model_copy(deep=True)
            for pool, gpus in wi.quotas[d.name].items():
                q = next((x for x in spec.quotas if x.pool == pool), None)
                if q is None:
                    q = QuotaSpec(pool=pool)
                    spec.quotas.append(q)
                q.guarantee = dict(q.guarantee)
                q.guarantee["nvidia.com/gpu"] = gpus
            out.append(Document(d.kind, d.name, d.metadata, spec, d.raw, d.source))
        else:
            out.append(d)
    errors = [
        f"{where}.removeNodeGroups: no node group {g!r}" for g in wi.removeNodeGroups if g not in removed
    ]
    errors += [f"{where}.quotas.{q}: no queue {q!r}" for q in wi.quotas if q not in queues_seen]
    if wi.addNodeGroups and not added:
        errors.append(f"{where}.addNodeGroups: the scenario has no Cluster document to add to")
    if errors:
        raise SimInputError(errors)
    return out


def _variant(name: str, docs: list[Document], src: str) -> Variant:
    try:
        b = build(docs)
    except ManifestError as exc:
        raise SimInputError([f"{src}: variant {name}: {e}" for e in exc.errors]) from None
    pcs = {p.name: p for p in default_priority_classes()}
    pcs.update({p.name: p for p in b.priority_classes})
    return Variant(name, tuple(b.nodes), tuple(b.pools), tuple(b.queues), tuple(pcs.values()))


def fifo_queues(pools: tuple[ResourcePool, ...], nodes: tuple[Node, ...]) -> tuple[Queue, ...]:
    """One queue, no quota limits: a cluster without a scheduler's admission control."""
    from gpupool.model import PreemptionPolicy, QueueingStrategy, ReclaimPolicy

    quotas = []
    for p in pools:
        g = sum(n.gpu_count for n in nodes if p.selects(n)) * 1000
        c = sum(n.cpu_milli for n in nodes if p.selects(n))
        m = sum(n.memory_mib for n in nodes if p.selects(n))
        s = sum(n.ephemeral_storage_mib for n in nodes if p.selects(n))
        b = sum(n.network_mbps for n in nodes if p.selects(n))
        quotas.append(PoolQuota(p.name, (g, c, m, s, b)))
    pol = PreemptionPolicy(ReclaimPolicy.NEVER, ReclaimPolicy.NEVER, ReclaimPolicy.NEVER)
    return (Queue("fifo", None, 1.0, QueueingStrategy.STRICT_FIFO, pol, tuple(quotas)),)
