"""Measured utilisation in the weekly report: allocated against used GPU-hours per team, and
the allocations held idle (资源被长期占用), from the hourly rollups
(gpupool.store.utilisation, written by gpupool.service.utilisation).

Why apart from the chargeback: the chargeback bills what was allocated, from the event history,
to the cent; these figures say how much of it computed, from what the devices reported, and
cover only the time a device was measured (a backend that measures nothing shows no rows).
An hour belongs to the report when it starts inside the report's window.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from gpupool.cost.chargeback import to_cents
from gpupool.cost.reports import CostData, money, table
from gpupool.store.utilisation import Rollup


@dataclass(slots=True)
class _Team:
    allocated_s: float = 0.0
    used_s: float = 0.0
    idle_s: float = 0.0
    memory_byte_s: float = 0.0
    sampled_s: float = 0.0


def _h(gpu_s: float) -> float:
    return round(gpu_s / 3600, 4)


def team_rows(rollups: Iterable[Rollup]) -> list[list[Any]]:
    """Per queue: measured allocated GPU-hours, used GPU-hours, utilisation %, GPU-hours held
    idle and the mean GPU memory in use (GiB) over the measured time."""
    teams: dict[str, _Team] = defaultdict(_Team)
    for r in rollups:
        t = teams[r.queue]
        t.allocated_s += r.gpu_s
        t.used_s += r.used_gpu_s
        t.idle_s += r.idle_gpu_s
        t.memory_byte_s += r.memory_byte_s
        t.sampled_s += r.sampled_s
    return [
        [
            q,
            _h(t.allocated_s),
            _h(t.used_s),
            round(100 * t.used_s / t.allocated_s, 1) if t.allocated_s else None,
            _h(t.idle_s),
            round(t.memory_byte_s / t.sampled_s / (1 << 30), 2) if t.sampled_s else None,
        ]
        for q, t in sorted(teams.items())
    ]


def idle_rows(rollups: Iterable[Rollup], prices: dict[str, Decimal]) -> list[list[Any]]:
    """Per workload held idle: its queue, GPUs, hours held idle and their cost at its pool's
    price, costliest first."""
    acc: dict[str, list[Any]] = {}
    for r in rollups:
        if r.idle_s <= 0:
            continue
        a = acc.setdefault(r.workload, [r.queue, r.pool, 0.0, 0.0])
        a[2] += r.idle_s
        a[3] += r.idle_gpu_s
    rows = []
    for name, (queue, pool, idle_s, idle_gpu_s) in acc.items():
        cents = to_cents(Decimal(str(idle_gpu_s)) / 3600 * prices.get(pool, Decimal(0)) * 100)
        rows.append(
            [name, queue, round(idle_gpu_s / idle_s, 3), round(idle_s / 3600, 4), money(cents), cents]
        )
    rows.sort(key=lambda r: (-r[5], r[0]))
    return [r[:5] for r in rows]


def utilisation_tables(store: Any, data: CostData) -> list[dict[str, Any]]:
    """The two tables for the caller's queues (an empty store or backend: tables without rows)."""
    rollups = [r for r in store.utilisation.between(data.window.start, data.window.end) if data.sees(r.queue)]
    prices = {name: p.price for name, p in data.pools.items()}
    return [
        table(
            "utilisation_teams",
            "Allocated vs used GPU-hours per team (measured: NVML, DCGM/HAMi or synthetic)",
            ["team", "allocatedGpuHours", "usedGpuHours", "utilisationPct", "idleGpuHours", "meanMemoryGiB"],
            team_rows(rollups),
        ),
        table(
            "idle_allocations",
            "Idle allocations (GPUs held below the utilisation threshold for their idleFor)",
            ["workload", "team", "gpus", "hoursHeldIdle", "cost"],
            idle_rows(rollups, prices),
        ),
    ]


__all__ = ["idle_rows", "team_rows", "utilisation_tables"]
