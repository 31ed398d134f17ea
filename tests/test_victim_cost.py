"""Cost-aware preemption (``engine/victim_cost.py``): victims by lost work, waiting for work
about to end instead of evicting it, the cooldown; a property (waiting never delays the
preemptor beyond its horizon) and the Kueue baseline at small scale (no preemption storm)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.engine import decide
from gpupool.engine.preemption import candidate_order
from gpupool.engine.victim_cost import duration_octave, wait_horizon
from gpupool.manifests import build, parse_documents
from gpupool.model import (
    Admission,
    EngineConfig,
    PodGroup,
    PodPlacement,
    PodRequest,
    Running,
    Snapshot,
    Workload,
)
from gpupool.sim.metrics import compute
from gpupool.sim.scenario import load_scenario
from gpupool.sim.simulator import simulate

KUEUE = Path(__file__).resolve().parents[1] / "examples" / "sim" / "kueue-baseline.yaml"

CLUSTER = """
apiVersion: gpupool.io/v1alpha1
kind: Cluster
metadata: {name: c}
spec: {nodes: [{name: n0, gpu: {model: none, count: 0, memory: 0}, cpu: CPUS, memory: 64Gi}]}
---
apiVersion: gpupool.io/v1alpha1
kind: ResourcePool
metadata: {name: cpu}
spec: {}
---
apiVersion: gpupool.io/v1alpha1
kind: Queue
metadata: {name: a}
spec: {quotas: [{pool: cpu, guarantee: {cpu: CPUS}}]}
"""


def _base(cpus: int = 10) -> Snapshot:
    b = build(parse_documents(CLUSTER.replace("CPUS", str(cpus)), "test"))
    return Snapshot(nodes=tuple(b.nodes), pools=tuple(b.pools), queues=tuple(b.queues))


def _wl(name: str, cpu: int, prio: int, dur: float | None, evictions: int = 0) -> Workload:
    req = PodRequest(cpu_milli=cpu * 1000, memory_mib=1)
    return Workload(
        name, "a", (PodGroup("main", 1, req),), priority=prio, expected_duration_s=dur, evictions=evictions
    )


def _run(w: Workload, at: float) -> Running:
    cpu = w.pod_groups[0].request.cpu_milli
    pod = PodPlacement("main", 0, "n0", (), 0, 0, cpu, 1)
    return Running(w, Admission("cpu", (pod,), False, at))


def _cycle(running: list[Running], pending: list[Workload], now: float, **cfg: object) -> tuple[bool, bool]:
    """(was the pending head admitted, was anything preempted)."""
    snap = replace(
        _base(),
        running=tuple(running),
        pending=tuple(pending),
        now=now,
        config=EngineConfig(**cfg),  # type: ignore[arg-type]
    )
    d = decide(snap)
    return any(a.workload == pending[0].name for a in d.admitted), bool(d.preempted)


# -- the order --------------------------------------------------------------------------------
def test_with_now_evictions_and_time_left_order_within_a_priority() -> None:
    # equal run time: the one evicted before goes last; equal cost: the one with more to run first
    bounced = _run(_wl("bounced", 1, 1, 100, evictions=1), at=5.0)  # 5 s x 2 = 10
    fresh = _run(_wl("fresh", 8, 1, 100), at=5.0)  # 5 s x 1 = 5
    long = _run(_wl("long", 1, 1, 1000), at=0.0)  # 10 s, ends at 1000
    short = _run(_wl("short", 1, 1, 20), at=0.0)  # 10 s, ends at 20
    lower = _run(_wl("lower", 8, 0, 100), at=0.0)  # lower priority: first whatever it lost

    def order(now: float | None) -> list[str]:
        rs = [bounced, fresh, long, short, lower]
        return [r.name for r in sorted(rs, key=lambda r: candidate_order(r, "other", now))]

    assert order(None) == ["lower", "bounced", "fresh", "long", "short"]  # age, then name
    # costs at 10: fresh 5; long, bounced, short 10 each, then by expected end 1000, 105, 20
    assert order(10.0) == ["lower", "fresh", "long", "bounced", "short"]


def test_a_workload_evicted_before_is_dearer_to_evict_again() -> None:
    fresh = _run(_wl("fresh", 2, 1, 100), at=4.0)  # 6 s x 1 = 6
    bounced = _run(_wl("bounced", 2, 1, 100, evictions=3), at=7.0)  # 3 s x 4 = 12
    got = sorted([fresh, bounced], key=lambda r: candidate_order(r, "other", 10.0))
    assert [r.name for r in got] == ["fresh", "bounced"]  # age alone would evict bounced first


# -- waiting and the cooldown -----------------------------------------------------------------
def test_waits_for_work_about_to_end_instead_of_evicting_it() -> None:
    victim = _run(_wl("low", 10, 0, 10.0), at=0.0)  # ends at 10
    urgent = _wl("urgent", 10, 5, 100.0)  # horizon 0.3 x 64 = 19.2 s
    assert wait_horizon(EngineConfig(), urgent) == 0.3 * 64
    assert _cycle([victim], [urgent], now=5.0) == (False, False)  # waits
    assert _cycle([victim], [urgent], now=5.0, preemption_cost=False) == (True, True)
    # the wait ends with the victim: at its end the urgent workload is admitted at once
    assert _cycle([], [urgent], now=10.0) == (True, False)


def test_no_wait_for_work_ending_beyond_the_horizon_or_overdue() -> None:
    urgent = _wl("urgent", 10, 5, 100.0)
    long = _run(_wl("long", 10, 0, 1000.0), at=0.0)
    assert _cycle([long], [urgent], now=5.0) == (True, True)
    overdue = _run(_wl("late", 10, 0, 3.0), at=0.0)  # expected at 3, still running at 5
    assert _cycle([overdue], [urgent], now=5.0) == (True, True)
    unknown = _wl("unknown", 10, 5, None)  # no declared duration: no horizon
    assert _cycle([_run(_wl("low", 10, 0, 10.0), at=0.0)], [unknown], now=5.0) == (True, True)


def test_cooldown_protects_recently_admitted_work() -> None:
    urgent = _wl("urgent", 10, 5, 1.0)  # horizon 0.3 s: too short to wait here
    recent = _run(_wl("recent", 10, 0, 1000.0), at=95.0)
    assert _cycle([recent], [urgent], now=100.0, preemption_cooldown_s=60.0) == (False, False)
    assert _cycle([recent], [urgent], now=160.0, preemption_cooldown_s=60.0) == (True, True)
    assert _cycle([recent], [urgent], now=100.0) == (True, True)  # off by default


def test_duration_octave() -> None:
    got = [duration_octave(d) for d in (None, 0.0, 0.2, 1.0, 1.9, 2.0, 100.0)]
    assert got == [None, None, -3, 0, 0, 1, 6]


# -- the property -------------------------------------------------------------------------------
_job = st.tuples(st.integers(1, 6), st.floats(0.0, 50.0), st.floats(0.5, 80.0))


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    st.lists(_job, min_size=1, max_size=5), st.integers(1, 10), st.floats(1.0, 200.0), st.floats(0.0, 50.0)
)
def test_waiting_never_delays_the_preemptor_beyond_its_horizon(
    jobs: list[tuple[int, float, float]], need: int, dur: float, now: float
) -> None:
    """Whenever the cost model waits where eager preemption would evict, the preemptor fits
    once the work expected to end within its horizon has ended: at ``now + horizon`` at the
    latest (nothing else pending). And it never evicts when eager preemption would not."""
    running = [_run(_wl(f"r{i}", c, 0, d), at=min(a, now)) for i, (c, a, d) in enumerate(jobs)]
    running = [r for r in running if r.admission.admitted_at + (r.workload.expected_duration_s or 0) > now]
    if sum(r.workload.pod_groups[0].request.cpu_milli for r in running) > 10_000:
        return  # more than the node holds: not a state the engine can be in
    urgent = _wl("urgent", need, 5, dur)
    cost = _cycle(running, [urgent], now)
    eager = _cycle(running, [urgent], now, preemption_cost=False)
    if cost[1]:
        assert eager[1]
    if eager[1] and not cost[0]:  # it waited
        h = wait_horizon(EngineConfig(), urgent)
        left = [
            r for r in running if r.admission.admitted_at + (r.workload.expected_duration_s or 0) > now + h
        ]
        assert _cycle(left, [urgent], now + h)[0]


# -- the Kueue baseline, small -------------------------------------------------------------------
def _small_kueue(tmp_path: Path) -> Path:
    doc = yaml.safe_load(KUEUE.read_text())
    spec = doc["spec"]
    spec["cluster"]["cohorts"][0]["count"] = 2
    spec["cluster"]["documents"][0]["spec"]["nodes"][0]["cpu"] = 240
    for s in spec["workload"]["sets"]:
        s["count"] = max(1, round(s["count"] * 0.2))
    p = tmp_path / "kueue-small.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


def test_kueue_baseline_small_reaches_its_physical_limit_without_a_storm(tmp_path: Path) -> None:
    sc = load_scenario(_small_kueue(tmp_path))
    cost = compute(simulate(sc, "gpupool"))
    eager = compute(simulate(sc, "gpupool-eager-preemption"))
    assert eager["makespan_over_limit"] > 1.1  # the storm the cost model is for
    assert cost["makespan_over_limit"] <= 1.05
    assert cost["preemption_lost_share"] < eager["preemption_lost_share"] / 2
    # the high class waits at most its horizon (0.3 x 1 s) for work about to end
    assert cost["per_class"]["large"]["wait_p90_s"] <= 0.3 + 1e-6
    assert cost["per_class"]["large"]["evictions_per_job"] == 0


def test_no_preemption_loops(tmp_path: Path) -> None:
    """No two workloads ever evict each other (in either order, at any time)."""
    sc = load_scenario(_small_kueue(tmp_path))
    for policy in ("gpupool", "gpupool-eager-preemption"):
        r = simulate(sc, policy)
        pairs = {(e.subject, e.detail.rsplit(" by ", 1)[1]) for e in r.events if e.kind == "preempted"}
        assert pairs and not {(b, a) for a, b in pairs} & pairs, policy


# -- the controller counts evictions ---------------------------------------------------------------
def test_the_controller_requeues_a_victim_with_one_more_eviction() -> None:
    from datetime import UTC, datetime
    from types import SimpleNamespace

    from gpupool.service.controller_commit import Commit

    rec = SimpleNamespace(
        seq=3, queue="a", owner="o", submitted_at=datetime(2026, 1, 1, tzinfo=UTC), manifest={}, reason=""
    )
    ctl = SimpleNamespace(
        store=SimpleNamespace(get_workload=lambda name: rec),
        pending={},
        _stored_reasons={},
        _requeue=lambda names, why, now: None,
    )
    victim = _run(_wl("v", 1, 0, 10.0, evictions=1), at=0.0)
    Commit._requeue_victims(ctl, {"v": victim}, 5.0)  # type: ignore[arg-type]
    assert ctl.pending["v"].model.evictions == 2
