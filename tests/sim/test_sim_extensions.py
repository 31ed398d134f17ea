"""Simulator extensions for CPU-only scenarios (Kueue's performance baseline needs each):
metrics that count CPU when the cluster has no GPUs, sub-second durations, nodes far above 64
units, per-class breakdowns, per-job admission times in the JSON, and the compact cohort and
workload sets."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.sim.metrics import compute
from gpupool.sim.runner import run_scenario, to_json
from gpupool.sim.scenario import load_scenario
from gpupool.sim.simulator import simulate
from gpupool.sim.sources import SimInputError

KUEUE = Path(__file__).resolve().parents[2] / "examples" / "sim" / "kueue-baseline.yaml"

SCENARIO = """
apiVersion: gpupool.io/v1alpha1
kind: Scenario
metadata: {name: cpu-only}
spec:
  policies: [POLICIES]
  cluster:
    documents:
      - {apiVersion: gpupool.io/v1alpha1, kind: Cluster, metadata: {name: c},
         spec: {nodes: [{name: big, gpu: {model: none, count: 0, memory: 0}, cpu: CPUS, memory: 1Ti}]}}
      - {apiVersion: gpupool.io/v1alpha1, kind: ResourcePool, metadata: {name: cpu}, spec: {}}
      - {apiVersion: gpupool.io/v1alpha1, kind: PriorityClass, metadata: {name: lo}, spec: {value: 1}}
      - {apiVersion: gpupool.io/v1alpha1, kind: PriorityClass, metadata: {name: hi}, spec: {value: 9}}
    cohorts:
      - {name: co, count: 1, pool: cpu,
         queues: {name: q, count: 2, guarantee: {cpu: GUAR}, borrowingLimit: {cpu: GUAR}}}
  workload:
    sets:
SETS
"""


def _scenario(tmp_path: Path, sets: str, cpus: int = 20, policies: str = "gpupool") -> Path:
    text = (
        SCENARIO.replace("POLICIES", policies)
        .replace("CPUS", str(cpus))
        .replace("GUAR", str(cpus // 2))
        .replace("SETS", sets)
    )
    p = tmp_path / "s.yaml"
    p.write_text(text)
    return p


PREEMPTING = """
      - {className: filler, queues: [q-0-1], count: 2, interval: 0, duration: 2s, cpu: 10, priorityClass: lo}
      - {className: urgent, queues: [q-0-0], count: 1, interval: 0, start: 500ms, duration: 1s,
         cpu: 10, priorityClass: hi}
"""


def test_cpu_only_metrics_count_cpu(tmp_path: Path) -> None:
    # two 10-CPU fillers fill the 20-CPU node; the urgent job reclaims its queue's guarantee
    # half a second later (eager: no waiting, so a filler loses 0.5 s x 10 CPU)
    sc = load_scenario(_scenario(tmp_path, PREEMPTING, policies="gpupool-eager-preemption"))
    m = compute(simulate(sc, "gpupool-eager-preemption"))
    assert m["metric_resource"] == "cpu"
    assert m["preemptions"] == 1
    # 10 CPU x 0.5 s thrown away, in CPU-hours
    assert m["preempted_gpu_hours_lost"] == pytest.approx(5.0 / 3600, abs=1e-3)
    assert m["utilization"] > 0.5  # was 0 without GPUs
    assert m["allocation_ratio"] > 0.5
    assert m["fairness"]["q-0-0"]["guarantee_gpus"] == 10.0
    assert m["preemption_lost_share"] > 0


def test_subsecond_durations_and_intervals(tmp_path: Path) -> None:
    sets = "      - {className: tiny, queues: [q-0-0], count: 3, interval: 100ms, duration: 200ms, cpu: 1}\n"
    r = simulate(load_scenario(_scenario(tmp_path, sets)), "gpupool")
    assert [(j.spec.submit, j.first_start, j.finish) for j in r.jobs] == [
        pytest.approx((0.0, 0.0, 0.2)),
        pytest.approx((0.1, 0.1, 0.3)),
        pytest.approx((0.2, 0.2, 0.4)),
    ]


def test_node_with_hundreds_of_cpus_runs_hundreds_of_pods_at_once(tmp_path: Path) -> None:
    sets = "      - {className: one, queues: [q-0-0, q-0-1], count: 300, interval: 0, duration: 1s, cpu: 1}\n"
    r = simulate(load_scenario(_scenario(tmp_path, sets, cpus=600)), "gpupool")
    assert len(r.jobs) == 600
    assert all(j.first_start == 0.0 and j.finish == pytest.approx(1.0) for j in r.jobs)


def test_per_class_breakdown_and_per_job_admissions(tmp_path: Path) -> None:
    sc = load_scenario(_scenario(tmp_path, PREEMPTING, policies="gpupool-eager-preemption"))
    runs = run_scenario(sc, workers=1)
    per_class = runs[0].metrics["per_class"]
    assert set(per_class) == {"filler", "urgent"}
    assert per_class["filler"]["evictions_per_job"] == 0.5
    assert per_class["urgent"]["wait_p90_s"] == 0.0
    assert per_class["filler"]["lost_units_s"] == pytest.approx(5.0)
    adm = to_json(sc, runs)["runs"][0]["job_admissions"]
    rows = dict(
        zip(adm["name"], zip(adm["class"], adm["admitted"], adm["evictions"], strict=True), strict=True)
    )
    evicted = [n for n, (_, _, e) in rows.items() if e == 1]
    assert len(evicted) == 1
    # admitted at 0, evicted at 0.5, admitted again when the urgent job ends at 1.5
    assert rows[evicted[0]][1] == [0.0, 1.5]
    assert rows["urgent-q-0-0-00000"][:2] == ("urgent", [0.5])


def test_sets_and_cohorts_report_bad_fields(tmp_path: Path) -> None:
    bad = "      - {className: x, queues: [nope-*], count: 1, interval: 0, duration: 1s, cpu: 1}\n"
    with pytest.raises(SimInputError, match=r"sets\[0\]\.queues\[0\]: 'nope-\*' matches no leaf queue"):
        load_scenario(_scenario(tmp_path, bad))
    bad = "      - {className: x, queues: [q-*], count: 1, interval: 0, duration: 12xms, cpu: 1}\n"
    with pytest.raises(SimInputError, match=r"sets\[0\].duration: invalid duration"):
        load_scenario(_scenario(tmp_path, bad))


def test_kueue_baseline_expands_to_its_published_shape() -> None:
    sc = load_scenario(KUEUE)
    v = sc.variants[0]
    leaves = [q for q in v.queues if q.parent]
    assert len(leaves) == 30 and len([q for q in v.queues if not q.parent]) == 5
    assert all(q.quotas[0].guarantee[1] == 20_000 for q in leaves)
    assert all(
        q.quotas[0].borrowing_limit is not None and q.quotas[0].borrowing_limit[1] == 100_000 for q in leaves
    )
    counts: dict[str, int] = {}
    for j in sc.trace.jobs:
        counts[j.label] = counts.get(j.label, 0) + 1
    assert counts == {"small": 10_500, "medium": 3_000, "large": 1_500}
    work = sum(j.cpu_milli / 1000 * j.duration for j in sc.trace.jobs)
    assert work == pytest.approx(39_600)  # the physical limit: 39,600 CPU-s / 600 CPU = 66 s


def test_window_rule_exact_when_preemptors_wait_long(tmp_path: Path) -> None:
    """The window rule stays exact when preemptors wait (a 600 s horizon for every job, on a
    deep Philly-like backlog with holds and backfill): the same starts as passing every
    pending workload to every cycle."""
    from dataclasses import replace

    from gpupool.sim.baselines import Policy
    from gpupool.sim.simulator import Simulation
    from tests.sim.test_sim import philly_csv, scenario_file

    philly_csv(tmp_path / "trace.csv", 700, 5, queues=6, span=30_000.0)
    body = "  workload:\n    philly: {path: trace.csv, autoQueues: {pool: p, cohort: all}}\n  seed: 5\n  scheduleInterval: 60s\n"
    sc = load_scenario(scenario_file(tmp_path, body, 3))
    base = Policy.named("gpupool")
    # horizon: a declared 600 s cap (there is none by default)
    pol = replace(base, config=replace(base.config, preemption_wait_fraction=1e9, preemption_wait_s=600.0))
    runs = [Simulation(sc, pol, sc.variants[0], full_pending=full).run() for full in (False, True)]
    fast, full = ([(j.spec.name, j.first_start, j.finish, j.preempted) for j in r.jobs] for r in runs)
    assert fast == full


def test_a_class_wait_is_part_of_the_scheduling_shape() -> None:
    """Workloads alike but for their class's preemptionWait wait differently, so the window
    rule must not treat them as one class (``engine.signature.scheduling_signature``)."""
    from dataclasses import replace

    from gpupool.engine.signature import scheduling_signature
    from gpupool.model import PodGroup, PodRequest, Workload

    w = Workload("w", "q", (PodGroup("main", 1, PodRequest(cpu_milli=1000)),), expected_duration_s=1.0)

    def shape(x: Workload) -> tuple[object, ...]:
        return scheduling_signature(x, duration="none")

    assert shape(w) != shape(replace(w, preemption_wait_s=0.0))
    assert shape(w) == shape(replace(w, name="other", arrival=5.0))
