"""Pass 2 in rounds, nearest guarantee first, and who may borrow at all.

Kueue's hierarchical cohorts: a workload that borrows from a nearer ancestor goes before one
that borrows from farther away, whatever their priorities, because a parent's own guarantee
beyond its children's belongs to its subtree. ``BorrowRounds`` runs pass 2 as one round per
level of the queue tree and a last round for what borrows from the whole cohort; a flat tree
(leaves under their cohort roots) has exactly the two passes of old.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from gpupool.engine.cohorts import fit_depth

if TYPE_CHECKING:
    from gpupool.engine.decisions import Decisions
    from gpupool.engine.state.quota import QuotaState
    from gpupool.model import ResourcePool, Vec, Workload

#: the last round of pass 2: borrowing from the whole cohort
BORROW_ANY = 1 << 30

#: one pass over pending work by queue: (work, decisions, may it borrow) -> what it leaves over
PassFn = Callable[[dict[str, list["Workload"]], "Decisions", bool], dict[str, list["Workload"]]]


class BorrowRounds:
    """The rounds of the borrowing pass and the rule that non-preemptible work never borrows.

    State: the round being run (``level``: 0 in pass 1, a level of the tree, or
    ``BORROW_ANY``), which ``beyond_round`` reads while a workload is tried."""

    __slots__ = ("level", "levels", "pools", "quota")

    def __init__(self, quota: QuotaState, pools: dict[str, ResourcePool]) -> None:
        self.quota = quota
        self.pools = pools
        #: rounds of pass 2 below the cohort roots: the deepest leaf's number of ancestors
        self.levels = max((len(p) - 1 for p in quota.path.values()), default=0)
        self.level = 0

    def run(
        self, by_queue: dict[str, list[Workload]], out: Decisions, allow_borrow: bool, one_pass: PassFn
    ) -> dict[str, list[Workload]]:
        """Pass 1 (``allow_borrow`` False): what fits within its leaf queue's guarantee. Pass 2
        borrows nearest first (Kueue's hierarchical cohorts): one round per level of the tree
        admits what stays within the guarantee of the queue that many levels up (a parent's own
        guarantee beyond its children's belongs to its subtree), then a last round what borrows
        from the whole cohort. A flat tree has no intermediate round. ``one_pass`` runs a round."""
        if not allow_borrow:
            self.level = 0
            return one_pass(by_queue, out, False)
        for level in range(1, self.levels):
            self.level = level
            by_queue = one_pass(by_queue, out, True)
            if not by_queue:
                return by_queue
        self.level = BORROW_ANY
        return one_pass(by_queue, out, True)

    def may_borrow(self, w: Workload, pool: str) -> bool:
        """Non-preemptible work (its class, or its pool) never borrows (KAI: non-preemptible jobs
        only within deserved quota): what it borrowed could not be reclaimed, so a lender could
        never get its guarantee back."""
        return w.preemptible and self.pools[pool].preemptible

    def beyond_round(self, w: Workload, pool: str, vec: Vec) -> bool:
        """Does ``w``'s borrowing reach further up the tree than this round of pass 2 admits?"""
        if self.level >= BORROW_ANY:
            return False
        d = fit_depth(self.quota, w.queue, pool, vec)
        return d is None or d > self.level
