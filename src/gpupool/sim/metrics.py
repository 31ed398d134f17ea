"""Metrics of a simulation run: waits, JCT, allocation, fragmentation, preemption, faults, fairness.

Everything is computed from the job records and the step-function time series with numpy, and
rounded so that the same run always serialises to the same bytes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpupool.discovery import synthetic
from gpupool.sim.results import JobRecord, RunResult
from gpupool.sim.sources import JobSpec

#: summary rows: (key, label, True when higher is better)
SUMMARY_ROWS: tuple[tuple[str, str, bool], ...] = (
    ("completion_rate", "completion rate", True),
    ("wait_mean_s", "wait mean (s)", False),
    ("wait_p50_s", "wait p50 (s)", False),
    ("wait_p95_s", "wait p95 (s)", False),
    ("wait_p99_s", "wait p99 (s)", False),
    ("jct_mean_s", "JCT mean (s)", False),
    ("jct_p95_s", "JCT p95 (s)", False),
    ("makespan_s", "makespan (s)", False),
    ("makespan_over_limit", "makespan / physical limit", False),
    ("allocation_ratio", "GPU allocation ratio", True),
    ("utilization", "GPU utilisation (useful work)", True),
    ("sm_utilization", "GPU SM utilisation (synthetic, by task type)", True),
    ("fragmentation", "fragmentation (free GPUs off whole nodes)", False),
    ("preemptions", "preemptions", False),
    ("preempted_gpu_hours_lost", "GPU-hours lost to preemption", False),
    ("consolidation_moves", "consolidation moves", False),
    ("consolidation_gpu_hours_lost", "GPU-hours lost to consolidation moves", False),
    ("preemption_lost_share", "capacity lost to preemption (share)", False),
    ("fault_gpu_hours_lost", "GPU-hours lost to faults", False),
    ("jobs_failed", "jobs failed (retries exhausted)", False),
    ("recover_mean_s", "time to recover mean (s)", False),
    ("fairness_jain", "fairness (Jain, usage/guarantee)", True),
)


def rnd(x: float, nd: int = 4) -> float:
    """Round for stable output (and turn -0.0/NaN into plain numbers)."""
    if x != x:  # NaN
        return 0.0
    r = round(float(x), nd)
    return 0.0 if r == 0 else r


def percentiles(values: list[float] | np.ndarray, qs: tuple[int, ...] = (50, 95, 99)) -> dict[str, float]:
    """p50/p95/p99 (linear interpolation, numpy's default); zeros for an empty set."""
    a = np.asarray(values, dtype=float)
    if a.size == 0:
        return {f"p{q}": 0.0 for q in qs}
    return {f"p{q}": rnd(float(np.percentile(a, q))) for q in qs}


def time_weighted_mean(times: list[float], values: list[float], end: float, start: float = 0.0) -> float:
    """Mean of a step function (value[i] holds on [times[i], times[i+1])) over [start, end]."""
    if not times or end <= start:
        return 0.0
    t = np.asarray(times, dtype=float)
    v = np.asarray(values, dtype=float)
    edges = np.clip(np.append(t[1:], end), start, end)
    begins = np.clip(t, start, end)
    dt = edges - begins
    pre = max(0.0, min(t[0], end) - start)  # before the first point the value is 0
    return float((v * dt).sum() / (dt.sum() + pre))


def integral(times: list[float], values: list[float], end: float) -> float:
    """Integral of a step function from times[0] to end."""
    if not times:
        return 0.0
    t = np.asarray(times, dtype=float)
    v = np.asarray(values, dtype=float)
    dt = np.clip(np.append(t[1:], end), None, end) - np.clip(t, None, end)
    return float((v * np.maximum(dt, 0)).sum())


def jain(x: list[float]) -> float:
    """Jain's fairness index: 1 when all equal, 1/n when one takes everything."""
    a = np.asarray(x, dtype=float)
    if a.size == 0 or not (a**2).sum():
        return 1.0
    return float(a.sum() ** 2 / (a.size * (a**2).sum()))


def job_units(spec: JobSpec, resource: str) -> float:
    """How much of the run's metric resource one job holds (GPUs, or CPUs without GPUs)."""
    if resource == "cpu":
        return spec.cpu_milli * spec.replicas / 1000.0
    return spec.gpu_total_milli / 1000.0


def synthetic_sm(jobs: list[JobRecord]) -> float:
    """The mean SM utilisation of the GPU time the jobs ran (completed work and work lost to
    preemption and faults), each at its task type's synthetic level (gpupool.discovery.synthetic,
    as the virtual backend shows it): allocation says the GPUs were held, this what they computed."""
    held = used = 0.0
    for j in jobs:
        done = job_units(j.spec, "gpu") * j.spec.duration if j.status == "completed" else 0.0
        run = done + j.lost_gpu_s + j.lost_fault_gpu_s
        held += run
        used += run * synthetic.level(str(j.spec.type), j.spec.name).sm_percent / 100
    return used / held if held else 0.0


def job_class(spec: JobSpec) -> str:
    """The class a job is reported under: its label, else its priority class, else "-"."""
    return spec.label or spec.priority_class or "-"


def _key(j: JobRecord, key: str) -> str:
    if key == "queue":
        return j.spec.queue
    return job_class(j.spec) if key == "class" else j.spec.type.value


def _group(r: RunResult, key: str) -> dict[str, dict[str, Any]]:
    groups: dict[str, list[Any]] = {}
    for j in r.jobs:
        if j.status == "rejected":
            continue
        groups.setdefault(_key(j, key), []).append(j)
    out: dict[str, dict[str, Any]] = {}
    for k, js in sorted(groups.items()):
        waits = [j.first_start - j.spec.submit for j in js if j.first_start is not None]
        jct = [j.finish - j.spec.submit for j in js if j.status == "completed" and j.finish is not None]
        out[k] = {
            "jobs": len(js),
            "completed": sum(j.status == "completed" for j in js),
            "wait_mean_s": rnd(float(np.mean(waits))) if waits else 0.0,
            **{f"wait_{p}_s": v for p, v in percentiles(waits).items()},
            "jct_mean_s": rnd(float(np.mean(jct))) if jct else 0.0,
            "preemptions": sum(j.preempted for j in js),
        }
        if key == "class":  # time to admission as Kueue's performance test reports it
            out[k].update(_class_extras(r, js, waits, jct))
    return out


def _class_extras(r: RunResult, js: list[JobRecord], waits: list[float], jct: list[float]) -> dict[str, Any]:
    """Per class: time to admission p90, JCT p90, evictions per job and the work they threw away."""
    lost = sum(j.lost_gpu_s for j in js)
    return {
        "wait_p90_s": percentiles(waits, (90,))["p90"],
        "jct_p90_s": percentiles(jct, (90,))["p90"],
        "evictions_per_job": rnd(sum(j.preempted for j in js) / len(js)) if js else 0.0,
        "lost_units_s": rnd(lost, 3),
        "work_units_s": rnd(sum(job_units(j.spec, r.resource) * j.spec.duration for j in js), 3),
    }


def physical_limit_s(r: RunResult, capacity_units: float) -> float:
    """Total work divided by capacity: no schedule of these jobs can end sooner (if every job
    could start at once); the Kueue baseline's yardstick."""
    if capacity_units <= 0:
        return 0.0
    work = sum(job_units(j.spec, r.resource) * j.spec.duration for j in r.jobs if j.status != "rejected")
    return work / capacity_units


def compute(r: RunResult) -> dict[str, Any]:
    """Every metric of one run, JSON-ready."""
    jobs = [j for j in r.jobs if j.status != "rejected"]
    started = [j for j in jobs if j.first_start is not None]
    waits = [j.first_start - j.spec.submit for j in started if j.first_start is not None]
    done = [j for j in jobs if j.status == "completed" and j.finish is not None]
    jct = [j.finish - j.spec.submit for j in done if j.finish is not None]
    end = max(r.end, 1e-9)
    cap_int = integral(r.times, [float(c) for c in r.cap_milli], end) / 1000.0
    alloc_int = integral(r.times, [float(a) for a in r.alloc_milli], end) / 1000.0
    useful = sum(job_units(j.spec, r.resource) * j.spec.duration for j in done)
    limit = physical_limit_s(r, r.cap_milli[0] / 1000.0 if r.cap_milli else 0.0)
    makespan = max((j.finish or 0.0 for j in done), default=0.0)
    lost = sum(j.lost_gpu_s for j in jobs)
    recover = [x for j in jobs for x in j.recover_s]
    gpu_hours = {q: u / 3600.0 for q, u in sorted(r.queue_usage_gpu_s.items())}
    total_usage = sum(gpu_hours.values()) or 1.0
    total_g = sum(r.queue_guarantee_milli.values()) or 1
    fairness: dict[str, dict[str, float]] = {}
    ratios = []
    for q in sorted(set(gpu_hours) | set(r.queue_guarantee_milli)):
        g = r.queue_guarantee_milli.get(q, 0)
        avg_gpus = gpu_hours.get(q, 0.0) * 3600.0 / end
        fairness[q] = {
            "gpu_hours": rnd(gpu_hours.get(q, 0.0), 3),
            "avg_gpus": rnd(avg_gpus),
            "usage_share": rnd(gpu_hours.get(q, 0.0) / total_usage),
            "guarantee_gpus": rnd(g / 1000.0),
            "guarantee_share": rnd(g / total_g),
            "usage_over_guarantee": rnd(avg_gpus / (g / 1000.0)) if g else 0.0,
        }
        if g and q in gpu_hours:
            ratios.append(avg_gpus / (g / 1000.0))
    kinds: dict[str, int] = {}
    for e in r.events:
        kinds[e.kind] = kinds.get(e.kind, 0) + 1
    return {
        "policy": r.policy,
        "variant": r.variant,
        "jobs": len(r.jobs),
        "jobs_rejected": len(r.jobs) - len(jobs),
        "jobs_completed": len(done),
        "jobs_failed": sum(j.status == "failed" for j in jobs),
        "jobs_unfinished": sum(j.status in ("pending", "running", "waiting") for j in jobs),
        "jobs_never_started": len(jobs) - len(started),
        "completion_rate": rnd(len(done) / len(jobs)) if jobs else 0.0,
        "wait_mean_s": rnd(float(np.mean(waits))) if waits else 0.0,
        **{f"wait_{p}_s": v for p, v in percentiles(waits).items()},
        "jct_mean_s": rnd(float(np.mean(jct))) if jct else 0.0,
        **{f"jct_{p}_s": v for p, v in percentiles(jct).items()},
        "makespan_s": rnd(makespan),
        "metric_resource": r.resource,
        "physical_limit_s": rnd(limit),
        "makespan_over_limit": rnd(makespan / limit) if limit else 0.0,
        "preemption_lost_share": rnd(lost / cap_int) if cap_int else 0.0,
        "allocation_ratio": rnd(alloc_int / cap_int) if cap_int else 0.0,
        "utilization": rnd(useful / cap_int) if cap_int else 0.0,
        "sm_utilization": rnd(synthetic_sm(jobs)),
        "fragmentation": rnd(float(np.mean(r.frag))) if r.frag else 0.0,
        "preemptions": r.preemptions,
        "preempted_gpu_hours_lost": rnd(lost / 3600.0, 3),
        "consolidation_moves": r.moves,
        "consolidation_gpu_hours_lost": rnd(r.moved_gpu_s_lost / 3600.0, 3),
        "fault_gpu_hours_lost": rnd(sum(j.lost_fault_gpu_s for j in jobs) / 3600.0, 3),
        "job_faults": kinds.get("job-fault", 0),
        "node_failures": kinds.get("node-failed", 0),
        "jobs_evicted_by_node_failure": kinds.get("job-evicted", 0),
        "recover_mean_s": rnd(float(np.mean(recover))) if recover else 0.0,
        "recover_p95_s": percentiles(recover)["p95"],
        "fairness_jain": rnd(jain(ratios)),
        "cycles": r.cycles,
        "engine_calls": r.engine_calls,
        "invariant_violations": len(r.violations),
        "per_queue": _group(r, "queue"),
        "per_type": _group(r, "type"),
        "per_class": _group(r, "class"),
        "fairness": fairness,
    }


def series(r: RunResult, points: int = 400) -> dict[str, list[float]]:
    """The step-function series resampled on a regular grid (for charts)."""
    end = max(r.end, 1.0)
    grid = np.linspace(0.0, end, points)
    t = np.asarray(r.times, dtype=float)
    if t.size == 0:
        z = [0.0] * points
        return {"t": [rnd(x, 1) for x in grid], "allocation": z, "pending": z, "running": z}
    idx = np.searchsorted(t, grid, side="right") - 1
    ok = idx >= 0
    idx = np.clip(idx, 0, t.size - 1)
    alloc = np.asarray(r.alloc_milli, dtype=float)[idx]
    cap = np.asarray(r.cap_milli, dtype=float)[idx]
    ratio = np.where(ok & (cap > 0), alloc / np.maximum(cap, 1), 0.0)
    pend = np.where(ok, np.asarray(r.pending, dtype=float)[idx], 0.0)
    run = np.where(ok, np.asarray(r.running, dtype=float)[idx], 0.0)
    return {
        "t": [rnd(x, 1) for x in grid],
        "allocation": [rnd(x) for x in ratio],
        "pending": [rnd(x) for x in pend],
        "running": [rnd(x) for x in run],
        "frag_t": [rnd(x, 1) for x in r.frag_times],
        "fragmentation": [rnd(x) for x in r.frag],
    }


def wait_quantiles(r: RunResult, n: int = 101) -> list[float]:
    """Wait-time quantiles 0..100% (an ECDF in n points; keeps the report small)."""
    waits = [j.first_start - j.spec.submit for j in r.jobs if j.first_start is not None]
    if not waits:
        return []
    return [rnd(x, 2) for x in np.percentile(np.asarray(waits, dtype=float), np.linspace(0, 100, n))]
