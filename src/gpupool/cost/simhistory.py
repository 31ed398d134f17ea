"""A simulator run's history in the shape metering reads, so every report works on a replay.

Why: a POC (验收) is judged before anything runs in production; replaying a trace through the
simulator and reporting it exactly as a live service is reported means the weekly figures of
the trial and of production are the same numbers, computed the same way.

The simulator keeps per job only its latest start, so ``MeteredSimulation`` records each run as
it happens: from its admission until it finishes, is preempted or faults. Simulated seconds
become datetimes from ``base`` (a Monday, so ISO weeks line up).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from gpupool.cost.history import History, Resources, Run, Wait, WorkloadInfo
from gpupool.engine.decisions import Decisions
from gpupool.manifests import Bundle
from gpupool.model import Running
from gpupool.sim.results import RunResult
from gpupool.sim.scenario import Scenario, Variant
from gpupool.sim.simulator import Policy, Simulation

BASE = datetime(2026, 1, 5, tzinfo=UTC)  # a Monday


@dataclass
class _Log:
    open: dict[str, tuple[float, Resources]] = field(default_factory=dict)
    runs: list[tuple[str, float, float | None, str, Resources]] = field(default_factory=list)
    faults: list[tuple[str, float, str]] = field(default_factory=list)


class MeteredSimulation(Simulation):
    """The simulator, also writing down every run (same decisions: it only observes)."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.cost = _Log()
        self._ending = "Succeeded"
        self._models = {n.name: n.gpu_model for n in self.nodes}

    def _started(self, ra: Running, t: float) -> None:
        super()._started(ra, t)
        pods = ra.admission.pods
        g, c, m, _storage, _net = ra.admission.quota_vec()
        model = next((self._models.get(p.node, "") for p in pods), "") or "unknown"
        frac = min((p.gpu_milli for p in pods if p.devices), default=1000)
        devices = sum(len(p.devices) for p in pods)
        self.cost.open[ra.name] = (t, Resources(ra.admission.pool, model, g, devices, frac, c, m))

    def _close(self, name: str, t: float, outcome: str) -> None:
        started = self.cost.open.pop(name, None)
        if started is not None:
            self.cost.runs.append((name, started[0], t, outcome, started[1]))

    def _release(self, name: str, t: float) -> Running | None:
        self._close(name, t, self._ending)
        return super()._release(name, t)

    def _preempt(self, d: Decisions, t: float) -> list[str]:
        for v in d.victims():
            if v in self.running:
                self._close(v, t, "Preempted")
        return super()._preempt(d, t)

    def _fault(self, name: str, t: float, why: str) -> None:
        self._ending = "Pending"  # requeued for a retry, unless none is left (below)
        try:
            super()._fault(name, t, why)
        finally:
            self._ending = "Succeeded"
        if self.jobs[name].status == "failed":
            n, start, end, _, res = self.cost.runs[-1]
            self.cost.runs[-1] = (n, start, end, "Failed", res)
        self.cost.faults.append((name, t, "NodeFailure" if why.startswith("node ") else "AbnormalExit"))


def _at(t: float) -> datetime:
    return BASE + timedelta(microseconds=round(t * 1_000_000))


def history_of(sim: MeteredSimulation) -> History:
    """Runs, waits and failures of a finished simulation."""
    infos: dict[str, WorkloadInfo] = {}
    for rec in sim.jobs.values():
        j = rec.spec
        g = j.gpu_total_milli
        infos[j.name] = WorkloadInfo(
            j.name, j.queue, j.priority_class, str(j.type), g, j.cpu_milli * j.replicas,
            j.memory_mib * j.replicas, "", rec.status, rec.reject_reason,
        )  # fmt: skip
    runs = [Run(n, 0, _at(a), _at(b) if b is not None else None, o, r) for n, a, b, o, r in sim.cost.runs]
    runs += [Run(n, 0, _at(a), None, "Running", r) for n, (a, r) in sim.cost.open.items()]
    runs.sort(key=lambda r: (r.workload, r.start))
    return History(infos, runs, _waits(sim, runs), [(n, _at(t), code) for n, t, code in sim.cost.faults])


def _waits(sim: MeteredSimulation, runs: Sequence[Run]) -> list[Wait]:
    """From submission to the first run, and from each interrupted run to the next."""
    by_job: dict[str, list[Run]] = {}
    for r in runs:
        by_job.setdefault(r.workload, []).append(r)
    out: list[Wait] = []
    for rec in sim.jobs.values():
        if rec.status == "rejected":
            continue
        name = rec.spec.name
        start: datetime | None = _at(rec.spec.submit)
        reason = "waiting for capacity"
        for r in by_job.get(name, []):
            if start is None:
                break
            out.append(Wait(name, start, r.start, True, reason))
            if r.end is None or r.outcome in ("Succeeded", "Failed"):
                start = None
                break
            start, reason = (
                r.end,
                "requeued after preemption" if r.outcome == "Preempted" else "retry after a failure",
            )
        if start is not None and rec.status in ("pending", "waiting"):
            out.append(Wait(name, start, None, False, reason))
    return out


def bundle_of_variant(v: Variant) -> Bundle:
    return Bundle(
        nodes=list(v.nodes),
        pools=list(v.pools),
        queues=list(v.queues),
        priority_classes=list(v.priority_classes),
    )


@dataclass(frozen=True)
class Replay:
    """One simulated run, ready for the reports; ``result`` is the simulator's own account."""

    history: History
    bundle: Bundle
    start: datetime
    end: datetime
    result: RunResult


def replay(scenario: Scenario, policy: str = "gpupool", variant: str | None = None) -> Replay:
    """Run one policy on one variant of a scenario (the baseline by default)."""
    names = [v.name for v in scenario.variants]
    v = (
        scenario.variants[0]
        if variant is None
        else next((x for x in scenario.variants if x.name == variant), None)
    )
    if v is None:
        raise ValueError(f"--variant: unknown variant {variant!r}; one of {', '.join(names)}")
    if policy not in scenario.policies:
        raise ValueError(
            f"--sim-policy: {policy!r} is not run by this scenario; one of {', '.join(scenario.policies)}"
        )
    sim = MeteredSimulation(scenario, Policy.named(policy), v)
    result = sim.run()
    return Replay(history_of(sim), bundle_of_variant(v), BASE, _at(result.end), result)


def job_waits(sim: MeteredSimulation, end: float) -> dict[str, float]:
    """Seconds each job waited in all: to its first start and again after every preemption or
    fault, a wait still open counted to ``end``. Why not the first wait alone: a preempted job
    waits again, and a design that preempts less would look worse on first waits only."""
    out = {rec.spec.name: 0.0 for rec in sim.jobs.values() if rec.status != "rejected"}
    for w in history_of(sim).waits:
        stop = w.end if w.end is not None else _at(end)
        out[w.workload] = out.get(w.workload, 0.0) + (stop - w.start).total_seconds()
    return out
