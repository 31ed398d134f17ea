"""Metering: exact allocated (and, where known, used) GPU time per run, clipped to a window.

Why integers: a chargeback must reconcile to the cent, which floats cannot promise once
thousands of intervals are summed. Every amount here is an ``int`` in *milli-GPU-microseconds*
(gpuMilli x microseconds, the store's clock resolution): a whole GPU for one second is
1,000 x 1,000,000. CPU is milli-CPU-microseconds and memory MiB-microseconds alike.

A run counts once, from its admission to the phase that ended it (preempted, requeued,
finished), and a run still holding its GPUs counts up to the window's end (``--to`` or now).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Protocol

from gpupool.cost.history import History, Run, WorkloadInfo

US_PER_S = 1_000_000
#: the longest window a report covers (ten years): bounds the work and memory of one request
MAX_WINDOW_DAYS = 3660
#: one GPU-hour in milli-GPU-microseconds
GPU_HOUR = 1000 * 3600 * US_PER_S

#: the virtual backend's simulated utilization (share of allocated GPU time doing work) per task
#: type; a documented assumption (docs/cost.md), not a measurement: training keeps GPUs busy,
#: inference idles between requests, evaluation and batch lie between.
SIMULATED_UTILIZATION: Mapping[str, float] = {
    "training": 0.85,
    "fine-tuning": 0.80,
    "inference": 0.45,
    "evaluation": 0.60,
    "batch": 0.70,
}


class UsageSource(Protocol):
    """Where used GPU time comes from. ``None``: this source cannot tell for that run.

    The local backend would answer from NVML utilization samples and Kubernetes from DCGM
    exporter series (``DCGM_FI_DEV_GPU_UTIL`` per pod, read from a Prometheus URL); neither is
    wired yet, so those backends report allocated time only and ``used`` stays empty.
    """

    def used_share(self, run: Run, info: WorkloadInfo) -> float | None: ...


class SimulatedUsage:
    """The virtual backend's answer: the per-type table above."""

    def __init__(self, table: Mapping[str, float] | None = None) -> None:
        self.table = dict(SIMULATED_UTILIZATION if table is None else table)

    def used_share(self, run: Run, info: WorkloadInfo) -> float | None:
        return self.table.get(info.task_type)


class NoUsage:
    """A backend that cannot tell (NVML/DCGM not configured): allocated time only."""

    def used_share(self, run: Run, info: WorkloadInfo) -> float | None:
        return None


@dataclass(frozen=True, slots=True)
class Window:
    """``[start, end)`` in UTC; both aware datetimes."""

    start: datetime
    end: datetime

    def __post_init__(self) -> None:
        for field, v in (("from", self.start), ("to", self.end)):
            if v.tzinfo is None:
                raise ValueError(f"{field}: a time zone is required (use UTC, e.g. 2026-12-01T00:00Z)")
        if self.end <= self.start:
            raise ValueError(f"to: must be after from ({self.start.isoformat()})")
        if self.end - self.start > timedelta(days=MAX_WINDOW_DAYS):
            raise ValueError(f"from: a report spans at most {MAX_WINDOW_DAYS} days; narrow --from/--to")

    @property
    def us(self) -> int:
        return us_between(self.start, self.end)


def us_between(a: datetime, b: datetime) -> int:
    """Exact microseconds from a to b (timedelta is exact, float seconds are not)."""
    d = b - a
    return (d.days * 86_400 + d.seconds) * US_PER_S + d.microseconds


def retained(window: Window, retention_days: int | None) -> Window:
    """The window cut to the retention period: history older than that is not reported."""
    if retention_days is None:
        return window
    if retention_days <= 0:
        raise ValueError("retentionDays: must be a positive number of days")
    floor = window.end - timedelta(days=retention_days)
    return window if window.start >= floor else Window(floor, window.end)


@dataclass(frozen=True, slots=True)
class Metered:
    """One run's share of the window, with the attributes reports group by."""

    workload: str
    attempt: int
    queue: str
    priority_class: str
    task_type: str
    pool: str
    gpu_model: str
    fraction_milli: int
    start: datetime
    end: datetime
    outcome: str
    gpu: int  # allocated milli-GPU-us
    used: int | None  # used milli-GPU-us, None where the backend cannot tell
    cpu: int  # milli-CPU-us
    memory: int  # MiB-us


def meter(history: History, window: Window, usage: UsageSource | None = None) -> list[Metered]:
    """Every run's overlap with the window; runs still open are counted to the window's end."""
    src = usage or NoUsage()
    out: list[Metered] = []
    for r in history.runs:
        start = max(r.start, window.start)
        end = min(r.end or window.end, window.end)
        if end <= start:
            continue
        info = history.workloads[r.workload]
        us = us_between(start, end)
        gpu = r.res.gpu_milli * us
        share = src.used_share(r, info)
        used = None if share is None else int(gpu * max(0.0, min(1.0, share)))
        out.append(
            Metered(
                r.workload,
                r.attempt,
                info.queue,
                info.priority_class,
                info.task_type,
                r.res.pool,
                r.res.gpu_model,
                r.res.fraction_milli,
                start,
                end,
                r.outcome if r.end is not None and r.end <= window.end else "Running",
                gpu,
                used,
                r.res.cpu_milli * us,
                r.res.memory_mib * us,
            )
        )
    return out


@dataclass
class Totals:
    """Summed amounts of one group (same units as Metered)."""

    gpu: int = 0
    used: int = 0
    used_known: int = 0  # allocated time whose usage is known (the denominator of utilization)
    cpu: int = 0
    memory: int = 0
    runs: int = 0

    def add(self, m: Metered, part: int = 1, whole: int = 1) -> None:
        """Add ``part/whole`` of one metered run (exact: its amounts are multiples of ``whole``)."""
        g = m.gpu * part // whole
        self.gpu += g
        if m.used is not None:
            self.used += m.used * part // whole
            self.used_known += g
        self.cpu += m.cpu * part // whole
        self.memory += m.memory * part // whole
        self.runs += 1

    @property
    def utilization(self) -> float | None:
        return self.used / self.used_known if self.used_known else None


KEYS: Mapping[str, Callable[[Metered], str]] = {
    "queue": lambda m: m.queue,
    "pool": lambda m: m.pool,
    "type": lambda m: m.task_type,
    "priority": lambda m: m.priority_class or "(none)",
    "model": lambda m: m.gpu_model,
    "fraction": lambda m: "whole" if m.fraction_milli >= 1000 else f"{m.fraction_milli / 1000:g}",
    "workload": lambda m: m.workload,
}


def rollup(items: Iterable[Metered], by: str) -> dict[str, Totals]:
    """Totals per value of one attribute (see KEYS), or per ``day``/``week`` (UTC, split exactly)."""
    out: dict[str, Totals] = defaultdict(Totals)
    if by in ("day", "week"):
        for m in items:
            for label, a, b in split_periods(m.start, m.end, by):
                out[label].add(m, us_between(a, b), us_between(m.start, m.end))
        return dict(sorted(out.items()))
    key = KEYS.get(by)
    if key is None:
        raise ValueError(f"by: unknown grouping {by!r}; one of {[*KEYS, 'day', 'week']}")
    for m in items:
        out[key(m)].add(m)
    return dict(sorted(out.items()))


def period_start(t: datetime, period: str) -> datetime:
    day = t.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return day - timedelta(days=day.weekday()) if period == "week" else day


def period_label(t: datetime, period: str) -> str:
    if period == "week":
        y, w, _ = t.isocalendar()
        return f"{y}-W{w:02d}"
    return t.date().isoformat()


def split_periods(start: datetime, end: datetime, period: str) -> list[tuple[str, datetime, datetime]]:
    """``[start, end)`` cut at UTC day (or ISO week) boundaries."""
    step = timedelta(days=7 if period == "week" else 1)
    out = []
    a = start
    p = period_start(start, period)
    while a < end:
        b = min(end, p + step)
        out.append((period_label(p, period), a, b))
        a, p = b, p + step
    return out


def rollup_subtrees(items: Iterable[Metered], parents: Mapping[str, str | None]) -> dict[str, Totals]:
    """Totals per queue including every queue below it (a team's, an org's figures)."""
    out: dict[str, Totals] = defaultdict(Totals)
    for m in items:
        for q in ancestors(m.queue, parents):
            out[q].add(m)
    return dict(sorted(out.items()))


def ancestors(queue: str, parents: Mapping[str, str | None]) -> list[str]:
    """The queue and its ancestors up to the root (a cycle or unknown parent stops the walk)."""
    out = [queue]
    seen = {queue}
    p = parents.get(queue)
    while p is not None and p not in seen:
        out.append(p)
        seen.add(p)
        p = parents.get(p)
    return out


def gpu_hours(amount: int) -> float:
    """milli-GPU-us as GPU-hours, for display only (sums are taken on the integers)."""
    return amount / GPU_HOUR
