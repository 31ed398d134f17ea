"""Workload sources for the simulator: Philly, Alibaba openb, generic CSV/JSONL, and a generator.

Every loader is strict: a malformed row raises :class:`SimInputError` naming the file and line,
because a figure computed from a silently half-parsed trace is worse than no figure.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
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
                f"j{i:06d}",
                q,
                ts - t0,
                max(dur, 1.0),
                per,
                reps,
                0,
                cpu_per_gpu * per,
                memory_per_gpu_mib * per,
                WorkloadType.TRAINING,
                "",
                (),
                where,
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
                name,
                queue,
                c - t0,
                dur,
                0 if frac else n,
                1,
                m if frac else 0,
                cpu,
                mem // 1 if mem else 0,
                WorkloadType.INFERENCE if frac else WorkloadType.BATCH,
                "",
                spec,
                where,
            )
        )
    return tr


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

        def get(key: str, default: str = "", row: dict[str, str] = row, where: str = where) -> str:
            col = columns.get(key)
            if col is None:
                return default
            if col not in row:
                if key in ("submit", "duration") or fmt == "csv":
                    errors.append(f"{where}: column {col!r} (for {key}) is missing")
                return default  # a JSON object may leave optional fields out
            return row[col]

        submit = _num(get("submit"), where, columns["submit"], errors)
        dur = _num(get("duration"), where, columns["duration"], errors)
        gpus = int(_num(get("gpus", "1"), where, columns.get("gpus", "gpus"), errors, integer=True))
        reps = int(
            _num(get("replicas", "1"), where, columns.get("replicas", "replicas"), errors, integer=True)
        )
        milli = int(
            _num(get("gpuMilli", "0"), where, columns.get("gpuMilli", "gpuMilli"), errors, integer=True)
        )
        cpu = int(
            _num(get("cpuMilli", "0"), where, columns.get("cpuMilli", "cpuMilli"), errors, integer=True)
        )
        mem = int(
            _num(get("memoryMiB", "0"), where, columns.get("memoryMiB", "memoryMiB"), errors, integer=True)
        )
        typ = get("type", "training") or "training"
        if typ not in types:
            errors.append(f"{where}: column {columns.get('type')!r}: unknown task type {typ!r}")
            typ = "training"
        model = get("gpuModel")
        if len(errors) >= 20:
            break
        if milli and 0 < milli < 1000:
            gpus = 0
        tr.jobs.append(
            JobSpec(
                get("name") or f"j{n:06d}",
                get("queue") or default_queue,
                submit,
                max(dur, 1.0),
                gpus,
                max(reps, 1),
                milli if gpus == 0 else 0,
                cpu,
                mem,
                WorkloadType(typ),
                get("priorityClass"),
                tuple(x for x in model.split("|") if x),
                where,
            )
        )
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
    tr = Trace()
    raw: list[tuple[float, str, JobSpec]] = []
    for ti, t in enumerate(types):
        if t.rate_per_hour <= 0:
            continue
        peak = t.rate_per_hour * (1 + abs(t.diurnal_amplitude)) / 3600.0
        n = int(rng.poisson(peak * horizon_s))
        times = np.sort(rng.uniform(0, horizon_s, n))
        phase = 2 * np.pi * (times / 3600.0 - t.peak_hour + 6.0) / 24.0
        keep = rng.uniform(0, 1, n) < (1 + t.diurnal_amplitude * np.sin(phase)) / (
            1 + abs(t.diurnal_amplitude)
        )
        times = times[keep]
        w = np.array([s[1] for s in t.sizes], dtype=float)
        idx = rng.choice(len(t.sizes), size=len(times), p=w / w.sum())
        qs = rng.choice(len(t.queues), size=len(times))
        mu = math.log(max(t.duration_mean_s, 1.0)) - t.duration_sigma**2 / 2
        durs = rng.lognormal(mu, t.duration_sigma, len(times))
        for k in range(len(times)):
            raw.append(
                (
                    float(times[k]),
                    f"{t.type.value}",
                    _gen_job(
                        t.type,
                        t.queues[int(qs[k])],
                        float(times[k]),
                        float(durs[k]),
                        t.sizes[int(idx[k])][0],
                        t.priority_class,
                        t.gpu_models,
                        gpus_per_node,
                        cpu_per_gpu,
                        memory_per_gpu_mib,
                        f"generator.types[{ti}]",
                    ),
                )
            )
    for bi, b in enumerate(bursts):
        mu = math.log(max(b.duration_mean_s, 1.0)) - 0.5
        durs = rng.lognormal(mu, 1.0, b.count)
        for k in range(b.count):
            raw.append(
                (
                    b.at_s,
                    b.type.value,
                    _gen_job(
                        b.type,
                        b.queue,
                        b.at_s,
                        float(durs[k]),
                        b.gpus,
                        b.priority_class,
                        (),
                        gpus_per_node,
                        cpu_per_gpu,
                        memory_per_gpu_mib,
                        f"generator.bursts[{bi}]",
                    ),
                )
            )
    raw.sort(key=lambda r: (r[0], r[1]))
    for i, (_, _, j) in enumerate(raw):
        job = JobSpec(
            f"{j.type.value[:3]}-{i:06d}",
            j.queue,
            round(j.submit, 3),
            round(j.duration, 3),
            j.gpus,
            j.replicas,
            j.gpu_milli,
            j.cpu_milli,
            j.memory_mib,
            j.type,
            j.priority_class,
            j.gpu_models,
            j.source,
        )
        tr.jobs.append(job)
    return tr


def _gen_job(
    typ: WorkloadType,
    queue: str,
    t: float,
    dur: float,
    size: float,
    pc: str,
    models: tuple[str, ...],
    per_node: int,
    cpu_per_gpu: int,
    mem_per_gpu: int,
    src: str,
) -> JobSpec:
    if 0 < size < 1:
        milli = round(size * 1000)
        return JobSpec(
            "",
            queue,
            t,
            max(dur, 1.0),
            0,
            1,
            milli,
            cpu_per_gpu * milli // 1000,
            mem_per_gpu * milli // 1000,
            typ,
            pc,
            models,
            src,
        )
    per, reps = split_gpus(int(size), per_node)
    return JobSpec(
        "", queue, t, max(dur, 1.0), per, reps, 0, cpu_per_gpu * per, mem_per_gpu * per, typ, pc, models, src
    )
