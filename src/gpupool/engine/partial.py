"""Partial admission: a gang with ``gang.minMember`` below its pod count may be admitted with
fewer pods when quota would refuse the whole of it (Kueue's partial admission, Volcano's
``minMember``).

Why a module of its own: the rule has two parts that must agree, which pods a reduced gang
keeps (``reduced``) and the largest count quota allows (``largest_count``); ``Attempt.run``
only calls them, after the full count failed on quota, and then places the reduced gang as usual.

Which pods go: one at a time from the pod group with the most replicas (the later group on a
tie), never the last pod of a group. A launcher plus N workers therefore loses workers, not its
launcher; a one-group gang simply runs fewer replicas. The count is monotone in quota (fewer
pods never need more), so the largest count that fits is found by bisection.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from gpupool.engine.decisions import Decisions, PendingCode
from gpupool.model import PodGroup, Workload

if TYPE_CHECKING:
    from gpupool.engine.preemption.search import Preemptor
    from gpupool.engine.session import Session
    from gpupool.engine.state.quota import QuotaState


def is_partial(w: Workload) -> bool:
    """May ``w`` run with fewer pods than it asks for (its gang minimum is below its count)?"""
    return w.gang_min is not None and w.min_pods < w.pod_count


def reduced(w: Workload, k: int) -> Workload:
    """``w`` with ``k`` pods (``w.min_pods <= k <= w.pod_count``): replicas are dropped one by
    one from the group with the most replicas (the later group on a tie); no group loses its
    last pod while another has more than one. The gang minimum stays ``w``'s own."""
    if k >= w.pod_count:
        return w
    counts = [g.replicas for g in w.pod_groups]
    drop = w.pod_count - k
    while drop > 0:
        i = max(range(len(counts)), key=lambda j: (counts[j], j))
        if counts[i] <= 1:
            break  # every group is down to one pod: fewer pods than groups cannot be met
        # down to the next group's level in one step (one pod at a time once they are level)
        level = max([c for j, c in enumerate(counts) if j != i] + [1])
        take = min(drop, max(counts[i] - level, 1))
        counts[i] -= take
        drop -= take
    groups = tuple(PodGroup(g.name, c, g.request) for g, c in zip(w.pod_groups, counts, strict=True))
    return replace(w, pod_groups=groups, gang_min=min(w.min_pods, sum(counts)))


def largest_count(
    quota: QuotaState, w: Workload, pool: str, within_guarantee: bool = False
) -> tuple[int, bool] | None:
    """The largest pod count in ``[w.min_pods, w.pod_count - 1]`` whose reduced gang passes
    ``w``'s queue's quota in ``pool`` (``within_guarantee``: without borrowing), with whether it
    borrows; None when even the minimum does not (the caller then reports the full count's
    quota reason)."""
    lo, hi = w.min_pods, w.pod_count - 1

    def fits(k: int) -> tuple[bool, bool]:
        ok, borrowing, _, _ = quota.check(w.queue, pool, reduced(w, k).quota_vec())
        return ok and not (within_guarantee and borrowing), borrowing

    if hi < lo:
        return None
    ok, borrowing = fits(lo)
    if not ok:
        return None
    best = lo
    while lo < hi:  # invariant: ``lo`` fits; find the largest that does
        mid = (lo + hi + 1) // 2
        ok, b = fits(mid)
        if ok:
            lo, best, borrowing = mid, mid, b
        else:
            hi = mid - 1
    return best, borrowing


class PartialAdmitter:
    """The engine's partial-admission steps: a reduced gang where quota refused the full one
    (``try_reduced``, ``in_guarantee``), and preemption for the minimum (``preempt_for_minimum``,
    through the ``Preemptor``)."""

    __slots__ = ("preemptor", "ssn")

    def __init__(self, ssn: Session, preemptor: Preemptor) -> None:
        self.ssn = ssn
        self.preemptor = preemptor

    def try_reduced(
        self,
        w: Workload,
        reasons: Sequence[tuple[str, PendingCode, object]],
        out: Decisions,
        allow_borrow: bool,
    ) -> bool | None:
        """In each pool where quota refused the full gang, in pool order, the largest count at
        or above the gang minimum that quota allows (in pass 1: without borrowing), placed with
        that minimum. True: admitted; None: this is pass 1 and a borrowing count would fit
        (pass 2 tries the full count first again); False: no reduced gang fits."""
        ssn = self.ssn
        wants_borrow = False
        for pool in [p for p, code, _ in reasons if code is PendingCode.QUOTA]:
            got = largest_count(ssn.quota, w, pool)
            if got is None:
                continue
            k, borrowing = got
            may_borrow = w.preemptible and ssn.pools[pool].preemptible
            if borrowing and (not may_borrow or not allow_borrow):
                # non-preemptible work never borrows (issue 11, item 5), and pass 1 admits
                # without borrowing: what the guarantee holds (pass 2 tries a borrowing count)
                wants_borrow = wants_borrow or may_borrow
                got = largest_count(ssn.quota, w, pool, within_guarantee=True)
                if got is None:
                    continue
                k, borrowing = got
            res = ssn.placer.place(reduced(w, k), pool, ssn.config.max_domain_tries)
            if res.pods is not None:
                ssn.admit(w, pool, tuple(res.pods), borrowing, out)
                return True
        return None if wants_borrow else False

    def in_guarantee(self, w: Workload, pools: list[str], out: Decisions) -> bool:
        """Pass 1, where the full gang would borrow in each of ``pools``: the largest count its
        leaf queue's guarantee holds (at or above the gang minimum), placed with that minimum,
        in pool order. Why: otherwise the gang waits for pass 2 on its full count, and work of
        other queues that borrows is admitted there first (issue 11 follow-up)."""
        ssn = self.ssn
        for pool in pools:
            got = largest_count(ssn.quota, w, pool, within_guarantee=True)
            if got is None:
                continue
            res = ssn.placer.place(reduced(w, got[0]), pool, ssn.config.max_domain_tries)
            if res.pods is not None:
                ssn.admit(w, pool, tuple(res.pods), False, out)
                return True
        return False

    def preempt_for_minimum(
        self, w: Workload, pools: list[str], ckeys: list[tuple[object, ...]], out: Decisions
    ) -> bool:
        """After preemption for the full gang failed: preempt for its minimum only (the
        simple rule of docs/engine.md, "Partial admission"; a larger count is not searched)."""
        if self.ssn.config.preempt == "none":
            return False
        least = reduced(w, w.min_pods)
        vec = least.quota_vec()
        for pool, ckey in zip(pools, ckeys, strict=True):
            if self.preemptor.try_preempt(least, pool, vec, out, (ckey[1], "min")):
                return True
        return False
