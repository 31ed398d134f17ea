"""One scheduling cycle: order, quota, placement, preemption. Pure: snapshot in, decisions out.

``Engine`` keeps a working state that can also be reused across cycles by an incremental caller
(the simulator): ``cycle()`` rolls back everything it tried, so the state it leaves behind is
exactly the state it was given; callers then ``apply()`` the decisions they accept.
"""

from __future__ import annotations

import gc
from bisect import insort
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Literal

from gpupool.engine.cycle_state import CycleState
from gpupool.engine.decay import UsageDecayOrder
from gpupool.engine.decisions import (
    Admit,
    Decisions,
    Pending,
    PendingCode,
)
from gpupool.engine.hints import BlockedHints
from gpupool.engine.holds import plan_hold
from gpupool.engine.ordering import FairShareOrder
from gpupool.engine.ordering import workload_order_key as workload_order_key
from gpupool.engine.partial import PartialAdmission, is_partial, reduced
from gpupool.engine.placement import Placer
from gpupool.engine.preemption import PreemptionSearch, WholeSlots
from gpupool.engine.reasons import no_pool_reason, non_preemptible_reason, quota_reason
from gpupool.engine.rounds import BorrowRounds
from gpupool.engine.state.cluster import ClusterState
from gpupool.engine.state.quota import QuotaState
from gpupool.engine.state.running import RunningSet, vec_of
from gpupool.engine.state.statement import Statement
from gpupool.model import (
    Admission,
    EngineConfig,
    PodPlacement,
    QueueingStrategy,
    Running,
    Snapshot,
    Vec,
    Workload,
)

_STATICS_MAX = 200_000  # cached workload facts before the cache starts afresh
_WholeSlots = WholeSlots  # the name the property tests patch


#: why a workload failed in each pool: a formatted reason, or (dimension, blocking queue) of a
#: quota failure, formatted only if the workload ends up pending
PoolReasons = list[tuple[str, PendingCode, tuple[object, ...] | str]]

ORDER_POLICIES = ("fair-share", "fifo")
PREEMPT_POLICIES = ("default", "none")


def validate_config(config: EngineConfig) -> None:
    """Reject unknown plugin names up front, naming the field and the choices."""
    from gpupool.engine.placement import SCORERS

    for field_name, value, known in (
        ("order", config.order, ORDER_POLICIES),
        ("score", config.score, tuple(SCORERS)),
        ("preempt", config.preempt, PREEMPT_POLICIES),
    ):
        if value not in known:
            raise ValueError(
                f"engine config {field_name}: unknown policy {value!r}; choose one of {', '.join(known)}"
            )


class Engine(PreemptionSearch, BlockedHints, PartialAdmission, BorrowRounds, UsageDecayOrder):
    """Scheduling state for one snapshot: cluster capacity, quota tree, running workloads."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.config: EngineConfig = snapshot.config
        validate_config(self.config)
        self.cluster = ClusterState(snapshot.nodes, snapshot.pools)
        self.quota = QuotaState(snapshot.queues, [p.name for p in snapshot.pools], self.cluster.capacity)
        self.placer = Placer(self.cluster, snapshot.config.score)
        # the fragmentation score needs the mix of pod shapes: keep it only where it is used;
        # where only ``auto`` uses it, only where fragmentation can arise (see AutoScore)
        scores = {self.placer.scorer_for(p.name).name for p in snapshot.pools}
        self._frag = bool(scores & {"fragmentation", "auto"})
        self._auto_only = "fragmentation" not in scores
        self._varied = False
        if self._frag and self._auto_only:
            from gpupool.engine.fragscore import varied_nodes

            self._varied = varied_nodes(snapshot.nodes)
        self.pools = {p.name: p for p in snapshot.pools}
        self.runs = RunningSet()
        #: the running workloads by name (the running set's dict, kept in step with its indexes)
        self.running: dict[str, Running] = self.runs.by_name
        self._stmt = Statement(self.cluster, self.quota, self.runs)
        self.leaf = {q: not kids for q, kids in self.quota.children.items()}
        self._leaves_of_root: dict[str, list[str]] = {}
        #: rounds of pass 2 below the cohort roots: the deepest leaf's number of ancestors
        self._levels = max((len(p) - 1 for p in self.quota.path.values()), default=0)
        self._level = 0
        for qn, is_leaf in self.leaf.items():
            if is_leaf:
                self._leaves_of_root.setdefault(self.quota.root[qn], []).append(qn)
        for r in snapshot.running:
            self._charge(r)
        self._running_shapes: Counter[object] = Counter()
        if self._frag:
            from gpupool.engine.fragscore import add_shapes

            add_shapes(self._running_shapes, (r.workload for r in snapshot.running))  # type: ignore[arg-type]
        self._stmt.commit()
        self.set_decayed_usage(snapshot.decayed_usage)
        self.now = snapshot.now
        self._pool_order: dict[str, list[str]] = {}
        self._model_pools: dict[tuple[str, ...], set[str]] = {}
        # facts about a workload that no state change alters, kept across cycles (checked by
        # object identity, so a new workload under an old name is looked at afresh)
        self._statics: dict[str, tuple[Workload, tuple[Vec, list[str], list[tuple[object, ...]]]]] = {}
        self._shape_ids: dict[tuple[object, ...], int] = {}
        #: what the current (or last) cycle knows; replaced by every ``cycle``
        self._cs = CycleState(frozenset(), None, self.runs.fresh, {})

    # -- state changes (used by incremental callers too) --------------------------------------
    def _charge(self, r: Running) -> None:
        for p in r.admission.pods:
            if p.node in self.cluster.index:
                self.cluster.allocate_pod(p)
        if r.workload.queue in self.quota.queues and r.admission.pool in self.pools:
            self.quota.add(r.workload.queue, r.admission.pool, r.admission.quota_vec())
        self.runs.set(r.name, r)

    def _discharge(self, r: Running) -> None:
        for p in r.admission.pods:
            if p.node in self.cluster.index:
                self.cluster.release_pod(p)
        if r.workload.queue in self.quota.queues and r.admission.pool in self.pools:
            self.quota.remove(r.workload.queue, r.admission.pool, r.admission.quota_vec())
        self.runs.set(r.name, None)

    def add_running(self, r: Running) -> None:
        """Record an admitted workload permanently (an incremental caller applying a decision)."""
        self._charge(r)
        self._stmt.commit()
        if self._frag:
            from gpupool.engine.fragscore import add_shapes

            add_shapes(self._running_shapes, [r.workload])  # type: ignore[arg-type]

    def remove_running(self, name: str) -> Running | None:
        """Release a finished, cancelled or evicted workload permanently."""
        r = self.running.get(name)
        if r is None:
            return None
        self._discharge(r)
        self._stmt.commit()
        if self._frag:
            from gpupool.engine.fragscore import add_shapes

            add_shapes(self._running_shapes, [r.workload], sign=-1)  # type: ignore[arg-type]
        return r

    def apply(self, decisions: Decisions, pending: Iterable[Workload], now: float) -> list[Running]:
        """Make a cycle's decisions permanent: evict victims, then charge admissions."""
        by_name = {w.name: w for w in pending}
        for v in decisions.victims():
            self.remove_running(v)
        out = []
        for a in decisions.admitted:
            w = by_name[a.workload]
            r = Running(w, Admission(a.pool, a.pods, a.borrowing, now))
            self.add_running(r)
            out.append(r)
        return out

    # -- the cycle ----------------------------------------------------------------------------
    def cycle(
        self,
        pending: Iterable[Workload],
        now: float | None = None,
        *,
        restore: bool = True,
        blocked: frozenset[str] | set[str] = frozenset(),
        more: Callable[[Workload], Workload | None] | None = None,
    ) -> Decisions:
        """Decide what to admit, preempt and leave pending. Leaves the state as it found it
        (``restore=False`` skips the rollback, for a caller that discards the engine).

        ``blocked`` names pending workloads the caller has shown can neither be placed nor
        preempt anything in the state the cycle starts from (see ``blocked_at_start``). Until
        something is preempted, such a workload would only fail again; the engine still takes
        it in its turn (it may be the one a pool holds nodes for) but skips it, without a
        pending entry, once every pool it could use holds nodes (``Decisions.skipped``). A cycle
        that preempts nothing decides exactly as without the hint; one that preempts may have
        skipped work that the freed capacity would have let in, so a caller that needs the
        exact outcome runs it again without the hint.

        ``more`` lets a caller that passes pending work in windows extend one while the cycle
        runs: after admitting ``w`` (and only until something is preempted) the engine asks
        ``more(w)`` for one more workload of the same queue, ordered after ``w``, and takes it
        in its turn, as if it had been passed from the start."""
        if now is not None:
            self.now = now
        stmt = self._stmt
        stmt.open()
        self._cs = CycleState(blocked, more, self.runs.fresh, dict(self.quota.U))
        # The cycle creates no reference cycles; pausing the cyclic GC saves ~20% on big cycles.
        gc_was_on = gc.isenabled()
        gc.disable()
        try:
            return self._cycle(list(pending))
        finally:
            if gc_was_on:
                gc.enable()
            if restore:
                stmt.discard()
            else:
                stmt.close()

    def _cycle(self, pending: list[Workload]) -> Decisions:
        out = Decisions()
        by_queue = self._by_queue(pending, out)
        if len(self._statics) > _STATICS_MAX:
            self._statics.clear()
        self._prepare_placement(by_queue)
        # Pass 1 admits what fits within guarantees; pass 2 lets the rest borrow. A borrower
        # admitted first would only be reclaimed (evicted) by a guaranteed workload later.
        deferred = self._pass(by_queue, out, allow_borrow=False)
        self._pass(deferred, out, allow_borrow=True)
        return out

    def _by_queue(self, pending: list[Workload], out: Decisions) -> dict[str, list[Workload]]:
        """The valid pending work by leaf queue, each in queue order; the rest pending with why
        (a duplicate name, an unknown queue, a queue with child queues)."""
        by_queue: dict[str, list[Workload]] = {}
        seen = self._cs.seen
        for w in pending:
            if w.name in seen or w.name in self.running:
                out.pending.append(Pending(w.name, w.queue, PendingCode.INVALID, "duplicate workload name"))
                continue
            seen.add(w.name)
            if w.queue not in self.quota.queues:
                out.pending.append(
                    Pending(w.name, w.queue, PendingCode.UNKNOWN_QUEUE, f"queue {w.queue} does not exist")
                )
                continue
            if not self.leaf[w.queue]:
                out.pending.append(
                    Pending(
                        w.name,
                        w.queue,
                        PendingCode.INVALID,
                        f"queue {w.queue} has child queues; submit to one of {', '.join(self.quota.children[w.queue])}",
                    )
                )
                continue
            by_queue.setdefault(w.queue, []).append(w)
        for lst in by_queue.values():
            lst.sort(key=workload_order_key)
        return by_queue

    def _prepare_placement(self, by_queue: dict[str, list[Workload]]) -> None:
        """Per-cycle placement inputs: the shape mix the fragmentation score weighs (what runs
        and what waits), no holds yet, and the time backfill is judged against."""
        if self._frag:
            from gpupool.engine.fragscore import FragContext, shares_gpus

            # the mix to keep capacity useful for: what runs and what waits
            pend = [w for lst in by_queue.values() for w in lst]
            if self.weighs_shape_mix() or shares_gpus(self._running_shapes, pend):  # type: ignore[arg-type]
                self.cluster.frag = FragContext(self.cluster, pend, self._running_shapes)  # type: ignore[arg-type]
            else:
                self.cluster.frag = None  # identical nodes, whole GPUs: ``auto`` is binpack
        self.placer.reserved = {}
        self.placer.now = self.now

    def _pass_at(
        self, by_queue: dict[str, list[Workload]], out: Decisions, allow_borrow: bool
    ) -> dict[str, list[Workload]]:
        """Take the pending work in fair-share order (``ordering.FairShareOrder``): the chosen
        queue's heads are taken in turn until one changes usage, the queue is done, or another
        queue's head goes first. Returns the work this round leaves to a later one."""
        order = FairShareOrder(self.quota, by_queue, self.config.order == "fifo")
        pos = order.pos
        deferred: dict[str, list[Workload]] = {}
        cs = self._cs
        one_head = self.config.one_head_per_queue
        more = cs.more if not one_head else None
        while (q := order.next_queue()) is not None:
            lst = by_queue[q]
            strict = self.quota.queues[q].strategy is QueueingStrategy.STRICT_FIFO
            hinted = bool(cs.blocked) and not strict and not one_head  # the hint may skip work
            while True:
                w = lst[pos[q]]
                pos[q] += 1
                result = self._take(w, out, allow_borrow, hinted)
                if result and more is not None and not out.preempted:
                    self._extend_window(more, w, lst, pos[q])
                stop = self._queue_stops(w, result, lst, pos[q], strict, deferred, out)
                if stop:
                    pos[q] = len(lst)
                elif hinted and not out.preempted:
                    pos[q] = self._skip_hinted(lst, pos[q], out)
                if stop or result or pos[q] >= len(lst) or not order.still_first(q):
                    break
            order.put_back()
        return deferred

    def _take(self, w: Workload, out: Decisions, allow_borrow: bool, hinted: bool) -> bool | None:
        """``w``'s turn: admitted (True), pending or skipped (False), or deferred to pass 2 (None)."""
        if hinted and w.name in self._cs.blocked and not out.preempted and self._held_everywhere(w):
            out.skipped += 1  # it would fail again and can no longer move a hold
            return False
        if not allow_borrow and self._must_borrow(w):
            return None  # cheap deferral: the queue is already at its guarantee
        result = self._try(w, out, allow_borrow)
        if result is not None:
            out.considered += 1
        return result

    def _extend_window(
        self, more: Callable[[Workload], Workload | None], w: Workload, lst: list[Workload], lo: int
    ) -> None:
        """The caller's window grows by one workload of ``w``'s queue, queued in its place."""
        nxt = more(w)
        if nxt is None:
            return
        seen = self._cs.seen
        if nxt.queue != w.queue or nxt.name in seen or workload_order_key(nxt) < workload_order_key(w):
            raise ValueError(f"more({w.name}) returned {nxt.name}: not a later workload of queue {w.queue}")
        seen.add(nxt.name)
        insort(lst, nxt, lo=lo, key=workload_order_key)

    def _queue_stops(
        self,
        w: Workload,
        result: bool | None,
        lst: list[Workload],
        rest: int,
        strict: bool,
        deferred: dict[str, list[Workload]],
        out: Decisions,
    ) -> bool:
        """Does ``w``'s queue stop here for this pass? A deferred ``w`` waits for pass 2 (with
        the rest of a StrictFIFO or one-head queue, to keep its order); a failed StrictFIFO head
        blocks the rest; with one head per queue the rest is not considered."""
        q = w.queue
        if result is None:
            deferred.setdefault(q, []).append(w)
            if strict or self.config.one_head_per_queue:
                deferred[q].extend(lst[rest:])
                return True
            return False
        if result is False and strict:
            why = f"queue {q} is StrictFIFO and its head {w.name} cannot be admitted yet"
            out.pending.extend(Pending(r.name, q, PendingCode.BLOCKED, why) for r in lst[rest:])
            return True
        if self.config.one_head_per_queue:
            why = "one head per queue per cycle; not considered yet"
            out.pending.extend(Pending(r.name, q, PendingCode.SKIPPED, why) for r in lst[rest:])
            return True
        return False

    def candidate_pools(self, w: Workload) -> list[str]:
        """Pools a workload may use: its own choice, else its queue's pools in the order they are
        listed, its preferred pools (``Workload.preferred_pools``) moved to the front."""
        order = self._pool_order.get(w.queue)
        if order is None:
            order = []
            for n in self.quota.path[w.queue]:  # the nearest queue that lists quotas decides
                listed = [pq.pool for pq in self.quota.queues[n].quotas if pq.pool in self.pools]
                if listed:
                    order = listed
                    break
            self._pool_order[w.queue] = order
        if w.pool is not None:
            return [w.pool] if w.pool in order else []
        if w.preferred_pools:  # its task type's pools first, in their order (docs/engine.md)
            first = [p for p in w.preferred_pools if p in order]
            order = first + [p for p in order if p not in first]
        if not w.gpu_models:
            return order
        ok = self._model_pools.get(w.gpu_models)
        if ok is None:
            ok = {p for p in self.pools if self.cluster.pool_indexes(p, w.gpu_models)}
            self._model_pools[w.gpu_models] = ok
        return [p for p in order if p in ok]

    def _reserve(self, w: Workload, pool: str) -> str:
        """Hold nodes in ``pool`` for ``w`` (``holds.plan_hold``) and say so in its reason.
        One hold per pool per cycle, for the best-ranked blocked workload."""
        plan = plan_hold(w, pool, self.cluster, self.placer.node_filter, self.runs, self.now)
        if plan is None:
            return ""
        held, start, note = plan
        self.placer.reserved[pool] = (held, start, w.name)
        self._cs.fail_cache.clear()  # held nodes are capacity taken away: cached fits may not hold
        return note

    def weighs_shape_mix(self, shares_gpus: bool = False) -> bool:
        """Does placement weigh the mix of pod shapes? Where only ``auto`` would, only if the GPU
        nodes differ or (``shares_gpus``) a running or waiting pod takes a GPU fraction."""
        return self._frag and (not self._auto_only or self._varied or shares_gpus)

    def _must_borrow(self, w: Workload) -> bool:
        """True when ``w`` needs GPUs and would take its leaf queue past its GPU guarantee in every
        pool it may use (a partial gang: even at its minimum): it can only be admitted by
        borrowing, so pass 1 leaves it to pass 2 (which also reports it, if it cannot borrow
        either)."""
        vec, pools, _ = self._static(w)
        g = vec[0]
        if g <= 0 or not pools:
            return False
        if is_partial(w):  # it may start at its minimum, which may fit the guarantee
            g = reduced(w, w.min_pods).quota_vec()[0]
        E, G, q = self.quota.E, self.quota.G, w.queue
        for p in pools:  # hot (every workload in pass 1): a plain loop, no generator
            k = (q, p)
            if E[k][0] + g <= G[k][0]:
                return False
        return True

    def _static(self, w: Workload) -> tuple[Vec, list[str], list[tuple[object, ...]]]:
        """Per-cycle facts about a workload that do not change between attempts."""
        got = self._statics.get(w.name)
        if got is not None and got[0] is w:
            return got[1]
        pools = self.candidate_pools(w)
        shape = (w.pod_groups, w.gpu_models, w.topology, w.tolerations, w.node_selector, w.gang_min)
        sid = self._shape_ids.setdefault(shape, len(self._shape_ids))
        ckeys: list[tuple[object, ...]] = [(p, sid) for p in pools]
        st = (w.quota_vec(), pools, ckeys)
        self._statics[w.name] = (w, st)
        return st

    def _try(self, w: Workload, out: Decisions, allow_borrow: bool = True) -> bool | None:
        """Admit ``w`` (True), leave it pending with a reason (False), or defer it to the borrowing pass (None)."""
        vec, pools, ckeys = self._static(w)
        if not vec[0] and not vec[1] and not vec[2] and w.pod_count == 0:
            out.pending.append(Pending(w.name, w.queue, PendingCode.INVALID, "workload has no pods"))
            return False
        if not pools:
            out.pending.append(Pending(w.name, w.queue, PendingCode.NO_POOL, no_pool_reason(w, self.pools)))
            return False
        # reasons are formatted only if the workload ends up pending (most attempts never need them)
        reasons: PoolReasons = []
        wants_borrow: list[str] = []  # pools where it fits quota only by borrowing
        quota = self.quota
        fail_cache = self._cs.fail_cache
        for pool, ckey in zip(pools, ckeys, strict=True):
            # a shape that did not fit earlier in this cycle cannot fit now: capacity only shrinks
            if pool in self.placer.reserved and self.placer.may_backfill(w, pool):
                ckey = (*ckey, "backfill")
            cached = fail_cache.get(ckey)
            if cached is not None:
                reasons.append((pool, cached[0], cached[1]))
                continue
            fits, borrowing, blk, dim = quota.check(w.queue, pool, vec)
            if not fits:
                assert blk is not None and dim is not None
                reasons.append((pool, PendingCode.QUOTA, (dim[1], blk)))
                continue
            if borrowing and not self._may_borrow(w, pool):
                reasons.append((pool, PendingCode.QUOTA, non_preemptible_reason(quota, w, pool, vec)))
                continue
            if borrowing and (not allow_borrow or self._beyond_round(w, pool, vec)):
                wants_borrow.append(pool)
                continue
            res = self.placer.place(w, pool, self.config.max_domain_tries)
            if res.pods is not None:
                self._admit(w, pool, tuple(res.pods), borrowing, out)
                return True
            code = PendingCode.TOPOLOGY if res.topology else PendingCode.CAPACITY
            reason = res.reason
            held = self.placer.reserved.get(pool)
            if held is not None and held[2] != w.name and not self.placer.may_backfill(w, pool):
                reason += f"; {len(held[0])} node(s) are held for {held[2]}"
            fail_cache[ckey] = (code, reason)
            reasons.append((pool, code, reason))
        # nothing fits as things are: try to make room (guaranteed work first, borrowers in pass 2)
        if wants_borrow:  # pass 1: a partial gang may start within its guarantee, fewer pods
            if not allow_borrow and is_partial(w) and self._partial_in_guarantee(w, wants_borrow, out):
                return True
            return None
        if is_partial(w) and any(code is PendingCode.QUOTA for _, code, _ in reasons):
            got = self._try_partial(w, reasons, out, allow_borrow)
            if got is not False:
                return got
        for pool, ckey in zip(pools, ckeys, strict=True) if self.config.preempt != "none" else ():
            if self._try_preempt(w, pool, vec, out, ckey[1]):
                return True
        if is_partial(w) and self._preempt_for_minimum(w, pools, ckeys, out):
            return True
        return self._leave_pending(w, vec, reasons, out)

    def _admit(
        self, w: Workload, pool: str, pods: tuple[PodPlacement, ...], borrowing: bool, out: Decisions
    ) -> None:
        """Charge and record ``w``'s admission with ``pods`` (fewer than it asks for, when partial)."""
        self.quota.add(w.queue, pool, vec_of(pods))
        self.runs.admit(Running(w, Admission(pool, pods, borrowing, self.now)))
        why = "borrowing idle quota from the cohort" if borrowing else "within guarantee"
        part = f" with {len(pods)} of {w.pod_count} pods" if len(pods) < w.pod_count else ""
        out.admitted.append(
            Admit(w.name, w.queue, pool, pods, borrowing, f"admitted to pool {pool}{part}, {why}")
        )

    def _leave_pending(self, w: Workload, vec: Vec, reasons: PoolReasons, out: Decisions) -> Literal[False]:
        """``w`` stays pending: hold nodes for it where it is blocked by capacity (one hold per
        pool per cycle), then say why, per pool where it had several."""
        if self.config.reserve:
            for pool, code, _ in reasons:
                if code is not PendingCode.QUOTA and pool not in self.placer.reserved:
                    note = self._reserve(w, pool)
                    if note:
                        reasons = [
                            (p, c, (t + "; " + note) if p == pool and isinstance(t, str) else t)
                            for p, c, t in reasons
                        ]
                    break
        texts = [
            (pool, code, r if isinstance(r, str) else self._quota_reason(w, pool, vec, r[0], r[1]))  # type: ignore[arg-type]
            for pool, code, r in reasons
        ]
        code = texts[0][1]
        msg = texts[0][2] if len(texts) == 1 else "; ".join(f"[{p}] {t}" for p, _, t in texts)
        out.pending.append(Pending(w.name, w.queue, code, msg))
        return False

    def _quota_reason(self, w: Workload, pool: str, vec: Vec, d: int, blk: str) -> str:
        q = self.quota
        memo_key = (None if blk == q.root[w.queue] else w.queue, pool, blk, d, vec[d], q.E[(blk, pool)][d])
        memo = self._cs.reason_memo
        got = memo.get(memo_key)
        if got is None:
            got = memo[memo_key] = quota_reason(q, w, pool, vec, d, blk)
        return got


def decide(snapshot: Snapshot) -> Decisions:
    """The engine's one public verb: a pure function of the snapshot."""
    return Engine(snapshot).cycle(snapshot.pending, snapshot.now, restore=False)
