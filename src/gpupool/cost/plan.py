"""What-ifs on the recorded history (``gpupool plan --add 4xH100-80GB``): replay what the store
saw through the simulator on today's design and on today's design plus some nodes.

Why replay rather than extrapolate: waits on a GPU cluster depend on gang sizes, fragmentation
and preemption, which no formula captures; the simulator runs the same engine the service does,
so "4 more H100 nodes" is answered with the same decisions the service would have taken.

The trace is every workload submitted in the window: its queue, class, type, shape (pods and
GPUs per pod), its submission time, and its duration (the declared ``duration``, else the length
of its last finished run, else how long its current run has lasted).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from decimal import Decimal
from typing import Any

import numpy as np

from gpupool.cost.history import History
from gpupool.cost.limits import DAY_S, Limit
from gpupool.cost.metering import us_between
from gpupool.manifests import Bundle
from gpupool.model import Node, PriorityClass, Queue, WorkloadType
from gpupool.sim.scenario import Faults, Scenario, Variant
from gpupool.sim.sources import JobSpec, Trace

#: a replay of less than one daily cycle may have missed the daily peak its waits depend on
PLAN_LIMIT = Limit("plan", DAY_S, "one daily cycle of submissions, so the replay holds the daily peak")

ADD_RE = re.compile(r"^(?P<n>[1-9][0-9]{0,3})x(?P<model>[A-Za-z0-9][-A-Za-z0-9_.]*)$")


def parse_add(values: Sequence[str], nodes: Sequence[Node]) -> list[Node]:
    """``N x MODEL``: N nodes shaped like today's nodes of that GPU model (labels included, so
    they join the same pools)."""
    out: list[Node] = []
    for v in values:
        m = ADD_RE.match(v)
        if m is None:
            raise ValueError(f"--add {v!r}: expected COUNTxGPU-MODEL, e.g. 4xH100-80GB (COUNT nodes)")
        like = next((n for n in nodes if n.gpu_model == m["model"]), None)
        if like is None:
            models = sorted({n.gpu_model for n in nodes})
            raise ValueError(
                f"--add {v!r}: no node with GPU model {m['model']!r} to copy; one of {', '.join(models)}"
            )
        for _ in range(int(m["n"])):
            out.append(replace(like, name=f"plan-{m['model'].lower()}-{len(out):03d}"))
    return out


def jobs_of(history: History, workloads: Sequence[Any], bundle: Bundle, start: datetime) -> list[JobSpec]:
    """The store's workloads submitted since ``start`` as a simulator trace."""
    from gpupool.manifests.convert import workload_model

    last_run: dict[str, float] = {}
    for r in history.runs:
        if r.end is not None and r.outcome == "Succeeded":
            last_run[r.workload] = us_between(r.start, r.end) / 1e6
    jobs = []
    for w in workloads:
        if w.submitted_at < start or w.name not in history.workloads:
            continue
        m = workload_model(w.manifest, bundle.priority_classes, float(w.seq), strict=False)
        if not m.pod_groups:
            continue
        duration = m.expected_duration_s or last_run.get(w.name)
        if not duration:
            continue  # never finished and declares no duration: nothing to replay
        pods = sum(g.replicas for g in m.pod_groups)
        req = max(m.pod_groups, key=lambda g: g.request.total_gpu_milli).request
        jobs.append(
            JobSpec(
                w.name, w.queue, us_between(start, w.submitted_at) / 1e6, float(duration),
                gpus=req.gpus, replicas=pods, gpu_milli=0 if req.gpus else req.gpu_milli,
                cpu_milli=req.cpu_milli, memory_mib=req.memory_mib, type=WorkloadType(m.type),
                priority_class=m.priority_class, gpu_models=m.gpu_models, source="store",
            )
        )  # fmt: skip
    return jobs


def variants(bundle: Bundle, added: Sequence[Node]) -> list[Variant]:
    """Today's design, and the planned one: the added nodes, and their capacity given to the
    cohort roots that hold each pool (a root cannot borrow, so without that the tree could not
    use a single new GPU); leaf guarantees stay as they are and borrow it."""
    classes: tuple[PriorityClass, ...] = tuple(bundle.priority_classes)
    base = Variant("today", tuple(bundle.nodes), tuple(bundle.pools), tuple(bundle.queues), classes)
    extra: dict[str, tuple[int, int, int]] = {}
    for p in bundle.pools:
        mine = [n for n in added if p.selects(n)]
        if mine:
            extra[p.name] = (
                sum(n.gpu_count for n in mine) * 1000,
                sum(n.cpu_milli for n in mine),
                sum(n.memory_mib for n in mine),
            )
    queues = tuple(_grown(q, extra) if q.parent is None else q for q in bundle.queues)
    return [base, replace(base, name="planned", nodes=(*bundle.nodes, *added), queues=queues)]


def _grown(q: Queue, extra: dict[str, tuple[int, int, int]]) -> Queue:
    quotas = []
    for quota in q.quotas:
        add = extra.get(quota.pool)
        if add is None:
            quotas.append(quota)
            continue
        g, c, m, storage, net = quota.guarantee
        grown = (g + add[0], c + add[1] if c else 0, m + add[2] if m else 0, storage, net)
        quotas.append(replace(quota, guarantee=grown))
    return replace(q, quotas=tuple(quotas))


KEYS = ["wait_mean_s", "wait_p95_s", "first_wait_mean_s", "jct_mean_s", "allocation_ratio"]
KEYS += ["utilization", "completion_rate", "preemptions", "lost_gpu_h"]


@dataclass(frozen=True)
class Replayed:
    """One design's replay: its table row and, per job, the seconds waited and times preempted."""

    row: list[Any]
    waits: dict[str, float]
    preempted: dict[str, int]


def replay_design(sc: Scenario, v: Variant, prices: dict[str, Decimal]) -> Replayed:
    """One design through the simulator (gpupool policy), every wait of every job counted."""
    from gpupool.cost.simhistory import MeteredSimulation, job_waits
    from gpupool.sim.metrics import compute
    from gpupool.sim.simulator import Policy

    sim = MeteredSimulation(sc, Policy.named("gpupool"), v)
    r = sim.run()
    m = compute(r)
    waits = job_waits(sim, r.end)
    w = np.asarray(list(waits.values()) or [0.0])
    m |= {"wait_mean_s": round(float(w.mean()), 4), "wait_p95_s": round(float(np.percentile(w, 95)), 4)}
    m |= {"first_wait_mean_s": compute(r)["wait_mean_s"]}
    m |= {"lost_gpu_h": round(sum(j.lost_gpu_s for j in r.jobs) / 3600, 3)}
    hours = Decimal(str(round(r.end / 3600, 6)))
    cost = hours * sum(
        (prices.get(p.name, Decimal(0)) * sum(n.gpu_count for n in v.nodes if p.selects(n)) for p in v.pools),
        Decimal(0),
    )
    row = [v.name, sum(n.gpu_count for n in v.nodes), *[m[k] for k in KEYS], f"{cost:.2f}"]
    return Replayed(row, waits, {j.spec.name: j.preempted for j in r.jobs})


def explain(today: Replayed, planned: Replayed) -> str | None:
    """Why the planned design waits longer on the replay than today's, in the jobs' terms (None
    when it does not): which jobs waited longer, and whether today's preemptions made room for
    them that the added capacity, preempting less, did not."""
    a, b = today.row[2], planned.row[2]
    if b <= a:
        return None
    worse = sorted((n for n in planned.waits if planned.waits[n] > today.waits.get(n, 0.0) + 1e-6),
                   key=lambda n: today.waits.get(n, 0.0) - planned.waits[n])  # fmt: skip
    spared = sorted(n for n, k in today.preempted.items() if k > planned.preempted.get(n, 0))
    text = (
        f"with more capacity the replayed mean wait is longer ({a:.0f} s -> {b:.0f} s):"
        f" {len(worse)} job(s) waited longer ({', '.join(worse[:5])}{', ...' if len(worse) > 5 else ''})"
    )
    if spared:
        text += (
            f"; today's design preempted {', '.join(spared[:5])} ({today.row[KEYS.index('lost_gpu_h') + 2]}"
            " GPU-h thrown away) and ran waiting work in their place, the planned one let them run on"
            " and later work queued behind them"
        )
    return text + ": an effect of this trace's order of admissions, not a shortage the nodes cause"


def plan(
    jobs: Sequence[JobSpec], bundle: Bundle, added: Sequence[Node], prices: dict[str, Decimal]
) -> dict[str, Any]:
    """Both designs replayed (gpupool policy): waits (every wait, first and after preemptions),
    allocation, utilization, capacity cost; ``note`` says why when more capacity waits longer."""
    if not jobs:
        raise ValueError("no workload in the window can be replayed (none declares a duration or finished)")
    sc = Scenario(
        "plan", "store", variants(bundle, added), Trace(jobs=list(jobs)), Faults(), None, 1, ["gpupool"]
    )
    today, planned = (replay_design(sc, v, prices) for v in sc.variants)
    return {
        "name": "plan",
        "title": f"Replay of {len(jobs)} recorded workloads, today and with {len(added)} more node(s)",
        "columns": ["design", "gpus", *KEYS, "capacityCost"],
        "rows": [today.row, planned.row],
        "note": explain(today, planned),
    }
