"""Time-scale invariance: the engine's and the simulator's decisions do not depend on the unit
of time (docs/engine.md, "Time-scale invariance").

Why: every duration-based rule is relative to something the user sees (a workload's declared
duration, the cycle interval, a declared setting); one that held an absolute number of seconds
(the preemption wait's power-of-two rounding and its 600 s cap) gave the Kueue baseline 1.026x
its physical limit in milliseconds and 1.150x in seconds. So: a state or a scenario with every
time multiplied by ``k`` (1/1000, 1, 1000) gets the same decisions in the same order.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.engine import decide
from gpupool.model import EngineConfig, Snapshot
from gpupool.sim.scenario import load_scenario
from gpupool.sim.simulator import simulate
from tests.engine.clusters import POOL, job, nodes, queues, running

SCALES = (1 / 1000, 1.0, 1000.0)

# -- the engine: one cycle ------------------------------------------------------------------------
#: a running job: (queue, GPUs, priority, admitted at, declared duration, evictions before)
_run = st.tuples(
    st.sampled_from("ab"), st.integers(1, 8), st.integers(0, 2), st.integers(0, 40), st.integers(1, 80),
    st.integers(0, 2),
)  # fmt: skip
#: a pending job: (queue, GPUs, priority, declared duration or None, class preemptionWait or None)
_pend = st.tuples(
    st.sampled_from("ab"), st.integers(1, 8), st.integers(0, 4), st.none() | st.integers(1, 200),
    st.none() | st.integers(0, 30),
)  # fmt: skip


def _snapshot(
    runs: list[tuple[str, int, int, int, int, int]],
    pend: list[tuple[str, int, int, int | None, int | None]],
    now: int,
    cooldown: int,
    k: float,
) -> Snapshot:
    """The state with every time (admission, arrival, duration, wait, now, cooldown) times ``k``;
    running jobs first-fit on two 8-GPU nodes (those that do not fit are left out)."""
    free = {"n0": list(range(8)), "n1": list(range(8))}
    rs = []
    for i, (q, g, prio, at, dur, ev) in enumerate(runs):
        node = next((n for n, devs in free.items() if len(devs) >= g), None)
        if node is None or min(at, now) + dur <= now:
            continue  # does not fit, or already ended
        devs = tuple(free[node][:g])
        del free[node][:g]
        w = job(f"r{i}", q, g, prio=prio, t=at * k, expected_duration_s=dur * k, evictions=ev)
        rs.append(running(w, node, devs, at=min(at, now) * k))
    ps = tuple(
        job(
            f"p{i}", q, g, prio=prio, t=(now - i % 3) * k,
            expected_duration_s=None if dur is None else dur * k,
            preemption_wait_s=None if wait is None else wait * k,
        )
        for i, (q, g, prio, dur, wait) in enumerate(pend)
    )  # fmt: skip
    cfg = EngineConfig(preemption_cooldown_s=cooldown * k)
    return Snapshot(
        nodes(2),
        (POOL,),
        queues({"a": 8, "b": 8}, 16),
        running=tuple(rs),
        pending=ps,
        now=now * k,
        config=cfg,
    )


def _engine_decisions(snap: Snapshot) -> tuple[Any, ...]:
    """What a cycle decided, without its reason texts (they may state a time in seconds)."""
    d = decide(snap)
    return (
        [(a.workload, a.pool, a.pods, a.borrowing, a.after_evicting) for a in d.admitted],
        [(p.preemptor, [(v.workload, v.rule) for v in p.victims]) for p in d.preempted],
        [(p.workload, p.code) for p in d.pending],
    )


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    st.lists(_run, max_size=8),
    st.lists(_pend, min_size=1, max_size=5),
    st.integers(0, 40),
    st.sampled_from([0, 0, 5]),
)
def test_a_cycle_decides_alike_at_every_time_scale(
    runs: list[tuple[str, int, int, int, int, int]],
    pend: list[tuple[str, int, int, int | None, int | None]],
    now: int,
    cooldown: int,
) -> None:
    got = [_engine_decisions(_snapshot(runs, pend, now, cooldown, k)) for k in SCALES]
    assert got[0] == got[1] == got[2]


def test_the_wait_horizon_scales_with_the_duration() -> None:
    """The case the Kueue baseline in seconds hit: a 1000 s preemptor waits for work ending
    300 s from now as a 1 s one waits for work ending in 0.3 s (the power-of-two rounding gave
    153.6 s, and the 600 s cap cut day-long jobs to ten minutes)."""
    from gpupool.engine.preemption.victim_cost import wait_horizon

    for k in SCALES:
        w = job("w", "a", 1, expected_duration_s=1.0 * k)
        assert abs(wait_horizon(EngineConfig(), w) - 0.3 * k) <= 1e-12 * k
    day = job("w", "a", 1, expected_duration_s=86_400.0)
    assert wait_horizon(EngineConfig(), day) > 600.0  # relative: no hidden cap in seconds
    assert wait_horizon(EngineConfig(preemption_wait_s=600.0), day) == 600.0  # a declared one


# -- the simulator: a whole scenario --------------------------------------------------------------
#: a workload set: (queue, count, interval, start, duration, CPUs, priority class); times in 0.1 s
_set = st.tuples(
    st.sampled_from(["q-0-0", "q-0-1", "q-0-*"]), st.integers(1, 6), st.integers(0, 12),
    st.integers(0, 10), st.integers(1, 25), st.integers(1, 10), st.sampled_from(["lo", "mid", "hi"]),
)  # fmt: skip


def _scenario_doc(
    sets: list[tuple[str, int, int, int, int, int, str]], interval: int, hi_wait: int | None, k: float
) -> dict[str, Any]:
    """A CPU-only scenario with every time (set interval, start and duration, the schedule
    interval, a class's preemptionWait) in units of ``0.1 s x k``."""

    def t(units: int) -> float:
        return units * 0.1 * k  # seconds: every field takes a number of seconds

    hi: dict[str, Any] = {"value": 9}
    if hi_wait is not None:
        hi["preemptionWait"] = t(hi_wait)
    classes = {"lo": {"value": 1}, "mid": {"value": 5}, "hi": hi}
    docs = [
        {"apiVersion": "gpupool.io/v1alpha1", "kind": "Cluster", "metadata": {"name": "c"},
         "spec": {"nodes": [{"name": f"n{i}", "gpu": {"model": "none", "count": 0, "memory": 0},
                             "cpu": 12, "memory": "64Gi"} for i in range(2)]}},
        {"apiVersion": "gpupool.io/v1alpha1", "kind": "ResourcePool", "metadata": {"name": "cpu"}, "spec": {}},
        *({"apiVersion": "gpupool.io/v1alpha1", "kind": "PriorityClass", "metadata": {"name": n}, "spec": s}
          for n, s in classes.items()),
    ]  # fmt: skip
    cohort = {
        "name": "co", "count": 1, "pool": "cpu",
        "queues": {"name": "q", "count": 2, "guarantee": {"cpu": 12}, "borrowingLimit": {"cpu": 12},
                   "preemption": {"withinQueue": "LowerPriority", "reclaimWithinCohort": "Any"}},
    }  # fmt: skip
    wsets = [
        {"className": f"s{i}", "queues": [q], "count": n, "interval": t(iv), "start": t(st_),
         "duration": t(dur), "cpu": cpu, "priorityClass": pc}
        for i, (q, n, iv, st_, dur, cpu, pc) in enumerate(sets)
    ]  # fmt: skip
    spec = {
        "seed": 1, "policies": ["gpupool"], "samples": 10, "scheduleInterval": t(interval),
        "cluster": {"documents": docs, "cohorts": [cohort]}, "workload": {"sets": wsets},
    }  # fmt: skip
    return {"apiVersion": "gpupool.io/v1alpha1", "kind": "Scenario", "metadata": {"name": "s"}, "spec": spec}


def _sim_decisions(doc: dict[str, Any], k: float) -> tuple[Any, ...]:
    """The run's event log in order and every job's starts, finish and preemptions, with the
    times in the unscaled unit (rounded: the same instants, up to float noise)."""
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "s.yaml"
        p.write_text(yaml.safe_dump(doc))
        r = simulate(load_scenario(p), "gpupool")

    def u(x: float | None) -> float | None:
        return None if x is None else round(x / k, 6)

    events = [(e.kind, e.subject, e.detail, u(e.time)) for e in r.events]
    jobs = [(j.spec.name, u(j.first_start), u(j.finish), j.preempted, j.status) for j in r.jobs]
    return events, jobs


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    st.lists(_set, min_size=1, max_size=4),
    st.sampled_from([0, 0, 1, 3]),
    st.none() | st.integers(0, 5),
)
def test_a_scenario_runs_alike_at_every_time_scale(
    sets: list[tuple[str, int, int, int, int, int, str]], interval: int, hi_wait: int | None
) -> None:
    got = [_sim_decisions(_scenario_doc(sets, interval, hi_wait, k), k) for k in SCALES]
    assert got[0] == got[1], "x1/1000 differs from x1"
    assert got[2] == got[1], "x1000 differs from x1"


def test_scaled_copy_is_the_same_scenario_but_for_its_unit() -> None:
    """The helper itself: at x1000 every time is a thousand times longer."""
    a = _scenario_doc([("q-0-0", 2, 3, 1, 5, 4, "hi")], 1, 2, 1.0)
    b = _scenario_doc([("q-0-0", 2, 3, 1, 5, 4, "hi")], 1, 2, 1000.0)
    assert a["spec"]["workload"]["sets"][0]["duration"] == 0.5
    assert b["spec"]["workload"]["sets"][0]["duration"] == 500.0
    assert b["spec"]["cluster"]["documents"][-1]["spec"]["preemptionWait"] == 200.0
