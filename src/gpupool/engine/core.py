"""One scheduling cycle: order, quota, placement, preemption. Pure: snapshot in, decisions out.

``Engine`` is small: it holds its parts as fields, each a class with its own state, made with
what it needs (``docs/architecture.md``, "The engine's parts"):

- ``ssn`` (``session.Session``): cluster, quota tree and running set under one ``Statement``,
  and the current cycle's ``CycleState``;
- ``facts`` (``facts.WorkloadFacts``): per-workload quota vector, pools and shape keys;
- ``mix`` (``shape_mix.ShapeMix``): the pod shapes the fragmentation score weighs;
- ``rounds`` (``rounds.BorrowRounds``): the passes, nearest guarantee first;
- ``preemptor`` (``preemption.search.Preemptor``) with its ``preemption.candidates.CandidateFinder``;
- ``partial`` (``partial.PartialAdmitter``), ``hints`` (``hints.BlockedHints``);
- ``attempt`` (``attempt.Attempt``): one workload's turn; ``passes`` (``passes.QueuePasses``).

The working state can be reused across cycles by an incremental caller (the simulator):
``cycle()`` rolls back everything it tried, so the state it leaves behind is exactly the state
it was given; callers then ``apply()`` the decisions they accept.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from gpupool.engine import over_quota
from gpupool.engine.attempt import Attempt
from gpupool.engine.consolidation import ConsolidatingPreemptor, Consolidator
from gpupool.engine.decay import set_decayed_usage
from gpupool.engine.decisions import Decisions
from gpupool.engine.facts import WorkloadFacts
from gpupool.engine.hints import BlockedHints
from gpupool.engine.memory_share import MemoryShares
from gpupool.engine.partial import PartialAdmitter
from gpupool.engine.passes import QueuePasses
from gpupool.engine.placement import SCORERS
from gpupool.engine.preemption.candidates import CandidateFinder
from gpupool.engine.preemption.search import Preemptor
from gpupool.engine.rounds import BorrowRounds
from gpupool.engine.session import Session
from gpupool.engine.shape_mix import ShapeMix
from gpupool.model import Admission, EngineConfig, PodPlacement, Running, Snapshot, Workload

ORDER_POLICIES = ("fair-share", "fifo")
PREEMPT_POLICIES = ("default", "none")


def validate_config(config: EngineConfig) -> None:
    """Reject unknown plugin names up front, naming the field and the choices."""
    for field_name, value, known in (
        ("order", config.order, ORDER_POLICIES),
        ("score", config.score, tuple(SCORERS)),
        ("preempt", config.preempt, PREEMPT_POLICIES),
    ):
        if value not in known:
            raise ValueError(
                f"engine config {field_name}: unknown policy {value!r}; choose one of {', '.join(known)}"
            )


class Engine:
    """Scheduling state for one snapshot, and the parts that decide a cycle over it."""

    def __init__(self, snapshot: Snapshot) -> None:
        validate_config(snapshot.config)
        self.ssn = ssn = Session(snapshot)
        # the state, named for the callers that read it (the controller, the simulator)
        self.config: EngineConfig = ssn.config
        self.cluster = ssn.cluster
        self.quota = ssn.quota
        self.placer = ssn.placer
        self.pools = ssn.pools
        self.runs = ssn.runs
        #: the running workloads (the running set's dict, kept in step with its indexes)
        self.running: dict[str, Running] = ssn.runs.by_name
        self.facts = WorkloadFacts(ssn.quota, ssn.pools, ssn.cluster)
        self.shares = MemoryShares(ssn.cluster.nodes)  # KAI's gpu-memory-only requests
        self.mix = ShapeMix(snapshot, ssn.placer)
        self.rounds = BorrowRounds(ssn.quota, ssn.pools)
        self.consolidator = Consolidator(ssn)  # KAI's consolidation (off unless a pool sets it)
        self.preemptor: Preemptor = ConsolidatingPreemptor(ssn, CandidateFinder(ssn), self.consolidator)
        self.partial = PartialAdmitter(ssn, self.preemptor)
        self.hints = BlockedHints(ssn, self.facts)
        self.attempt = Attempt(ssn, self.facts, self.rounds, self.preemptor, self.partial)
        self.passes = QueuePasses(ssn, self.attempt, self.hints)
        for r in snapshot.running:
            ssn.charge(r)
        ssn.stmt.commit()
        self.set_decayed_usage(snapshot.decayed_usage)

    @property
    def now(self) -> float:
        """The time the last (or current) cycle decides at."""
        return self.ssn.now

    # -- state changes (used by incremental callers too) --------------------------------------
    def add_running(self, r: Running) -> None:
        """Record an admitted workload permanently (an incremental caller applying a decision)."""
        self.ssn.charge(r)
        self.ssn.stmt.commit()
        self.mix.add([r.workload])

    def withhold_devices(self, unhealthy: Mapping[str, Mapping[int, str]]) -> None:
        """Take unhealthy devices out of placement, node -> device -> why (the caller's fault
        record: state in). Held whole, and known as unhealthy to reasons and holds."""
        st = self.cluster
        for node, devs in unhealthy.items():
            i = st.index.get(node)
            if i is not None:
                for d, why in sorted(devs.items()):
                    st.withhold(i, d, why)
        st.commit()

    def remove_running(self, name: str) -> Running | None:
        """Release a finished, cancelled or evicted workload permanently."""
        r = self.running.get(name)
        if r is None:
            return None
        self.ssn.discharge(r)
        self.ssn.stmt.commit()
        self.mix.add([r.workload], sign=-1)
        return r

    def shrink_running(self, name: str, pods: Iterable[PodPlacement]) -> Running | None:
        """Take some pods off a running elastic gang permanently (a ``Shrink`` carried out);
        what it still runs, or None when it was not running."""
        r = self.running.get(name)
        if r is None:
            return None
        gone = set(pods)
        self.ssn.discharge_part(
            Running(r.workload, replace(r.admission, pods=tuple(p for p in r.admission.pods if p in gone)))
        )
        self.ssn.stmt.commit()
        return self.running.get(name)

    def apply(self, decisions: Decisions, pending: Iterable[Workload], now: float) -> list[Running]:
        """Make a cycle's decisions permanent: evict victims, shrink elastic gangs, then charge
        admissions."""
        by_name = {w.name: w for w in pending}
        for v in decisions.victims():
            self.remove_running(v)
        for sh in decisions.shrinks():
            self.shrink_running(sh.workload, sh.pods)
        for m in decisions.moved:  # stopped, and restarted at once where the move reserved
            old = self.remove_running(m.workload)
            if old is not None:
                self.add_running(Running(old.workload, replace(old.admission, pods=m.pods, admitted_at=now)))
        out = []
        for a in decisions.admitted:
            w = self.shares.resolve(by_name[a.workload])  # the request it was placed as
            r = Running(w, Admission(a.pool, a.pods, a.borrowing, now))
            self.add_running(r)
            out.append(r)
        return out

    def set_decayed_usage(self, usage: Mapping[str, float] | Iterable[tuple[str, float]]) -> None:
        """Decayed GPU-seconds per queue for the fair-share order (``decay.set_decayed_usage``)."""
        set_decayed_usage(self.quota, self.config, usage)

    # -- reads for callers --------------------------------------------------------------------
    def candidate_pools(self, w: Workload) -> list[str]:
        """Pools ``w`` may use, in the order they are tried (``facts.WorkloadFacts``)."""
        return self.facts.candidate_pools(w)

    def blocked_at_start(self, w: Workload, memo: dict[object, Any] | None = None) -> bool:
        """Can ``w`` neither be placed nor preempt anything now (``hints.BlockedHints``)?"""
        return self.hints.blocked_at_start(w, memo)

    def weighs_shape_mix(self, shares_gpus: bool = False) -> bool:
        """Does placement weigh the mix of pod shapes (``shape_mix.ShapeMix.weighs``)?"""
        return self.mix.weighs(shares_gpus)

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
        ssn = self.ssn
        if now is not None:
            ssn.now = now
        if more is not None:  # what a window pulls in is resolved as what was passed (KAI's shares)
            pull, shares = more, self.shares

            def more(w: Workload) -> Workload | None:
                nxt = pull(w)
                return None if nxt is None else shares.resolve(nxt)

        ssn.begin(blocked, more)
        # The cycle creates no reference cycles; pausing the cyclic GC saves ~20% on big cycles.
        gc_was_on = gc.isenabled()
        gc.disable()
        counted = self.mix.count_hidden(1)  # a windowed caller's left-out shapes (ShapeMix.hidden)
        try:
            return self._cycle(list(pending))
        finally:
            if counted:
                self.mix.count_hidden(-1)
            if gc_was_on:
                gc.enable()
            if restore:
                ssn.stmt.discard()
            else:
                ssn.stmt.close()

    def _cycle(self, pending: list[Workload]) -> Decisions:
        """The cycle's steps: sort the work into queues, prepare placement, then pass 1 admits
        what fits within guarantees and pass 2 (in rounds) lets the rest borrow. A borrower
        admitted first would only be reclaimed (evicted) by a guaranteed workload later."""
        out = Decisions()
        passes = self.passes
        by_queue = passes.by_queue([self.shares.resolve(w) for w in pending], out)
        self.facts.trim()
        over_quota.begin_cycle(self.quota, by_queue, self.facts.of)  # OverQuota trees' fair shares
        self.mix.prepare(self.cluster, by_queue.values())
        self.placer.holds.clear()
        self.placer.now = self.ssn.now
        deferred = self.rounds.run(by_queue, out, False, passes.run)
        self.rounds.run(deferred, out, True, passes.run)
        out.waited = self.ssn.cs.waited
        return out


def decide(snapshot: Snapshot) -> Decisions:
    """The engine's one public verb: a pure function of the snapshot."""
    return Engine(snapshot).cycle(snapshot.pending, snapshot.now, restore=False)
