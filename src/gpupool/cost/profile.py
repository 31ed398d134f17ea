"""Task profile (梳理任务画像) and the pool design it suggests, checked on data it did not see.

Why fit on one part and judge on another: a design sized from the very weeks it is replayed on
looks better than it will be; the suggested guarantees come from the first part of the trace
(by submit time, ``fit_share``) and both designs — the scenario's own and the suggestion — are
replayed through the simulator on the rest only.

Offered demand is what the work asked for, as if every job ran from its submission for its
duration: per queue and per hour, the mean GPUs wanted. The suggestion keeps the nodes and pools
and redraws the queues: each queue's guarantee is a percentile of its hourly demand (scaled
down together when they exceed the pool), its borrowing limit the rest of its peak.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta, tzinfo
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import numpy as np
import yaml

from gpupool.cost.limits import DAY_S, Limit
from gpupool.manifests import API_VERSION, Bundle
from gpupool.model import ResourcePool, WorkloadType
from gpupool.sim.scenario import Scenario, Variant
from gpupool.sim.sources import JobSpec, Trace

NON_PREEMPTIBLE_TYPES = {WorkloadType.INFERENCE}
#: percentiles of hourly demand and an hour-of-day rhythm mean little before one whole day
PROFILE_LIMIT = Limit(
    "profile", DAY_S, "one daily cycle in the fitted part, for hourly-demand percentiles and the daily rhythm"
)


def split(jobs: Sequence[JobSpec], fit_share: float) -> tuple[list[JobSpec], list[JobSpec], float]:
    """Jobs submitted before the cut, the rest shifted to start at 0, and the cut (s)."""
    if not 0.1 <= fit_share <= 0.9:
        raise ValueError("--fit-share: must be between 0.1 and 0.9")
    if not jobs:
        raise ValueError("the trace has no jobs")
    first, last = min(j.submit for j in jobs), max(j.submit for j in jobs)
    cut = first + (last - first) * fit_share
    fit = [j for j in jobs if j.submit < cut]
    rest = [replace(j, submit=j.submit - cut) for j in jobs if j.submit >= cut]
    return fit, rest, cut


def hourly_demand(jobs: Sequence[JobSpec], key: str = "queue") -> dict[str, np.ndarray]:
    """Mean GPUs wanted per hour, per value of ``key`` (queue or type)."""
    if not jobs:
        return {}
    start = min(j.submit for j in jobs)
    n = math.ceil((max(j.submit + j.duration for j in jobs) - start) / 3600) + 1
    out: dict[str, np.ndarray] = defaultdict(lambda: np.zeros(n))
    for j in jobs:
        g = j.gpu_total_milli / 1000
        a, b = j.submit - start, j.submit - start + j.duration
        row = out[str(getattr(j, key))]
        h = int(a // 3600)
        while a < b:
            stop = min(b, (h + 1) * 3600)
            row[h] += g * (stop - a) / 3600
            a, h = stop, h + 1
    return dict(out)


def _pct(x: np.ndarray, q: float) -> float:
    return float(np.percentile(x, q)) if len(x) else 0.0


def profile_tables(
    jobs: Sequence[JobSpec], origin: datetime | None = None, tz: tzinfo | None = None
) -> list[dict[str, Any]]:
    """Demand per type and per queue (mean, p50, p95, peak GPUs), the daily and weekly rhythm
    (by the clock in ``tz`` when the trace's ``origin`` is known: ``rhythm``)."""
    cols = ["key", "jobs", "gpuHours", "meanGpus", "p50Gpus", "p95Gpus", "peakGpus", "meanDurationH"]
    tables = []
    for key, title in (("type", "Demand per task type"), ("queue", "Demand per queue (team)")):
        counts: dict[str, list[JobSpec]] = defaultdict(list)
        for j in jobs:
            counts[str(getattr(j, key))].append(j)
        rows = []
        for k, d in sorted(hourly_demand(jobs, key).items()):
            js = counts[k]
            gh = sum(j.gpu_total_milli / 1000 * j.duration for j in js) / 3600
            rows.append([k, len(js), round(gh, 1), round(float(d.mean()), 2), round(_pct(d, 50), 2),
                         round(_pct(d, 95), 2), round(float(d.max()), 2),
                         round(float(np.mean([j.duration for j in js])) / 3600, 2)])  # fmt: skip
        tables.append({"name": key, "title": title, "columns": cols, "rows": rows})
    tables.append(rhythm(jobs, origin, tz))
    return tables


DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")


def rhythm(jobs: Sequence[JobSpec], origin: datetime | None, tz: tzinfo | None) -> dict[str, Any]:
    """Share of submissions by hour of day and weekday on the clock in ``tz`` (None: the
    server's local zone), each job at ``origin`` + its submit offset; without an origin, hours
    and days counted from the trace's start, and the title says so."""
    hours, days = np.zeros(24), np.zeros(7)
    label = ""
    for j in jobs:
        if origin is None:
            h, d = int(j.submit // 3600) % 24, int(j.submit // 86400) % 7
        else:
            at = (origin + timedelta(seconds=j.submit)).astimezone(tz)
            h, d, label = at.hour, at.weekday(), str(tz or at.tzname())
        hours[h] += 1
        days[d] += 1
    total = max(1, len(jobs))
    rows = [[f"hour {h:02d}", round(hours[h] / total, 4)] for h in range(24)]
    if origin is None:
        rows += [[f"day {d}", round(days[d] / total, 4)] for d in range(7)]
        title = "Share of submissions by hour and day from the trace's start (its clock is unknown)"
    else:
        rows += [[DAYS[d], round(days[d] / total, 4)] for d in range(7)]
        title = f"Share of submissions by hour of day and weekday ({label or tz or 'local time'})"
    return {"name": "rhythm", "title": title, "columns": ["when", "share"], "rows": rows}


def zone(name: str | None) -> tzinfo | None:
    """An IANA time zone by name (None: the server's local zone); a bad name is a ValueError
    naming ``--tz``."""
    if name is None:
        return None
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(
            f"--tz: {name!r} is not an IANA time zone (e.g. UTC, Europe/Berlin, Asia/Shanghai)"
        ) from None


def suggest_queues(
    jobs: Sequence[JobSpec],
    pool: ResourcePool,
    capacity: int,
    root: str,
    percentile: float = 50.0,
    leaves: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """Queue manifests: guarantees from a demand percentile, borrowing up to the p99 peak."""
    demand = hourly_demand(jobs, "queue")
    want = {q: _pct(d, percentile) for q, d in demand.items()}
    total = sum(want.values())
    scale = min(1.0, capacity / total) if total else 1.0
    docs: list[dict[str, Any]] = [
        {"apiVersion": API_VERSION, "kind": "Queue", "metadata": {"name": root},
         "spec": {"description": "suggested by gpupool profile", "quotas": [{"pool": pool.name, "guarantee": {"nvidia.com/gpu": capacity}}]}}
    ]  # fmt: skip
    for q in sorted(set(leaves) - set(demand)):  # no demand seen: may borrow, holds nothing
        docs.append({"apiVersion": API_VERSION, "kind": "Queue", "metadata": {"name": q},
                     "spec": {"parent": root, "description": "no demand in the fitted part",
                              "quotas": [{"pool": pool.name, "guarantee": {"nvidia.com/gpu": 0}}]}})  # fmt: skip
    for q, d in sorted(demand.items()):
        g = math.floor(want[q] * scale)
        # never below the widest job seen: a limit narrower than a job would strand it for good
        widest = max((j.gpu_total_milli for j in jobs if j.queue == q), default=0) / 1000
        peak = math.ceil(max(_pct(d, 99), widest))
        quota: dict[str, Any] = {"pool": pool.name, "guarantee": {"nvidia.com/gpu": g}}
        quota["borrowingLimit"] = {"nvidia.com/gpu": max(0, min(capacity, peak) - g)}
        desc = f"guarantee p{percentile:g} of hourly demand {want[q]:.1f} GPUs (x{scale:.2f}), limit {peak}"
        docs.append({"apiVersion": API_VERSION, "kind": "Queue", "metadata": {"name": q},
                     "spec": {"parent": root, "description": desc, "quotas": [quota]}})  # fmt: skip
    return docs


def pool_manifest(p: ResourcePool) -> dict[str, Any]:
    spec: dict[str, Any] = {"description": p.description or "kept from the current design"}
    if p.node_selector:
        spec["nodeSelector"] = dict(p.node_selector)
    if p.gpu_models:
        spec["gpuModels"] = list(p.gpu_models)
    if not p.preemptible:
        spec["preemptible"] = False
    if p.price_per_gpu_hour:
        spec["pricePerGPUHour"] = p.price_per_gpu_hour
    return {"apiVersion": API_VERSION, "kind": "ResourcePool", "metadata": {"name": p.name}, "spec": spec}


def preemption_advice(jobs: Sequence[JobSpec]) -> dict[str, Any]:
    """Which task types deserve a non-preemptible pool: serving, and work whose runs are long and
    wide enough that a preemption throws away more than an hour of a node."""
    rows = []
    for typ in sorted({j.type for j in jobs}):
        js = [j for j in jobs if j.type == typ]
        mean_h = float(np.mean([j.duration for j in js])) / 3600
        wide = float(np.mean([j.gpu_total_milli >= 8000 for j in js]))
        reason = "serving: a preemption is an outage" if typ in NON_PREEMPTIBLE_TYPES else ""
        if not reason and mean_h >= 12 and wide >= 0.5:
            reason = f"runs average {mean_h:.1f} h on 8+ GPUs: a preemption loses a node-day"
        rows.append(
            [
                str(typ),
                len(js),
                round(mean_h, 2),
                round(wide, 3),
                bool(reason),
                reason or "preemptible is fine",
            ]
        )
    cols = ["type", "jobs", "meanDurationH", "shareOn8PlusGpus", "nonPreemptible", "why"]
    return {
        "name": "preemption",
        "title": "Which types deserve a non-preemptible pool",
        "columns": cols,
        "rows": rows,
    }


def suggested_design(
    sc: Scenario, fit: Sequence[JobSpec], percentile: float
) -> tuple[list[dict[str, Any]], Variant]:
    """The suggestion's manifests and its simulator variant (same nodes, pools, classes)."""
    from gpupool.manifests import build, parse_documents

    base = sc.variants[0]
    if len(base.pools) != 1:
        names = ", ".join(p.name for p in base.pools)
        raise ValueError(
            f"{sc.source}: the suggestion handles one pool; this design has {len(base.pools)}"
            f" (choose one with --pool: {names})"
        )
    pool = base.pools[0]
    capacity = sum(n.gpu_count for n in base.nodes if pool.selects(n))
    roots = {q.parent for q in base.queues if q.parent} - {q.name for q in base.queues if q.parent}
    root = sorted(roots)[0] if roots else "org"
    leaves = [q.name for q in base.queues if q.name not in {x.parent for x in base.queues}]
    docs = [pool_manifest(pool), *suggest_queues(fit, pool, capacity, root, percentile, leaves)]
    bundle: Bundle = build(parse_documents(yaml.safe_dump_all(docs), "suggested.yaml"))
    return docs, Variant("suggested", base.nodes, base.pools, tuple(bundle.queues), base.priority_classes)


def compare(
    sc: Scenario, rest: Sequence[JobSpec], suggested: Variant, policy: str = "gpupool"
) -> dict[str, Any]:
    """Both designs replayed on the held-out jobs: waits (every wait of a job, as ``plan``
    counts them), utilization, completion."""
    from gpupool.cost.simhistory import MeteredSimulation, job_waits
    from gpupool.sim.metrics import compute
    from gpupool.sim.simulator import Policy

    held = replace(sc, trace=Trace(jobs=list(rest)), variants=[sc.variants[0], suggested], horizon=None)
    keys = ["allocation_ratio", "utilization", "completion_rate", "preemptions"]
    rows = []
    for v in held.variants:
        sim = MeteredSimulation(held, Policy.named(policy), v)
        r = sim.run()
        w = np.asarray(list(job_waits(sim, r.end).values()) or [0.0])
        waits = [round(float(x), 4) for x in (w.mean(), np.percentile(w, 50), np.percentile(w, 95))]
        m = compute(r)
        rows.append([v.name, *waits, *[m[k] for k in keys]])
    return {
        "name": "replay",
        "title": f"Both designs on the held-out {len(rest)} jobs ({policy})",
        "columns": ["design", "wait_mean_s", "wait_p50_s", "wait_p95_s", *keys],
        "rows": rows,
    }


def verdict(replay: dict[str, Any]) -> str | None:
    """None when the suggestion is no worse than today's design on its own replay (mean wait,
    completion rate); else the words that withdraw it."""
    col = {c: i for i, c in enumerate(replay["columns"])}
    today, suggested = replay["rows"][0], replay["rows"][1]
    worse = []
    for key, unit, higher_is_worse in (("wait_mean_s", " s", True), ("completion_rate", "", False)):
        a, b = today[col[key]], suggested[col[key]]
        if (b > a) if higher_is_worse else (b < a):
            worse.append(f"{key} {b:g}{unit} against {a:g}{unit}")
    if not worse:
        return None
    return (
        "no better design found; today's is best on the replay (the suggestion: "
        + ", ".join(worse)
        + "): suggested.yaml not written"
    )
