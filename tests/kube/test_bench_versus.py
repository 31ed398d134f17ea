"""``gpupool bench kube --versus kueue``: Kueue's objects come from the same gpupool manifests
(one quota for both sides), the Jobs are spread as the case says, and the report prints both
rows. The run itself needs the real binaries and minutes; it is a benchmark, not a test."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from typer.testing import CliRunner

from gpupool.bench.kueue_versus import (
    GPU,
    QUEUE_LABEL,
    format_versus,
    gpupool_manifests,
    jobs,
    kueue_objects,
    limits,
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
    r = {
        "case": "cohort-borrowing",
        "nodes": 25,
        "jobs": 300,
        "admissible": 200,
        "cpus": 2,
        "load_average_1m": {"before": 1.0, "after": 2.0},
        "sides": {"kueue": _side(8.0), "gpupool": _side(None)},
    }
    out = format_versus(r)
    assert "kueue + kube-scheduler" in out and "\n  gpupool " in out
    assert "team-b 90/88/90" in out and "preemptions 2" in out
    assert " - " in out  # a side that never got there reads "-", not 0


def test_an_unknown_versus_is_a_clear_error() -> None:
    res = CliRunner().invoke(app, ["bench", "kube", "--versus", "volcano"])
    assert res.exit_code == 2
    assert "--versus" in res.output
