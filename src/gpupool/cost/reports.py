"""The usage and chargeback reports as plain data: titled tables of rows, ready for any renderer.

Why plain data: the CLI, the API and the dashboard show the same numbers, and the CLI may get
them from the API as JSON; one shape (``{"kind", "from", "to", "tables": [...]}``) means one
renderer per output format and nothing computed twice.

Authorization is a queue filter (``visible``): a team's caller sees the rows of its own queue
subtree; the chargeback is still computed over everyone (idle is what nobody else used), but
pool totals and other teams' rows are left out of what it is shown.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from gpupool.cost.chargeback import (
    Chargeback,
    PoolCost,
    chargeback,
    covered,
    multiplier,
    pools_of,
    reconciles,
)
from gpupool.cost.history import History, load_history
from gpupool.cost.metering import (
    GPU_HOUR,
    US_PER_S,
    Metered,
    SimulatedUsage,
    Totals,
    UsageSource,
    Window,
    ancestors,
    gpu_hours,
    meter,
    retained,
    rollup,
    rollup_subtrees,
)
from gpupool.cost.policy import IDLE_RULES, CostPolicySpec
from gpupool.manifests import Bundle

Visible = Callable[[str], bool]


@dataclass
class CostData:
    """Everything a report reads, loaded once."""

    window: Window
    bundle: Bundle
    history: History
    policy: CostPolicySpec
    metered: list[Metered]
    pools: dict[str, PoolCost]
    parents: dict[str, str | None]
    visible: Visible | None = None  # None: every queue (a platform admin)

    def sees(self, queue: str) -> bool:
        return self.visible is None or self.visible(queue)

    def mine(self) -> list[Metered]:
        return [m for m in self.metered if self.sees(m.queue)]


def bundle_of(store: Any) -> Bundle:
    """The configuration in force, from the stored objects (invalid ones left out, as the
    controller does)."""
    from gpupool.manifests.convert import bundle_from_manifests, object_manifest

    return bundle_from_manifests([object_manifest(r) for r in store.list_objects()], skip_invalid=True)


def load(
    history: History,
    bundle: Bundle,
    window: Window,
    policy: CostPolicySpec,
    usage: UsageSource | None = None,
    visible: Visible | None = None,
) -> CostData:
    """Meter the history over the window (cut to the policy's retention)."""
    win = retained(window, policy.retentionDays)
    src = usage or SimulatedUsage({**SimulatedUsage().table, **policy.utilization})
    pools = pools_of(bundle, history.nodes)
    for name, price in policy.pricePerGpuHour.items():
        if name in pools:
            pools[name] = replace(pools[name], price=price)
    return CostData(
        win,
        bundle,
        history,
        policy,
        meter(history, win, src),
        pools,
        {q.name: q.parent for q in bundle.queues},
        visible,
    )


def load_store(
    store: Any, window: Window, policy: CostPolicySpec, visible: Visible | None = None
) -> CostData:
    """``load`` over a store's own history and configuration."""
    bundle = bundle_of(store)
    return load(load_history(store, bundle), bundle, window, policy, None, visible)


def money(cents: int | Decimal) -> str:
    return f"{Decimal(cents) / 100:.2f}"


def hours(amount: int) -> float:
    return round(gpu_hours(amount), 4)


def table(name: str, title: str, columns: list[str], rows: list[list[Any]]) -> dict[str, Any]:
    return {"name": name, "title": title, "columns": columns, "rows": rows}


def report(
    kind: str, data: CostData, tables: list[dict[str, Any]], summary: Mapping[str, Any]
) -> dict[str, Any]:
    return {
        "kind": kind,
        "from": data.window.start.isoformat(),
        "to": data.window.end.isoformat(),
        "currency": data.policy.currency,
        "scope": "cluster" if data.visible is None else "subtree",
        "summary": dict(summary),
        "tables": tables,
    }


USAGE_COLUMNS = ["key", "gpuHours", "usedGpuHours", "utilization", "cpuHours", "memoryGiBHours", "runs"]


def _usage_row(key: str, t: Totals) -> list[Any]:
    util = t.utilization
    return [
        key,
        hours(t.gpu),
        hours(t.used) if t.used_known else None,
        None if util is None else round(util, 4),
        round(t.cpu / (1000 * 3600 * US_PER_S), 4),
        round(t.memory / (1024 * 3600 * US_PER_S), 4),
        t.runs,
    ]


def usage_report(data: CostData) -> dict[str, Any]:
    """GPU-hours allocated (and used, where known) by queue subtree, pool, type, priority
    class, GPU model, fraction and day."""
    items = data.mine()
    subtree = rollup_subtrees(items, data.parents)
    tables = [
        table(
            "queues",
            "By queue (with everything below it)",
            USAGE_COLUMNS,
            [_usage_row(q, t) for q, t in subtree.items() if data.sees(q)],
        )
    ]
    for by, title in (
        ("pool", "By pool"),
        ("type", "By task type"),
        ("priority", "By priority class"),
        ("model", "By GPU model"),
        ("fraction", "By GPU fraction"),
        ("day", "By day (UTC)"),
    ):
        tables.append(
            table(by, title, USAGE_COLUMNS, [_usage_row(k, t) for k, t in rollup(items, by).items()])
        )
    total = sum(m.gpu for m in items)
    return report("usage", data, tables, {"gpuHours": hours(total), "runs": len(items)})


def run_chargeback(data: CostData) -> Chargeback:
    return chargeback(data.history, data.metered, data.pools, data.window, data.policy)


def chargeback_report(data: CostData) -> dict[str, Any]:
    """List charges, surcharges, idle (and its spread), waiting cost and losses; the pool rows
    and the reconciliation only for a caller who sees every queue."""
    cb = run_chargeback(data)
    tables = []
    if data.visible is None:
        tables.append(_pool_table(cb))
    tables += [
        _charge_table(data, cb),
        _team_table(data, cb),
        _waiting_table(data, cb),
        _loss_table(data, cb),
    ]
    ok = all(reconciles(pc) for pc in cb.pools)
    summary: dict[str, Any] = {
        "listCost": money(sum(v for pc in cb.pools for (q, _), v in pc.charges.items() if data.sees(q))),
        "surcharge": money(sum(v for q, v in cb.surcharges.items() if data.sees(q))),
    }
    summary["idleRule"] = IDLE_RULES[data.policy.idle_rule()]
    unpriced = sorted(pc.pool for pc in cb.pools if pc.price == 0 and pc.capacity)
    if unpriced:  # every cost of theirs is 0: say why rather than show $0 as a figure
        summary["unpriced"] = f"no pricePerGPUHour (or CostPolicy pricePerGpuHour): {', '.join(unpriced)}"
    if data.visible is None:
        summary |= {
            "covers": coverage(data),
            "capacityCost": money(sum(pc.total_cents for pc in cb.pools)),
            "idleCost": money(sum(pc.idle_cents for pc in cb.pools)),
            "reconciles": ok,
            "rule": "sum(list charges) + idle = capacity x price x hours, per pool, to the cent",
        }
    return report("chargeback", data, tables, summary)


def _minute(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%d %H:%M")


def coverage(data: CostData) -> str:
    """The period capacity and idle are counted over, in words: the window, or the part of it
    after the first node joined (before it there was nothing to price)."""
    part = covered(data.history.nodes, data.window)
    if part is None:
        return "no node existed in this period: no capacity"
    a, b = part
    why = "since the first node joined" if a > data.window.start else "the whole period"
    if b < data.window.end:
        why += ", until the last node left"
    end = _minute(b)
    if end[:10] == _minute(a)[:10]:  # the same day: the time says it
        end = end[11:]
    return f"covers {_minute(a)} → {end} UTC, {why}"


def _pool_table(cb: Chargeback) -> dict[str, Any]:
    rows = [
        [
            pc.pool,
            str(pc.price),
            hours(pc.capacity),
            hours(pc.allocated),
            hours(pc.idle),
            round(pc.allocated / pc.capacity, 4) if pc.capacity else None,
            money(pc.total_cents),
            money(sum(pc.charges.values())),
            money(pc.idle_cents),
            reconciles(pc),
            pc.overcommitted,
        ]
        for pc in cb.pools
    ]
    cols = ["pool", "pricePerGpuHour", "capacityGpuHours", "allocatedGpuHours", "idleGpuHours"]
    cols += ["allocatedShare", "capacityCost", "charged", "idleCost", "reconciles", "overcommitted"]
    return table("pools", "Pools: capacity, allocated and idle", cols, rows)


def _charge_table(data: CostData, cb: Chargeback) -> dict[str, Any]:
    rows = []
    for pc in cb.pools:
        by_key: dict[tuple[str, str], int] = {}
        for m in data.metered:
            if m.pool == pc.pool:
                by_key[(m.queue, m.priority_class)] = by_key.get((m.queue, m.priority_class), 0) + m.gpu
        for (q, c), v in sorted(pc.charges.items()):
            if not data.sees(q):
                continue
            mult = multiplier(data.policy, c)
            extra = (Decimal(v) * (mult - 1)).quantize(Decimal(1))
            rows.append(
                [q, pc.pool, c or "(none)", hours(by_key.get((q, c), 0)), money(v), str(mult), money(extra)]
            )
    cols = ["queue", "pool", "priorityClass", "gpuHours", "listCost", "multiplier", "surcharge"]
    return table("charges", "Charges per queue, pool and priority class", cols, rows)


def _team_table(data: CostData, cb: Chargeback) -> dict[str, Any]:
    own: dict[str, list[int]] = {}
    for pc in cb.pools:
        for (q, _), v in pc.charges.items():
            own.setdefault(q, [0, 0, 0])[0] += v
        for q, v in pc.idle_shares.items():
            own.setdefault(q, [0, 0, 0])[2] += v
    for q, v in cb.surcharges.items():
        own.setdefault(q, [0, 0, 0])[1] += v
    subtree: dict[str, list[int]] = {}
    for q, (lst, extra, idle) in own.items():
        for a in ancestors(q, data.parents):
            acc = subtree.setdefault(a, [0, 0, 0])
            acc[0], acc[1], acc[2] = acc[0] + lst, acc[1] + extra, acc[2] + idle
    rows = [
        [q, len(ancestors(q, data.parents)) - 1, *map(money, v), money(sum(v)), *_own(data, own, q)]
        for q, v in sorted(subtree.items())
        if data.sees(q)
    ]
    cols = ["queue", "depth", "listCost", "surcharge", "idleShare", "total", "parent", "ownTotal"]
    return table("teams", "Cost per team (queue with everything below it; ownTotal: its own)", cols, rows)


def _own(data: CostData, own: Mapping[str, list[int]], q: str) -> tuple[str | None, str]:
    """The parent and the queue's own total (its subtree's less its children's), so a chart can
    stack children under their parent instead of counting them twice."""
    return data.parents.get(q), money(sum(own.get(q, [0])))


def _waiting_table(data: CostData, cb: Chargeback) -> dict[str, Any]:
    rows = [[q, t, hours(a), money(c)] for (q, t), (a, c) in cb.waiting.items() if data.sees(q)]
    return table(
        "waiting", "Waiting: GPUs requested x time waited", ["queue", "type", "gpuHoursWaited", "value"], rows
    )


def _loss_table(data: CostData, cb: Chargeback) -> dict[str, Any]:
    rows = [[q, k, hours(a)] for (q, k), a in cb.losses.items() if data.sees(q)]
    return table(
        "losses", "GPU time thrown away (runs stopped before finishing)", ["queue", "ended", "gpuHours"], rows
    )


def parse_time(value: str | None, field: str, default: datetime) -> datetime:
    """An ISO-8601 time (``Z`` allowed; a date alone is midnight UTC), or ``default``."""
    if value is None or value == "":
        return default
    try:
        t = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"{field}: {value!r} is not an ISO-8601 time (e.g. 2026-12-01 or 2026-12-01T08:00Z)"
        ) from None
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)


__all__ = ["GPU_HOUR", "CostData", "chargeback_report", "load", "load_store", "parse_time", "usage_report"]
