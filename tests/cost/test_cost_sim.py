"""Reports on a simulator replay: metering agrees with the simulator's own account."""

from __future__ import annotations

import json
import zipfile
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpupool.cli.main import app
from gpupool.cost.chargeback import reconciles
from gpupool.cost.metering import GPU_HOUR, Window
from gpupool.cost.policy import parse_policy
from gpupool.cost.reports import load, run_chargeback
from gpupool.cost.simhistory import Replay, replay
from gpupool.sim.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[2]
POC = ROOT / "examples" / "sim" / "poc.yaml"
PRICES = {"kind": "CostPolicy", "spec": {"pricePerGpuHour": {"training": 2.9, "inference": 1.8}}}


@pytest.fixture(scope="module")
def poc() -> Iterator[Replay]:
    yield replay(load_scenario(POC))


def test_metered_gpu_time_is_the_simulators(poc: Replay) -> None:
    data = load(poc.history, poc.bundle, Window(poc.start, poc.end), parse_policy(PRICES))
    metered = sum(m.gpu for m in data.metered) / GPU_HOUR
    simulated = sum(poc.result.queue_usage_gpu_s.values()) / 3600
    assert metered == pytest.approx(simulated, rel=1e-6)
    cb = run_chargeback(data)
    lost = sum(a for (_, kind), a in cb.losses.items() if kind == "preempted") / GPU_HOUR
    assert lost == pytest.approx(sum(j.lost_gpu_s for j in poc.result.jobs) / 3600, rel=1e-6)
    lost_faults = sum(a for (_, kind), a in cb.losses.items() if kind in ("requeued", "failed")) / GPU_HOUR
    assert lost_faults == pytest.approx(sum(j.lost_fault_gpu_s for j in poc.result.jobs) / 3600, rel=1e-6)
    assert all(reconciles(pc) for pc in cb.pools)
    assert {pc.pool: str(pc.price) for pc in cb.pools} == {"inference": "1.8", "training": "2.9"}


def test_every_simulated_job_waits_then_runs_in_order(poc: Replay) -> None:
    runs: dict[str, list[tuple[object, object]]] = {}
    for r in poc.history.runs:
        runs.setdefault(r.workload, []).append((r.start, r.end))
    for spans in runs.values():
        for (_, end), (start, _) in pairwise(spans):
            assert end is not None and end <= start  # a job never runs twice at once
    for w in poc.history.waits:
        assert w.end is None or w.start <= w.end


def test_cli_weekly_from_a_simulator_run(tmp_path: Path) -> None:
    out = tmp_path / "poc.html"
    res = CliRunner().invoke(app, ["report", "weekly", "--sim", str(POC), "-o", "html", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "Operations review" not in out.read_text()  # a replay has no approvals or operators
    bad = CliRunner().invoke(app, ["report", "usage", "--sim", str(POC), "--variant", "nope"])
    assert bad.exit_code == 2 and "--variant" in bad.output
    missing = CliRunner().invoke(app, ["report", "usage", "--sim", str(tmp_path / "none.yaml")])
    assert missing.exit_code == 2 and "--sim" in missing.output


def test_evidence_bundle_from_a_replay(tmp_path: Path) -> None:
    out = tmp_path / "sim.zip"
    res = CliRunner().invoke(app, ["evidence", "--sim", str(POC), "-o", str(out)])
    assert res.exit_code == 0, res.output
    with zipfile.ZipFile(out) as z:
        assert json.loads(z.read("audit/verify.json"))["ok"] is None  # said, not pretended
        pre = z.read("allocation/preemptions.jsonl").decode().splitlines()
        assert pre and all(json.loads(p)["victim"] for p in pre)
        assert (
            z.read("recovery/failures.csv").decode().startswith("workload,queue,at,reason,minutesToRunAgain")
        )
