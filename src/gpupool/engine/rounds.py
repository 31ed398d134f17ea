"""Pass 2 in rounds, nearest guarantee first, and who may borrow at all.

Kueue's hierarchical cohorts: a workload that borrows from a nearer ancestor goes before one
that borrows from farther away, whatever their priorities, because a parent's own guarantee
beyond its children's belongs to its subtree. ``BorrowRounds`` (a mixin of ``core.Engine``) runs
pass 2 as one round per level of the queue tree and a last round for what borrows from the
whole cohort; a flat tree (leaves under their cohort roots) has exactly the two passes of old.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpupool.engine.cohorts import fit_depth

if TYPE_CHECKING:
    from gpupool.engine.decisions import Decisions
    from gpupool.engine.state.quota import QuotaState
    from gpupool.model import ResourcePool, Vec, Workload

#: the last round of pass 2: borrowing from the whole cohort
BORROW_ANY = 1 << 30


class BorrowRounds:
    """The rounds of the borrowing pass and the rule that non-preemptible work never borrows."""

    quota: QuotaState
    pools: dict[str, ResourcePool]
    #: rounds of pass 2 below the cohort roots (the deepest leaf's number of ancestors)
    _levels: int
    #: the round being run: 0 (pass 1), a level, or ``BORROW_ANY``
    _level: int

    if TYPE_CHECKING:

        def _pass_at(
            self, by_queue: dict[str, list[Workload]], out: Decisions, allow_borrow: bool
        ) -> dict[str, list[Workload]]: ...

    def _pass(
        self, by_queue: dict[str, list[Workload]], out: Decisions, allow_borrow: bool
    ) -> dict[str, list[Workload]]:
        """Pass 1 (``allow_borrow`` False): what fits within its leaf queue's guarantee. Pass 2
        borrows nearest first (Kueue's hierarchical cohorts): one round per level of the tree
        admits what stays within the guarantee of the queue that many levels up (a parent's own
        guarantee beyond its children's belongs to its subtree), then a last round what borrows
        from the whole cohort. A flat tree has no intermediate round."""
        if not allow_borrow:
            self._level = 0
            return self._pass_at(by_queue, out, False)
        for level in range(1, self._levels):
            self._level = level
            by_queue = self._pass_at(by_queue, out, True)
            if not by_queue:
                return by_queue
        self._level = BORROW_ANY
        return self._pass_at(by_queue, out, True)

    def _may_borrow(self, w: Workload, pool: str) -> bool:
        """Non-preemptible work (its class, or its pool) never borrows (KAI: non-preemptible jobs
        only within deserved quota): what it borrowed could not be reclaimed, so a lender could
        never get its guarantee back."""
        return w.preemptible and self.pools[pool].preemptible

    def _beyond_round(self, w: Workload, pool: str, vec: Vec) -> bool:
        """Does ``w``'s borrowing reach further up the tree than this round of pass 2 admits?"""
        if self._level >= BORROW_ANY:
            return False
        d = fit_depth(self.quota, w.queue, pool, vec)
        return d is None or d > self._level
