"""Workload sources for the simulator: Philly, Alibaba openb, generic CSV/JSONL, and a generator.

Every loader is strict: a malformed row raises :class:`SimInputError` naming the file and line,
because a figure computed from a silently half-parsed trace is worse than no figure.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields, replace
from datetime import datetime
from pathlib import Path

import numpy as np

from gpupool.model import WorkloadType


class SimInputError(ValueError):
    """Bad simulator input; ``errors`` holds one located message each (file, line or field)."""

    def __init__(self, errors: list[str] | str) -> None:
        self.errors = [errors] if isinstance(errors, str) else list(errors)
        super().__init__("\n".join(self.errors))


@dataclass(frozen=True, slots=True)
class JobSpec:
    """One job of a trace, independent of the policy that will schedule it.

    ``gpus`` whole GPUs per pod (or ``gpu_milli`` < 1000 for one fractional pod), ``replicas`` pods.
    """

    name: str
    queue: str
    submit: float
    duration: float
    gpus: int = 1
    replicas: int = 1
    gpu_milli: int = 0
    cpu_milli: int = 0
    memory_mib: int = 0
    type: WorkloadType = WorkloadType.TRAINING
    priority_class: str = ""
    gpu_models: tuple[str, ...] = ()
    source: str = ""
    #: the class the report breaks figures down by ("" : the priority class)
    label: str = ""
    #: an elastic gang's minimum pod count (``gang.minMember``; None: all or nothing)
    min_replicas: int | None = None

    @property
    def gpu_total_milli(self) -> int:
        return (self.gpus * 1000 if self.gpus else self.gpu_milli) * self.replicas

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        # rebuilt from positional fields: a trace goes to every worker process, and the
        # dataclass default (a state walk through fields() per object) was 40% slower
        return (JobSpec, tuple([getattr(self, f) for f in _SPEC_FIELDS]))


_SPEC_FIELDS = tuple(f.name for f in fields(JobSpec))


@dataclass(slots=True)
class Trace:
    jobs: list[JobSpec] = field(default_factory=list)
    #: Queue name -> share of total GPU time (used to size automatic queue guarantees).
    gpu_time_by_queue: dict[str, float] = field(default_factory=dict)


#: the run a zero duration is given (a zero duration would finish in the cycle that admits
#: it); every positive duration is kept as it is, however short (sub-second work, as in
#: Kueue's performance test): a floor in seconds would make a scenario written in another unit
#: of time run differently (docs/engine.md, "Time-scale invariance")
MIN_DURATION_S = 0.001


def split_gpus(n: int, per_node: int) -> tuple[int, int]:
    """(GPUs per pod, pods) for an n-GPU job: the largest divisor of n that fits on one node."""
    if n <= per_node:
        return n, 1
    for d in range(per_node, 0, -1):
        if n % d == 0:
            return d, n // d
    return 1, n


def _num(v: str, where: str, col: str, errors: list[str], integer: bool = False) -> float:
    try:
        x = float(v)
    except (TypeError, ValueError):
        errors.append(f"{where}: column {col!r}: not a number: {v!r}")
        return 0.0
    if not math.isfinite(x) or x < 0:
        errors.append(f"{where}: column {col!r}: must be a finite non-negative number, got {v!r}")
        return 0.0
    if integer and x != int(x):
        errors.append(f"{where}: column {col!r}: must be a whole number, got {v!r}")
    return x


def _read_csv(path: Path, required: tuple[str, ...]) -> Iterator[tuple[str, dict[str, str]]]:
    try:
        f = path.open(newline="", encoding="utf-8")
    except OSError as exc:
        raise SimInputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    with f:
        reader = csv.DictReader(f)
        cols = reader.fieldnames or []
        missing = [c for c in required if c not in cols]
        if missing:
            raise SimInputError(
                f"{path}:1: missing column(s) {', '.join(missing)}; header is {','.join(cols)}"
            )
        for row in reader:
            where = f"{path}:{reader.line_num}"
            if None in row or any(v is None for v in row.values()):
                raise SimInputError(f"{where}: expected {len(cols)} fields")
            yield where, row


def load_philly(
    path: Path,
    gpus_per_node: int = 8,
    cpu_per_gpu: int = 0,
    memory_per_gpu_mib: int = 0,
    max_jobs: int | None = None,
    queue_prefix: str = "",
) -> Trace:
    """Philly CSV ``timestamp,duration,num_gpus,gpu_time,cluster``; each virtual cluster is a queue."""
    errors: list[str] = []
    raw: list[tuple[float, float, int, str, str]] = []
    for where, row in _read_csv(path, ("timestamp", "duration", "num_gpus", "cluster")):
        try:
            ts = datetime.fromisoformat(row["timestamp"].strip()).timestamp()
        except ValueError:
            errors.append(f"{where}: column 'timestamp': not a date-time: {row['timestamp']!r}")
            ts = 0.0
        dur = _num(row["duration"], where, "duration", errors)
        n = _num(row["num_gpus"], where, "num_gpus", errors, integer=True)
        cl = row["cluster"].strip().lower()
        if not cl:
            errors.append(f"{where}: column 'cluster': empty")
        if len(errors) >= 20:
            break
        raw.append((ts, dur, int(n), cl, where))
        if max_jobs is not None and len(raw) >= max_jobs:
            break
    if errors:
        raise SimInputError(errors)
    if not raw:
        raise SimInputError(f"{path}: no jobs")
    t0 = min(r[0] for r in raw)
    tr = Trace()
    for i, (ts, dur, n, cl, where) in enumerate(raw):
        per, reps = split_gpus(n, gpus_per_node) if n > 0 else (0, 1)
        q = f"{queue_prefix}{cl}"
        tr.jobs.append(
            JobSpec(
                name=f"j{i:06d}",
                queue=q,
                submit=ts - t0,
                duration=max(dur, 1.0),
                gpus=per,
                replicas=reps,
                cpu_milli=cpu_per_gpu * per,
                memory_mib=memory_per_gpu_mib * per,
                type=WorkloadType.TRAINING,
                source=where,
            )
        )
        tr.gpu_time_by_queue[q] = tr.gpu_time_by_queue.get(q, 0.0) + dur * n
    return tr


def load_openb(path: Path, queue: str = "default", max_jobs: int | None = None) -> Trace:
    """Alibaba openb pod list: creation time is the submit, scheduled->deletion the run time."""
    errors: list[str] = []
    tr = Trace()
    rows = []
    for where, row in _read_csv(path, ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")):
        cpu = _num(row["cpu_milli"], where, "cpu_milli", errors, integer=True)
        mem = _num(row["memory_mib"], where, "memory_mib", errors, integer=True)
        n = _num(row["num_gpu"], where, "num_gpu", errors, integer=True)
        m = _num(row["gpu_milli"], where, "gpu_milli", errors, integer=True)
        created = row.get("creation_time") or "0"
        c = _num(created, where, "creation_time", errors)
        sched = _num(row.get("scheduled_time") or created, where, "scheduled_time", errors)
        deleted = _num(row.get("deletion_time") or str(sched + 3600), where, "deletion_time", errors)
        spec = tuple(sorted(x for x in (row.get("gpu_spec") or "").split("|") if x))
        if len(errors) >= 20:
            break
        rows.append(
            (c, max(deleted - sched, 1.0), int(n), int(m), int(cpu), int(mem), spec, row["name"], where)
        )
        if max_jobs is not None and len(rows) >= max_jobs:
            break
    if errors:
        raise SimInputError(errors)
    t0 = min((r[0] for r in rows), default=0.0)
    for c, dur, n, m, cpu, mem, spec, name, where in rows:
        frac = n == 1 and 0 < m < 1000
        tr.jobs.append(
            JobSpec(
                name=name,
                queue=queue,
                submit=c - t0,
                duration=dur,
                gpus=0 if frac else n,
                replicas=1,
                gpu_milli=m if frac else 0,
                cpu_milli=cpu,
                memory_mib=mem // 1 if mem else 0,
                type=WorkloadType.INFERENCE if frac else WorkloadType.BATCH,
                gpu_models=spec,
                source=where,
            )
        )
    return tr


def _generic_job(
    n: int,
    where: str,
    row: dict[str, str],
    columns: Mapping[str, str],
    fmt: str,
    default_queue: str,
    types: set[str],
    errors: list[str],
) -> JobSpec | None:
    """One row of a CSV/JSONL trace as a job; problems go to ``errors`` (the job is then unused),
    and ``None`` once there are 20 of them."""

    def get(key: str, default: str = "") -> str:
        col = columns.get(key)
        if col is None:
            return default
        if col not in row:
            if key in ("submit", "duration") or fmt == "csv":
                errors.append(f"{where}: column {col!r} (for {key}) is missing")
            return default  # a JSON object may leave optional fields out
        return row[col]

    def whole(key: str, default: str) -> int:
        return int(_num(get(key, default), where, columns.get(key, key), errors, integer=True))

    submit = _num(get("submit"), where, columns["submit"], errors)
    dur = _num(get("duration"), where, columns["duration"], errors)
    gpus = whole("gpus", "1")
    reps = whole("replicas", "1")
    milli = whole("gpuMilli", "0")
    cpu = whole("cpuMilli", "0")
    mem = whole("memoryMiB", "0")
    typ = get("type", "training") or "training"
    if typ not in types:
        errors.append(f"{where}: column {columns.get('type')!r}: unknown task type {typ!r}")
        typ = "training"
    model = get("gpuModel")
    if len(errors) >= 20:
        return None
    if milli and 0 < milli < 1000:
        gpus = 0
    return JobSpec(
        name=get("name") or f"j{n:06d}",
        queue=get("queue") or default_queue,
        submit=submit,
        duration=dur if dur > 0 else MIN_DURATION_S,
        gpus=gpus,
        replicas=max(reps, 1),
        gpu_milli=milli if gpus == 0 else 0,
        cpu_milli=cpu,
        memory_mib=mem,
        type=WorkloadType(typ),
        priority_class=get("priorityClass"),
        gpu_models=tuple(x for x in model.split("|") if x),
        source=where,
    )


_COLUMN_KEYS = (
    "submit",
    "duration",
    "gpus",
    "replicas",
    "gpuMilli",
    "cpuMilli",
    "memoryMiB",
    "queue",
    "type",
    "priorityClass",
    "gpuModel",
    "name",
)


def load_generic(
    path: Path,
    columns: Mapping[str, str],
    fmt: str = "csv",
    default_queue: str = "default",
    max_jobs: int | None = None,
) -> Trace:
    """A CSV or JSONL trace with a column mapping (scenario field -> column name)."""
    errors: list[str] = []
    for k in ("submit", "duration"):
        if k not in columns:
            raise SimInputError(f"columns.{k}: required in the column mapping")

    def rows() -> Iterator[tuple[str, dict[str, str]]]:
        if fmt == "csv":
            yield from _read_csv(path, tuple(columns[k] for k in ("submit", "duration")))
            return
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise SimInputError(f"{path}: cannot read: {exc.strerror or exc}") from None
        for i, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise SimInputError(f"{path}:{i}: invalid JSON: {exc.msg}") from None
            if not isinstance(obj, dict):
                raise SimInputError(f"{path}:{i}: expected a JSON object")
            yield f"{path}:{i}", {k: "" if v is None else str(v) for k, v in obj.items()}

    tr = Trace()
    types = {t.value for t in WorkloadType}
    for n, (where, row) in enumerate(rows()):
        job = _generic_job(n, where, row, columns, fmt, default_queue, types, errors)
        if job is None:  # enough problems to report
            break
        tr.jobs.append(job)
        if max_jobs is not None and len(tr.jobs) >= max_jobs:
            break
    if errors:
        raise SimInputError(errors)
    return tr


@dataclass(frozen=True, slots=True)
class TaskTypeGen:
    """Arrival process of one task type (Poisson, optionally with a diurnal peak)."""

    type: WorkloadType
    rate_per_hour: float
    queues: tuple[str, ...]
    sizes: tuple[tuple[int, float], ...]  # (GPUs, weight); 0 < GPUs < 1 as milli for fractions
    duration_mean_s: float
    duration_sigma: float = 1.0
    priority_class: str = ""
    diurnal_amplitude: float = 0.0  # rate x (1 + a*sin) with the peak at ``peak_hour``
    peak_hour: float = 14.0
    gpu_models: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class BurstGen:
    """Many jobs submitted at one instant (a team launching a sweep)."""

    at_s: float
    count: int
    type: WorkloadType
    queue: str
    gpus: int
    duration_mean_s: float
    priority_class: str = ""


def generate(
    types: list[TaskTypeGen],
    bursts: list[BurstGen],
    horizon_s: float,
    seed: int,
    gpus_per_node: int = 8,
    cpu_per_gpu: int = 8000,
    memory_per_gpu_mib: int = 65536,
) -> Trace:
    """Synthetic jobs: thinning of a Poisson process gives the diurnal peak exactly."""
    rng = np.random.default_rng(seed)
    node = _NodeShape(gpus_per_node, cpu_per_gpu, memory_per_gpu_mib)
    raw: list[tuple[float, str, JobSpec]] = []
    for ti, t in enumerate(types):  # the draws' order makes the trace: types first, then bursts
        raw.extend(_type_arrivals(rng, t, horizon_s, node, f"generator.types[{ti}]"))
    for bi, b in enumerate(bursts):
        raw.extend(_burst_arrivals(rng, b, node, f"generator.bursts[{bi}]"))
    raw.sort(key=lambda r: (r[0], r[1]))
    tr = Trace()
    for i, (_, _, j) in enumerate(raw):
        name = f"{j.type.value[:3]}-{i:06d}"
        tr.jobs.append(replace(j, name=name, submit=round(j.submit, 3), duration=round(j.duration, 3)))
    return tr


@dataclass(frozen=True, slots=True)
class _NodeShape:
    """How generated GPU counts become pods, and their CPU and memory requests."""

    gpus_per_node: int
    cpu_per_gpu: int
    memory_per_gpu_mib: int


def _type_arrivals(
    rng: np.random.Generator, t: TaskTypeGen, horizon_s: float, node: _NodeShape, src: str
) -> list[tuple[float, str, JobSpec]]:
    if t.rate_per_hour <= 0:
        return []
    peak = t.rate_per_hour * (1 + abs(t.diurnal_amplitude)) / 3600.0
    n = int(rng.poisson(peak * horizon_s))
    times = np.sort(rng.uniform(0, horizon_s, n))
    phase = 2 * np.pi * (times / 3600.0 - t.peak_hour + 6.0) / 24.0
    keep = rng.uniform(0, 1, n) < (1 + t.diurnal_amplitude * np.sin(phase)) / (1 + abs(t.diurnal_amplitude))
    times = times[keep]
    w = np.array([s[1] for s in t.sizes], dtype=float)
    idx = rng.choice(len(t.sizes), size=len(times), p=w / w.sum())
    qs = rng.choice(len(t.queues), size=len(times))
    mu = math.log(max(t.duration_mean_s, 1.0)) - t.duration_sigma**2 / 2
    durs = rng.lognormal(mu, t.duration_sigma, len(times))
    out = []
    for k in range(len(times)):
        at, queue, size = float(times[k]), t.queues[int(qs[k])], t.sizes[int(idx[k])][0]
        job = _gen_job(t.type, queue, at, float(durs[k]), size, t.priority_class, t.gpu_models, node, src)
        out.append((at, f"{t.type.value}", job))
    return out


def _burst_arrivals(
    rng: np.random.Generator, b: BurstGen, node: _NodeShape, src: str
) -> list[tuple[float, str, JobSpec]]:
    mu = math.log(max(b.duration_mean_s, 1.0)) - 0.5
    durs = rng.lognormal(mu, 1.0, b.count)
    return [
        (
            b.at_s,
            b.type.value,
            _gen_job(b.type, b.queue, b.at_s, float(d), b.gpus, b.priority_class, (), node, src),
        )
        for d in durs
    ]


def _gen_job(
    typ: WorkloadType,
    queue: str,
    t: float,
    dur: float,
    size: float,
    pc: str,
    models: tuple[str, ...],
    node: _NodeShape,
    src: str,
) -> JobSpec:
    if 0 < size < 1:  # one pod on a share of one GPU, with that share of a GPU's CPU and memory
        milli = round(size * 1000)
        per, reps = 0, 1
        cpu, mem = node.cpu_per_gpu * milli // 1000, node.memory_per_gpu_mib * milli // 1000
    else:
        milli = 0
        per, reps = split_gpus(int(size), node.gpus_per_node)
        cpu, mem = node.cpu_per_gpu * per, node.memory_per_gpu_mib * per
    return JobSpec(
        name="",
        queue=queue,
        submit=t,
        duration=max(dur, 1.0),
        gpus=per,
        replicas=reps,
        gpu_milli=milli,
        cpu_milli=cpu,
        memory_mib=mem,
        type=typ,
        priority_class=pc,
        gpu_models=models,
        source=src,
    )
