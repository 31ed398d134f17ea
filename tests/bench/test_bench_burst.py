"""The burst benchmark runs end to end on a small burst (its figures are read, not asserted)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.bench.burst import run_burst


@pytest.mark.slow
def test_burst_bench_reports_both_bursts_without_errors() -> None:
    r = run_burst(60, 4, [], backlog=20)
    assert r["baseline_healthz"]["n"] == r["submit"]["n"] == 60
    assert r["submit"]["errors"] == 0 and r["baseline_healthz"]["errors"] == 0
    assert 0 < r["submit"]["p50_ms"] <= r["submit"]["p99_ms"] <= r["submit"]["max_ms"]
    assert r["backlog"] == 20
    for b in (r["submit"], r["baseline_healthz"]):
        assert b["p50_ms"] <= b["p95_ms"] <= b["p99_ms"]
        assert b["server_cpu_ms_per_request"] > 0 and b["client_cpu_ms_per_request"] > 0
        assert b["load_average_start"] >= 0 and b["load_average_end"] >= 0


def _burst_row(n: int) -> dict[str, float]:
    return {
        "n": n,
        "per_s": 500.0,
        "p50_ms": 10.0,
        "p95_ms": 20.0,
        "p99_ms": 30.0,
        "max_ms": 40.0,
        "errors": 0,
        "server_cpu_ms_per_request": 1.25,
        "client_cpu_ms_per_request": 0.1,
        "load_average_start": 3.0,
        "load_average_end": 4.0,
    }


def test_burst_table_names_cpu_per_request_and_load_beside_each_latency() -> None:
    from gpupool.bench.burst import format_burst

    r = {
        "database": "postgresql+psycopg://127.0.0.1:5432/db",
        "clients": 32,
        "backlog": 0,
        "baseline_healthz": _burst_row(10),
        "submit": _burst_row(10),
        "cycles_during_burst": 3.0,
        "cycle_seconds_during_burst": 0.5,
        "meets_target": True,
    }
    text = format_burst(r)
    assert "postgresql+psycopg://127.0.0.1:5432/db" in text
    assert text.count("p95   20.0") == 2 and text.count("server 1.25 ms, client 0.10 ms") == 2
    assert text.count("load average 3.0 -> 4.0") == 2


def test_burst_database_label_drops_credentials() -> None:
    from gpupool.bench.burst import _database

    assert _database(["--database-url", "postgresql://u:secret@h:5432/d"]) == "postgresql://h:5432/d"
    assert _database([]) == "sqlite (state dir)"


def test_burst_issues_its_own_token_on_a_database_that_already_had_one(tmp_path: Path) -> None:
    """A second run on one PostgreSQL database gets no bootstrap token file: it used to fail."""
    from gpupool.bench.burst import _token
    from gpupool.store import Store

    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    st = Store.open(url)
    try:
        assert st.ensure_bootstrap_admin() is not None
        token = _token(tmp_path, ["--database-url", url])
        principal = st.authenticate(token)
        assert principal is not None and principal.role.value == "platform-admin"
    finally:
        st.close()
