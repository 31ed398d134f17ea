"""The preemption search: make room for one workload by evicting candidates, or change nothing.

It follows Kueue's steps: check the cheap bounds (``bounds``), remove candidates in their order
until the preemptor fits, give back every victim not needed, admit. Every step runs on the
session's live state inside its ``Statement`` (KAI's checkpoint and rollback), so nothing is
evicted until the whole result has been simulated.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from gpupool.engine.cohorts import borrowing_below, fit_depth
from gpupool.engine.decisions import Admit, Decisions, Preempt, PreemptRule, Shrink, Victim
from gpupool.engine.preemption import bounds, fair_sharing, floor, shrink
from gpupool.engine.preemption.candidates import Candidate, CandidateFinder
from gpupool.engine.preemption.slots import WholeSlots
from gpupool.engine.preemption.victim_cost import choose_victims, should_wait, waits_again
from gpupool.engine.state.running import vec_of
from gpupool.model import Admission, PodPlacement, Running, Vec, Workload

if TYPE_CHECKING:
    from gpupool.engine.session import Session


class Preemptor:
    """Makes room for a workload in a pool (``try_preempt``), over the session's state, with
    the victims its ``CandidateFinder`` allows (as Kueue's ``Scheduler`` holds its
    ``preemption.Preemptor``)."""

    __slots__ = ("candidates", "ssn")

    def __init__(self, ssn: Session, candidates: CandidateFinder) -> None:
        self.ssn = ssn
        self.candidates = candidates

    def try_preempt(self, w: Workload, pool: str, vec: Vec, out: Decisions, sid: object) -> bool:
        """Make room for ``w`` in ``pool`` by evicting candidates (Kueue's steps: remove until
        it fits, give back what is not needed, admit); False, with nothing changed, if no set
        of candidates makes it fit."""
        # Within a cycle capacity only shrinks and candidates only leave, until a preemption
        # succeeds: a failed search for the same queue, pool, shape and priority fails again.
        ssn = self.ssn
        cs, stmt = ssn.cs, ssn.stmt
        failed = cs.preempt_failed
        memo = (w.queue, w.priority, pool, sid)
        if memo in failed:
            return False
        if waits_again(ssn, w, memo):
            return False
        cands = choose_victims(ssn.config, ssn.now, self.candidates.find(w, pool, vec))
        cands = fair_sharing.most_above_first(ssn.quota, cands)  # OverQuota trees only
        cands = shrink.split(ssn.config, ssn.now, cands)  # elastic gangs' extra pods first
        slots = bounds.bounded_slots(ssn.cluster, ssn.quota, w, pool, vec, cands)
        cp = stmt.checkpoint()
        steps: list[tuple[Candidate, bool]] = []
        removed = None if slots is False else self._remove_until_fits(w, pool, vec, cands, slots, steps)
        if removed is None:
            failed.add(memo)
            return False
        assert slots is not False
        # Whether to wait for work about to end is asked only of a search that would evict
        # (the answer is the same False otherwise), on the state before its victims: on the
        # Philly replay most searches fail, and the wait trial first cost a third of the CPU.
        # Not before the search: a failed search marks its class (``memo``) for the cycle, and a
        # wait asked first leaves it unmarked, so a later workload of the class with another
        # horizon searched again and preempted (the full replay's decisions changed).
        stmt.rollback(cp)
        if should_wait(ssn, self.fits_now, w, pool, vec, memo):  # work about to end makes room
            return False
        slots = None if slots is None else WholeSlots.of(ssn.cluster, w, pool)  # counts afresh
        removed = self._replay(steps, slots)  # the same search on the same state, without its trials
        victims = self._trim(w, pool, vec, self._give_back(w, pool, vec, removed, slots), slots)
        res = ssn.placer.place(w, pool, ssn.config.max_domain_tries)
        assert res.pods is not None
        borrowing = ssn.quota.check(w.queue, pool, vec)[1]
        ssn.quota.add(w.queue, pool, vec_of(res.pods))
        ssn.runs.admit(Running(w, Admission(pool, tuple(res.pods), borrowing, ssn.now)))
        for c in victims:
            cs.evicted.add(c.running.name)
        cs.fail_cache.clear()
        failed.clear()
        _decide_preemption(w, pool, tuple(res.pods), borrowing, victims, out)
        return True

    def fits_now(
        self,
        w: Workload,
        pool: str,
        vec: Vec,
        reclaim_depth: int = 1 << 30,
        sides: list[tuple[str, str]] | None = None,
        own_only: bool = False,
    ) -> bool:
        """Would ``w`` pass quota, keep the search's rules (``_legal``) and be placed in the
        current state? ``own_only``: every victim so far is of ``w``'s own queue. The placement
        trial is undone."""
        ssn = self.ssn
        if not ssn.quota.check(w.queue, pool, vec)[0] or not self._legal(
            w, pool, vec, reclaim_depth, sides or [], own_only
        ):
            return False
        cp = ssn.stmt.checkpoint()
        res = ssn.placer.place(w, pool, ssn.config.max_domain_tries)
        ssn.stmt.rollback(cp)
        return res.pods is not None

    def _legal(
        self,
        w: Workload,
        pool: str,
        vec: Vec,
        reclaim_depth: int,
        sides: list[tuple[str, str]],
        own_only: bool = False,
    ) -> bool:
        """Would admitting ``w`` now keep the search's rules? It ends within the guarantee of a
        queue below every reclaimed victim's common ancestor with it (``reclaim_depth``: the
        lowest such ancestor's depth), and above every guarantee only where
        ``borrowWithinCohort`` allows, for fair sharing, or when every victim is of its own
        queue (``own_only``: Kueue's last attempt, "only candidates from the same queue, but
        with borrowing": it then borrows only what is idle, reclaimable as any borrowing, and
        evicting more of its own work to stay within its guarantee would not be minimal);
        non-preemptible work ends within every guarantee; every fair-sharing victim's side keeps
        a larger share than ``w``'s."""
        q = self.ssn.quota
        if not (w.preemptible and self.ssn.pools[pool].preemptible):
            return not q.check(w.queue, pool, vec)[1]
        if not fair_sharing.below_victims(q, w, pool, vec, sides):
            return False
        f = fit_depth(q, w.queue, pool, vec)
        if f is None:
            return reclaim_depth > len(q.path[w.queue]) and (
                own_only or self.candidates.may_borrow_preempting(w, pool) or bool(sides)
            )
        return f < reclaim_depth

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
        gave back what it borrowed), or when its removal would take a queue with
        ``guaranteeFloor`` below its guarantee (``floor``). ``steps``
        records every candidate released and whether it stayed released (``_replay``)."""
        ssn = self.ssn
        quota = ssn.quota
        cp = ssn.stmt.checkpoint()
        free_gpu = ssn.cluster.capacity[pool][0] - ssn.cluster.pool_used[pool]
        freed = 0
        depth = 1 << 30
        sides: list[tuple[str, str]] = []
        removed: list[Candidate] = []
        for c in cands:
            if shrink.rest_too_early(c, removed):
                continue  # a gang never falls below its minimum: its extras go first
            if c.rule is not PreemptRule.WITHIN_QUEUE and (
                not borrowing_below(quota, c.running.workload.queue, pool, c.lca)
                or floor.breaks_floor(
                    quota, c.running.workload.queue, pool, c.lca, c.running.admission.quota_vec()
                )
            ):
                continue
            share = fair_sharing.weighted_share(quota, c.sides[1]) if c.sides is not None else 0.0
            shrink.release(ssn, c)
            if c.sides is not None and not fair_sharing.victim_lowers(quota, w, pool, vec, c.sides, share):
                shrink.restore(ssn, c)  # its side would fall below the preemptor's: not a victim
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
            if not room or free_gpu + freed < vec[0] or not quota.check(w.queue, pool, vec)[0]:
                continue  # a placement trial cannot succeed yet
            if self.fits_now(w, pool, vec, depth, sides, _own_only(removed)):
                return removed
        ssn.stmt.rollback(cp)
        return None

    def _replay(self, steps: list[tuple[Candidate, bool]], slots: WholeSlots | None) -> list[Candidate]:
        """Redo a successful ``_remove_until_fits`` from its ``steps``, on the state it started
        from: the same releases (and put-backs) in the same order, so the same state, without
        its placement trials (only a successful search is replayed: its last step fitted)."""
        ssn = self.ssn
        removed: list[Candidate] = []
        for c, kept in steps:
            shrink.release(ssn, c)
            if not kept:
                shrink.restore(ssn, c)
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
        ssn = self.ssn
        victims: list[Candidate] = []
        rest = removed[:-1]
        while rest:
            c = rest.pop()
            kept = (*victims, *rest, removed[-1])
            if shrink.pinned(c, kept):
                victims.append(c)  # extras whose rest goes: the whole workload goes
                continue
            shrink.restore(ssn, c)
            depth = min((x.depth for x in kept if x.rule is PreemptRule.RECLAIM), default=1 << 30)
            sides = [x.sides for x in kept if x.sides is not None]
            own = _own_only(kept)
            room = slots is None or slots.enough(c)
            if not room or not self.fits_now(w, pool, vec, depth, sides, own):
                shrink.release(ssn, c)
                if slots is not None:
                    slots.enough(c)
                victims.append(c)
        victims.append(removed[-1])
        victims.reverse()
        return victims

    def _trim(
        self, w: Workload, pool: str, vec: Vec, victims: list[Candidate], slots: WholeSlots | None
    ) -> list[Candidate]:
        """Give back every extra pod of a shrink that is not needed, one pod at a time, its
        first pods first (a shrink takes no more pods than make room)."""
        ssn = self.ssn
        depth = min((x.depth for x in victims if x.rule is PreemptRule.RECLAIM), default=1 << 30)
        sides = [x.sides for x in victims if x.sides is not None]
        own = _own_only(victims)
        out: list[Candidate] = []
        for c in victims:
            if c.part != shrink.EXTRAS or shrink.pinned(c, victims):
                out.append(c)
                continue
            taken = list(c.running.admission.pods)
            for p in list(taken):
                if len(taken) == 1:
                    break  # it made room where none was: at least one pod is needed
                one = replace(c, running=shrink.with_pods(c.running, (p,)))
                shrink.restore(ssn, one)
                room = slots is None or slots.enough(one)
                if room and self.fits_now(w, pool, vec, depth, sides, own):
                    taken.remove(p)
                    continue
                shrink.release(ssn, one)
                if slots is not None:
                    slots.enough(one)
            out.append(replace(c, running=shrink.with_pods(c.running, taken)))
        return out


def _own_only(victims: Sequence[Candidate]) -> bool:
    """Is every victim of the preemptor's own queue (``withinQueue``)?"""
    return all(c.rule is PreemptRule.WITHIN_QUEUE for c in victims)


def _decide_preemption(
    w: Workload,
    pool: str,
    pods: tuple[PodPlacement, ...],
    borrowing: bool,
    victims: list[Candidate],
    out: Decisions,
) -> None:
    """Record a preemption: the victims with their rules and reasons, the elastic gangs that
    lose only extra pods (``Shrink``), and the admission."""
    whole, shrunk = shrink.whole_and_shrunk(victims)
    names = tuple(c.running.name for c in whole)
    out.preempted.append(
        Preempt(
            w.name,
            w.queue,
            tuple(
                Victim(
                    c.running.name, c.running.workload.queue, c.running.workload.priority, c.rule, c.reason
                )
                for c in whole
            ),
            tuple(_shrink_of(c) for c in shrunk),
        )
    )
    small = tuple(c.running.name for c in shrunk)
    why = f"admitted to pool {pool} after preempting {len(names)} workload(s): {', '.join(names)}"
    if small:
        why = f"admitted to pool {pool} after preempting {len(names)} workload(s){': ' if names else ''}"
        why += f"{', '.join(names)}; shrinking {len(small)} elastic gang(s): {', '.join(small)}"
    out.admitted.append(
        Admit(w.name, w.queue, pool, pods, borrowing, why, after_evicting=names, after_shrinking=small)
    )
    out.pending_after_preemption = len(out.pending)


def _shrink_of(c: Candidate) -> Shrink:
    """The shrink decision of an extras victim: the pods it loses, the count it keeps."""
    v, full = c.running.workload, c.full
    assert full is not None
    gone = c.running.admission.pods
    keep = len(full.admission.pods) - len(gone)
    why = f"{c.reason}; {len(gone)} pod(s) above minMember {v.gang_min} removed, {keep} keep running"
    return Shrink(c.running.name, v.queue, v.priority, c.rule, why, gone, keep)
