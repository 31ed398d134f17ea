"""One workload's turn in a cycle: quota, placement, partial admission, preemption, and the
reason it stays pending (the Kubernetes scheduler's "schedule one", over the whole gang).

``Attempt.run`` tries each pool the workload may use in order: the quota check (``QuotaState``),
the borrowing rules (``rounds.BorrowRounds``), a placement (``placement.Placer``), and where
nothing fits as things are, a reduced gang (``partial.PartialAdmitter``) or room made by
preemption (``preemption.search.Preemptor``); a workload left pending may have nodes held for it
(``holds.plan_hold``) and gets its reason (``reasons``).
"""

from __future__ import annotations

from typing import Literal

from gpupool.engine.decisions import Decisions, Pending, PendingCode
from gpupool.engine.facts import WorkloadFacts
from gpupool.engine.feasible import Unsatisfiable, beyond_capacity, beyond_pool
from gpupool.engine.holds import plan_hold
from gpupool.engine.partial import PartialAdmitter, is_partial, reduced
from gpupool.engine.preemption.search import Preemptor
from gpupool.engine.reasons import no_pool_reason, non_preemptible_reason, quota_reason
from gpupool.engine.rounds import BorrowRounds
from gpupool.engine.session import Session
from gpupool.model import Vec, Workload

#: why a workload failed in each pool: a formatted reason, or (dimension, blocking queue) of a
#: quota failure, formatted only if the workload ends up pending
PoolReasons = list[tuple[str, PendingCode, tuple[object, ...] | str]]

#: pending codes no node hold can help: quota, and an inventory the workload can never fit
_NO_HOLD = (PendingCode.QUOTA, PendingCode.UNSATISFIABLE)


class Attempt:
    """Tries one workload (``run``) with the parts it is given; state is the session's."""

    __slots__ = ("facts", "hopeless", "partial", "preemptor", "rounds", "ssn")

    def __init__(
        self,
        ssn: Session,
        facts: WorkloadFacts,
        rounds: BorrowRounds,
        preemptor: Preemptor,
        partial: PartialAdmitter,
    ) -> None:
        self.ssn = ssn
        self.facts = facts
        self.rounds = rounds
        self.preemptor = preemptor
        self.partial = partial
        #: which shapes can never run in a pool as it is (kept across cycles)
        self.hopeless = Unsatisfiable(ssn.cluster)

    def must_borrow(self, w: Workload) -> bool:
        """True when ``w`` needs GPUs and would take its leaf queue past its GPU guarantee in every
        pool it may use (a partial gang: even at its minimum): it can only be admitted by
        borrowing, so pass 1 leaves it to pass 2 (which also reports it, if it cannot borrow
        either)."""
        vec, pools, _ = self.facts.of(w)
        g = vec[0]
        if g <= 0 or not pools:
            return False
        if is_partial(w):  # it may start at its minimum, which may fit the guarantee
            g = reduced(w, w.min_pods).quota_vec()[0]
        quota = self.ssn.quota
        E, G, q = quota.E, quota.G, w.queue
        for p in pools:  # hot (every workload in pass 1): a plain loop, no generator
            k = (q, p)
            if E[k][0] + g <= G[k][0]:
                return False
        return True

    def run(self, w: Workload, out: Decisions, allow_borrow: bool = True) -> bool | None:
        """Admit ``w`` (True), leave it pending with a reason (False), or defer it to the borrowing pass (None)."""
        vec, pools, ckeys = self.facts.of(w)
        ssn = self.ssn
        if not vec[0] and not vec[1] and not vec[2] and w.pod_count == 0:
            out.pending.append(Pending(w.name, w.queue, PendingCode.INVALID, "workload has no pods"))
            return False
        if not pools:
            out.pending.append(Pending(w.name, w.queue, PendingCode.NO_POOL, no_pool_reason(w, ssn.pools)))
            return False
        # reasons are formatted only if the workload ends up pending (most attempts never need them)
        reasons: PoolReasons = []
        wants_borrow: list[str] = []  # pools where it fits quota only by borrowing
        if self._fit_as_is(w, vec, pools, ckeys, out, allow_borrow, reasons, wants_borrow):
            return True
        # nothing fits as things are: try to make room (guaranteed work first, borrowers in pass 2)
        partial = self.partial
        part = is_partial(w)
        if wants_borrow:  # pass 1: a partial gang may start within its guarantee, fewer pods
            if not allow_borrow and part and partial.in_guarantee(w, wants_borrow, out):
                return True
            return None
        if part and any(code is PendingCode.QUOTA for _, code, _ in reasons):
            got = partial.try_reduced(w, reasons, out, allow_borrow)
            if got is not False:
                return got
        if ssn.config.preempt != "none":
            try_preempt = self.preemptor.try_preempt
            hopeless = [p for p, code, _ in reasons if code is PendingCode.UNSATISFIABLE]
            for pool, ckey in zip(pools, ckeys, strict=True):
                if hopeless and pool in hopeless:
                    continue  # evicting everything would not make room
                if try_preempt(w, pool, vec, out, ckey[1]):
                    return True
        if part and partial.preempt_for_minimum(w, pools, ckeys, out):
            return True
        return self._leave_pending(w, vec, reasons, out)

    def _fit_as_is(
        self,
        w: Workload,
        vec: Vec,
        pools: list[str],
        ckeys: list[tuple[object, ...]],
        out: Decisions,
        allow_borrow: bool,
        reasons: PoolReasons,
        wants_borrow: list[str],
    ) -> bool:
        """Admit ``w`` in the first pool where it passes quota and is placed as things are; else
        collect why in each pool (``reasons``) and where it would have to borrow (``wants_borrow``)."""
        ssn = self.ssn
        quota, placer, rounds = ssn.quota, ssn.placer, self.rounds
        holds = placer.holds
        fail_cache, too_big_memo = ssn.cs.fail_cache, ssn.cs.beyond_pool
        for pool, ckey in zip(pools, ckeys, strict=True):
            # a shape that did not fit earlier in this cycle cannot fit now: capacity only shrinks
            if holds.in_pool(pool):  # the held nodes it may use are part of what it can fit on
                n = holds.usable(w, pool, placer.now)
                if n:
                    ckey = (*ckey, "backfill") if n == len(holds.of_pool(pool)) else (*ckey, "backfill", n)
            cached = fail_cache.get(ckey)
            if cached is not None:
                reasons.append((pool, cached[0], cached[1]))
                continue
            fits, borrowing, blk, dim = quota.check(w.queue, pool, vec)
            if not fits:
                assert blk is not None and dim is not None
                if ckey in too_big_memo:  # hot: every quota refusal of a long backlog
                    too_big = too_big_memo[ckey]
                else:
                    too_big = too_big_memo[ckey] = beyond_pool(w, vec, pool, ssn.cluster)
                if too_big is not None:
                    reasons.append((pool, PendingCode.UNSATISFIABLE, too_big))
                else:
                    reasons.append((pool, PendingCode.QUOTA, (dim[1], blk)))
                continue
            if borrowing and not rounds.may_borrow(w, pool):
                reasons.append((pool, PendingCode.QUOTA, non_preemptible_reason(quota, w, pool, vec)))
                continue
            if borrowing and (not allow_borrow or rounds.beyond_round(w, pool, vec)):
                wants_borrow.append(pool)
                continue
            too_big = beyond_capacity(w, vec, pool, ssn.cluster)
            if too_big is not None:  # O(1): a placement would try its pods until one fails
                fail_cache[ckey] = (PendingCode.UNSATISFIABLE, too_big)
                reasons.append((pool, PendingCode.UNSATISFIABLE, too_big))
                continue
            res = placer.place(w, pool, ssn.config.max_domain_tries)
            if res.pods is not None:
                ssn.admit(w, pool, tuple(res.pods), borrowing, out)
                return True
            code = PendingCode.TOPOLOGY if res.topology else PendingCode.CAPACITY
            reason = res.reason
            hopeless = self.hopeless.of(w, pool, ckey[1], placer.node_filter(w))
            if hopeless is not None:
                code, reason = PendingCode.UNSATISFIABLE, hopeless
            elif holds.in_pool(pool) and not placer.may_backfill(w, pool):
                held_for = holds.holders_text(pool, w.name)
                if held_for:
                    reason += "; " + held_for
            fail_cache[ckey] = (code, reason)
            reasons.append((pool, code, reason))
        return False

    def _leave_pending(self, w: Workload, vec: Vec, reasons: PoolReasons, out: Decisions) -> Literal[False]:
        """``w`` stays pending: hold nodes for it where it is blocked by capacity (one hold per
        pool per cycle), then say why, per pool where it had several."""
        holds = self.ssn.placer.holds
        if self.ssn.config.reserve and w.name not in holds.by_workload:
            for pool, code, _ in reasons:
                if code not in _NO_HOLD and holds.room(pool):
                    note = self._reserve(w, pool)
                    if note:
                        reasons = [
                            (p, c, (t + "; " + note) if p == pool and isinstance(t, str) else t)
                            for p, c, t in reasons
                        ]
                    break
        if len(reasons) == 1:  # the common case, without the per-pool list
            pool, code, r = reasons[0]
            msg = r if isinstance(r, str) else self._quota_reason(w, pool, vec, r[0], r[1])  # type: ignore[arg-type]
        else:
            texts = [
                (pool, r if isinstance(r, str) else self._quota_reason(w, pool, vec, r[0], r[1]))  # type: ignore[arg-type]
                for pool, _, r in reasons
            ]
            code = reasons[0][1]
            msg = "; ".join(f"[{p}] {t}" for p, t in texts)
        out.pending.append(Pending(w.name, w.queue, code, msg))
        return False

    def _reserve(self, w: Workload, pool: str) -> str:
        """Give ``w`` a planned start in ``pool`` (``holds.plan_hold``, after the holds ranked
        before it) and say so in its reason. Up to the pool's ``reservations`` per cycle, for
        the best-ranked blocked workloads."""
        ssn = self.ssn
        holds = ssn.placer.holds
        plan = plan_hold(w, pool, ssn.cluster, ssn.placer.node_filter, ssn.runs, ssn.now, holds)
        if plan is None:
            return ""
        holds.add(plan)
        ssn.cs.fail_cache.clear()  # held nodes are capacity taken away: cached fits may not hold
        return plan.note

    def _quota_reason(self, w: Workload, pool: str, vec: Vec, d: int, blk: str) -> str:
        q = self.ssn.quota
        memo_key = (None if blk == q.root[w.queue] else w.queue, pool, blk, d, vec[d], q.E[(blk, pool)][d])
        memo = self.ssn.cs.reason_memo
        got = memo.get(memo_key)
        if got is None:
            got = memo[memo_key] = quota_reason(q, w, pool, vec, d, blk)
        return got
