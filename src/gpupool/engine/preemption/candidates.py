"""Who may be evicted for a workload in a pool, and by which rule (the Preempt extension point).

``CandidateFinder.find`` collects the legal victims: the preemptor's own queue's work that
``withinQueue`` lets it evict, and the work of other queues of its cohort that borrow as seen
from their common ancestor with it (reclaim, ``borrowWithinCohort``, fair sharing); then it
orders them by ``ordering.candidate_order`` (docs/engine.md, "Quota and preemption semantics").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpupool.engine.cohorts import borrowing_below, fit_depth
from gpupool.engine.decisions import PreemptRule
from gpupool.engine.preemption import bounds, fair_sharing, ordering
from gpupool.engine.preemption.ordering import reclaimable, within_queue_victim, within_threshold
from gpupool.model import ZERO, ReclaimPolicy, Running, Vec, Workload, vadd, vsub

if TYPE_CHECKING:
    from gpupool.engine.session import Session


@dataclass(slots=True)
class Candidate:
    """A running workload that may be evicted for ``preemptor`` in ``pool``, and by which rule."""

    running: Running
    rule: PreemptRule
    preemptor: Workload
    pool: str
    cohort: str
    #: for a victim of another queue: the common ancestor with the preemptor's queue and its
    #: depth on the preemptor's path (a reclaim is legal only if the preemptor ends within the
    #: guarantee of a queue below it)
    lca: str | None = None
    depth: int = 0
    #: for a fair-sharing victim: (the preemptor's side, the victim's side) of their common
    #: ancestor, whose weighted shares must stay in that order (``preemption/fair_sharing.py``)
    sides: tuple[str, str] | None = None
    #: for a part of a running elastic gang (``preemption/shrink.py``): ``"extras"`` (its pods
    #: above ``gang_min``, ``running`` holds only those) or ``"rest"`` (the pods that stay);
    #: ``full`` is the whole running workload. None: the whole workload is the candidate
    part: str | None = None
    full: Running | None = None

    @property
    def reason(self) -> str:
        """Why this victim (formatted only for victims actually chosen)."""
        w, v = self.preemptor, self.running.workload
        if self.rule is PreemptRule.WITHIN_QUEUE:
            if w.priority == v.priority:
                return f"preempted by {w.name} (priority {w.priority}, queued earlier) within queue {w.queue}"
            return f"preempted by {w.name} (priority {w.priority} > {v.priority}) within queue {w.queue}"
        if self.rule is PreemptRule.FAIR_SHARE:
            return (
                f"preempted by {w.name} for fair sharing in cohort {self.cohort}: queue {v.queue} is "
                f"borrowing above queue {w.queue}'s weighted share"
            )
        if self.rule is PreemptRule.RECLAIM:
            return f"queue {w.queue} reclaims its guarantee in pool {self.pool}; queue {v.queue} is borrowing"
        return (
            f"preempted by {w.name} (priority {w.priority} > {v.priority}) borrowing in cohort {self.cohort}; "
            f"queue {v.queue} is borrowing"
        )


class CandidateFinder:
    """The legal victims for a preemptor, read from the session's quota tree and running set."""

    __slots__ = ("ssn",)

    def __init__(self, ssn: Session) -> None:
        self.ssn = ssn

    def find(self, w: Workload, pool: str, vec: Vec) -> list[Candidate]:
        """Who may be evicted for ``w``, in the order to try them.

        Ordered by ``ordering.candidate_order`` (one rule, as in Kueue): other queues' borrowed
        capacity first, then the lowest priority, then the most recently admitted. Own-queue
        candidates and reclaim from the cohort go together (Kueue: "preempt from all
        ClusterQueues in cohort"): reclaim is open when ``w`` could end within a guarantee once
        its own candidates are gone. With no guarantee in reach and ``borrowWithinCohort:
        Never`` only its own queue's work is a candidate (docs/engine.md, "Quota and preemption
        semantics").
        """
        ssn = self.ssn
        if not ssn.runs.by_pq or not ssn.pools[pool].preemptible:
            return []
        own = self._own(w, pool)
        freed = ZERO
        for c in own:
            freed = vadd(freed, c.running.admission.quota_vec())
        best = fit_depth(ssn.quota, w.queue, pool, vsub(vec, freed))
        fair = self.fair_sharing(w, pool)
        if best is None and not self.may_borrow_preempting(w, pool) and not fair:
            # it would stay above every guarantee: only its own queue's work may go (Kueue's last
            # attempt, "only candidates from the same queue, but with borrowing"), and never for
            # non-preemptible work, which never borrows
            out = own if w.preemptible and ssn.pools[pool].preemptible else own[:0]
        else:
            out = own + self._cohort(w, pool, vec, best, fair)
        if bounds.SEARCH_SHORTCUTS and bounds.device_bounds(ssn.cluster, w, pool, vec, out) is False:
            return out[:0]  # even with all of them gone it would not fit: no order makes room
        mine = w.queue
        out.sort(key=lambda c: ordering.candidate_order(c.running, mine))
        return out[: ssn.config.max_preemption_candidates]

    def may_borrow_preempting(self, w: Workload, pool: str) -> bool:
        """May ``w`` end above its guarantee after preempting (Kueue's ``borrowWithinCohort``)?
        Never for non-preemptible work, which never borrows."""
        pol = self.ssn.quota.queues[w.queue].preemption
        return (
            pol.borrow_within_cohort is not ReclaimPolicy.NEVER
            and w.preemptible
            and self.ssn.pools[pool].preemptible
        )

    def fair_sharing(self, w: Workload, pool: str) -> bool:
        """Does ``w``'s cohort preempt for fair sharing (``spec.fairSharing.preemption`` on its
        root), and may ``w`` end borrowing (preemptible, in a preemptible pool)?"""
        return (
            fair_sharing.enabled(self.ssn.quota, w.queue)
            and w.preemptible
            and self.ssn.pools[pool].preemptible
        )

    def _own(self, w: Workload, pool: str) -> list[Candidate]:
        """Running work of ``w``'s own queue that ``withinQueue`` lets it evict: lower priority,
        or (``LowerOrNewerEqualPriority``) equal priority and queued after ``w``."""
        ssn = self.ssn
        policy = ssn.quota.queues[w.queue].preemption.within_queue
        if policy is ReclaimPolicy.NEVER:
            return []
        equal = policy is ReclaimPolicy.LOWER_OR_NEWER_EQUAL_PRIORITY
        lowest = ssn.runs.lowest_priority(pool, w.queue)
        if lowest > w.priority or (lowest == w.priority and not equal):
            return []
        cs = ssn.cs
        evicted, now, root = cs.evicted, cs.admitted_now, ssn.quota.root[w.queue]
        out: list[Candidate] = []
        for r in ssn.runs.by_pq.get((pool, w.queue), {}).values():
            v = r.workload
            if (
                v.name in evicted
                or v.name in now
                or not v.preemptible
                or not within_queue_victim(w, v, equal)
            ):
                continue
            out.append(Candidate(r, PreemptRule.WITHIN_QUEUE, w, pool, root))
        return out

    def _cohort(self, w: Workload, pool: str, vec: Vec, best: int | None, fair_on: bool) -> list[Candidate]:
        """Work of other queues of the cohort that borrow as seen from their common ancestor with
        ``w``'s queue (the leaf and every queue below that ancestor above its guarantee, now and
        when the cycle started). Reclaim (``reclaimWithinCohort``) where ``w`` could end within
        the guarantee of a queue below that ancestor (``best``: the lowest depth in reach);
        else lower-priority victims only if ``borrowWithinCohort`` lets ``w`` borrow, or, in a
        fair-sharing cohort, victims whose side of the common ancestor has a larger weighted
        share than ``w``'s side would have (``preemption/fair_sharing.py``)."""
        ssn = self.ssn
        q, cs = ssn.quota, ssn.cs
        pol = q.queues[w.queue].preemption
        root = q.root[w.queue]
        # a fair-sharing cohort takes borrowers' work by share, never by borrowWithinCohort (as in
        # Kueue, where the two do not combine): otherwise each rule could undo the other
        borrow = self.may_borrow_preempting(w, pool) and not fair_on
        evicted, now, path = cs.evicted, cs.admitted_now, q.path[w.queue]
        out: list[Candidate] = []
        for other in ssn.leaves_of_root.get(root, ()):
            rs = ssn.runs.by_pq.get((pool, other))
            if other == w.queue or not rs:
                continue
            lca = q.common_ancestor(w.queue, other)
            if not self.borrowing_since_start(other, pool, lca):
                continue
            depth = path.index(lca) if lca is not None else len(path)
            reclaim = (
                pol.reclaim_within_cohort is not ReclaimPolicy.NEVER and best is not None and best < depth
            )
            sides = None
            if fair_on and pol.reclaim_within_cohort is not ReclaimPolicy.NEVER:
                ab = (fair_sharing.side(q, w.queue, lca), fair_sharing.side(q, other, lca))
                sides = ab if fair_sharing.below_victims(q, w, pool, vec, [ab]) else None
            if not reclaim and not borrow and sides is None:
                continue  # no rule lets w take this queue's work (each check below would fail)
            for r in rs.values():
                v = r.workload
                if v.name in evicted or v.name in now or not v.preemptible:
                    continue
                if reclaim and reclaimable(pol.reclaim_within_cohort, w, v):
                    rule = PreemptRule.RECLAIM
                elif borrow and v.priority < w.priority and within_threshold(pol, v):
                    rule = PreemptRule.BORROW
                elif sides is not None and reclaimable(pol.reclaim_within_cohort, w, v):
                    rule = PreemptRule.FAIR_SHARE
                else:
                    continue
                out.append(Candidate(r, rule, w, pool, root, lca, depth, sides))
        return out

    def borrowing_since_start(self, other: str, pool: str, lca: str | None) -> bool:
        """Is ``other`` borrowing below ``lca`` now, and was it already when the cycle started
        (victims are pre-cycle work; a queue that only now borrows is no reclaim source)?"""
        q, cs = self.ssn.quota, self.ssn.cs
        key = (other, pool, lca)
        at_start = cs.borrowing_at_start.get(key)
        if at_start is None:
            at_start = cs.borrowing_at_start[key] = borrowing_below(q, other, pool, lca, cs.usage_at_start)
        return at_start and borrowing_below(q, other, pool, lca)
