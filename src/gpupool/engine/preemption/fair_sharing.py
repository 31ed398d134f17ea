"""Fair-sharing preemption, opt-in per cohort (Kueue's fair sharing, its
``LessThanOrEqualToFinalShare`` strategy).

A cohort root with ``spec.fairSharing.preemption: true`` lets a queue below its weighted fair
share preempt borrowers of the cohort whose share is above its own, down to equal shares: a
victim ``v`` of queue ``o`` may go for ``w`` of queue ``q`` only if, with ``w`` admitted and
``v`` gone, the weighted share of ``q``'s side of their common ancestor is at most that of
``o``'s side, and removing ``v`` lowers ``o``'s side's share (each side is the child of the
common ancestor on the way to the queue; share: ``QuotaState.share`` over the queue's weight,
the measure the fair-share order uses). ``o`` must be borrowing below the common ancestor, so
no queue is pushed below its guarantee, and ``q`` never ends above ``o``: down to equal shares.

No loops: every such preemption replaces the larger of the two shares (``o``'s) by two values
strictly below it, so the shares sorted from the largest down decrease lexicographically; with
no arrivals or completions this can happen only finitely often (a property test checks it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpupool.model import FairSharingMode

if TYPE_CHECKING:
    from gpupool.engine.preemption.candidates import Candidate
    from gpupool.engine.state.quota import QuotaState
    from gpupool.model import Vec, Workload


def enabled(q: QuotaState, leaf: str) -> bool:
    """Has ``leaf``'s cohort root opted in to fair-sharing preemption?"""
    return q.queues[q.root[leaf]].fair_sharing_preemption


def side(q: QuotaState, leaf: str, lca: str | None) -> str:
    """The child of ``lca`` on ``leaf``'s path (the leaf itself when ``lca`` is its parent)."""
    path = q.path[leaf]
    if lca is None or lca not in path:
        return path[-1]
    i = path.index(lca)
    return path[max(0, i - 1)]


def weighted_share(q: QuotaState, name: str) -> float:
    """The tree's fair-share measure (``QuotaState.weighted_share``; ``engine/over_quota.py``)."""
    return q.weighted_share(name)


def share_with(q: QuotaState, w: Workload, pool: str, vec: Vec, name: str) -> float:
    """The weighted share of ``name`` (on ``w``'s path) if ``w`` were admitted now."""
    cp = q.checkpoint()
    q.add(w.queue, pool, vec)
    try:
        return weighted_share(q, name)
    finally:
        q.rollback(cp)


def below_victims(q: QuotaState, w: Workload, pool: str, vec: Vec, sides: list[tuple[str, str]]) -> bool:
    """With ``w`` admitted in the current state (its victims gone), is each preemptor side's
    share at most its victim side's? ``sides``: (preemptor side, victim side) per fair-sharing
    victim."""
    if not sides:
        return True
    mine: dict[str, float] = {}
    for a, b in sides:
        if a not in mine:
            mine[a] = share_with(q, w, pool, vec, a)
        if not mine[a] <= weighted_share(q, b):
            return False
    return True


def victim_lowers(
    q: QuotaState, w: Workload, pool: str, vec: Vec, sides: tuple[str, str], before: float
) -> bool:
    """Just after evicting a candidate (its side's share was ``before``): did that lower its
    side's share, and does the preemptor's side, with ``w``, stay at or below it?"""
    after = weighted_share(q, sides[1])
    return after < before and share_with(q, w, pool, vec, sides[0]) <= after


def most_above_first(q: QuotaState, cands: list[Candidate]) -> list[Candidate]:
    """In an over-quota tree (``fairSharing.mode: OverQuota``), other queues' candidates of one
    priority go from the side furthest above its fair share first (KAI takes back from the
    queue most over its fair share); the sort is stable, so the cost model's order stands within
    a side. Any other tree: ``cands`` unchanged."""
    if (
        not cands
        or q.queues[q.root[cands[0].preemptor.queue]].fair_sharing_mode is not FairSharingMode.OVER_QUOTA
    ):
        return cands
    mine = cands[0].preemptor.queue
    memo: dict[str, float] = {}

    def key(c: Candidate) -> tuple[int, int, float]:
        v = c.running.workload
        if v.queue == mine:
            return (1, v.priority, 0.0)
        s = side(q, v.queue, c.lca)
        if s not in memo:
            memo[s] = weighted_share(q, s)
        return (0, v.priority, -memo[s])

    return sorted(cands, key=key)
