"""Where ``gpupool profile`` takes its work and its current design from, besides a Scenario:
the store's recorded history (``--from-store``) and a Slurm ``sacct`` export (``--sacct``).

Why one shape for all of them: the profile and the suggestion work on a simulator
:class:`Scenario` (a design and a trace), so each input becomes one, and what an input says
beyond the trace — waits actually seen, outcomes, GPU models — becomes ``observed`` rows
(queue, type, GPU model, wait seconds or None, outcome) for one table.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

import numpy as np

from gpupool.cost.history import History
from gpupool.cost.metering import us_between
from gpupool.manifests import Bundle
from gpupool.sim.scenario import Faults, Scenario, Variant
from gpupool.sim.sources import JobSpec, Trace

#: (queue, task type, GPU model, wait seconds or None, outcome)
Observed = tuple[str, str, str, float | None, str]


@dataclass
class ProfileInput:
    """A design and its trace, and what was observed of the work beyond the trace."""

    scenario: Scenario
    observed: list[Observed] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: the wall-clock time of the trace's second 0 (None: unknown, the rhythm is in trace time)
    origin: datetime | None = None


def scenario_of(bundle: Bundle, jobs: Sequence[JobSpec], source: str) -> Scenario:
    """A one-variant Scenario ("baseline") of a configuration and a trace."""
    v = Variant(
        "baseline",
        tuple(bundle.nodes),
        tuple(bundle.pools),
        tuple(bundle.queues),
        tuple(bundle.priority_classes),
    )
    return Scenario("profile", source, [v], Trace(jobs=list(jobs)), Faults(), None, 1, ["gpupool"])


def only_pool(sc: Scenario, pool: str, job_pool: dict[str, str]) -> Scenario:
    """The design cut to one pool (its nodes, and the queues with a quota there, their quotas
    cut to it) and the jobs that ran there (``job_pool``: job name -> pool; a job never placed
    is kept when it named no other pool)."""
    base = sc.variants[0]
    chosen = next((p for p in base.pools if p.name == pool), None)
    if chosen is None:
        names = ", ".join(p.name for p in base.pools)
        raise ValueError(f"--pool: {pool!r} is not a pool of the design ({names})")
    queues = []
    for q in base.queues:
        quotas = tuple(x for x in q.quotas if x.pool == pool)
        if quotas:
            queues.append(replace(q, quotas=quotas))
    kept = {q.name for q in queues}
    queues = [replace(q, parent=None) if q.parent not in kept else q for q in queues]
    v = replace(
        base,
        nodes=tuple(n for n in base.nodes if chosen.selects(n)),
        pools=(chosen,),
        queues=tuple(queues),
    )
    jobs = [j for j in sc.trace.jobs if job_pool.get(j.name, pool) == pool]
    return replace(sc, variants=[v], trace=Trace(jobs=jobs))


def from_store(store: Any, start: datetime, end: datetime, pool: str | None = None) -> ProfileInput:
    """The store's configuration and the workloads submitted in [start, end) as a trace."""
    from gpupool.cost.history import load_history
    from gpupool.cost.plan import jobs_of
    from gpupool.cost.reports import bundle_of

    bundle = bundle_of(store)
    history = load_history(store, bundle)
    records = [w for w in store.list_workloads() if w.submitted_at < end]
    jobs = jobs_of(history, records, bundle, start)
    sc = scenario_of(bundle, jobs, "store")
    placed = _pools_of(history)
    if pool is not None:
        sc = only_pool(sc, pool, placed)
    names = {j.name for j in sc.trace.jobs}
    notes = []
    left = sum(1 for w in records if w.submitted_at >= start) - len(jobs)
    if left:
        notes.append(
            f"{left} workload(s) in the window neither declare a duration nor finished: not replayed"
        )
    return ProfileInput(sc, _observed_in_store(history, names), notes, start)


def _pools_of(history: History) -> dict[str, str]:
    out = {name: w.pool_hint for name, w in history.workloads.items() if w.pool_hint}
    for r in history.runs:
        out[r.workload] = r.res.pool  # where it ran beats what it asked for
    return out


def _observed_in_store(history: History, names: set[str]) -> list[Observed]:
    """Per workload: the first admitted wait, the GPU model of its first run, and its outcome
    (the reason code of its last failure, else its phase)."""
    wait: dict[str, float] = {}
    for w in history.waits:
        if w.admitted and w.end is not None and w.workload not in wait:
            wait[w.workload] = us_between(w.start, w.end) / 1e6
    model: dict[str, str] = {}
    for r in history.runs:
        model.setdefault(r.workload, r.res.gpu_model)
    failed = {name: reason for name, _, reason in sorted(history.failures, key=lambda f: f[1])}
    out: list[Observed] = []
    for name in sorted(names):
        info = history.workloads[name]
        outcome = failed.get(name, info.phase)
        out.append((info.queue, info.task_type, model.get(name, ""), wait.get(name), outcome))
    return out


def observed_table(observed: Sequence[Observed]) -> dict[str, Any]:
    """Waits and outcomes as they happened, per queue, task type and GPU model."""
    groups: dict[tuple[str, str, str], list[Observed]] = defaultdict(list)
    for o in observed:
        groups[(o[0], o[1], o[2] or "-")].append(o)
    rows = []
    for (queue, typ, model), os_ in sorted(groups.items()):
        waits = np.array([o[3] for o in os_ if o[3] is not None], dtype=float)
        outcomes = Counter(o[4] for o in os_).most_common(3)
        rows.append(
            [
                queue,
                typ,
                model,
                len(os_),
                round(float(np.percentile(waits, 50)) / 3600, 3) if len(waits) else None,
                round(float(np.percentile(waits, 95)) / 3600, 3) if len(waits) else None,
                ", ".join(f"{k} {n}" for k, n in outcomes),
            ]
        )
    cols = ["queue", "type", "gpuModel", "jobs", "waitP50H", "waitP95H", "topOutcomes"]
    return {"name": "observed", "title": "Waits and outcomes as recorded", "columns": cols, "rows": rows}


__all__ = ["Observed", "ProfileInput", "from_store", "observed_table", "only_pool", "scenario_of"]
