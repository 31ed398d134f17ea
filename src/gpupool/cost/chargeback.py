"""Chargeback (成本分摊): list charges, idle (闲置), waiting (排队) cost and preemption loss.

The reconciliation rule (docs/cost.md): for each pool, the priced capacity of the window,
``round(capacity x price x hours)`` in cents, is split over the queues' allocated amounts and the
idle remainder by the largest-remainder method, so that to the cent

    sum(queue list charges in the pool) + pool idle = capacity x price x hours.

Rounding each share on its own would lose or invent cents; sharing one rounded total cannot.
Priority multipliers are a surcharge reported beside the list charge, so they never break it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import ROUND_HALF_EVEN, Decimal

from gpupool.cost.history import History, NodeSpan, WorkloadInfo
from gpupool.cost.metering import GPU_HOUR, Metered, Window, ancestors, us_between
from gpupool.cost.policy import CostPolicySpec, IdleRule
from gpupool.manifests import Bundle

IDLE = "(idle)"


#: when a node's GPUs existed: (joined or None for "before history", left or None, GPUs)
Span = tuple[datetime | None, datetime | None, int]


@dataclass(frozen=True, slots=True)
class PoolCost:
    """A pool's price, capacity and who holds guarantees in it (milli-GPU). ``spans``: when its
    nodes' GPUs existed (None: no node history, the GPUs in force count over the whole window)."""

    name: str
    price: Decimal  # per GPU-hour
    gpus: int
    guarantees: Mapping[str, int] = field(default_factory=dict)
    spans: tuple[Span, ...] | None = None


def pools_of(bundle: Bundle, nodes: Sequence[NodeSpan] | None = None) -> dict[str, PoolCost]:
    """Prices and capacities from the configuration in force (capacity: GPUs on the nodes each
    pool selects, over the time each node existed when ``nodes`` says; guarantees: the most
    specific queues with a GPU guarantee in the pool)."""
    holders = _guarantee_holders(bundle)
    return {
        p.name: PoolCost(
            p.name,
            Decimal(str(p.price_per_gpu_hour)),
            sum(n.gpu_count for n in bundle.nodes if p.selects(n)),
            holders.get(p.name, {}),
            None
            if nodes is None
            else tuple((s.start, s.end, s.node.gpu_count) for s in nodes if p.selects(s.node)),
        )
        for p in bundle.pools
    }


def _clip(span: Span, window: Window) -> tuple[datetime, datetime]:
    start, end, _ = span
    return max(start or window.start, window.start), min(end or window.end, window.end)


def pool_capacity(pool: PoolCost, window: Window) -> int:
    """milli-GPU-us of the pool's GPUs inside the window: each node from when it joined to when
    it left, clipped to the window (a young cluster is not priced for time before it existed)."""
    if pool.spans is None:
        return pool.gpus * 1000 * window.us
    total = 0
    for span in pool.spans:
        a, b = _clip(span, window)
        if b > a:
            total += span[2] * 1000 * us_between(a, b)
    return total


def covered(nodes: Sequence[NodeSpan] | None, window: Window) -> tuple[datetime, datetime] | None:
    """The part of the window some node existed in (the whole window without node history);
    None when no node did."""
    if nodes is None:
        return window.start, window.end
    parts = [_clip((s.start, s.end, 0), window) for s in nodes]
    parts = [(a, b) for a, b in parts if b > a]
    if not parts:
        return None
    return min(a for a, _ in parts), max(b for _, b in parts)


def _guarantee_holders(bundle: Bundle) -> dict[str, dict[str, int]]:
    parents = {q.name: q.parent for q in bundle.queues}
    out: dict[str, dict[str, int]] = defaultdict(dict)
    for q in bundle.queues:
        for quota in q.quotas:
            if quota.guarantee[0] > 0:
                out[quota.pool][q.name] = quota.guarantee[0]
    for held in out.values():  # a parent's guarantee is its children's when they hold one too
        for name in list(held):
            for a in ancestors(name, parents)[1:]:
                held.pop(a, None)
    return out


def cents(amount: int, price: Decimal) -> Decimal:
    """milli-GPU-us at a GPU-hour price, in exact (unrounded) cents."""
    return Decimal(amount) * price * 100 / GPU_HOUR


def split_cents(total: int, weights: Mapping[str, int]) -> dict[str, int]:
    """``total`` cents over the keys in proportion to their weights, summing to ``total`` exactly
    (largest remainder; ties go to the key that sorts first, so results are reproducible)."""
    wsum = sum(weights.values())
    if wsum <= 0:
        return dict.fromkeys(weights, 0)
    base = {k: total * w // wsum for k, w in weights.items()}
    rest = total - sum(base.values())
    order = sorted(weights, key=lambda k: (-(total * weights[k] % wsum), k))
    for k in order[:rest]:
        base[k] += 1
    return base


def to_cents(value: Decimal) -> int:
    return int(value.quantize(Decimal(1), rounding=ROUND_HALF_EVEN))


@dataclass
class PoolCharge:
    """One pool's window: amounts in milli-GPU-us, money in integer cents."""

    pool: str
    price: Decimal
    capacity: int
    allocated: int
    idle: int
    total_cents: int
    idle_cents: int
    charges: dict[tuple[str, str], int]  # (queue, priority class) -> list cents
    idle_shares: dict[str, int]  # queue -> idle cents shared to it by the idle rule
    overcommitted: bool


def share_idle(
    idle_cents: int, pool: PoolCost, by_key: Mapping[tuple[str, str], int], rule: IdleRule
) -> dict[str, int]:
    """The pool's idle cents over its queues by the policy's rule, to the cent (largest
    remainder); empty when the rule is "none" or nobody qualifies (idle stays the pool's)."""
    if rule == "guarantee":
        weights = dict(pool.guarantees)
    elif rule == "allocated":
        weights = defaultdict(int)
        for (q, _), a in by_key.items():
            weights[q] += a
    else:
        return {}
    return split_cents(idle_cents, weights) if sum(weights.values()) > 0 else {}


def charge_pool(pool: PoolCost, items: Sequence[Metered], window: Window, rule: IdleRule) -> PoolCharge:
    """Price one pool's capacity and share it over its users and its idle time."""
    by_key: dict[tuple[str, str], int] = defaultdict(int)
    for m in items:
        by_key[(m.queue, m.priority_class)] += m.gpu
    allocated = sum(by_key.values())
    capacity = pool_capacity(pool, window)
    over = allocated > capacity  # nodes left unrecorded, or the config is not the one used
    capacity = max(capacity, allocated)
    total = to_cents(cents(capacity, pool.price))
    weights = {f"{q}\x00{c}": a for (q, c), a in by_key.items()}
    weights[IDLE] = capacity - allocated
    shares = split_cents(total, weights)
    idle_cents = shares.pop(IDLE)
    charges = {_pair(k): v for k, v in shares.items()}
    spread_to = share_idle(idle_cents, pool, by_key, rule)
    return PoolCharge(
        pool.name,
        pool.price,
        capacity,
        allocated,
        capacity - allocated,
        total,
        idle_cents,
        charges,
        spread_to,
        over,
    )


def _pair(key: str) -> tuple[str, str]:
    q, _, c = key.partition("\x00")
    return q, c


def multiplier(policy: CostPolicySpec, priority_class: str) -> Decimal:
    return policy.priorityMultipliers.get(priority_class, Decimal(1))


@dataclass
class Chargeback:
    """The whole window's chargeback."""

    window: Window
    currency: str
    pools: list[PoolCharge]
    waiting: dict[tuple[str, str], tuple[int, int]]  # (queue, type) -> (milli-GPU-us waited, cents)
    losses: dict[tuple[str, str], int]  # (queue, outcome) -> milli-GPU-us thrown away
    surcharges: dict[str, int]  # queue -> cents added by priority multipliers


def chargeback(
    history: History,
    metered: Sequence[Metered],
    pools: Mapping[str, PoolCost],
    window: Window,
    policy: CostPolicySpec,
) -> Chargeback:
    """List charges and idle per pool, then waiting cost, losses and surcharges."""
    by_pool: dict[str, list[Metered]] = defaultdict(list)
    for m in metered:
        by_pool[m.pool].append(m)
    unknown = sorted(set(by_pool) - set(pools))
    cost_pools = dict(pools)
    for name in unknown:  # a pool deleted since: charged at no price, never dropped
        cost_pools[name] = PoolCost(name, Decimal(0), 0)
    charged = [
        charge_pool(cost_pools[n], by_pool.get(n, []), window, policy.idle_rule()) for n in sorted(cost_pools)
    ]
    surcharges: dict[str, int] = defaultdict(int)
    for pc in charged:
        for (q, c), v in pc.charges.items():
            extra = to_cents(Decimal(v) * (multiplier(policy, c) - 1))
            if extra:
                surcharges[q] += extra
    return Chargeback(
        window,
        policy.currency,
        charged,
        waiting_cost(history, window, cost_pools),
        preemption_loss(metered),
        dict(surcharges),
    )


def _wait_price(info: WorkloadInfo, pools: Mapping[str, PoolCost], admitted_in: str | None) -> Decimal:
    """The price of the pool the work asked for or ran in; else the mean list price."""
    for name in (info.pool_hint, admitted_in):
        if name and name in pools:
            return pools[name].price
    prices = [p.price for p in pools.values()]
    return sum(prices, Decimal(0)) / len(prices) if prices else Decimal(0)


def waiting_cost(
    history: History, window: Window, pools: Mapping[str, PoolCost]
) -> dict[tuple[str, str], tuple[int, int]]:
    """GPU time requested x time waited, by queue and task type, and its value at list price."""
    ran_in = {r.workload: r.res.pool for r in history.runs}
    amounts: dict[tuple[str, str], int] = defaultdict(int)
    value: dict[tuple[str, str], Decimal] = defaultdict(Decimal)
    for w in history.waits:
        start, end = max(w.start, window.start), min(w.end or window.end, window.end)
        if end <= start:
            continue
        info = history.workloads[w.workload]
        amt = info.requested_gpu_milli * us_between(start, end)
        key = (info.queue, info.task_type)
        amounts[key] += amt
        value[key] += cents(amt, _wait_price(info, pools, ran_in.get(w.workload)))
    return {k: (a, to_cents(value[k])) for k, a in sorted(amounts.items())}


#: how a run ended when its work was thrown away (a requeue after a failed attempt ends "Pending")
LOSS_OUTCOMES = {"Preempted": "preempted", "Pending": "requeued", "Failed": "failed"}


def preemption_loss(metered: Sequence[Metered]) -> dict[tuple[str, str], int]:
    """GPU time of runs that ended without finishing, by queue and how they ended (no checkpoint
    is known to gpupool, so a stopped run's whole time within the window counts as lost)."""
    out: dict[tuple[str, str], int] = defaultdict(int)
    for m in metered:
        kind = LOSS_OUTCOMES.get(m.outcome)
        if kind is not None:
            out[(m.queue, kind)] += m.gpu
    return dict(sorted(out.items()))


def reconciles(pc: PoolCharge) -> bool:
    """The reconciliation rule for one pool: list charges plus idle equal the priced capacity."""
    return sum(pc.charges.values()) + pc.idle_cents == pc.total_cents == to_cents(
        cents(pc.capacity, pc.price)
    ) and sum(pc.idle_shares.values()) in (0, pc.idle_cents)
