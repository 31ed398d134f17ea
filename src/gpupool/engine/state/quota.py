"""The quota tree's usage per pool, with checkpoint and rollback.

The engine tries admissions and preemptions on this state and rolls back what it does not keep
(KAI's "statement" idea), so a cycle never needs to copy it. The free capacity of nodes and
devices is ``state/cluster.py``'s; the two are undone together by ``state/statement.py``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, KeysView
from typing import NamedTuple

from gpupool.model import (
    NO_LIMIT,
    UNLIMITED,
    ZERO,
    FairSharingMode,
    Queue,
    Vec,
    devices_only,
    vadd,
    vle,
    vmax,
    vsub,
)


class QuotaFigures(NamedTuple):
    """What the quota tree says of one queue in one pool, for readers outside the engine."""

    guarantee: Vec
    limit: Vec  # guarantee + borrowing limit (a root: its guarantee)
    used: Vec  # actual usage of the queue's subtree


class QuotaState:
    """Usage and limits of the queue tree per pool, with borrowing and lending.

    For a queue n in pool p: G = guarantee, limit = G + borrowing limit (root: G), R = G - lending
    limit (the part nobody else may use). Effective usage E(leaf) = usage; E(n) = sum over children
    c of max(E(c), R(c)). Admission needs E <= limit at every node on the path to the root.
    """

    def __init__(self, queues: Iterable[Queue], pools: Iterable[str], capacity: dict[str, Vec]) -> None:
        qs = list(queues)
        self.queues: dict[str, Queue] = {q.name: q for q in qs}
        self.children: dict[str, list[str]] = {q.name: [] for q in qs}
        for q in qs:
            if q.parent is not None and q.parent in self.children:
                self.children[q.parent].append(q.name)
        self.path: dict[str, tuple[str, ...]] = {}
        for q in qs:
            path = [q.name]
            seen = {q.name}
            cur = q
            while cur.parent is not None and cur.parent in self.queues and cur.parent not in seen:
                seen.add(cur.parent)
                path.append(cur.parent)
                cur = self.queues[cur.parent]
            self.path[q.name] = tuple(path)
        self.root: dict[str, str] = {q: p[-1] for q, p in self.path.items()}
        self.pools = list(pools)
        self.capacity = capacity
        self.G: dict[tuple[str, str], Vec] = {}
        self.limit: dict[tuple[str, str], Vec] = {}
        self.R: dict[tuple[str, str], Vec] = {}
        self.usable: dict[tuple[str, str], bool] = {}
        self.U: dict[tuple[str, str], Vec] = {}  # subtree actual usage
        self.E: dict[tuple[str, str], Vec] = {}  # effective usage (with reservations)
        self.log: list[tuple[str, str, Vec]] = []
        self._share: dict[str, float] = {}
        #: usage decay (``engine/decay.py``): a term per queue node added to its share; empty: off
        self.decay: dict[str, float] = {}
        for pool in self.pools:
            for name in self._post_order():
                self._init_node(name, pool)
            for name in self.queues:
                self.usable[(name, pool)] = any(
                    self.queues[a].quota(pool) is not None for a in self.path[name]
                )
        self._denominators()
        #: what a node's share is divided by for the fair-share order and fair-sharing
        #: preemption: its weight, or 1 where the over-quota measure holds the weights
        self.share_weight: dict[str, float] = {
            n: 1.0
            if self.queues[self.root[n]].fair_sharing_mode is FairSharingMode.OVER_QUOTA
            else max(q.weight, 1e-9)
            for n, q in self.queues.items()
        }
        #: the cohort roots measured by fair share (``engine/over_quota.py``), in name order:
        #: fixed with the tree, so a cycle of a tree without one does no over-quota work at all
        self.over_quota_roots: tuple[str, ...] = tuple(
            sorted(
                n
                for n in self.queues
                if self.root[n] == n and self.queues[n].fair_sharing_mode is FairSharingMode.OVER_QUOTA
            )
        )

    def _post_order(self) -> Iterator[str]:
        seen: set[str] = set()

        def visit(n: str) -> Iterator[str]:
            seen.add(n)
            for c in self.children[n]:
                if c not in seen:
                    yield from visit(c)
            yield n

        for name in self.queues:
            if name not in seen and self.root[name] == name:
                yield from visit(name)
        for name in self.queues:  # cycles: still initialise
            if name not in seen:
                yield from visit(name)

    def _init_node(self, name: str, pool: str) -> None:
        q = self.queues[name]
        spec = q.quota(pool)
        kids = self.children[name]
        child_g = ZERO
        for c in kids:
            child_g = vadd(child_g, self.G[(c, pool)])
        child_g = tuple(min(x, UNLIMITED) for x in child_g)  # type: ignore[assignment]
        if spec is not None:
            g = vmax(spec.guarantee, child_g) if kids else spec.guarantee
        else:
            g = child_g if kids else devices_only(0)
        is_root = self.root[name] == name
        if is_root:
            limit = g
        elif spec is not None and spec.borrowing_limit is not None:
            limit = tuple(min(UNLIMITED, a + b) for a, b in zip(g, spec.borrowing_limit, strict=True))  # type: ignore[assignment]
        else:
            limit = NO_LIMIT
        if spec is not None and spec.lending_limit is not None:
            r = tuple(max(0, a - b) for a, b in zip(g, spec.lending_limit, strict=True))
        else:
            r = ZERO
        key = (name, pool)
        self.G[key] = g
        self.limit[key] = limit
        self.R[key] = r  # type: ignore[assignment]
        self.U[key] = ZERO
        e = ZERO
        for c in kids:
            e = vadd(e, vmax(self.E[(c, pool)], self.R[(c, pool)]))
        self.E[key] = e

    # -- the read view (the service shows these; G, U and E stay the engine's) ---------------
    def keys(self) -> KeysView[tuple[str, str]]:
        """Every (queue, pool) the tree has figures for."""
        return self.G.keys()

    def figures(self, queue: str, pool: str) -> QuotaFigures | None:
        """Guarantee, limit and usage of ``queue`` in ``pool`` (None: not in the tree)."""
        key = (queue, pool)
        g = self.G.get(key)
        return None if g is None else QuotaFigures(g, self.limit[key], self.U[key])

    # -- transactions -------------------------------------------------------------------------
    def checkpoint(self) -> int:
        return len(self.log)

    def rollback(self, cp: int) -> None:
        while len(self.log) > cp:
            leaf, pool, vec = self.log.pop()
            self._change(leaf, pool, vsub(ZERO, vec))

    def commit(self) -> None:
        self.log.clear()

    def add(self, leaf: str, pool: str, vec: Vec) -> None:
        self._change(leaf, pool, vec)
        self.log.append((leaf, pool, vec))

    def remove(self, leaf: str, pool: str, vec: Vec) -> None:
        neg = vsub(ZERO, vec)
        self._change(leaf, pool, neg)
        self.log.append((leaf, pool, neg))

    def _change(self, leaf: str, pool: str, vec: Vec) -> None:
        path = self.path[leaf]
        E, R, U = self.E, self.R, self.U
        prev_old = prev_new = ZERO
        cache = self._share
        v0, v1, v2, v3, v4 = vec
        # written out per dimension, as in check(): every admission and rollback comes here
        for depth, n in enumerate(path):
            cache.pop(n, None)
            key = (n, pool)
            u = U[key]
            U[key] = (u[0] + v0, u[1] + v1, u[2] + v2, u[3] + v3, u[4] + v4)
            old = E[key]
            if depth == 0:
                new = (old[0] + v0, old[1] + v1, old[2] + v2, old[3] + v3, old[4] + v4)
            else:
                r0, r1, r2, r3, r4 = R[(path[depth - 1], pool)]
                po, pn = prev_old, prev_new
                new = (
                    old[0] - (po[0] if po[0] > r0 else r0) + (pn[0] if pn[0] > r0 else r0),
                    old[1] - (po[1] if po[1] > r1 else r1) + (pn[1] if pn[1] > r1 else r1),
                    old[2] - (po[2] if po[2] > r2 else r2) + (pn[2] if pn[2] > r2 else r2),
                    old[3] - (po[3] if po[3] > r3 else r3) + (pn[3] if pn[3] > r3 else r3),
                    old[4] - (po[4] if po[4] > r4 else r4) + (pn[4] if pn[4] > r4 else r4),
                )
            E[key] = new
            prev_old, prev_new = old, new

    # -- queries ------------------------------------------------------------------------------
    def check(self, leaf: str, pool: str, vec: Vec) -> tuple[bool, bool, str | None, tuple[str, int] | None]:
        """Can ``vec`` be added at ``leaf``? Returns (fits, borrowing, blocking queue, blocking dim).

        Hot path of every admission attempt: arithmetic is written out per dimension.
        """
        E, R, G, L = self.E, self.R, self.G, self.limit
        v0, v1, v2, v3, v4 = vec
        borrowing = False
        o0 = o1 = o2 = o3 = o4 = n0 = n1 = n2 = n3 = n4 = 0
        first = True
        child: str = leaf
        for n in self.path[leaf]:
            key = (n, pool)
            old = E[key]
            if first:
                a0, a1, a2, a3, a4 = old[0] + v0, old[1] + v1, old[2] + v2, old[3] + v3, old[4] + v4
                first = False
            else:
                r0, r1, r2, r3, r4 = R[(child, pool)]
                a0 = old[0] - (o0 if o0 > r0 else r0) + (n0 if n0 > r0 else r0)
                a1 = old[1] - (o1 if o1 > r1 else r1) + (n1 if n1 > r1 else r1)
                a2 = old[2] - (o2 if o2 > r2 else r2) + (n2 if n2 > r2 else r2)
                a3 = old[3] - (o3 if o3 > r3 else r3) + (n3 if n3 > r3 else r3)
                a4 = old[4] - (o4 if o4 > r4 else r4) + (n4 if n4 > r4 else r4)
            lim = L[key]
            if a0 > lim[0]:
                return False, borrowing, n, (n, 0)
            if a1 > lim[1]:
                return False, borrowing, n, (n, 1)
            if a2 > lim[2]:
                return False, borrowing, n, (n, 2)
            if a3 > lim[3]:
                return False, borrowing, n, (n, 3)
            if a4 > lim[4]:
                return False, borrowing, n, (n, 4)
            if not borrowing:
                g = G[key]
                if a0 > g[0] or a1 > g[1] or a2 > g[2] or a3 > g[3] or a4 > g[4]:
                    borrowing = True
            o0, o1, o2, o3, o4 = old
            n0, n1, n2, n3, n4 = a0, a1, a2, a3, a4
            child = n
        return True, borrowing, None, None

    def within_guarantee(self, leaf: str, pool: str, vec: Vec) -> bool:
        """Would ``vec`` fit under the guarantee of the leaf and every ancestor below the root?"""
        path = self.path[leaf]
        E, R, G = self.E, self.R, self.G
        # the leaf's own guarantee first, without vector helpers: it is what usually fails
        e, g = E[(leaf, pool)], G[(leaf, pool)]
        if (
            e[0] + vec[0] > g[0]
            or e[1] + vec[1] > g[1]
            or e[2] + vec[2] > g[2]
            or e[3] + vec[3] > g[3]
            or e[4] + vec[4] > g[4]
        ):
            return False
        prev_old = prev_new = ZERO
        for depth, n in enumerate(path):
            key = (n, pool)
            old = E[key]
            if depth == 0:
                new = vadd(old, vec)
            else:
                r = R[(path[depth - 1], pool)]
                new = vadd(vsub(old, vmax(prev_old, r)), vmax(prev_new, r))
            if (depth < len(path) - 1 or len(path) == 1) and not vle(new, G[key]):
                return False
            prev_old, prev_new = old, new
        return True

    def is_borrowing(
        self,
        leaf: str,
        pool: str,
        stop_at: str | None = None,
        usage: dict[tuple[str, str], Vec] | None = None,
    ) -> bool:
        """Is the leaf (or an ancestor below ``stop_at``) using more than its guarantee?"""
        u = self.U if usage is None else usage
        for n in self.path[leaf]:
            if n == stop_at:
                return False
            key = (n, pool)
            if not vle(u[key], self.G[key]):
                return True
        return False

    def share(self, name: str) -> float:
        """Dominant-resource share of a queue node: usage over guarantee (or pool capacity)."""
        cached = self._share.get(name)
        if cached is not None:
            return cached
        best = 0.0
        U = self.U
        for key, i0, i1, i2, i3, i4 in self._inv_den[name]:  # hot: the fair-share key of every pick
            u0, u1, u2, u3, u4 = U[key]
            s = u0 * i0
            t = u1 * i1
            if t > s:
                s = t
            t = u2 * i2
            if t > s:
                s = t
            if u3:  # storage and bandwidth: rarely requested, so mostly skipped
                t = u3 * i3
                if t > s:
                    s = t
            if u4:
                t = u4 * i4
                if t > s:
                    s = t
            if s > best:
                best = s
        if self.decay:  # recent use counts against a queue (issue 11, item 7c)
            best += self.decay.get(name, 0.0)
        self._share[name] = best
        return best

    def set_decay(self, terms: dict[str, float]) -> None:
        """Replace the usage-decay terms (``engine/decay.py``); cached shares are stale."""
        self.decay = terms
        self._share.clear()

    def weighted_share(self, name: str) -> float:
        """The fair-share measure of a queue node: its share over ``share_weight``."""
        return self.share(name) / self.share_weight[name]

    def set_fair_shares(self, shares: dict[tuple[str, str], tuple[float, ...]]) -> None:
        """Measure the nodes in ``shares`` against these fair shares, per pool and resource,
        instead of their guarantees (``engine/over_quota.py``); cached shares are stale. A fair
        share of 0 counts as a thousandth of a unit: a queue using what it has no share of
        ranks after every queue that has one."""
        rows: dict[str, list[tuple[tuple[str, str], float, float, float, float, float]]] = {}
        for (name, pool), f in shares.items():
            i0, i1, i2, i3, i4 = (1.0 / max(x, 1e-3) for x in f)
            rows.setdefault(name, []).append(((name, pool), i0, i1, i2, i3, i4))
        self._inv_den.update(rows)
        self._share.clear()

    def _denominators(self) -> None:
        """1/denominator per queue, pool and resource: the guarantee, or the pool when none is set."""
        self._inv_den: dict[str, list[tuple[tuple[str, str], float, float, float, float, float]]] = {}
        for name in self.queues:
            rows = []
            for pool in self.pools:
                g = self.G[(name, pool)]
                cap = self.capacity.get(pool, ZERO)
                inv = []
                for d in range(len(g)):
                    den = g[d] if 0 < g[d] < UNLIMITED else cap[d]
                    inv.append(1.0 / den if den > 0 else 0.0)
                rows.append(((name, pool), inv[0], inv[1], inv[2], inv[3], inv[4]))
            self._inv_den[name] = rows

    def common_ancestor(self, a: str, b: str) -> str | None:
        pa = self.path[a]
        pb = set(self.path[b])
        for n in pa:
            if n in pb:
                return n
        return None


__all__ = ["QuotaState"]
