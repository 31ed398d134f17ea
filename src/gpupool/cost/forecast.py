"""Capacity forecast (容量预测) and TCO (总拥有成本) from the metered history.

Why these models: demand on a GPU platform has a trend (teams grow) and a weekly rhythm (work is
submitted on weekdays); Holt-Winters exponential smoothing (statsmodels) models both and needs
no hand-written fitting. Every forecast is checked on data it was not fitted on: the last
quarter of the history is held out, the error there is reported next to a naive
same-time-last-season forecast, so a reader can judge whether the model earns its keep.

Why limits and intervals: a seasonal model learns nothing from less than two of its seasons, and
a history that starts before the cluster existed is zeros the model takes for a quiet past (a
15-minute-old install fitted over 28 days forecast a 500-GPU peak from 6.8 GPUs of demand).
So the series starts when the first node joined, the season is chosen from that length, a
history shorter than two daily seasons is refused (``--force`` answers with the fallback and a
warning), and the forecast comes with a prediction interval simulated from the fitted model,
sized into a range of GPU counts rather than one number.

Demand here is *wanted concurrency*: GPUs held plus GPUs requested by waiting work, per bucket.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import numpy as np

from gpupool.cost.chargeback import covered, pool_capacity
from gpupool.cost.limits import DAY_S, WEEK_S, Limit
from gpupool.cost.metering import US_PER_S, us_between
from gpupool.cost.reports import CostData

HOLDOUT = 0.25
#: the prediction interval's coverage: the 5th to the 95th percentile of simulated paths
LEVEL = 0.9
PATHS = 500  # simulated paths per interval (seeded: the same history gives the same interval)


def observed_since(data: CostData) -> datetime:
    """Where the history a forecast may learn from begins: when the first node of the window
    joined (the window's start without node history, or before any node existed: the end)."""
    part = covered(data.history.nodes, data.window)
    return data.window.end if part is None else part[0]


def demand_series(
    data: CostData, bucket_s: int = 3600, since: datetime | None = None
) -> dict[str, list[float]]:
    """Per pool, mean GPUs held plus GPUs waited for in each bucket from ``since`` (default the
    window's start) to the window's end. Buckets end at the window's end; the first one, cut by
    ``since``, is the mean over its part after ``since`` (time before it is not a quiet past)."""
    since = max(since or data.window.start, data.window.start)
    step = bucket_s * US_PER_S
    have = us_between(since, data.window.end)
    n = -(-have // step) if have > 0 else 0
    origin = data.window.end - timedelta(microseconds=n * step)  # the first bucket's start
    out: dict[str, list[float]] = {p: [0.0] * n for p in data.pools}
    for pool, start, end, milli in _spans(data):
        a, b = us_between(origin, max(start, since)), us_between(origin, end)
        row = out.setdefault(pool, [0.0] * n)
        while a < b:
            i = a // step
            stop = min(b, (i + 1) * step)
            row[i] += milli * (stop - a) / 1000
            a = stop
    first = step - (n * step - have)  # the part of the first bucket after ``since``
    return {p: [v / (first if i == 0 else step) for i, v in enumerate(row)] for p, row in out.items()}


def _spans(data: CostData) -> list[tuple[str, Any, Any, int]]:
    """(pool, start, end, milli-GPUs) of every run metered and every wait seen in the window."""
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
    return spans


@dataclass(frozen=True)
class Forecast:
    method: str
    values: list[float]  # the forecast, one per bucket of the horizon
    holdout_mae: float | None  # the method's error on the held-out tail (GPUs)
    naive_mae: float | None  # a same-time-last-season forecast's error there
    lower: list[float] | None = None  # the prediction interval (LEVEL), one per bucket
    upper: list[float] | None = None


#: a method's forecast and its interval bounds
Fitted = tuple[str, list[float], list[float], list[float]]


def _interval(res: Any, horizon: int) -> tuple[list[float], list[float]]:
    """The LEVEL prediction interval from paths simulated by the fitted model (statsmodels)."""
    paths = np.asarray(res.simulate(horizon, repetitions=PATHS, error="add", anchor="end", random_state=0))
    paths = paths.reshape(horizon, -1)
    tail = (1 - LEVEL) / 2 * 100
    lo, hi = np.percentile(paths, [tail, 100 - tail], axis=1)
    return [max(0.0, float(v)) for v in lo], [max(0.0, float(v)) for v in hi]


def _fit(history: Sequence[float], horizon: int, season: int) -> Fitted:
    """Holt-Winters when two seasons are known, Holt's trend with four points, else the mean
    (its interval: the history's range)."""
    from statsmodels.tsa.holtwinters import ExponentialSmoothing

    y = np.asarray(history, dtype=float)
    if len(y) == 0:
        return "none", [0.0] * horizon, [0.0] * horizon, [0.0] * horizon
    if np.ptp(y) == 0:
        flat = [float(y[0])] * horizon
        return "constant", flat, flat, flat
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # convergence chatter on short, flat series
        if season > 1 and len(y) >= 2 * season:
            model = ExponentialSmoothing(
                y, trend="add", seasonal="add", seasonal_periods=season, damped_trend=True
            )
            method = "holt-winters"
        elif len(y) >= 4:
            model = ExponentialSmoothing(y, trend="add", damped_trend=True)
            method = "holt"
        else:
            mean = [float(y.mean())] * horizon
            return "mean", mean, [float(y.min())] * horizon, [float(y.max())] * horizon
        res = model.fit()
        lo, hi = _interval(res, horizon)
    return method, [max(0.0, float(v)) for v in res.forecast(horizon)], lo, hi


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
        pred = _fit(history[:cut], len(test), season)[1]
        mae = _mae(pred, test)
        naive = _mae(_naive(history[:cut], len(test), season), test)
    method, values, lower, upper = _fit(history, horizon, season)
    return Forecast(method, values, mae, naive, lower, upper)


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


def forecast_limit(command: str, bucket_s: int) -> Limit:
    """Two daily seasons: the least history the seasonal model learns a daily rhythm from."""
    return Limit(command, 2 * DAY_S, f"two daily seasons of {DAY_S // bucket_s} buckets for Holt-Winters")


def season_of(have_s: float, bucket_s: int) -> int:
    """The season, in buckets: a week once two weeks are known, else a day (from the history
    the model is fitted on, not the window asked for)."""
    return (WEEK_S if have_s >= 2 * WEEK_S else DAY_S) // bucket_s


def history_note(data: CostData, command: str, bucket_s: int, force: bool) -> tuple[datetime, str | None]:
    """Where the forecast's history starts, and the warning when it is short (raises when short
    and not forced)."""
    since = observed_since(data)
    have = us_between(since, data.window.end) / US_PER_S
    if covered(data.history.nodes, data.window) is None:
        words = "no node existed in the window"
    elif since > data.window.start:
        words = f"since the first node joined at {since:%Y-%m-%d %H:%M} UTC"
    else:
        words = f"the whole window, from {since:%Y-%m-%d %H:%M} UTC"
    return since, forecast_limit(command, bucket_s).check(have, words, force)


def capacity_plan(
    data: CostData,
    horizon_days: int = 14,
    target_wait_h: float = 0.5,
    bucket_s: int = 3600,
    since: datetime | None = None,
) -> dict[str, Any]:
    """Per pool: forecast of demand with its interval, its held-out error, and the GPUs the wait
    target needs (for the forecast, and for the interval's low and high ends). The history
    starts at ``since``, by default when the first node joined (``observed_since``)."""
    since = since or observed_since(data)
    season = season_of(us_between(since, data.window.end) / US_PER_S, bucket_s)
    horizon = max(1, horizon_days * DAY_S // bucket_s)
    bucket_h = bucket_s / 3600
    rows = []
    for pool, series in sorted(demand_series(data, bucket_s, since).items()):
        f = forecast(series, horizon, season)
        need = gpus_for_wait(f.values, target_wait_h, bucket_h)
        low = gpus_for_wait(f.lower or f.values, target_wait_h, bucket_h)
        high = gpus_for_wait(f.upper or f.values, target_wait_h, bucket_h)
        today = data.pools[pool].gpus if pool in data.pools else 0
        rows.append(
            [pool, today, round(max(series, default=0.0), 2), round(max(f.values), 2),
             round(max(f.lower or f.values), 2), round(max(f.upper or f.values), 2),
             need, low, high, need - today, f.method,
             None if f.holdout_mae is None else round(f.holdout_mae, 3),
             None if f.naive_mae is None else round(f.naive_mae, 3)]
        )  # fmt: skip
    cols = ["pool", "gpusToday", "peakDemand", "forecastPeak", "forecastPeakLow", "forecastPeakHigh"]
    cols += ["gpusNeeded", "gpusNeededLow", "gpusNeededHigh", "change", "method", "holdoutMAE", "naiveMAE"]
    end = data.window.end + timedelta(days=horizon_days)
    return {
        "name": "capacity",
        "title": f"Capacity for waits under {target_wait_h:g} h until {end.date().isoformat()}"
        f" ({LEVEL:.0%} interval: low-high)",
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
    data: CostData,
    params: TcoParams,
    target_wait_h: float = 0.5,
    horizon_days: int = 14,
    force: bool = False,
) -> dict[str, Any]:
    """GPUs needed for the wait target per pool (a range: the forecast interval's low and high
    ends around the forecast), and owning them against renting, today and planned. Refuses a
    history shorter than two daily seasons unless ``force`` (then the summary warns)."""
    from gpupool.cost.reports import report

    since, warning = history_note(data, "report tco", 3600, force)
    plan = capacity_plan(data, horizon_days, target_wait_h, since=since)
    demand = demand_series(data, since=since)
    allocated: dict[str, int] = {}
    for m in data.mine():
        allocated[m.pool] = allocated.get(m.pool, 0) + m.gpu
    rows, advice = [], []
    col = {c: i for i, c in enumerate(plan["columns"])}
    for r in plan["rows"]:
        pool, today = r[0], r[1]
        low, need, high = r[col["gpusNeededLow"]], r[col["gpusNeeded"]], r[col["gpusNeededHigh"]]
        cap = pool_capacity(data.pools[pool], data.window) if pool in data.pools else 0
        measured = allocated.get(pool, 0) / cap if cap else 0.0
        mean_demand = float(np.mean(demand.get(pool) or [0.0]))
        rows.append([pool, "today", *tco(today, measured, params).values()])
        for label, gpus in (("planned-low", low), ("planned", need), ("planned-high", high)):
            util = min(1.0, mean_demand / gpus) if gpus else 0.0
            rows.append([pool, label, *tco(gpus, util, params).values()])
        advice.append(f"{pool} {low}-{high} (forecast {need}, today {today})")
    tco_cols = ["pool", "design", "gpus", "utilization", "ownPerMonth", "rentPerMonth"]
    tco_cols += ["ownPerDeliveredGpuHour", "rentPerDeliveredGpuHour", "breakEvenUtilization"]
    tables = [
        plan,
        {"name": "tco", "title": "Own against rent, per month", "columns": tco_cols, "rows": rows},
    ]
    summary: dict[str, Any] = {"warning": warning} if warning else {}
    summary |= {"gpusNeeded": "; ".join(advice), "historyFrom": since.isoformat()}
    summary |= {"targetWaitHours": target_wait_h, "horizonDays": horizon_days}
    summary |= {k: getattr(params, v) for k, v in TCO_KEYS.items()}
    return report("tco", data, tables, summary)


def forecast_report(
    data: CostData, target_wait_h: float = 0.5, horizon_days: int = 14, force: bool = False
) -> dict[str, Any]:
    """The capacity forecast alone (``gpupool report forecast``): the same limit, interval and
    range of GPUs as ``report tco``, without the cost model."""
    from gpupool.cost.reports import report

    since, warning = history_note(data, "report forecast", 3600, force)
    plan = capacity_plan(data, horizon_days, target_wait_h, since=since)
    summary: dict[str, Any] = {"warning": warning} if warning else {}
    summary |= {"historyFrom": since.isoformat(), "targetWaitHours": target_wait_h}
    summary |= {"horizonDays": horizon_days, "interval": f"{LEVEL:.0%}"}
    return report("forecast", data, [plan], summary)
