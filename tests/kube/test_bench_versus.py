"""``gpupool bench kube --versus kueue``: Kueue's objects come from the same gpupool manifests
(one quota for both sides), the Jobs of each case are shaped as the case says, the observer
counts admissions, binds, preemptions and quota from the API's answers (a mock transport here),
``--case`` selects and ``-o json`` has one entry per case with both sides. The run itself needs
the real binaries and minutes; it is a benchmark, not a test."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from typer.testing import CliRunner

from gpupool.bench import kueue_versus
from gpupool.bench.kueue_cases import CASES, RECLAIM_TEAMS, fragmentation, priority_classes
from gpupool.bench.kueue_versus import (
    GPU,
    QUEUE_LABEL,
    _observe,
    _Watch,
    format_versus,
    gpupool_manifests,
    jobs,
    kueue_objects,
    limits,
    select_cases,
)
from gpupool.cli.main import app
from gpupool.manifests.bundle import load_bundle


def test_kueue_objects_are_generated_from_the_gpupool_manifests(tmp_path: Path) -> None:
    docs = gpupool_manifests(25)
    (tmp_path / "bench.yaml").write_text(yaml.safe_dump_all(docs))
    bundle = load_bundle([tmp_path / "bench.yaml"])  # gpupool itself accepts them
    assert bundle is not None
    objs = [o for _, o in kueue_objects(docs)]
    kinds = [o["kind"] for o in objs]
    assert kinds.count("ResourceFlavor") == 1 and kinds.count("ClusterQueue") == 3
    assert kinds.count("LocalQueue") == 3
    flavor = next(o for o in objs if o["kind"] == "ResourceFlavor")
    assert flavor["spec"]["nodeLabels"] == {"gpupool.io/environment": "bench"}
    cqs = {o["metadata"]["name"]: o["spec"] for o in objs if o["kind"] == "ClusterQueue"}
    assert {s["cohortName"] for s in cqs.values()} == {"bench"}
    nominal = {n: s["resourceGroups"][0]["flavors"][0]["resources"][0] for n, s in cqs.items()}
    assert sum(r["nominalQuota"] for r in nominal.values()) == 200  # the GPUs, exactly
    assert nominal["team-a"] == {"name": GPU, "nominalQuota": 100, "borrowingLimit": 50}
    # gpupool's default preemption policy goes over, not Kueue's (Never everywhere)
    assert cqs["team-b"]["preemption"] == {
        "withinClusterQueue": "LowerPriority",
        "reclaimWithinCohort": "Any",
        "borrowWithinCohort": {"policy": "Never"},
    }
    assert limits(docs) == {n: r["nominalQuota"] + r["borrowingLimit"] for n, r in nominal.items()}
    lqs = {o["metadata"]["name"]: o["spec"]["clusterQueue"] for o in objs if o["kind"] == "LocalQueue"}
    assert lqs == {n: n for n in cqs}


def test_the_jobs_are_kueue_style_and_spread_by_the_case() -> None:
    js = jobs(300, "gpupool")
    per: dict[str, int] = {}
    for j in js:
        assert j["spec"]["suspend"] is True
        assert j["spec"]["template"]["spec"]["schedulerName"] == "gpupool"
        per[j["metadata"]["labels"][QUEUE_LABEL]] = per.get(j["metadata"]["labels"][QUEUE_LABEL], 0) + 1
    assert per == {"team-a": 75, "team-b": 150, "team-c": 75}


def _side(admitted_s: float | None) -> dict[str, Any]:
    return {
        "jobs": 300,
        "admissible": 200,
        "binds_per_s": 22.2,
        "preemptions_all_phases": 2,
        "fragmentation": {
            "partly_used_nodes": 3,
            "free_gpus_on_partly_used": 6,
            "empty_nodes": 0,
            "full_nodes": 22,
        },
        "unbound_pods_of_admitted_jobs": 0,
        "phases": [],
        "gpus_per_queue_over_time": [[0.5, {"team-a": 1, "team-b": 0}]],
        "admitted": 200,
        "bound": 200,
        "create_seconds": 4.0,
        "to_all_admitted_s": admitted_s,
        "to_all_bound_s": 9.0,
        "admissions_per_s": 25.0,
        "peak_gpus_per_queue": {"team-a": 75, "team-b": 90},
        "final_gpus_per_queue": {"team-a": 75, "team-b": 88},
        "preemptions": 2,
        "limit_per_queue": {"team-a": 150, "team-b": 90},
        "quota_violations": [],
        "cpu_seconds": {"kueue": 3.0, "kube-apiserver": 9.0},
    }


def test_the_report_prints_both_rows() -> None:
    r = {"cases": [_case("cohort-borrowing"), _case("gang")], "cpus": 2}
    out = format_versus(r)
    assert out.count("kueue + kube-scheduler") == 2 and out.count("\n  gpupool ") == 2
    assert "team-b 90/88/90" in out and "22.2" in out  # binds/s
    assert "nodes partly used 3 (6 GPUs free on them)" in out
    assert "differs by design: one binds" in out
    assert " - " in out  # a side that never got there reads "-", not 0


def _case(name: str) -> dict[str, Any]:
    return {
        "case": name,
        "summary": "s",
        "nodes": 25,
        "gpus": 200,
        "jobs": 300,
        "cpus": 2,
        "load_average_1m": {"before": 1.0, "after": 2.0},
        "differs_by_design": ["one binds"],
        "sides": {"kueue": _side(8.0), "gpupool": _side(None)},
    }


def test_an_unknown_versus_is_a_clear_error() -> None:
    res = CliRunner().invoke(app, ["bench", "kube", "--versus", "volcano"])
    assert res.exit_code == 2
    assert "--versus" in res.output


def test_the_cases_and_their_selection() -> None:
    assert [c.name for c in select_cases(None)] == ["cohort-borrowing", "reclaim", "gang"]
    assert [c.name for c in select_cases(["gang"])] == ["gang"]
    with pytest.raises(ValueError, match="unknown case nope"):
        select_cases(["nope"])
    # the cohort case spreads three priority classes that exist on both sides
    prios = {j["spec"]["template"]["spec"].get("priorityClassName") for j in jobs(9, "x", ("a", "b", "c"))}
    assert prios == {"a", "b", "c"}
    names = {p["metadata"]["name"] for p in priority_classes()}
    assert {"training", "experiment", "evaluation"} <= names
    assert all(p["preemptionPolicy"] == "Never" for p in priority_classes())


def test_the_reclaim_case_borrows_all_of_the_lenders_guarantee_then_reclaims_it() -> None:
    case = CASES["reclaim"]
    assert case.teams == RECLAIM_TEAMS
    docs = gpupool_manifests(4, case.teams)
    assert limits(docs) == {"team-a": 16, "team-b": 16, "team-c": 16}
    fill, own = case.phases(4, 0, "gpupool")
    per = [j["metadata"]["labels"][QUEUE_LABEL] for j in fill.jobs]
    assert per.count("team-b") == 16 and per.count("team-c") == 16 and fill.admit == 32
    owners = [j["metadata"]["labels"][QUEUE_LABEL] for j in own.jobs]
    assert owners.count("team-a") == 16 and owners.count("team-c") == 2 and own.admit == own.bind == 18
    assert {j["spec"]["template"]["spec"]["priorityClassName"] for j in own.jobs} == {"training"}
    cqs = {o["metadata"]["name"]: o["spec"] for _, o in kueue_objects(docs) if o["kind"] == "ClusterQueue"}
    assert cqs["team-a"]["preemption"]["reclaimWithinCohort"] == "Any"
    assert "borrowingLimit" not in cqs["team-a"]["resourceGroups"][0]["flavors"][0]["resources"][0]


def test_the_gang_case_asks_for_all_pods_at_once_and_turns_on_wait_for_pods_ready() -> None:
    case = CASES["gang"]
    (phase,) = case.phases(6, 12, "default-scheduler")
    spec = phase.jobs[0]["spec"]
    assert spec["parallelism"] == spec["completions"] == 4
    assert phase.admit == 3 and phase.bind == 12  # two 3-GPU pods a node: 12 pods on 6 nodes
    assert case.kueue_config["waitForPodsReady"]["blockAdmission"] is True


def test_kueue_gets_the_cases_manager_configuration(tmp_path: Path) -> None:
    from gpupool.kube.kueue_local import _kueue_config

    cfg = yaml.safe_load(_kueue_config(tmp_path, 1, 2, 3, CASES["gang"].kueue_config).read_text())
    assert cfg["waitForPodsReady"]["timeout"] == "30s"
    assert cfg["integrations"] == {"frameworks": ["batch/job"]}
    assert "waitForPodsReady" not in yaml.safe_load(_kueue_config(tmp_path, 1, 2, 3).read_text())


def test_fragmentation_of_a_placement() -> None:
    def pod(node: str, gpus: int) -> dict[str, Any]:
        return {"spec": {"nodeName": node, "containers": [{"resources": {"limits": {GPU: gpus}}}]}}

    f = fragmentation([pod("n0", 3), pod("n0", 3), pod("n1", 8), pod("n2", 1)], ["n0", "n1", "n2", "n3"])
    assert f == {"partly_used_nodes": 2, "free_gpus_on_partly_used": 9, "empty_nodes": 1, "full_nodes": 1}


def _api(states: list[tuple[dict[str, bool], dict[str, str]]]) -> httpx.Client:
    """A stub API: each sample the next (Job -> suspended, pod -> node) state, the last repeated."""
    calls = {"jobs": 0, "pods": 0}

    def handler(req: httpx.Request) -> httpx.Response:
        kind = "jobs" if req.url.path.endswith("/jobs") else "pods"
        jobs_now, pods_now = states[min(calls[kind], len(states) - 1)]
        calls[kind] += 1
        if kind == "jobs":
            items: list[dict[str, Any]] = [
                {
                    "metadata": {"name": n, "labels": {QUEUE_LABEL: "team-a" if n < "j2" else "team-b"}},
                    "spec": {
                        "suspend": s,
                        "template": {"spec": {"containers": [{"resources": {"limits": {GPU: 1}}}]}},
                    },
                }
                for n, s in jobs_now.items()
            ]
        else:
            items = [
                {
                    "metadata": {"name": p, "labels": {"batch.kubernetes.io/job-name": p.split("-")[0]}},
                    "spec": {"nodeName": node, "containers": [{"resources": {"limits": {GPU: 1}}}]},
                }
                for p, node in pods_now.items()
            ]
        return httpx.Response(200, json={"items": items})

    return httpx.Client(transport=httpx.MockTransport(handler), base_url="http://api")


def test_the_observer_counts_admissions_binds_preemptions_and_quota(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kueue_versus.time, "sleep", lambda s: None)
    states = [
        ({"j0": False, "j1": False, "j2": True}, {}),
        ({"j0": False, "j1": True, "j2": False}, {"j0-x": "n0", "j2-x": "n0"}),  # j1 preempted
        ({"j0": False, "j1": False, "j2": False}, {"j0-x": "n0", "j1-x": "n1", "j2-x": "n0"}),
    ]
    w = _Watch({"team-a": 1, "team-b": 1}, 8)
    with _api(states) as http:
        got = _observe(http, w, {"j0", "j1", "j2"}, 3, 3, kueue_versus.time.monotonic(), settle_s=0.0)
    assert got["admitted"] == 3 and got["bound"] == 3 and got["preemptions"] == 1
    assert got["to_all_admitted_s"] is not None and got["binds_per_s"] > 0
    assert w.peak == {"team-a": 2, "team-b": 1} and w.violations() == ["team-a held 2 > 1"]
    assert [held for _, held in w.timeline] == [
        {"team-a": 2, "team-b": 0},
        {"team-a": 1, "team-b": 1},
        {"team-a": 2, "team-b": 1},
    ]


def test_case_selection_and_the_json_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def fake_run(nodes: Any, count: Any, say: Any, keep: Any, cases: Any) -> dict[str, Any]:
        seen.update(nodes=nodes, count=count, cases=cases)
        return {"cases": [_case(c) for c in cases], "cpus": 2}

    monkeypatch.setattr(kueue_versus, "run_versus", fake_run)
    res = CliRunner().invoke(
        app, ["bench", "kube", "--versus", "kueue", "--case", "gang", "--case", "reclaim", "-o", "json"]
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert [c["case"] for c in out["cases"]] == ["gang", "reclaim"]
    assert seen == {"nodes": None, "count": None, "cases": ["gang", "reclaim"]}  # the cases' own sizes
    side = out["cases"][0]["sides"]["gpupool"]
    for key in (
        "to_all_admitted_s",
        "to_all_bound_s",
        "admissions_per_s",
        "binds_per_s",
        "fragmentation",
        "quota_violations",
        "preemptions_all_phases",
        "cpu_seconds",
        "peak_gpus_per_queue",
        "gpus_per_queue_over_time",
    ):
        assert key in side
    bad = CliRunner().invoke(app, ["bench", "kube", "--versus", "kueue", "--case", "nope"])
    assert bad.exit_code == 2 and "unknown case nope" in bad.output


@pytest.mark.realkube
def test_the_gang_case_on_the_real_cluster_prints_both_rows() -> None:
    """The smallest gang case end to end on two real clusters (2 nodes: one gang fits, the
    quota admits more): gpupool admits only what it can place whole; both rows come out."""
    import os

    from gpupool.kube.realcluster import MissingBinaries, find_binaries

    try:
        binaries = find_binaries()
        for name in ("kube-scheduler", "kueue"):
            if not binaries.path(name).exists():
                raise MissingBinaries(f"no {name} in {binaries.directory} (run `make kube-bin`)")
    except MissingBinaries as exc:
        if os.environ.get("GPUPOOL_REQUIRE_KUBE") == "1":
            pytest.fail(f"GPUPOOL_REQUIRE_KUBE=1 but Kueue cannot start: {exc}")
        pytest.skip(f"Kueue beside the real API server: {exc}")
    r = kueue_versus.run_versus(nodes=2, count=3, cases=["gang"])
    (case,) = r["cases"]
    gp, kq = case["sides"]["gpupool"], case["sides"]["kueue"]
    assert gp["admitted"] == gp["admissible"] == 1 and gp["bound"] == 4
    assert gp["unbound_pods_of_admitted_jobs"] == 0 and not gp["quota_violations"]
    assert kq["admitted"] >= 1 and "kueue" in kq["cpu_seconds"]
    out = format_versus(r)
    assert "kueue + kube-scheduler" in out and "\n  gpupool " in out
