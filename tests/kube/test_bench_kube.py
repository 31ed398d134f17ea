"""``gpupool bench kube``'s report: every figure the issue asks for, read from the result."""

from __future__ import annotations

from typing import Any

from gpupool.bench.kube import format_result, job


def _result(binds_per_s: float, first: float | None) -> dict[str, Any]:
    kube = {
        "nodes": 1000,
        "jobs": 2000,
        "pods": 10_000,
        "admissible": 8000,
        "bound": 8000,
        "create_seconds": 0.5,
        "first_bind_s": 0.4,
        "seconds": 8000 / binds_per_s,
        "binds_per_s": binds_per_s,
        "requests": 18_000,
        "requests_per_bind": 2.25,
        "top_requests": {"create pods/binding": 8000, "patch nodes": 8000},
        "cpu_seconds": {"fake_api_server_and_bench": 10.0, "gpupool_server": 12.0},
        "gpupool_cpu_ms_per_bind": 1.5,
        "restart": {"to_first_bind_s": first, "server_logged_s": 7.1},
        "violations": 0,
    }
    virtual = {
        "admitted_workloads": 1600,
        "pods": 8000,
        "seconds": 1.7,
        "pods_per_s": 4700.0,
        "submit_seconds": 0.3,
    }
    return {"kubernetes": kube, "virtual": virtual, "load_average_1m": 2.0, "cpus": 2}


def test_the_report_has_the_issues_figures() -> None:
    out = format_result(_result(520.0, 6.5))
    assert "8000 pods bound in 15.4 s" in out and "520 binds/s" in out
    assert "2.25 API requests per bind" in out
    assert "1.50 ms per bind: 667 binds per CPU-second" in out  # the adapter's own cost
    assert "first bind 6.5 s after spawning" in out
    assert "1600 workloads (8000 pods) admitted in 1.7 s" in out  # the virtual baseline
    assert ">= 500 binds/s met; restart-to-first-bind < 10 s met" in out


def test_missed_targets_are_said_so() -> None:
    out = format_result(_result(146.0, None))
    assert ">= 500 binds/s NOT met" in out and "restart-to-first-bind < 10 s NOT met" in out
    assert "first bind None s" in out


def test_bench_jobs_are_kueue_style() -> None:
    j = job(7, 5)
    assert j["spec"]["suspend"] is True and j["spec"]["parallelism"] == 5
    assert j["metadata"]["labels"] == {"kueue.x-k8s.io/queue-name": "bench"}
    assert j["spec"]["template"]["spec"]["schedulerName"] == "gpupool"
