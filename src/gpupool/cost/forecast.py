"""Capacity forecast (容量预测) and TCO (总拥有成本) from the metered history.

Why these models: demand on a GPU platform has a trend (teams grow) and a weekly rhythm (work is
submitted on weekdays); Holt-Winters exponential smoothing (statsmodels) models both and needs
no hand-written fitting. A history too short for a season falls back to Holt's trend, then to
the mean, and the report says which was used. Every forecast is checked on data it was not
fitted on: the last quarter of the history is held out, the error there is reported next to a
naive same-time-last-season forecast, so a reader can judge whether the model earns its keep.

Demand here is *wanted concurrency*: GPUs held plus GPUs requested by waiting work, per bucket.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np

from gpupool.cost.metering import US_PER_S, us_between
from gpupool.cost.reports import CostData

HOLDOUT = 0.25


def demand_series(data: CostData, bucket_s: int = 3600) -> dict[str, list[float]]:
    """Per pool, mean GPUs held plus GPUs waited for in each bucket of the window."""
    n = max(1, -(-data.window.us // (bucket_s * US_PER_S)))
    step = bucket_s * US_PER_S
    out: dict[str, list[float]] = {p: [0.0] * n for p in data.pools}
    spans: list[tuple[str, Any, Any, int]] = [
        (m.pool, m.start, m.end, m.gpu // us_between(m.start, m.end)) for m in data.mine()
    ]
    ran_in = {r.workload: r.res.pool for r in data.history.runs}
    for w in data.history.waits:
        info = data.history.workloads[w.workload]
        pool = info.pool_hint or ran_in.get(w.workload, "")
        start, end = max(w.start, data.window.start), min(w.end or data.window.end, data.window.end)
        if pool and end > start and data.sees(info.queue):
            spans.append((pool, start, end, info.requested_gpu_milli))
    for pool, start, end, milli in spans:
        a, b = us_between(data.window.start, start), us_between(data.window.start, end)
        row = out.setdefault(pool, [0.0] * n)
        while a < b:
            i = a // step
            stop = min(b, (i + 1) * step)
            row[i] += milli * (stop - a) / (1000 * step)
            a = stop
    return out


@dataclass(frozen=True)
class Forecast:
    method: str
    values: list[float]  # the forecast, one per bucket of the horizon
    holdout_mae: float | None  # the method's error on the held-out tail (GPUs)
    naive_mae: float | None  # a same-time-last-season forecast's error there


def _fit(history: Sequence[float], horizon: int, season: int) -> tuple[str, list[float]]:
    """Holt-Winters when two seasons are known, Holt's trend with four points, else the mean."""
    from statsmodels.tsa.holtwinters import ExponentialSmoothing

    y = np.asarray(history, dtype=float)
    if len(y) == 0:
        return "none", [0.0] * horizon
    if np.ptp(y) == 0:
        return "constant", [float(y[0])] * horizon
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # convergence chatter on short, flat series
        if season > 1 and len(y) >= 2 * season:
            model = ExponentialSmoothing(
                y, trend="add", seasonal="add", seasonal_periods=season, damped_trend=True
            )
            return "holt-winters", [max(0.0, float(v)) for v in model.fit().forecast(horizon)]
        if len(y) >= 4:
            model = ExponentialSmoothing(y, trend="add", damped_trend=True)
            return "holt", [max(0.0, float(v)) for v in model.fit().forecast(horizon)]
    return "mean", [float(y.mean())] * horizon


def _naive(history: Sequence[float], horizon: int, season: int) -> list[float]:
    if not history:
        return [0.0] * horizon
    s = season if season > 1 and len(history) >= season else 1
    tail = list(history[-s:])
    return [tail[i % s] for i in range(horizon)]


def _mae(a: Sequence[float], b: Sequence[float]) -> float:
    return float(np.mean(np.abs(np.asarray(a) - np.asarray(b)))) if a else 0.0


def forecast(history: Sequence[float], horizon: int, season: int) -> Forecast:
    """Fit on the first three quarters, score on the last; then refit on all and forecast."""
    if horizon < 1:
        raise ValueError("horizon: must be at least one bucket")
    cut = int(len(history) * (1 - HOLDOUT))
    test = list(history[cut:])
    mae = naive = None
    if cut >= 4 and test:
        _, pred = _fit(history[:cut], len(test), season)
        mae = _mae(pred, test)
        naive = _mae(_naive(history[:cut], len(test), season), test)
    method, values = _fit(history, horizon, season)
    return Forecast(method, values, mae, naive)


def gpus_for_wait(demand: Sequence[float], target_wait_h: float, bucket_h: float = 1.0) -> int:
    """The fewest GPUs for which a fluid queue fed by ``demand`` never waits longer than the target.

    Model (docs/cost.md): in each bucket the work wanting GPUs beyond the capacity C joins a
    backlog that drains when demand falls below C; the backlog's wait is backlog / C hours.
    An approximation for sizing; the simulator's replay is the exact answer for one design.
    """
    if target_wait_h < 0:
        raise ValueError("target wait: must not be negative")
    peak = max(demand, default=0.0)
    if peak <= 0:
        return 0

    def ok(c: int) -> bool:
        backlog = 0.0
        for d in demand:
            backlog = max(0.0, backlog + (d - c) * bucket_h)
            if backlog / c > target_wait_h + 1e-9:
                return False
        return True

    lo, hi = 1, math.ceil(peak)  # the peak always suffices; the answer lies in [1, peak]
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid + 1, hi)
    return lo


def capacity_plan(
    data: CostData, horizon_days: int = 14, target_wait_h: float = 0.5, bucket_s: int = 3600
) -> dict[str, Any]:
    """Per pool: forecast of demand, its held-out error, and GPUs needed for the wait target."""
    season = (7 * 86400) // bucket_s if data.window.us >= 14 * 86400 * US_PER_S else 86400 // bucket_s
    horizon = max(1, horizon_days * 86400 // bucket_s)
    rows = []
    for pool, series in sorted(demand_series(data, bucket_s).items()):
        f = forecast(series, horizon, season)
        need = gpus_for_wait(f.values, target_wait_h, bucket_s / 3600)
        today = data.pools[pool].gpus if pool in data.pools else 0
        rows.append(
            [
                pool,
                today,
                round(max(series, default=0.0), 2),
                round(max(f.values), 2),
                need,
                need - today,
                f.method,
                None if f.holdout_mae is None else round(f.holdout_mae, 3),
                None if f.naive_mae is None else round(f.naive_mae, 3),
            ]
        )
    cols = ["pool", "gpusToday", "peakDemand", "forecastPeak", "gpusNeeded", "change", "method"]
    cols += ["holdoutMAE", "naiveMAE"]
    end = data.window.end + timedelta(days=horizon_days)
    return {
        "name": "capacity",
        "title": f"Capacity for waits under {target_wait_h:g} h until {end.date().isoformat()}",
        "columns": cols,
        "rows": rows,
    }


@dataclass(frozen=True)
class TcoParams:
    """Owning against renting (inputs of ``gpupool report tco --params FILE``)."""

    capex_per_gpu: float = 30_000.0  # purchase, with its share of the node
    life_years: float = 4.0  # straight-line depreciation
    power_kw_per_gpu: float = 0.7  # at the wall, node share included
    price_per_kwh: float = 0.12
    pue: float = 1.3
    facility_per_gpu_month: float = 40.0  # space, network, support contracts
    ops_hours_per_node_month: float = 4.0  # operations effort
    ops_hourly_rate: float = 80.0
    gpus_per_node: int = 8
    rent_per_gpu_hour: float = 2.9  # on demand: paid only while allocated
    utilization: float | None = None  # allocated / capacity; None: measured


TCO_KEYS = {
    "capexPerGpu": "capex_per_gpu",
    "lifeYears": "life_years",
    "powerKwPerGpu": "power_kw_per_gpu",
    "pricePerKwh": "price_per_kwh",
    "pue": "pue",
    "facilityPerGpuMonth": "facility_per_gpu_month",
    "opsHoursPerNodeMonth": "ops_hours_per_node_month",
    "opsHourlyRate": "ops_hourly_rate",
    "gpusPerNode": "gpus_per_node",
    "rentPerGpuHour": "rent_per_gpu_hour",
    "utilization": "utilization",
}


def parse_tco(doc: Mapping[str, Any] | None, where: str = "tco") -> TcoParams:
    """Parameters from a YAML mapping (camelCase keys); a bad value names its key."""
    vals: dict[str, Any] = {}
    for k, v in (doc or {}).items():
        if k not in TCO_KEYS:
            raise ValueError(f"{where}: {k}: unknown parameter; one of {', '.join(TCO_KEYS)}")
        if (
            isinstance(v, bool)
            or not isinstance(v, int | float)
            or v < 0
            or (k == "utilization" and not 0 < v <= 1)
        ):
            raise ValueError(
                f"{where}: {k}: must be a non-negative number{' in (0, 1]' if k == 'utilization' else ''}"
            )
        vals[TCO_KEYS[k]] = v
    p = TcoParams(**vals)
    if p.life_years <= 0 or p.gpus_per_node < 1:
        raise ValueError(f"{where}: lifeYears and gpusPerNode: must be positive")
    return p


HOURS_PER_MONTH = 730.0


def tco(gpus: int, utilization: float, p: TcoParams) -> dict[str, float]:
    """Monthly cost of owning ``gpus`` against renting the GPU-hours they would deliver."""
    u = p.utilization if p.utilization is not None else utilization
    own_gpu_month = (
        p.capex_per_gpu / (p.life_years * 12)
        + p.power_kw_per_gpu * p.pue * p.price_per_kwh * HOURS_PER_MONTH
        + p.facility_per_gpu_month
        + p.ops_hours_per_node_month * p.ops_hourly_rate / p.gpus_per_node
    )
    delivered = gpus * HOURS_PER_MONTH * u
    own = own_gpu_month * gpus
    rent = delivered * p.rent_per_gpu_hour
    return {
        "gpus": gpus,
        "utilization": round(u, 4),
        "ownPerMonth": round(own, 2),
        "rentPerMonth": round(rent, 2),
        "ownPerDeliveredGpuHour": round(own / delivered, 4) if delivered else math.inf,
        "rentPerDeliveredGpuHour": p.rent_per_gpu_hour,
        "breakEvenUtilization": round(own_gpu_month / (HOURS_PER_MONTH * p.rent_per_gpu_hour), 4)
        if p.rent_per_gpu_hour
        else math.inf,
    }


def tco_report(
    data: CostData, params: TcoParams, target_wait_h: float = 0.5, horizon_days: int = 14
) -> dict[str, Any]:
    """GPUs needed for the wait target per pool, and owning them against renting, today and planned."""
    from gpupool.cost.reports import report

    plan = capacity_plan(data, horizon_days, target_wait_h)
    demand = demand_series(data)
    allocated: dict[str, int] = {}
    for m in data.mine():
        allocated[m.pool] = allocated.get(m.pool, 0) + m.gpu
    rows = []
    cols = plan["columns"]
    for r in plan["rows"]:
        pool, today, need = r[0], r[1], r[cols.index("gpusNeeded")]
        cap = today * 1000 * data.window.us
        measured = allocated.get(pool, 0) / cap if cap else 0.0
        mean_demand = float(np.mean(demand.get(pool, [0.0])))
        for label, gpus, util in (
            ("today", today, measured),
            ("planned", need, min(1.0, mean_demand / need) if need else 0.0),
        ):
            t = tco(gpus, util, params)
            rows.append([pool, label, *t.values()])
    tco_cols = ["pool", "design", "gpus", "utilization", "ownPerMonth", "rentPerMonth"]
    tco_cols += ["ownPerDeliveredGpuHour", "rentPerDeliveredGpuHour", "breakEvenUtilization"]
    tables = [
        plan,
        {"name": "tco", "title": "Own against rent, per month", "columns": tco_cols, "rows": rows},
    ]
    assumptions = {k: getattr(params, v) for k, v in TCO_KEYS.items()}
    return report(
        "tco", data, tables, {"targetWaitHours": target_wait_h, "horizonDays": horizon_days, **assumptions}
    )
