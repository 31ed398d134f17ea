"""Demand forecast, GPUs for a wait target, and TCO."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from gpupool.cli.main import app
from gpupool.cost.forecast import (
    TcoParams,
    capacity_plan,
    demand_series,
    forecast,
    gpus_for_wait,
    parse_tco,
    tco,
    tco_report,
)
from gpupool.cost.history import History, Resources, Run, Wait, WorkloadInfo
from gpupool.cost.metering import Window
from gpupool.cost.policy import CostPolicySpec
from gpupool.cost.reports import load
from gpupool.service.config import EXAMPLES, seed_config
from gpupool.store import Store
from tests.cost.test_cost_metering import example_bundle

T0 = datetime(2026, 11, 2, tzinfo=UTC)


def weekly_series(weeks: int, seed: int = 7) -> list[float]:
    """Hourly demand: a weekday/daytime rhythm, a slow trend, a little noise."""
    rng = np.random.default_rng(seed)
    out = []
    for h in range(weeks * 168):
        day, hour = (h // 24) % 7, h % 24
        base = 20 + 0.01 * h + (10 if day < 5 and 8 <= hour < 20 else 0)
        out.append(max(0.0, base + rng.normal(0, 1)))
    return out


def test_holt_winters_learns_the_week_and_beats_guessing_on_held_out_data() -> None:
    f = forecast(weekly_series(6), horizon=168, season=168)
    assert f.method == "holt-winters" and len(f.values) == 168
    assert f.holdout_mae is not None and f.holdout_mae < 2.0  # the noise is 1 GPU; the rhythm is 10
    # a weekday noon is forecast busier than a Sunday night
    monday_noon, sunday_night = f.values[12], f.values[6 * 24 + 2]
    assert monday_noon - sunday_night > 5


def test_short_histories_fall_back() -> None:
    assert forecast([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 3, 168).method == "holt"
    assert forecast([2.0, 4.0], 2, 24).method == "mean" and forecast([2.0, 4.0], 2, 24).values == [3.0, 3.0]
    assert forecast([5.0] * 50, 2, 24).values == [5.0, 5.0]
    with pytest.raises(ValueError, match="horizon"):
        forecast([1.0], 0, 24)


def test_gpus_for_a_wait_target() -> None:
    assert gpus_for_wait([10.0] * 24, 0.0) == 10
    assert gpus_for_wait([], 1.0) == 0
    # one 20-GPU hour among 5-GPU hours: 10 GPUs leave a 10 GPU-hour backlog, one hour's wait
    spike = [5.0] * 5 + [20.0] + [5.0] * 5
    assert gpus_for_wait(spike, 1.0) == 10
    assert gpus_for_wait(spike, 0.0) == 20
    assert gpus_for_wait(spike, 100.0) < 10
    with pytest.raises(ValueError, match="target wait"):
        gpus_for_wait(spike, -1)


def test_tco_known_answer_and_break_even() -> None:
    p = TcoParams(capex_per_gpu=24_000, life_years=4, power_kw_per_gpu=1.0, price_per_kwh=0.1, pue=1.0)
    p = TcoParams(
        **{
            **p.__dict__,
            "facility_per_gpu_month": 0.0,
            "ops_hours_per_node_month": 0.0,
            "rent_per_gpu_hour": 2.0,
        }
    )
    t = tco(10, 0.5, p)
    # 500 capex + 73 power per GPU-month; 10 GPUs; 3650 delivered GPU-hours at 2.00 rented
    assert t["ownPerMonth"] == 5730.0 and t["rentPerMonth"] == 7300.0
    assert t["ownPerDeliveredGpuHour"] == pytest.approx(5730 / 3650, abs=1e-4)
    assert t["breakEvenUtilization"] == pytest.approx(573 / 1460, abs=1e-4)
    assert math.isinf(tco(0, 0.5, p)["ownPerDeliveredGpuHour"])


def test_tco_parameters_name_the_bad_key() -> None:
    assert parse_tco({"rentPerGpuHour": 3.5}).rent_per_gpu_hour == 3.5
    with pytest.raises(ValueError, match="capexPerGPU: unknown parameter"):
        parse_tco({"capexPerGPU": 1})
    with pytest.raises(ValueError, match="utilization: must be"):
        parse_tco({"utilization": 1.5})
    with pytest.raises(ValueError, match="pue: must be"):
        parse_tco({"pue": "high"})


def history() -> History:
    """4 GPUs busy for 10 h every day of a week on p, and 4 more waited for 2 h each day."""
    info = {
        "busy": WorkloadInfo(
            "busy", "llm-research", "", "training", 4000, 0, 0, "h100-training", "Succeeded", ""
        ),
        "late": WorkloadInfo(
            "late", "llm-research", "", "training", 4000, 0, 0, "h100-training", "Pending", ""
        ),
    }
    runs, waits = [], []
    res = Resources("h100-training", "H100-80GB", 4000, 4, 1000, 0, 0)
    for d in range(7):
        day = T0 + timedelta(days=d)
        runs.append(Run("busy", d + 1, day + timedelta(hours=8), day + timedelta(hours=18), "Succeeded", res))
        waits.append(Wait("late", day + timedelta(hours=9), day + timedelta(hours=11), False, "quota"))
    return History(info, runs, waits, [])


def test_demand_and_the_capacity_plan_from_a_history() -> None:
    bundle = example_bundle()
    data = load(history(), bundle, Window(T0, T0 + timedelta(days=7)), CostPolicySpec())
    d = demand_series(data)["h100-training"]
    assert len(d) == 168 and d[8] == 4.0 and d[9] == 8.0 and d[20] == 0.0
    plan = capacity_plan(data, horizon_days=7, target_wait_h=0.0)
    row = dict(zip(plan["columns"], next(r for r in plan["rows"] if r[0] == "h100-training"), strict=True))
    assert row["peakDemand"] == 8.0 and row["method"] == "holt-winters"
    assert 6 <= row["gpusNeeded"] <= 10  # about the daily peak of 8
    rep = tco_report(data, TcoParams(), 0.0, 7)
    designs = [r[1] for r in rep["tables"][1]["rows"] if r[0] == "h100-training"]
    assert designs == ["today", "planned-low", "planned", "planned-high"]


def test_cli_tco_on_a_store(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/g.db"
    with Store.open(db) as s:
        seed_config(s, EXAMPLES / "cluster")
    params = tmp_path / "tco.yaml"
    params.write_text("rentPerGpuHour: 3.1\nopsHourlyRate: 90\n")
    res = CliRunner().invoke(
        app, ["report", "tco", "--db", db, "--params", str(params), "--to", "2026-12-01", "--force"]
    )  # its nodes join after --to: no history, answered only when forced
    assert res.exit_code == 0, res.output
    assert "Own against rent" in res.stdout and "h100-training" in res.stdout
    params.write_text("rentPerGpuHour: -1\n")
    bad = CliRunner().invoke(app, ["report", "tco", "--db", db, "--params", str(params)])
    assert bad.exit_code == 2 and "rentPerGpuHour" in bad.output
