"""Over-quota fair share (``spec.fairSharing.mode: OverQuota`` on a cohort root; issue 27 item 1).

Why: the default measure (``GuaranteeWeighted``) is usage / guarantee / weight, so spare
capacity goes in proportion to guarantee x weight. KAI and Volcano's proportion plugin give each
queue its deserved quota (its guarantee) first and split only the surplus, by an over-quota
weight; a team with a small guarantee and a large weight then gets much of the surplus.

How: at the start of a cycle, each node's *fair share* of every resource its cohort root
guarantees is water-filled top-down (``water_fill``): the parent's fair share (the root's: its
guarantee) goes first to every child's ``min(guarantee, demand)``, then the rest by
``overQuotaWeight``, never above a child's demand (usage plus pending requests); what a child
cannot use is split again among the others. The measure is usage / fair share (max over pools
and resources, as the default's dominant share): below 1 a queue gets less than its fair share.
Ordering and fair-sharing preemption read it through ``QuotaState.share`` unchanged, so the
rest of the engine does not know which mode a tree uses. A resource the root does not guarantee
keeps the default's denominator (the pool's capacity): nobody deserves any of it.

Pure and deterministic: children in name order, plain float arithmetic, no state but the
quota tree's; fair shares are fixed for the cycle (usage then moves, demand does not).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from gpupool.model import UNLIMITED

if TYPE_CHECKING:
    from gpupool.engine.state.quota import QuotaState
    from gpupool.model import Vec, Workload

_EPS = 1e-9

#: per (queue node, pool): a fair share per resource dimension
Shares = dict[tuple[str, str], tuple[float, ...]]


def water_fill(capacity: float, claims: Sequence[tuple[float, float, float]]) -> list[float]:
    """Split ``capacity`` among ``claims`` of (deserved, demand, weight): each first gets
    ``min(deserved, demand)`` (scaled down alike if even that exceeds ``capacity``), then the
    rest goes by weight to those still below their demand, capped there, the excess of a capped
    claim split again among the others. A claim of weight 0 gets no surplus. The result sums to
    ``min(capacity, total demand)`` unless every unmet claim has weight 0."""
    cap = max(capacity, 0.0)
    out = [min(max(d, 0.0), max(m, 0.0)) for d, m, _ in claims]
    base = sum(out)
    if base >= cap:
        f = cap / base if base > 0 else 0.0
        return [x * f for x in out]
    left = cap - base
    active = [i for i, (_, m, wt) in enumerate(claims) if m > out[i] and wt > 0]
    while active and left > _EPS:
        wsum = sum(claims[i][2] for i in active)
        # the weight's fraction first: left * (w / sum) never exceeds left, even for subnormal
        # weights, where (left * w) / sum rounds up past it
        give = {i: left * (claims[i][2] / wsum) for i in active}
        capped = [i for i in active if out[i] + give[i] >= claims[i][1]]
        if not capped:
            for i in active:
                out[i] += give[i]
            break
        for i in capped:
            left -= claims[i][1] - out[i]
            out[i] = claims[i][1]
        left = max(left, 0.0)
        done = set(capped)
        active = [i for i in active if i not in done]
    return out


def over_quota_roots(quota: QuotaState) -> tuple[str, ...]:
    """The cohort roots whose tree uses the over-quota measure, in name order."""
    return quota.over_quota_roots


def demand(
    quota: QuotaState, roots: Iterable[str], pending: Iterable[tuple[str, Vec, Sequence[str]]]
) -> dict[tuple[str, str], list[float]]:
    """What every node of ``roots``' trees asks for per pool: its subtree's usage plus the
    requests of its pending work, counted in every pool the work may use (an upper bound: the
    cap only ever lets a queue keep less than it could use)."""
    trees = set(roots)
    out: dict[tuple[str, str], list[float]] = {}
    for n in quota.queues:
        if quota.root[n] in trees:
            for p in quota.pools:
                out[(n, p)] = [float(x) for x in quota.U[(n, p)]]
    for leaf, vec, pools in pending:
        if leaf not in quota.queues or quota.root[leaf] not in trees:
            continue
        for p in pools:
            for n in quota.path[leaf]:
                row = out.get((n, p))
                if row is not None:
                    for d, x in enumerate(vec):
                        row[d] += x
    return out


def fair_shares(
    quota: QuotaState, roots: Iterable[str], want: Mapping[tuple[str, str], list[float]]
) -> Shares:
    """Every node's fair share per pool and resource, top-down from each root (see module doc).
    A resource its root does not guarantee: the pool's capacity, for every node of the tree."""
    out: Shares = {}
    for root in roots:
        for p in quota.pools:
            cap = quota.capacity.get(p, (0, 0, 0, 0, 0))
            g = quota.G[(root, p)]
            top = tuple(float(g[d]) if 0 < g[d] < UNLIMITED else float(cap[d]) for d in range(len(g)))
            split = tuple(0 < x < UNLIMITED for x in g)
            _descend(quota, root, p, top, split, want, out)
    return out


def _descend(
    quota: QuotaState,
    n: str,
    pool: str,
    mine: tuple[float, ...],
    split: tuple[bool, ...],
    want: Mapping[tuple[str, str], list[float]],
    out: Shares,
) -> None:
    out[(n, pool)] = mine
    kids = sorted(quota.children[n])
    if not kids:
        return
    per_kid: list[list[float]] = [list(mine) for _ in kids]
    for d, on in enumerate(split):
        if not on:
            continue
        claims = []
        for c in kids:
            g = quota.G[(c, pool)][d]
            claims.append((min(float(g), mine[d]), want[(c, pool)][d], quota.queues[c].over_quota_weight))
        for i, x in enumerate(water_fill(mine[d], claims)):
            per_kid[i][d] = x
    for c, row in zip(kids, per_kid, strict=True):
        _descend(quota, c, pool, tuple(row), split, want, out)


def begin_cycle(
    quota: QuotaState,
    by_queue: Mapping[str, Sequence[Workload]],
    facts_of: Callable[[Workload], tuple[Vec, list[str], object]],
) -> None:
    """Fix this cycle's fair shares of every over-quota tree from its usage and pending work
    (``QuotaState.set_fair_shares``). No tree in that mode: nothing is done, nothing changes."""
    roots = over_quota_roots(quota)
    if not roots:
        return
    trees = set(roots)
    pending = []
    for leaf, ws in by_queue.items():
        if leaf in quota.root and quota.root[leaf] in trees:
            for w in ws:
                vec, pools, _ = facts_of(w)
                pending.append((leaf, vec, pools))
    quota.set_fair_shares(fair_shares(quota, roots, demand(quota, roots, pending)))
