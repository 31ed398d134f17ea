"""Preemption: who may be evicted for a workload, in which order, and the search that makes room.

The order is one function, ``candidate_order``, as in Kueue's
``pkg/scheduler/preemption/common/ordering.go`` (``CandidatesOrdering``): the candidate search
(``PreemptionSearch.preemption_candidates``) collects the legal victims and sorts them by it;
nothing else decides who goes first. The search itself follows Kueue's steps: check the cheap
bounds (``WholeSlots``), remove candidates until the preemptor fits, give back every victim not
needed, admit (``PreemptionSearch._try_preempt``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from gpupool.engine import fair_preemption as fair
from gpupool.engine.cohorts import borrowing_below, fit_depth
from gpupool.engine.decisions import Admit, Decisions, Preempt, PreemptRule, Victim
from gpupool.engine.reach import reachable
from gpupool.engine.slots import WholeSlots
from gpupool.engine.state.running import vec_of
from gpupool.engine.victim_cost import choose_victims, cost_key, should_wait
from gpupool.model import (
    ZERO,
    Admission,
    PodPlacement,
    PreemptionPolicy,
    ReclaimPolicy,
    Running,
    Vec,
    Workload,
    vadd,
    vsub,
)

#: the bounds that only save work (the property tests switch them off to show that they change no
#: decision): the device bounds before the candidates are sorted, and ``reach.reachable``'s bound
SEARCH_SHORTCUTS = True

if TYPE_CHECKING:
    from gpupool.engine.cycle_state import CycleState
    from gpupool.engine.placement import Placer
    from gpupool.engine.state.cluster import ClusterState
    from gpupool.engine.state.quota import QuotaState
    from gpupool.engine.state.running import RunningSet
    from gpupool.engine.state.statement import Statement
    from gpupool.model import EngineConfig, ResourcePool


def candidate_order(
    victim: Running, preemptor_queue: str, now: float | None = None
) -> tuple[int, int, float, float, float, str]:
    """Sort key of a preemption candidate: the smallest key is evicted first.

    1. Work of *other* queues (reclaimed or borrowed capacity) before work of the preemptor's own
       queue: taking back what others borrow leaves the preemptor's queue its own work (Kueue's
       criterion "other ClusterQueues first").
    2. Lower priority first: the least important work goes.
    3. With ``now`` (the cost model, ``victim_cost.cost_key``): the least lost work per unit
       freed first (run time x (1 + earlier evictions)), then the most left to run.
    4. Most recently admitted first: it has lost the least progress.
    5. The name: a total order, so the choice never depends on how the candidates were found.
    """
    v = victim.workload
    cost = (0.0, 0.0) if now is None else cost_key(victim, now)
    return (int(v.queue == preemptor_queue), v.priority, *cost, -victim.admission.admitted_at, v.name)


def within_queue_victim(w: Workload, v: Workload, newer_equal: bool) -> bool:
    """May ``w`` evict ``v`` of its own queue: lower priority, or, with ``withinQueue:
    LowerOrNewerEqualPriority``, equal priority and queued after ``w`` (Kueue's rule: the victim
    cannot evict ``w`` back, since ``w`` is older)."""
    if v.priority != w.priority:
        return v.priority < w.priority
    return newer_equal and (v.arrival, v.name) > (w.arrival, w.name)


def within_threshold(pol: PreemptionPolicy, v: Workload) -> bool:
    """May a borrowing preemptor evict ``v`` under ``borrowWithinCohort.maxPriorityThreshold``?
    Kueue's guard: borrowing may displace only work at or below a set priority, so a team that
    borrows never evicts another team's important work however high its own priority."""
    return pol.borrow_max_priority is None or v.priority <= pol.borrow_max_priority


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
    #: ancestor, whose weighted shares must stay in that order (``engine/fair_preemption.py``)
    sides: tuple[str, str] | None = None

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


class PreemptionSearch:
    """The engine's preemption steps: the candidate search and making room for one workload.

    A mixin of ``core.Engine``: the steps read and change the engine's state through the
    attributes declared here (the engine sets them), so the cycle's outline stays in core.py
    and every step of the search is here, in the order it runs."""

    config: EngineConfig
    cluster: ClusterState
    quota: QuotaState
    runs: RunningSet
    placer: Placer
    pools: dict[str, ResourcePool]
    now: float
    _cs: CycleState
    _stmt: Statement
    _leaves_of_root: dict[str, list[str]]

    if TYPE_CHECKING:

        def _charge(self, r: Running) -> None: ...

        def _discharge(self, r: Running) -> None: ...

    def preemption_candidates(self, w: Workload, pool: str, vec: Vec) -> list[Candidate]:
        """Preempt extension point: who may be evicted for ``w``, in the order to try them.

        Collected here, ordered by ``preemption.candidate_order`` (one rule, as in Kueue): other
        queues' borrowed capacity first, then the lowest priority, then the most recently admitted.
        Own-queue candidates and reclaim from the cohort go together (Kueue: "preempt from all
        ClusterQueues in cohort"): reclaim is open when ``w`` could end within a guarantee once
        its own candidates are gone. With no guarantee in reach and ``borrowWithinCohort:
        Never`` there is nothing to preempt for (docs/engine.md, "Quota and preemption semantics").
        """
        if not self.runs.by_pq or not self.pools[pool].preemptible:
            return []
        own = self._own_candidates(w, pool)
        freed = ZERO
        for c in own:
            freed = vadd(freed, c.running.admission.quota_vec())
        best = fit_depth(self.quota, w.queue, pool, vsub(vec, freed))
        fair = self._fair_sharing(w, pool)
        if best is None and not self._may_borrow_preempting(w, pool) and not fair:
            return own[:0]  # it would stay above every guarantee: only borrowWithinCohort allows that
        out = own + self._cohort_candidates(w, pool, vec, best, fair)
        if SEARCH_SHORTCUTS and self._device_bounds(w, pool, vec, out) is False:
            return out[:0]  # even with all of them gone it would not fit: no order makes room
        mine = w.queue
        out.sort(key=lambda c: candidate_order(c.running, mine))
        return out[: self.config.max_preemption_candidates]

    def _may_borrow_preempting(self, w: Workload, pool: str) -> bool:
        """May ``w`` end above its guarantee after preempting (Kueue's ``borrowWithinCohort``)?
        Never for non-preemptible work, which never borrows."""
        pol = self.quota.queues[w.queue].preemption
        return (
            pol.borrow_within_cohort is not ReclaimPolicy.NEVER
            and w.preemptible
            and self.pools[pool].preemptible
        )

    def _fair_sharing(self, w: Workload, pool: str) -> bool:
        """Does ``w``'s cohort preempt for fair sharing (``spec.fairSharing.preemption`` on its
        root), and may ``w`` end borrowing (preemptible, in a preemptible pool)?"""
        return fair.enabled(self.quota, w.queue) and w.preemptible and self.pools[pool].preemptible

    def _own_candidates(self, w: Workload, pool: str) -> list[Candidate]:
        """Running work of ``w``'s own queue that ``withinQueue`` lets it evict: lower priority,
        or (``LowerOrNewerEqualPriority``) equal priority and queued after ``w``."""
        policy = self.quota.queues[w.queue].preemption.within_queue
        if policy is ReclaimPolicy.NEVER:
            return []
        equal = policy is ReclaimPolicy.LOWER_OR_NEWER_EQUAL_PRIORITY
        lowest = self.runs.lowest_priority(pool, w.queue)
        if lowest > w.priority or (lowest == w.priority and not equal):
            return []
        cs = self._cs
        evicted, now, root = cs.evicted, cs.admitted_now, self.quota.root[w.queue]
        out: list[Candidate] = []
        for r in self.runs.by_pq.get((pool, w.queue), {}).values():
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

    def _cohort_candidates(
        self, w: Workload, pool: str, vec: Vec, best: int | None, fair_on: bool
    ) -> list[Candidate]:
        """Work of other queues of the cohort that borrow as seen from their common ancestor with
        ``w``'s queue (the leaf and every queue below that ancestor above its guarantee, now and
        when the cycle started). Reclaim (``reclaimWithinCohort``) where ``w`` could end within
        the guarantee of a queue below that ancestor (``best``: the lowest depth in reach);
        else lower-priority victims only if ``borrowWithinCohort`` lets ``w`` borrow, or, in a
        fair-sharing cohort, victims whose side of the common ancestor has a larger weighted
        share than ``w``'s side would have (``engine/fair_preemption.py``)."""
        q, cs = self.quota, self._cs
        pol = q.queues[w.queue].preemption
        root = q.root[w.queue]
        # a fair-sharing cohort takes borrowers' work by share, never by borrowWithinCohort (as in
        # Kueue, where the two do not combine): otherwise each rule could undo the other
        borrow = self._may_borrow_preempting(w, pool) and not fair_on
        evicted, now, path = cs.evicted, cs.admitted_now, q.path[w.queue]
        out: list[Candidate] = []
        for other in self._leaves_of_root.get(root, ()):
            rs = self.runs.by_pq.get((pool, other))
            if other == w.queue or not rs:
                continue
            lca = q.common_ancestor(w.queue, other)
            if not self._borrowing_since_start(other, pool, lca):
                continue
            depth = path.index(lca) if lca is not None else len(path)
            reclaim = (
                pol.reclaim_within_cohort is not ReclaimPolicy.NEVER and best is not None and best < depth
            )
            sides = None
            if fair_on and pol.reclaim_within_cohort is not ReclaimPolicy.NEVER:
                ab = (fair.side(q, w.queue, lca), fair.side(q, other, lca))
                sides = ab if fair.below_victims(q, w, pool, vec, [ab]) else None
            for r in rs.values():
                v = r.workload
                if v.name in evicted or v.name in now or not v.preemptible:
                    continue
                if reclaim and (pol.reclaim_within_cohort is ReclaimPolicy.ANY or v.priority < w.priority):
                    rule = PreemptRule.RECLAIM
                elif borrow and v.priority < w.priority and within_threshold(pol, v):
                    rule = PreemptRule.BORROW
                elif sides is not None and (
                    pol.reclaim_within_cohort is ReclaimPolicy.ANY or v.priority < w.priority
                ):
                    rule = PreemptRule.FAIR_SHARE
                else:
                    continue
                out.append(Candidate(r, rule, w, pool, root, lca, depth, sides))
        return out

    def _borrowing_since_start(self, other: str, pool: str, lca: str | None) -> bool:
        """Is ``other`` borrowing below ``lca`` now, and was it already when the cycle started
        (victims are pre-cycle work; a queue that only now borrows is no reclaim source)?"""
        q, cs = self.quota, self._cs
        key = (other, pool, lca)
        at_start = cs.borrowing_at_start.get(key)
        if at_start is None:
            at_start = cs.borrowing_at_start[key] = borrowing_below(q, other, pool, lca, cs.usage_at_start)
        return at_start and borrowing_below(q, other, pool, lca)

    def _legal(
        self, w: Workload, pool: str, vec: Vec, reclaim_depth: int, sides: list[tuple[str, str]]
    ) -> bool:
        """Would admitting ``w`` now keep the search's rules? It ends within the guarantee of a
        queue below every reclaimed victim's common ancestor with it (``reclaim_depth``: the
        lowest such ancestor's depth), and above every guarantee only where
        ``borrowWithinCohort`` allows or for fair sharing; non-preemptible work ends within every
        guarantee; every fair-sharing victim's side keeps a larger share than ``w``'s."""
        q = self.quota
        if not (w.preemptible and self.pools[pool].preemptible):
            return not q.check(w.queue, pool, vec)[1]
        if not fair.below_victims(q, w, pool, vec, sides):
            return False
        f = fit_depth(q, w.queue, pool, vec)
        if f is None:
            return reclaim_depth > len(q.path[w.queue]) and (
                self._may_borrow_preempting(w, pool) or bool(sides)
            )
        return f < reclaim_depth

    def _fits_now(
        self,
        w: Workload,
        pool: str,
        vec: Vec,
        reclaim_depth: int = 1 << 30,
        sides: list[tuple[str, str]] | None = None,
    ) -> bool:
        if not self.quota.check(w.queue, pool, vec)[0] or not self._legal(
            w, pool, vec, reclaim_depth, sides or []
        ):
            return False
        cp = self._stmt.checkpoint()
        res = self.placer.place(w, pool, self.config.max_domain_tries)
        self._stmt.rollback(cp)
        return res.pods is not None

    def _try_preempt(self, w: Workload, pool: str, vec: Vec, out: Decisions, sid: object) -> bool:
        """Make room for ``w`` in ``pool`` by evicting candidates (Kueue's steps: remove until
        it fits, give back what is not needed, admit); False, with nothing changed, if no set
        of candidates makes it fit."""
        # Within a cycle capacity only shrinks and candidates only leave, until a preemption
        # succeeds: a failed search for the same queue, pool, shape and priority fails again.
        cs = self._cs
        failed = cs.preempt_failed
        memo = (w.queue, w.priority, pool, sid)
        if memo in failed:
            return False
        cands = choose_victims(self, self.preemption_candidates(w, pool, vec))
        slots = self._bounded_slots(w, pool, vec, cands)
        cp = self._stmt.checkpoint()
        steps: list[tuple[Candidate, bool]] = []
        removed = None if slots is False else self._remove_until_fits(w, pool, vec, cands, slots, steps)
        if removed is None:
            failed.add(memo)
            return False
        assert slots is not False
        # Whether to wait for work about to end is asked only of a search that would evict
        # (the answer is the same False otherwise), on the state before its victims: on the
        # Philly replay most searches fail, and the wait trial first cost a third of the CPU.
        self._stmt.rollback(cp)
        if should_wait(self, w, pool, vec, memo):  # work about to end makes room: evict nobody
            return False
        slots = None if slots is None else WholeSlots.of(self.cluster, w, pool)  # counts afresh
        removed = self._replay(steps, slots)  # the same search on the same state, without its trials
        victims = self._give_back(w, pool, vec, removed, slots)
        res = self.placer.place(w, pool, self.config.max_domain_tries)
        assert res.pods is not None
        borrowing = self.quota.check(w.queue, pool, vec)[1]
        self.quota.add(w.queue, pool, vec_of(res.pods))
        self.runs.admit(Running(w, Admission(pool, tuple(res.pods), borrowing, self.now)))
        for c in victims:
            cs.evicted.add(c.running.name)
        cs.fail_cache.clear()
        failed.clear()
        _decide_preemption(w, pool, tuple(res.pods), borrowing, victims, out)
        return True

    def _bounded_slots(
        self, w: Workload, pool: str, vec: Vec, cands: list[Candidate]
    ) -> WholeSlots | Literal[False] | None:
        """The cheap bounds before any trial: False when even evicting every candidate could
        not make room (by free GPU milli, then by whole free devices); else the device count to
        keep during the search (None where it does not apply)."""
        slots = self._device_bounds(w, pool, vec, cands)
        if slots is False:
            return False
        if SEARCH_SHORTCUTS:  # the same bounds on what the search would remove at most
            free_gpu = self.cluster.capacity[pool][0] - self.cluster.pool_used[pool]
            gone = reachable(self.quota, pool, cands)
            if gone is not None and (
                free_gpu + sum(r.admission.quota_vec()[0] for r in gone) < vec[0]
                or (slots is not None and not slots.could_fit_after(gone))
            ):
                return False
        return slots

    def _device_bounds(
        self, w: Workload, pool: str, vec: Vec, cands: list[Candidate]
    ) -> WholeSlots | Literal[False] | None:
        """False when even evicting every candidate (in any order) could not make room, by free
        GPU milli, then by whole free devices; else the device count (None where it does not
        apply)."""
        if not cands:
            return False
        free_gpu = self.cluster.capacity[pool][0] - self.cluster.pool_used[pool]
        if free_gpu + sum(c.running.admission.quota_vec()[0] for c in cands) < vec[0]:
            return False
        slots = WholeSlots.of(self.cluster, w, pool)
        if slots is not None and not slots.could_fit_without(cands):
            return False
        return slots

    def _remove_until_fits(
        self,
        w: Workload,
        pool: str,
        vec: Vec,
        cands: list[Candidate],
        slots: WholeSlots | None,
        steps: list[tuple[Candidate, bool]],
    ) -> list[Candidate] | None:
        """Evict candidates in order until ``w`` fits; the evicted, or None (state rolled back).
        A victim of another queue is skipped once its queue no longer borrows (earlier victims
        gave back what it borrowed): reclaim never takes a queue's own guarantee. ``steps``
        records every candidate released and whether it stayed released (``_replay``)."""
        cp = self._stmt.checkpoint()
        free_gpu = self.cluster.capacity[pool][0] - self.cluster.pool_used[pool]
        freed = 0
        depth = 1 << 30
        sides: list[tuple[str, str]] = []
        removed: list[Candidate] = []
        for c in cands:
            if c.rule is not PreemptRule.WITHIN_QUEUE and not borrowing_below(
                self.quota, c.running.workload.queue, pool, c.lca
            ):
                continue
            share = fair.weighted_share(self.quota, c.sides[1]) if c.sides is not None else 0.0
            self._discharge(c.running)
            if c.sides is not None and not fair.victim_lowers(self.quota, w, pool, vec, c.sides, share):
                self._charge(c.running)  # its side would fall below the preemptor's: not a victim
                steps.append((c, False))
                continue
            steps.append((c, True))
            removed.append(c)
            if c.rule is PreemptRule.RECLAIM:
                depth = min(depth, c.depth)
            if c.sides is not None:
                sides.append(c.sides)
            freed += c.running.admission.quota_vec()[0]
            room = slots is None or slots.enough(c)  # whole free devices for every pod, by count
            if not room or free_gpu + freed < vec[0] or not self.quota.check(w.queue, pool, vec)[0]:
                continue  # a placement trial cannot succeed yet
            if self._fits_now(w, pool, vec, depth, sides):
                return removed
        self._stmt.rollback(cp)
        return None

    def _replay(self, steps: list[tuple[Candidate, bool]], slots: WholeSlots | None) -> list[Candidate]:
        """Redo a successful ``_remove_until_fits`` from its ``steps``, on the state it started
        from: the same releases (and put-backs) in the same order, so the same state, without
        its placement trials (only a successful search is replayed: its last step fitted)."""
        removed: list[Candidate] = []
        for c, kept in steps:
            self._discharge(c.running)
            if not kept:
                self._charge(c.running)
                continue
            removed.append(c)
            if slots is not None:
                slots.enough(c)
        return removed

    def _give_back(
        self, w: Workload, pool: str, vec: Vec, removed: list[Candidate], slots: WholeSlots | None
    ) -> list[Candidate]:
        """Minimise: give back every victim that turns out not to be needed, newest choice
        first (the last one removed is needed: without it ``w`` did not fit)."""
        victims: list[Candidate] = []
        rest = removed[:-1]
        while rest:
            c = rest.pop()
            self._charge(c.running)
            kept = (*victims, *rest, removed[-1])
            depth = min((x.depth for x in kept if x.rule is PreemptRule.RECLAIM), default=1 << 30)
            sides = [x.sides for x in kept if x.sides is not None]
            if (slots is not None and not slots.enough(c)) or not self._fits_now(w, pool, vec, depth, sides):
                self._discharge(c.running)
                if slots is not None:
                    slots.enough(c)
                victims.append(c)
        victims.append(removed[-1])
        victims.reverse()
        return victims


def _decide_preemption(
    w: Workload,
    pool: str,
    pods: tuple[PodPlacement, ...],
    borrowing: bool,
    victims: list[Candidate],
    out: Decisions,
) -> None:
    """Record a preemption: the victims with their rules and reasons, and the admission."""
    names = tuple(c.running.name for c in victims)
    out.preempted.append(
        Preempt(
            w.name,
            w.queue,
            tuple(
                Victim(
                    c.running.name, c.running.workload.queue, c.running.workload.priority, c.rule, c.reason
                )
                for c in victims
            ),
        )
    )
    why = f"admitted to pool {pool} after preempting {len(names)} workload(s): {', '.join(names)}"
    out.admitted.append(Admit(w.name, w.queue, pool, pods, borrowing, why, after_evicting=names))
    out.pending_after_preemption = len(out.pending)
