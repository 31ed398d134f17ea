"""Simulator: metric arithmetic, determinism, faults, window rule equivalence, loaders, CLI, report.

Every replay here runs the engine's invariant checker after every cycle (``check_invariants``)
and fails on any violation.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from gpupool.sim import runner
from gpupool.sim.metrics import compute, integral, jain, percentiles, time_weighted_mean
from gpupool.sim.report import render_html
from gpupool.sim.results import Event, JobRecord, RunResult
from gpupool.sim.runner import dumps, run_scenario, to_json
from gpupool.sim.scenario import load_scenario
from gpupool.sim.simulator import simulate
from gpupool.sim.sources import JobSpec, SimInputError, load_philly, split_gpus

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"
POLICIES = ("fifo-first-fit", "kueue-like", "gpupool")

CLUSTER = """
      - apiVersion: gpupool.io/v1alpha1
        kind: Cluster
        metadata: {name: t}
        spec:
          nodeGroups:
            - name: n
              count: NODES
              gpu: {model: P100, count: 8, memory: 16Gi}
              cpu: 64
              memory: 512Gi
      - apiVersion: gpupool.io/v1alpha1
        kind: ResourcePool
        metadata: {name: p}
        spec: {}
"""


def philly_csv(path: Path, n: int, seed: int, queues: int = 3, span: float = 20_000.0) -> Path:
    """A small Philly-format trace: mostly 1-GPU jobs, some 2/4/8/16-GPU gangs."""
    rng = random.Random(seed)
    lines = ["timestamp,duration,num_gpus,gpu_time,cluster"]
    for _ in range(n):
        t = rng.uniform(0, span)
        g = rng.choices([1, 2, 4, 8, 16], [20, 3, 3, 2, 1])[0]
        d = round(rng.expovariate(1 / 1800.0)) + 1
        sec = int(t)
        ts = f"2017-10-{1 + sec // 86400:02d} {sec % 86400 // 3600:02d}:{sec % 3600 // 60:02d}:{sec % 60:02d}"
        lines.append(f"{ts},{d}.0,{g},{d * g}.0,c{rng.randrange(queues)}")
    path.write_text("\n".join(lines) + "\n")
    return path


def scenario_file(tmp_path: Path, body: str, nodes: int = 4, name: str = "s.yaml") -> Path:
    text = (
        "apiVersion: gpupool.io/v1alpha1\nkind: Scenario\nmetadata: {name: t}\nspec:\n"
        "  cluster:\n    documents:" + CLUSTER.replace("NODES", str(nodes)) + body
    )
    p = tmp_path / name
    p.write_text(text)
    return p


def philly_scenario(tmp_path: Path, n: int = 300, nodes: int = 4, extra: str = "", seed: int = 1) -> Path:
    philly_csv(tmp_path / "trace.csv", n, seed)
    body = (
        "  workload:\n    philly: {path: trace.csv, autoQueues: {pool: p, cohort: all}}\n"
        f"  seed: {seed}\n" + extra
    )
    return scenario_file(tmp_path, body, nodes)


def checked(sc_path: Path, policy: str, **kw: object) -> RunResult:
    sc = load_scenario(sc_path)
    r = simulate(sc, policy, check_invariants=True, **kw)  # type: ignore[arg-type]
    assert r.violations == [], r.violations[:5]
    return r


# -- metric arithmetic ------------------------------------------------------------------------
def test_percentiles_and_means_by_hand() -> None:
    assert percentiles([1, 2, 3, 4, 5]) == {"p50": 3.0, "p95": 4.8, "p99": 4.96}
    assert percentiles([]) == {"p50": 0.0, "p95": 0.0, "p99": 0.0}
    # value 2 on [0,10), 4 on [10,20) -> mean 3 over [0,20]
    assert time_weighted_mean([0, 10], [2, 4], 20) == pytest.approx(3.0)
    # starts at t=10: zero before -> (4*10)/20
    assert time_weighted_mean([10], [4], 20) == pytest.approx(2.0)
    assert integral([0, 10], [2, 4], 15) == pytest.approx(2 * 10 + 4 * 5)
    assert jain([1, 1, 1]) == pytest.approx(1.0)
    assert jain([1, 0, 0, 0]) == pytest.approx(0.25)


def _rec(
    name: str, queue: str, submit: float, start: float | None, finish: float | None, gpus: int
) -> JobRecord:
    spec = JobSpec(name, queue, submit, (finish or 0) - (start or 0), gpus)
    status = "completed" if finish is not None else ("running" if start is not None else "pending")
    return JobRecord(spec, 0, status=status, attempt=1, first_start=start, start=start, finish=finish)


def test_compute_on_a_hand_built_run() -> None:
    jobs = [
        _rec("a", "q1", 0, 0, 100, 2),  # wait 0, JCT 100
        _rec("b", "q1", 0, 50, 150, 2),  # wait 50, JCT 150
        _rec("c", "q2", 10, None, None, 4),  # never started
    ]
    jobs[1].lost_gpu_s = 3600.0 * 2
    jobs[1].preempted = 1
    r = RunResult(
        policy="p",
        variant="baseline",
        jobs=jobs,
        times=[0, 50, 100, 150],
        alloc_milli=[2000, 4000, 2000, 0],
        cap_milli=[8000, 8000, 8000, 8000],
        pending=[2, 1, 1, 1],
        running=[1, 2, 1, 0],
        frag_times=[0, 100],
        frag=[0.5, 0.25],
        queue_usage_gpu_s={"q1": 400.0},
        queue_guarantee_milli={"q1": 4000, "q2": 4000},
        events=[Event(1, "job-fault", "a")],
        preemptions=1,
        cycles=3,
        engine_calls=3,
        violations=[],
        end=200.0,
    )
    m = compute(r)
    assert m["jobs_completed"] == 2 and m["jobs_never_started"] == 1
    assert m["completion_rate"] == pytest.approx(2 / 3, abs=1e-4)
    assert m["wait_mean_s"] == 25.0 and m["wait_p50_s"] == 25.0
    assert m["jct_mean_s"] == 125.0
    # allocated GPU-seconds: 2*50 + 4*50 + 2*50 = 400 of 8*200 = 1600
    assert m["allocation_ratio"] == 0.25
    # useful work: 2 GPUs x 100 s twice = 400 GPU-s of 1600
    assert m["utilization"] == 0.25
    assert m["fragmentation"] == 0.375
    assert m["preempted_gpu_hours_lost"] == 2.0 and m["preemptions"] == 1
    assert m["job_faults"] == 1
    assert m["fairness"]["q1"]["avg_gpus"] == 2.0  # 400 GPU-s over 200 s
    assert m["fairness"]["q1"]["usage_over_guarantee"] == 0.5
    assert m["per_queue"]["q1"]["wait_p95_s"] == pytest.approx(47.5)


def test_split_gpus() -> None:
    assert split_gpus(1, 8) == (1, 1)
    assert split_gpus(16, 8) == (8, 2)
    assert split_gpus(12, 8) == (6, 2)
    assert split_gpus(7, 4) == (1, 7)


# -- replays ------------------------------------------------------------------------------------
def test_generated_trace_all_policies_invariants_hold(tmp_path: Path) -> None:
    p = philly_scenario(tmp_path, n=250, nodes=4)
    res = {pol: checked(p, pol) for pol in POLICIES}
    for pol, r in res.items():
        done = sum(j.status == "completed" for j in r.jobs)
        assert done == len(r.jobs), pol  # no horizon: everything finishes
        for j in r.jobs:
            assert j.first_start is not None and j.first_start >= j.spec.submit
            assert j.finish == pytest.approx(j.start + j.spec.duration)  # type: ignore[operator]
    # FIFO never preempts; the policies do differ on this contended trace
    assert res["fifo-first-fit"].preemptions == 0
    waits = {pol: compute(r)["wait_mean_s"] for pol, r in res.items()}
    assert len(set(waits.values())) > 1


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("seed", [1, 2])
def test_window_rule_gives_the_same_results_as_passing_everything(
    tmp_path: Path, policy: str, seed: int
) -> None:
    p = philly_scenario(tmp_path, n=220, nodes=3, seed=seed)
    sc = load_scenario(p)
    fast = simulate(sc, policy, check_invariants=True)
    full = simulate(sc, policy, check_invariants=True, full_pending=True)
    assert fast.violations == [] and full.violations == []
    key = [(j.spec.name, j.first_start, j.finish, j.preempted) for j in fast.jobs]
    assert key == [(j.spec.name, j.first_start, j.finish, j.preempted) for j in full.jobs]
    assert fast.preemptions == full.preemptions


@pytest.mark.parametrize(("seed", "reservations"), [(3, 1), (4, 1), (5, 1), (3, 4), (6, 16)])
def test_window_rule_exact_under_a_deep_backlog(tmp_path: Path, seed: int, reservations: int) -> None:
    """Many queues and classes, a backlog, holds and backfill: the blocked-class hint, windows
    grown during the cycle and up-front backfill witnesses must not change a single start, and
    with several planned starts per pool (a failure then takes a hold) neither."""
    philly_csv(tmp_path / "trace.csv", 700, seed, queues=6, span=30_000.0)
    body = (
        "  workload:\n    philly: {path: trace.csv, autoQueues: {pool: p, cohort: all}}\n"
        f"  seed: {seed}\n  scheduleInterval: 60s\n"
    )
    path = scenario_file(tmp_path, body, 3)
    path.write_text(path.read_text().replace("spec: {}", f"spec: {{reservations: {reservations}}}", 1))
    sc = load_scenario(path)
    fast = simulate(sc, "gpupool")
    full = simulate(sc, "gpupool", full_pending=True)
    key = [(j.spec.name, j.first_start, j.finish, j.preempted) for j in fast.jobs]
    assert key == [(j.spec.name, j.first_start, j.finish, j.preempted) for j in full.jobs]
    # several planned starts: a window whose members took holds is grown and the cycle rerun
    assert fast.engine_calls < (2 if reservations == 1 else 4) * fast.cycles


def test_same_seed_byte_identical_json(tmp_path: Path) -> None:
    p = philly_scenario(
        tmp_path,
        n=150,
        extra="  faults: {mtbf: {hours: 2, repairAfter: 30m}, jobFailuresPerHour: 0.5}\n",
    )
    a = dumps(to_json(load_scenario(p), run_scenario(load_scenario(p), check_invariants=True)))
    b = dumps(to_json(load_scenario(p), run_scenario(load_scenario(p), check_invariants=True)))
    assert a == b
    data = json.loads(a)
    assert all(r["metrics"]["invariant_violations"] == 0 for r in data["runs"])
    assert any(r["metrics"]["node_failures"] > 0 for r in data["runs"])


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_parallel_runs_equal_sequential_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, method: str
) -> None:
    """Worker processes (used for long traces) must not change a byte of the results, whether
    they inherit the scenario (fork) or receive it (spawn)."""
    monkeypatch.setattr(runner, "start_method", lambda: method)
    p = philly_scenario(
        tmp_path,
        n=150,
        extra="  faults: {mtbf: {hours: 2, repairAfter: 30m}, jobFailuresPerHour: 0.5}\n",
    )
    seen: list[tuple[str, int, int]] = []
    sc = load_scenario(p)
    par = run_scenario(sc, lambda label, done, total: seen.append((label, done, total)), workers=2)
    seq = run_scenario(load_scenario(p), workers=1)
    assert dumps(to_json(sc, par)) == dumps(to_json(sc, seq))
    assert [r.label for r in par] == list(sc.policies)
    # every run reports completion through the progress callback
    assert {(label, done) for label, done, total in seen if done == total} == {(q, 150) for q in sc.policies}


# -- faults -------------------------------------------------------------------------------------
def _one_job_scenario(tmp_path: Path, faults: str, duration: int = 7200) -> Path:
    (tmp_path / "t.csv").write_text(f"submit,duration,gpus,queue\n0,{duration},8,a\n")
    body = (
        "  workload:\n    csv: {path: t.csv, columns: {submit: submit, duration: duration, gpus: gpus, queue: queue}}\n"
        "  policies: [gpupool]\n"
        "  seed: 5\n" + faults
    )
    docs = (
        "      - apiVersion: gpupool.io/v1alpha1\n        kind: Queue\n        metadata: {name: a}\n"
        "        spec: {quotas: [{pool: p, guarantee: {nvidia.com/gpu: 16}}]}\n"
    )
    return scenario_file(tmp_path, docs + body, nodes=2)


def test_node_failure_evicts_requeues_with_backoff_and_records(tmp_path: Path) -> None:
    p = _one_job_scenario(
        tmp_path,
        "  faults:\n    nodeFailures: [{node: n-001, at: 1000, repairAfter: 600}]\n"
        "    retry: {maxRetries: 2, backoff: 300}\n",
    )
    r = checked(p, "gpupool")
    (j,) = r.jobs
    kinds = [(e.kind, e.subject) for e in r.events]
    assert ("node-failed", "n-001") in kinds and ("node-repaired", "n-001") in kinds
    assert ("job-evicted", "j000000") in kinds and ("retry-scheduled", "j000000") in kinds
    # evicted at 1000, back after the 300 s backoff on the other node, runs 7200 s from scratch
    assert j.status == "completed" and j.retries == 1 and j.faults == 1
    assert j.start == 1300.0 and j.finish == 1300.0 + 7200.0
    assert j.recover_s == [300.0]
    assert j.lost_fault_gpu_s == pytest.approx(8 * 1000.0)
    m = compute(r)
    assert m["node_failures"] == 1 and m["jobs_evicted_by_node_failure"] == 1
    assert m["fault_gpu_hours_lost"] == pytest.approx(8000 / 3600, abs=1e-3)


def test_retries_exhausted_marks_the_job_failed(tmp_path: Path) -> None:
    p = _one_job_scenario(
        tmp_path,
        "  faults:\n    jobFailuresPerHour: 1000\n    retry: {maxRetries: 2, backoff: 10, backoffFactor: 3}\n",
    )
    r = checked(p, "gpupool")
    (j,) = r.jobs
    assert j.status == "failed" and j.retries == 2 and j.faults == 3
    scheduled = [e for e in r.events if e.kind == "retry-scheduled"]
    assert [e.detail.split(" in ")[-1] for e in scheduled] == ["10s", "30s"]
    assert [e.kind for e in r.events].count("job-failed") == 1
    assert compute(r)["jobs_failed"] == 1


def test_what_if_adds_nodes_and_changes_quotas(tmp_path: Path) -> None:
    extra = (
        "  whatIf:\n"
        "    - name: more\n"
        "      addNodeGroups: [{name: m, count: 4, gpu: {model: P100, count: 8, memory: 16Gi}, cpu: 64, memory: 512Gi}]\n"
        "      quotas: {c0: {p: 64}}\n"
    )
    p = philly_scenario(tmp_path, n=150, nodes=2, extra=extra)
    sc = load_scenario(p)
    base, more = sc.variants
    assert sum(n.gpu_count for n in more.nodes) == sum(n.gpu_count for n in base.nodes) + 32
    q = {x.name: x for x in more.queues}["c0"]
    assert q.quotas[0].guarantee[0] == 64_000
    sc.policies = ["gpupool"]
    runs = run_scenario(sc, check_invariants=True)
    assert [r.label for r in runs] == ["gpupool @ baseline", "gpupool @ more"]
    assert all(not r.result.violations for r in runs)
    assert runs[1].metrics["wait_mean_s"] <= runs[0].metrics["wait_mean_s"]


# -- bad input ----------------------------------------------------------------------------------
def test_malformed_philly_row_names_file_line_and_column(tmp_path: Path) -> None:
    f = tmp_path / "bad.csv"
    f.write_text(
        "timestamp,duration,num_gpus,gpu_time,cluster\n2017-10-01 00:00:00,10,1,10,a\n"
        "2017-10-01 00:00:05,ten,1,10,a\n2017-10-01 00:00:09,5,1.5,5,a\n"
    )
    with pytest.raises(SimInputError) as exc:
        load_philly(f)
    assert f"{f}:3: column 'duration': not a number" in str(exc.value)
    assert f"{f}:4: column 'num_gpus': must be a whole number" in str(exc.value)


def test_scenario_field_errors_are_located(tmp_path: Path) -> None:
    p = philly_scenario(tmp_path, n=5, extra="  faults: {retry: {maxRetries: -1}}\n  bogus: 1\n")
    with pytest.raises(SimInputError) as exc:
        load_scenario(p)
    msg = str(exc.value)
    assert f"{p}: spec.faults.retry.maxRetries" in msg
    assert f"{p}: spec.bogus: Extra inputs are not permitted" in msg


def test_cli_bad_input_exits_2_without_traceback(tmp_path: Path) -> None:
    from gpupool.cli.main import app

    f = tmp_path / "trace.csv"
    f.write_text("timestamp,duration,num_gpus,gpu_time,cluster\n2017-10-01 00:00:00,10,x,10,a\n")
    p = scenario_file(tmp_path, "  workload:\n    philly: {path: trace.csv}\n")
    res = CliRunner().invoke(app, ["sim", str(p), "-o", "json"])
    assert res.exit_code == 2
    out = res.output
    assert "trace.csv:2: column 'num_gpus'" in out.replace("\n", "")
    assert "Traceback" not in out


def test_unknown_models_and_impossible_requests_are_reported(tmp_path: Path) -> None:
    (tmp_path / "t.jsonl").write_text(
        '{"s": 0, "d": 60, "g": 1, "q": "a", "m": "H100"}\n'
        '{"s": 1, "d": 60, "g": 64, "q": "a"}\n'
        '{"s": 2, "d": 60, "g": 1, "q": "nope"}\n'
        '{"s": 3, "d": 60, "g": 1, "q": "a"}\n'
    )
    docs = (
        "      - apiVersion: gpupool.io/v1alpha1\n        kind: Queue\n        metadata: {name: a}\n"
        "        spec: {quotas: [{pool: p, guarantee: {nvidia.com/gpu: 16}}]}\n"
    )
    body = (
        "  workload:\n    csv: {path: t.jsonl, format: jsonl, columns: {submit: s, duration: d, gpus: g,"
        " queue: q, gpuModel: m}}\n"
    )
    p = scenario_file(tmp_path, docs + body, nodes=2)
    sc = load_scenario(p)
    runs = run_scenario(sc, check_invariants=True)
    data = to_json(sc, runs)
    assert data["rejected"]["count"] == 3
    reasons = " | ".join(x["reason"] for x in data["rejected"]["jobs"])
    assert "unknown GPU model(s) H100" in reasons
    assert "no node can host one pod (64 GPU" in reasons and "queue 'nope' does not exist" in reasons
    assert all(r["metrics"]["jobs_completed"] == 1 for r in data["runs"])
    assert data["rejected"]["jobs"][0]["source"].endswith("t.jsonl:1")


# -- report -------------------------------------------------------------------------------------
def test_report_is_self_contained_with_a_highlighted_summary(tmp_path: Path) -> None:
    p = philly_scenario(tmp_path, n=120, nodes=3)
    sc = load_scenario(p)
    data = to_json(sc, run_scenario(sc, check_invariants=True))
    page = render_html(data)
    import re

    assert not re.search(r"<script[^>]*\ssrc=", page)  # plotly.js is inlined, nothing is fetched
    assert len(page) > 1_000_000  # the plotly bundle itself
    assert "Plotly" in page and page.count('class="best"') >= 3
    from gpupool.sim.report import csv_tables

    tables = csv_tables(data)
    assert set(tables) >= {"summary.csv", "per_queue.csv", "per_type.csv", "fairness.csv", "events.csv"}
    assert tables["summary.csv"].startswith("run,metric,value\n")


def test_cli_writes_report_json_and_csv(tmp_path: Path) -> None:
    from gpupool.cli.main import app

    p = philly_scenario(tmp_path, n=60, nodes=3)
    res = CliRunner().invoke(app, ["sim", str(p), "--report", str(tmp_path / "out" / "r.html")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "out" / "metrics.json").exists() and (tmp_path / "out" / "summary.csv").exists()
    res = CliRunner().invoke(app, ["sim", str(p), "-o", "json"])
    data = json.loads(res.stdout)
    assert [r["label"] for r in data["runs"]] == list(POLICIES)


# -- the shared data ----------------------------------------------------------------------------
@pytest.mark.skipif(not (SHARED / "philly" / "philly.csv").exists(), reason="../shared/data is absent")
def test_philly_slice_replays_with_invariants(tmp_path: Path) -> None:
    body = (
        "  workload:\n"
        f"    philly: {{path: {SHARED / 'philly' / 'philly.csv'}, maxJobs: 400,"
        " autoQueues: {pool: p, cohort: all}}\n"
        "  policies: [fifo-first-fit, gpupool]\n"
    )
    p = scenario_file(tmp_path, body, nodes=6)
    sc = load_scenario(p)
    assert len(sc.trace.jobs) == 400
    for r in run_scenario(sc, check_invariants=True):
        assert not r.result.violations
        assert r.metrics["jobs_rejected"] + r.metrics["jobs_completed"] == 400


def test_wait_quantiles_are_monotone(tmp_path: Path) -> None:
    from gpupool.sim.metrics import wait_quantiles

    r = checked(philly_scenario(tmp_path, n=80, nodes=2), "gpupool")
    q = wait_quantiles(r)
    assert len(q) == 101 and bool(np.all(np.diff(q) >= 0))


GEN = """
  cluster:
    files: [CLUSTER]
  seed: SEED
  workload:
    generator:
      duration: 10h
      types:
        - {type: training, ratePerHour: 4, queues: [pre, res], sizes: {"8": 2, "16": 1, "2": 1}, meanDuration: 2h,
           priorityClass: training}
        - {type: inference, ratePerHour: 10, queues: [srv, res], sizes: {"0.25": 2, "0.5": 2, "1": 1}, meanDuration: 1h,
           priorityClass: inference-critical, diurnal: {amplitude: 0.8}}
        - {type: evaluation, ratePerHour: 6, queues: [res], sizes: {"1": 2, "0.5": 1}, meanDuration: 30m,
           priorityClass: evaluation}
      bursts:
        - {at: 3h, count: 12, queue: pre, gpus: 8, meanDuration: 1h, priorityClass: training}
  faults: {jobFailuresPerHour: 0.1, mtbf: {hours: 30, repairAfter: 1h}, retry: {maxRetries: 1, backoff: 60}}
"""

GEN_CLUSTER = """
apiVersion: gpupool.io/v1alpha1
kind: Cluster
metadata: {name: g}
spec:
  nodeGroups:
    - {name: h, count: 4, gpu: {model: H100, count: 8, memory: 80Gi}, cpu: 192, memory: 2Ti, labels: {env: t}}
    - {name: a, count: 2, gpu: {model: A100, count: 8, memory: 40Gi}, cpu: 128, memory: 1Ti, labels: {env: i}}
---
apiVersion: gpupool.io/v1alpha1
kind: ResourcePool
metadata: {name: t}
spec: {nodeSelector: {env: t}}
---
apiVersion: gpupool.io/v1alpha1
kind: ResourcePool
metadata: {name: i}
spec: {nodeSelector: {env: i}, placement: Spread}
---
apiVersion: gpupool.io/v1alpha1
kind: Queue
metadata: {name: org}
spec: {quotas: [{pool: t, guarantee: {nvidia.com/gpu: 32}}, {pool: i, guarantee: {nvidia.com/gpu: 16}}]}
---
apiVersion: gpupool.io/v1alpha1
kind: Queue
metadata: {name: pre}
spec: {parent: org, quotas: [{pool: t, guarantee: {nvidia.com/gpu: 16}}]}
---
apiVersion: gpupool.io/v1alpha1
kind: Queue
metadata: {name: res}
spec: {parent: org, quotas: [{pool: t, guarantee: {nvidia.com/gpu: 16}}, {pool: i, guarantee: {nvidia.com/gpu: 4}}]}
---
apiVersion: gpupool.io/v1alpha1
kind: Queue
metadata: {name: srv}
spec: {parent: org, quotas: [{pool: i, guarantee: {nvidia.com/gpu: 12}}]}
"""


@pytest.mark.parametrize("policy", POLICIES)
def test_window_rule_exact_on_a_mixed_generated_workload(tmp_path: Path, policy: str) -> None:
    """Fractions, priorities (preemption), two pools, faults and retries: still the same results."""
    (tmp_path / "c.yaml").write_text(GEN_CLUSTER)
    p = tmp_path / "g.yaml"
    p.write_text(
        "apiVersion: gpupool.io/v1alpha1\nkind: Scenario\nmetadata: {name: g}\nspec:"
        + GEN.replace("CLUSTER", "c.yaml").replace("SEED", "4")
    )
    sc = load_scenario(p)
    fast = simulate(sc, policy, check_invariants=True)
    full = simulate(sc, policy, check_invariants=True, full_pending=True)
    assert fast.violations == [] and full.violations == []
    assert [(j.first_start, j.finish, j.preempted, j.faults) for j in fast.jobs] == [
        (j.first_start, j.finish, j.preempted, j.faults) for j in full.jobs
    ]
    assert [(e.time, e.kind, e.subject) for e in fast.events] == [
        (e.time, e.kind, e.subject) for e in full.events
    ]
