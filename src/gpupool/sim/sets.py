"""Compact scenario forms: workload sets (``spec.workload.sets``) and cohort sets
(``spec.cluster.cohorts``), each expanded the same way every run.

Why: Kueue's scheduler performance test describes 15,000 workloads as three classes per queue
(a count, a creation interval, a runtime, a request, a priority). Writing that out as rows would
hide the scenario in its data; a set says it in one line and expands the same way every run.
Sub-second durations and intervals are allowed (``200ms``), as that test needs them.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Any

from gpupool import quantity as qty
from gpupool.manifests import API_VERSION
from gpupool.sim.events import clean_time
from gpupool.sim.manifest import CohortSetSpec, Duration, WorkloadSetSpec
from gpupool.sim.sources import MIN_DURATION_S, JobSpec, SimInputError, Trace


@dataclass(frozen=True, slots=True)
class WorkloadSet:
    """One resolved set: the queues it feeds and the shape and timing of its workloads."""

    label: str
    queues: tuple[str, ...]
    count: int
    interval_s: float
    start_s: float
    duration_s: float
    cpu_milli: int
    memory_mib: int
    gpus: int
    replicas: int
    priority_class: str
    spec: WorkloadSetSpec


def duration_s(v: Duration, where: str) -> float:
    """Seconds from a number, ``1h30m``-style text, or milliseconds (``200ms``)."""
    if isinstance(v, str) and v.strip().endswith("ms"):
        head = v.strip()[:-2]
        try:
            ms = float(head)
        except ValueError:
            raise SimInputError(f"{where}: invalid duration {v!r}") from None
        if not ms >= 0 or ms == float("inf"):
            raise SimInputError(f"{where}: invalid duration {v!r}: must be finite and non-negative")
        return ms / 1000.0
    try:
        return qty.parse_duration(v)
    except qty.QuantityError as exc:
        raise SimInputError(f"{where}: {exc}") from None


def resolve_sets(specs: list[WorkloadSetSpec], leaves: list[str], where: str) -> list[WorkloadSet]:
    """Each set with its queue globs matched against the scenario's leaf queues; every
    problem is reported with its field."""
    errors: list[str] = []
    out: list[WorkloadSet] = []
    for i, s in enumerate(specs):
        at = f"{where}[{i}]"
        queues: list[str] = []
        for k, pat in enumerate(s.queues):
            got = [q for q in leaves if fnmatch.fnmatchcase(q, pat)]
            if not got:
                errors.append(f"{at}.queues[{k}]: {pat!r} matches no leaf queue")
            queues.extend(q for q in got if q not in queues)
        try:
            cpu = qty.cpu_milli(s.cpu)
            mem = qty.memory_mib(s.memory) if isinstance(s.memory, str) else int(s.memory)
            interval = duration_s(s.interval, f"{at}.interval")
            start = duration_s(s.start, f"{at}.start")
            dur = duration_s(s.duration, f"{at}.duration")
        except (qty.QuantityError, SimInputError) as exc:
            errors.append(f"{at}: {exc}")
            continue
        out.append(
            WorkloadSet(
                s.className, tuple(queues), s.count, interval, start, dur if dur > 0 else MIN_DURATION_S,
                cpu, mem, s.gpus, s.replicas, s.priorityClass, s,
            )
        )  # fmt: skip
    if errors:
        raise SimInputError(errors)
    return out


def expand_sets(sets: list[WorkloadSet]) -> Trace:
    """The jobs of every set, ordered by submit time (then set, queue, index: a total order).
    Names say where a job comes from: ``<class>-<queue>-<n>``."""
    raw: list[tuple[float, int, int, int, JobSpec]] = []
    for si, s in enumerate(sets):
        for qi, q in enumerate(s.queues):
            for n in range(s.count):
                t = clean_time(s.start_s + n * s.interval_s)  # 0.1 x 3 is 0.30000000000000004
                job = JobSpec(
                    name=f"{s.label}-{q}-{n:05d}",
                    queue=q,
                    submit=t,
                    duration=s.duration_s,
                    gpus=s.gpus,
                    replicas=s.replicas,
                    cpu_milli=s.cpu_milli,
                    memory_mib=s.memory_mib,
                    type=s.spec.type,
                    priority_class=s.priority_class,
                    source=f"spec.workload.sets[{si}]",
                    label=s.label,
                )
                raw.append((t, si, qi, n, job))
    raw.sort(key=lambda r: r[:4])
    tr = Trace(jobs=[r[4] for r in raw])
    for j in tr.jobs:
        tr.gpu_time_by_queue[j.queue] = tr.gpu_time_by_queue.get(j.queue, 0.0) + (
            j.duration * j.gpu_total_milli / 1000.0
        )
    return tr


def _scaled(guarantee: dict[str, str | int | float], n: int, where: str) -> dict[str, str | int | float]:
    """``n`` times a guarantee (a cohort root holds the sum of its leaves' guarantees)."""
    out: dict[str, str | int | float] = {}
    for k, v in guarantee.items():
        try:
            if k == "cpu":
                out[k] = f"{qty.cpu_milli(v) * n}m"
            elif k == "memory":
                out[k] = f"{(qty.memory_mib(v) if isinstance(v, str) else int(v)) * n}Mi"
            else:
                out[k] = float(v) * n
        except (qty.QuantityError, ValueError) as exc:
            raise SimInputError(f"{where}.queues.guarantee.{k}: {exc}") from None
    return out


def cohort_documents(specs: list[CohortSetSpec], where: str) -> list[dict[str, Any]]:
    """The Queue documents of ``spec.cluster.cohorts``: per cohort a root and its leaves."""
    docs: list[dict[str, Any]] = []
    for i, c in enumerate(specs):
        qs = c.queues
        root_g = _scaled(qs.guarantee, qs.count, f"{where}[{i}]")
        leaf_quota: dict[str, Any] = {"pool": c.pool, "guarantee": dict(qs.guarantee)}
        if qs.borrowingLimit is not None:
            leaf_quota["borrowingLimit"] = dict(qs.borrowingLimit)
        pol = qs.preemption.model_dump(mode="json")
        for k in range(c.count):
            root = f"{c.name}-{k}"
            docs.append(_queue_doc(root, {"quotas": [{"pool": c.pool, "guarantee": root_g}]}))
            for j in range(qs.count):
                spec = {"parent": root, "preemption": pol, "quotas": [leaf_quota]}
                docs.append(_queue_doc(f"{qs.name}-{k}-{j}", spec))
    return docs


def _queue_doc(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "Queue", "metadata": {"name": name}, "spec": spec}
