"""Consolidation: move preemptible running work so that a blocked workload starts now.

KAI's consolidation action: when the free GPUs are scattered, a job that needs a whole node
would otherwise wait (behind a hold, ``holds.py``) until running work ends, which may be never
for work with no declared duration. Instead, preemptible running work that can be placed
elsewhere at once, on free capacity and displacing nothing, is moved there (stopped and
restarted on its new placement, reserved for it), and the blocked workload starts on what it
freed, in the same cycle.

Rules (docs/engine.md, "KAI"): off unless the pool's ``spec.consolidation.enabled``; only work
of a preemptible class in a preemptible pool, of a priority no higher than the beneficiary's
(what an eviction for it would allow); never a workload moved or admitted less than its
cooldown ago (a declared duration, or a tenth of the workload's declared duration: relative,
so scaling every time leaves decisions unchanged); at most ``maxMovesPerCycle`` moves per pool
per cycle; never a move that does not let the beneficiary start in this cycle. The search is
bounded: a few blocked workloads per pool per cycle, a few candidate nodes each.
"""

from __future__ import annotations

from gpupool.engine.decisions import Decisions, Move
from gpupool.engine.partial import is_partial
from gpupool.engine.preemption.candidates import CandidateFinder
from gpupool.engine.preemption.search import Preemptor
from gpupool.engine.session import Session
from gpupool.engine.state.cycle import CycleState
from gpupool.model import Admission, Consolidation, Running, Vec, Workload

#: blocked workloads per pool per cycle that consolidation searches for
MAX_TRIES_PER_POOL = 2
#: candidate nodes tried per blocked workload
MAX_NODES = 8


class Consolidator:
    """Finds moves for a blocked workload (``try_move``); counts per pool are per cycle."""

    __slots__ = ("_cs", "_moves", "_tries", "ssn")

    def __init__(self, ssn: Session) -> None:
        self.ssn = ssn
        self._cs: CycleState | None = None
        self._moves: dict[str, int] = {}
        self._tries: dict[str, int] = {}

    def setting(self, pool: str) -> Consolidation | None:
        """The pool's consolidation setting when it is on, else None."""
        p = self.ssn.pools.get(pool)
        c = p.consolidation if p is not None else None
        return c if c is not None and c.enabled and p is not None and p.preemptible else None

    def try_move(self, w: Workload, pool: str, borrowing: bool, out: Decisions) -> bool:
        """Move running work so that ``w`` is admitted to ``pool`` now (True: moves and the
        admission recorded in ``out``); the state is unchanged when no move set works."""
        cfg = self.setting(pool)
        if cfg is None:
            return False
        if self._cs is not self.ssn.cs:  # a new cycle: fresh budgets
            self._cs, self._moves, self._tries = self.ssn.cs, {}, {}
        budget = cfg.max_moves_per_cycle - self._moves.get(pool, 0)
        if budget <= 0 or self._tries.get(pool, 0) >= MAX_TRIES_PER_POOL:
            return False
        self._tries[pool] = self._tries.get(pool, 0) + 1
        movable = self._movable(w, pool, cfg)
        for node in self._nodes(w, pool, movable)[:MAX_NODES]:
            moves = self._try_node(w, pool, node, movable[node], budget, borrowing, out)
            if moves:
                self._moves[pool] = self._moves.get(pool, 0) + moves
                self.ssn.cs.fail_cache.clear()  # capacity was rearranged
                return True
        return False

    def _movable(self, w: Workload, pool: str, cfg: Consolidation) -> dict[str, list[Running]]:
        """Per node, the running work of ``pool`` there that may be moved for ``w``."""
        ssn = self.ssn
        out: dict[str, list[Running]] = {}
        for name in sorted(ssn.runs.by_name):
            r = ssn.runs.by_name[name]
            v = r.workload
            if r.admission.pool != pool or name in ssn.runs.fresh or not r.admission.pods:
                continue
            if not v.preemptible or not v.movable or v.priority > w.priority:
                continue
            cool = cfg.cooldown_s
            if cool is None:
                cool = 0.1 * v.expected_duration_s if v.expected_duration_s else 0.0
            if ssn.now - r.admission.admitted_at < cool:
                continue
            for node in sorted({p.node for p in r.admission.pods}):
                out.setdefault(node, []).append(r)
        return out

    def _nodes(self, w: Workload, pool: str, movable: dict[str, list[Running]]) -> list[str]:
        """Nodes worth freeing for ``w``: free plus movable GPUs reach its largest pod, fewest
        GPUs to move first (then by name: deterministic)."""
        st = self.ssn.cluster
        k = max((pg.request.gpus for pg in w.pod_groups), default=0)
        ranked = []
        for node, rs in movable.items():
            i = st.index.get(node)
            if i is None:
                continue
            moved = sum(
                sum(len(p.devices) * p.gpu_milli // 1000 for p in r.admission.pods if p.node == node)
                for r in rs
            )
            if st.free_whole[i] + moved >= k:
                ranked.append((moved, node))
        return [n for _, n in sorted(ranked)]

    def _try_node(
        self,
        w: Workload,
        pool: str,
        node: str,
        rs: list[Running],
        budget: int,
        borrowing: bool,
        out: Decisions,
    ) -> int:
        """Take work off ``node`` (smallest first) until ``w`` is placed, then place what was
        taken elsewhere; the number of moves, or 0 (state rolled back)."""
        ssn = self.ssn
        cp = ssn.stmt.checkpoint()
        taken: list[Running] = []
        placed = None
        for r in sorted(rs, key=lambda r: (r.admission.quota_vec()[0], r.name)):
            if len(taken) >= budget:
                break
            ssn.discharge(r)
            taken.append(r)
            inner = ssn.stmt.checkpoint()
            res = ssn.placer.place(w, pool, ssn.config.max_domain_tries)
            if res.pods is not None:
                placed = tuple(res.pods)
                break
            ssn.stmt.rollback(inner)
        if placed is None:
            ssn.stmt.rollback(cp)
            return 0
        moves = self._replace(w, pool, taken)
        if moves is None:
            ssn.stmt.rollback(cp)
            return 0
        out.moved.extend(moves)
        ssn.admit(w, pool, placed, borrowing, out)
        a = out.admitted[-1]
        freed = ", ".join(m.workload for m in moves)
        out.admitted[-1] = type(a)(
            a.workload,
            a.queue,
            a.pool,
            a.pods,
            a.borrowing,
            f"{a.reason}, after moving {freed} (consolidation)",
        )
        return len(moves)

    def _replace(self, w: Workload, pool: str, taken: list[Running]) -> list[Move] | None:
        """Place every taken workload on free capacity (``w`` already placed); its moves, or None."""
        ssn = self.ssn
        moves = []
        for r in taken:
            res = ssn.placer.place(r.workload, pool, ssn.config.max_domain_tries)
            if res.pods is None or len(res.pods) != len(r.admission.pods):
                return None
            pods = tuple(res.pods)
            ssn.quota.add(r.workload.queue, pool, r.admission.quota_vec())
            ssn.runs.admit(Running(r.workload, Admission(pool, pods, r.admission.borrowing, ssn.now)))
            src = tuple(sorted({p.node for p in r.admission.pods}))
            why = f"Consolidated: freed node {', '.join(src)} for {w.name}"
            moves.append(Move(r.name, r.workload.queue, pool, src, pods, w.name, why))
        return moves


class ConsolidatingPreemptor(Preemptor):
    """The preemptor a workload's turn uses (``attempt.Attempt``): in a pool with consolidation
    on, it first tries to make room by moving work (KAI runs consolidation before reclaim and
    preempt: a move restarts the work at once, an eviction makes it wait), then by evicting."""

    __slots__ = ("consolidator",)

    def __init__(self, ssn: Session, candidates: CandidateFinder, consolidator: Consolidator) -> None:
        super().__init__(ssn, candidates)
        self.consolidator = consolidator

    def try_preempt(self, w: Workload, pool: str, vec: Vec, out: Decisions, sid: object) -> bool:
        """Move work so that ``w`` starts, else evict (``Preemptor.try_preempt``)."""
        c = self.consolidator
        if c.setting(pool) is not None and not is_partial(w):
            fits, borrowing, _, _ = self.ssn.quota.check(w.queue, pool, vec)
            if fits and c.try_move(w, pool, borrowing, out):
                return True
        return super().try_preempt(w, pool, vec, out, sid)
