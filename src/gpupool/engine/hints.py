"""The ``blocked`` hint of ``Engine.cycle``: proving a workload cannot move in the starting
state, and skipping such work in a cycle once it can no longer change anything.

Why: an incremental caller (the simulator, the controller's windows) carries a long backlog
that mostly cannot move; ``blocked_at_start`` proves it per workload (memoised by pool and
shape), and the cycle then skips each such workload in its turn, once every pool it could use
holds nodes, until something is preempted (see ``Engine.cycle`` for the exact contract).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpupool.engine.cohorts import borrowing_below, fit_depth
from gpupool.engine.facts import WorkloadFacts
from gpupool.engine.holds import Holds
from gpupool.engine.preemption import fair_sharing
from gpupool.model import ReclaimPolicy, Vec, Workload

if TYPE_CHECKING:
    from gpupool.engine.decisions import Decisions
    from gpupool.engine.session import Session


class BlockedHints:
    """The hint's proof (``blocked_at_start``) and its skips in a cycle (``held_everywhere``,
    ``skip_hinted``), over the session's state and the workloads' facts."""

    __slots__ = ("facts", "ssn")

    def __init__(self, ssn: Session, facts: WorkloadFacts) -> None:
        self.ssn = ssn
        self.facts = facts

    def blocked_at_start(self, w: Workload, memo: dict[object, Any] | None = None) -> bool:
        """True when ``w`` can neither be placed nor preempt anything in the current (committed)
        state, whatever its quota: an incremental caller may then pass it as ``blocked`` to the
        next cycle. Placement trials are memoised in ``memo`` by pool and shape (valid for one
        state only); the check ignores holds, which only ever take capacity away."""
        vec, pools, ckeys = self.facts.of(w)
        if not pools or (w.gang_min is not None and w.gang_min < w.pod_count):
            return False  # the cycle reports why / an elastic gang may start smaller: no proof
        for pool, key in zip(pools, ckeys, strict=True):
            pk = ("preempt", w.queue, w.priority, pool, vec)
            may = None if memo is None else memo.get(pk)
            if may is None:
                may = self._may_preempt_at_start(w, pool, vec, memo)
                if memo is not None:
                    memo[pk] = may
            if may:
                return False
            fits = None if memo is None else memo.get(key)
            if fits is None:
                fits = self._fits_unheld(w, pool, vec)
                if memo is not None:
                    memo[key] = fits
            if fits:
                return False
        return True

    def _fits_unheld(self, w: Workload, pool: str, vec: Vec) -> bool:
        """Could ``w`` be placed in ``pool`` now, ignoring holds? (The trial is undone.)"""
        st, placer = self.ssn.cluster, self.ssn.placer
        if vec[0] > st.capacity[pool][0] - st.pool_used[pool]:
            return False  # not enough free GPU milli in the whole pool
        saved, placer.holds = placer.holds, Holds()
        cp = st.checkpoint()
        try:
            return placer.place(w, pool, self.ssn.config.max_domain_tries).pods is not None
        finally:
            st.rollback(cp)
            placer.holds = saved

    def _may_preempt_at_start(
        self, w: Workload, pool: str, vec: Vec, memo: dict[object, Any] | None = None
    ) -> bool:
        """Could any preemption rule give ``w`` a victim in ``pool`` now (a cheap superset)?"""
        ssn = self.ssn
        if ssn.config.preempt == "none" or not ssn.pools[pool].preemptible or not ssn.runs.by_pq:
            return False
        pol = ssn.quota.queues[w.queue].preemption
        lowest = ssn.runs.lowest_priority(pool, w.queue)
        if pol.within_queue is not ReclaimPolicy.NEVER and (
            lowest < w.priority
            or (lowest == w.priority and pol.within_queue is ReclaimPolicy.LOWER_OR_NEWER_EQUAL_PRIORITY)
        ):
            return self._room_from_victims(w, pool, vec)
        if pol.borrow_within_cohort is not ReclaimPolicy.NEVER or fair_sharing.enabled(ssn.quota, w.queue):
            return self._room_from_victims(w, pool, vec)
        # reclaim needs a guarantee in reach: the leaf's, or an ancestor's below the root
        return (
            pol.reclaim_within_cohort is not ReclaimPolicy.NEVER
            and fit_depth(ssn.quota, w.queue, pool, vec) is not None
            and self._room_from_victims(w, pool, vec)
        )

    def _room_from_victims(self, w: Workload, pool: str, vec: Vec) -> bool:
        """Could evicting every workload any rule might take for ``w`` free its GPUs? Every
        victim runs in ``w``'s own queue or in another leaf of its cohort that borrows now
        (``CandidateFinder.borrowing_since_start``), so the free GPU milli of the pool plus what
        those queues use bounds what any search in the coming cycle can free (capacity only
        shrinks, and victims only leave, until something is preempted). Why: on the Philly
        replay a queue within its guarantee could otherwise never be shown blocked, however
        little the borrowers hold."""
        q, st, runs = self.ssn.quota, self.ssn.cluster, self.ssn.runs
        room = st.capacity[pool][0] - st.pool_used[pool] + q.U[(w.queue, pool)][0]
        if room >= vec[0]:
            return True
        for other in self.ssn.leaves_of_root.get(q.root[w.queue], ()):
            if (
                other != w.queue
                and (pool, other) in runs.by_pq
                and borrowing_below(q, other, pool, q.common_ancestor(w.queue, other))
            ):
                room += q.U[(other, pool)][0]
                if room >= vec[0]:
                    return True
        return False

    def held_everywhere(self, w: Workload) -> bool:
        """Has every pool ``w`` may use all the holds it allows in this cycle (so ``w`` can add
        or move no hold)?"""
        pools = self.facts.of(w)[1]
        holds = self.ssn.placer.holds
        if len(pools) == 1:  # the common case, without a generator
            return not holds.room(pools[0])
        return bool(pools) and not any(holds.room(p) for p in pools)

    def skip_hinted(self, lst: list[Workload], p: int, out: Decisions) -> int:
        """Skip the run of hinted workloads at the queue's head in one go: each would only be
        popped and skipped in its turn (this is what makes the hint cheap)."""
        blocked, n = self.ssn.cs.blocked, len(lst)
        start = p
        while p < n and lst[p].name in blocked and self.held_everywhere(lst[p]):
            p += 1
        out.skipped += p - start
        return p
