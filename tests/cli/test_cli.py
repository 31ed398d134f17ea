"""The CLI as a user meets it: readable output, located errors, exit codes, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from gpupool.cli import app

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def test_demo_shows_decisions_and_reasons() -> None:
    r = runner.invoke(app, ["demo"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "admit" in r.output and "pending" in r.output
    assert "llama-405b-pretrain" in r.output


def test_schedule_json_is_machine_readable() -> None:
    r = runner.invoke(
        app,
        [
            "schedule",
            "-f",
            str(ROOT / "examples" / "cluster"),
            "-f",
            str(ROOT / "examples" / "workloads"),
            "-o",
            "json",
        ],
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["invariantViolations"] == []
    names = {a["workload"] for a in out["admitted"]}
    assert "chat-serving" in names
    pending = {p["workload"]: p for p in out["pending"]}
    assert pending["llama-405b-pretrain"]["code"] == "QuotaExceeded"


def test_bad_manifest_exits_2_with_located_error(tmp_path: Path) -> None:
    f = tmp_path / "q.yaml"
    f.write_text("apiVersion: gpupool.io/v1alpha1\nkind: Queue\nmetadata: {name: q}\nspec: {weight: zero}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "gpupool.cli.main", "validate", "-f", str(f)], capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert f"{f}: document 1 (Queue/q): spec.weight" in proc.stderr


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    r = runner.invoke(app, ["validate", "-f", str(tmp_path / "nope.yaml")])
    assert r.exit_code == 2
    assert "no such file or directory" in r.output


def test_bench_engine_json_small() -> None:
    r = runner.invoke(
        app,
        [
            "bench",
            "engine",
            "--nodes",
            "40",
            "--queues",
            "20",
            "--cohorts",
            "2",
            "--workloads",
            "300",
            "-o",
            "json",
        ],
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    for key in ("placements_per_second", "cycle_seconds", "cpu_seconds", "peak_memory_mb"):
        assert key in out and key in out["baseline"]
    assert out["cpu_speedup_vs_baseline"] > 0  # the ratio by CPU seconds, as bench/README.md states it
    assert out["placements"] > 0
