"""The burst benchmark runs end to end on a small burst (its figures are read, not asserted)."""

from __future__ import annotations

import pytest

from gpupool.bench.burst import run_burst


@pytest.mark.slow
def test_burst_bench_reports_both_bursts_without_errors() -> None:
    r = run_burst(60, 4, [], backlog=20)
    assert r["baseline_healthz"]["n"] == r["submit"]["n"] == 60
    assert r["submit"]["errors"] == 0 and r["baseline_healthz"]["errors"] == 0
    assert 0 < r["submit"]["p50_ms"] <= r["submit"]["p99_ms"] <= r["submit"]["max_ms"]
    assert r["backlog"] == 20
