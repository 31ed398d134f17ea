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
from dataclasses import replace
from datetime import datetime
from decimal import Decimal
from typing import Any

from gpupool.cost.history import History
from gpupool.cost.metering import us_between
from gpupool.manifests import Bundle
from gpupool.model import Node, PriorityClass, Queue, WorkloadType
from gpupool.sim.scenario import Faults, Scenario, Variant
from gpupool.sim.sources import JobSpec, Trace

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
    from gpupool.service.convert import workload_model

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


def plan(
    jobs: Sequence[JobSpec], bundle: Bundle, added: Sequence[Node], prices: dict[str, Decimal]
) -> dict[str, Any]:
    """Both designs replayed (gpupool policy): waits, allocation, utilization, capacity cost."""
    from gpupool.sim.metrics import compute
    from gpupool.sim.simulator import simulate

    if not jobs:
        raise ValueError("no workload in the window can be replayed (none declares a duration or finished)")
    sc = Scenario(
        "plan", "store", variants(bundle, added), Trace(jobs=list(jobs)), Faults(), None, 1, ["gpupool"]
    )
    keys = [
        "wait_mean_s",
        "wait_p95_s",
        "jct_mean_s",
        "allocation_ratio",
        "utilization",
        "completion_rate",
        "preemptions",
    ]
    rows = []
    for v in sc.variants:
        r = simulate(sc, "gpupool", v)
        m = compute(r)
        hours = r.end / 3600
        cost = sum(
            (
                prices.get(p.name, Decimal(0)) * sum(n.gpu_count for n in v.nodes if p.selects(n))
                for p in v.pools
            ),
            Decimal(0),
        ) * Decimal(str(round(hours, 6)))
        gpus = sum(n.gpu_count for n in v.nodes)
        rows.append([v.name, gpus, *[m[k] for k in keys], f"{cost:.2f}"])
    cols = ["design", "gpus", *keys, "capacityCost"]
    return {
        "name": "plan",
        "title": f"Replay of {len(jobs)} recorded workloads, today and with {len(added)} more node(s)",
        "columns": cols,
        "rows": rows,
    }
