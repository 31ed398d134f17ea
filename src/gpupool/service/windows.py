"""The controller's cycle over windows of the pending set, exact by construction.

Why: a cycle's cost grows with the pending list, and it holds the interpreter while it runs; a
burst of thousands of identical submissions (a sweep, a retry storm) made every cycle pay for
all of them, though after the first that cannot start none of the others can either. Pending
workloads are grouped into *classes* of identical scheduling shape: everything the engine reads
but the name and the arrival (queue, priority, pod groups, topology, tolerations, selector,
gang, pool, type, declared duration). A cycle is given the first member of each class; while
the engine admits a window's last member it pulls the next (the engine's ``more``), so a class
that fits keeps growing inside the one cycle. The window is exact when some member of it was
tried and failed (QuotaExceeded, InsufficientCapacity, TopologyUnsatisfiable, NoMatchingPool)
after the cycle's last preemption: a later member of the same class is tried later, with the
same request, at a state that only got tighter (nothing is freed once nothing is preempted),
so it fails too, and a failure changes no state. Otherwise the windows are enlarged and the
cycle, which has no side effects, runs again. StrictFIFO queues are given whole. The members
left out get their class witness's reason. ``tests/service/test_windows.py`` checks on generated
clusters and backlogs that the decisions equal those of a cycle given everything. This is the
simulator's window rule (gpupool.sim.simulator), restricted to classes that include the
declared duration, which makes the backfill cases it handles separately identical.

Workloads the engine found ``Unsatisfiable`` in every pool they may use (``Hopeless``) are kept
out of the cycles that follow, with that reason, until the controller installs a new engine
(nodes, health, cordons, configuration or quota changed): such a workload cannot run even with
nothing else running, so no admission or eviction changes that, and it holds and evicts
nothing. Its pod shapes stay in the fragmentation mix (as a window's hidden members do), so
the others' decisions are those of a cycle given it. Why: a gang of 100,000 pods was tried
every cycle, at the cost of every other team's wait.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpupool.engine import Decisions, Engine, Pending, PendingCode
from gpupool.engine.holds import Holds
from gpupool.engine.ordering import workload_order_key
from gpupool.engine.signature import Signature, scheduling_signature
from gpupool.model import QueueingStrategy, Workload

try:  # the fragmentation scorer's shape counting
    from gpupool.engine.fragscore import add_shapes
except ImportError:  # pragma: no cover
    add_shapes = None  # type: ignore[assignment]

FAILED = frozenset(
    {
        PendingCode.QUOTA,
        PendingCode.CAPACITY,
        PendingCode.TOPOLOGY,
        PendingCode.NO_POOL,
        PendingCode.UNSATISFIABLE,
    }
)


#: a workload's class: its scheduling signature (``engine.signature``: every field but its name
#: and arrival, derived from the model, so a field added later is part of the class)
Shape = Signature


@dataclass(slots=True)
class WindowStats:
    cycles: int = 0  # engine calls, reruns included
    passed: int = 0  # workloads given to the last call
    hidden: int = 0  # workloads left out of it


@dataclass(slots=True)
class _Plan:
    """One attempt: what is passed, and the windows still short of their class."""

    passed: list[Workload]
    windows: dict[Shape, list[str]]
    pulled: int = 0


class Hopeless:
    """The workloads Unsatisfiable in every pool they may use, valid for one engine (an
    engine is rebuilt whenever the inventory or the configuration changes)."""

    __slots__ = ("_engine", "known")

    def __init__(self) -> None:
        self._engine: Engine | None = None
        self.known: dict[str, Pending] = {}

    def of(self, engine: Engine) -> dict[str, Pending]:
        """The reasons known for ``engine`` (none after it changed)."""
        if engine is not self._engine:
            self._engine, self.known = engine, {}
        return self.known

    def learn(self, engine: Engine, d: Decisions, pending: Sequence[Workload]) -> None:
        known = self.of(engine)
        by_name = {w.name: w for w in pending}
        for p in d.pending:
            w = by_name.get(p.workload)
            if p.code is PendingCode.UNSATISFIABLE and w is not None:
                pools = engine.candidate_pools(w)
                # one pool: its code; several: "[pool] reason; ..." with each pool's own
                if len(pools) == 1 or p.reason.count(_NEVER) == len(pools):
                    known[p.workload] = p


#: how every reason ``engine.feasible`` gives starts, per pool
_NEVER = "can never run in pool"


def _classes(
    pending: Sequence[Workload], engine: Engine, known: Mapping[str, Pending] | None = None
) -> tuple[list[Workload], dict[Shape, list[Workload]]]:
    whole: list[Workload] = []
    classes: dict[Shape, list[Workload]] = {}
    queues, root = engine.quota.queues, engine.quota.root
    # an over-quota tree's fair shares are water-filled from all of its pending demand: a window
    # would hide demand and change the shares, so its work is passed whole (as StrictFIFO's is)
    over_quota = set(engine.quota.over_quota_roots)
    for w in pending:
        if known and w.name in known:
            continue
        q = queues.get(w.queue)
        if q is None or q.strategy is QueueingStrategy.STRICT_FIFO or root.get(w.queue) in over_quota:
            whole.append(w)
        else:
            classes.setdefault(scheduling_signature(w), []).append(w)
    for members in classes.values():
        members.sort(key=workload_order_key)
    return whole, classes


def _plan(whole: list[Workload], classes: dict[Shape, list[Workload]], k: Mapping[Shape, int]) -> _Plan:
    plan = _Plan(list(whole), {})
    for c, members in classes.items():
        n = min(len(members), k.get(c, 1))
        plan.passed.extend(members[:n])
        if n < len(members):
            plan.windows[c] = [w.name for w in members[:n]]
    return plan


def _hide(
    engine: Engine, classes: dict[Shape, list[Workload]], plan: _Plan, hopeless: Sequence[Workload] = ()
) -> None:
    if add_shapes is None:
        return
    hidden: Counter[object] = Counter()
    for c, names in plan.windows.items():
        add_shapes(hidden, classes[c][len(names) :])  # type: ignore[arg-type]
    if hopeless:
        add_shapes(hidden, hopeless)  # type: ignore[arg-type]
    engine.mix.hidden = hidden or None


def _witnessed(d: Decisions, plan: _Plan, classes: dict[Shape, list[Workload]], holds: Holds) -> list[Shape]:
    """The classes whose window proves nothing: no member failed after the last preemption,
    or, where a pool plans more starts than one, every member that failed took a hold (that
    failure changed state: a member left out would have taken the next hold; one that failed
    without a hold was tried when the holds were used up, and the rest come after it)."""
    late = d.pending[d.pending_after_preemption :] if d.preempted else d.pending
    failed = {p.workload for p in late if p.code in FAILED}
    holders = holds.by_workload if any(n > 1 for n in holds.limits.values()) else {}
    out = []
    for c, names in plan.windows.items():
        if len(names) >= len(classes[c]):
            continue
        if not any(n in failed and n not in holders for n in names):
            out.append(c)
    return out


def windowed_cycle(
    engine: Engine,
    pending: Sequence[Workload],
    now: float,
    stats: WindowStats | None = None,
    known: Mapping[str, Pending] | None = None,
) -> tuple[Decisions, dict[str, Pending]]:
    """The engine's decisions for ``pending`` (as if given whole), and the reasons of the members
    left out (their class witness's, under their own name; those in ``known``, hopeless for
    this engine (``Hopeless``), their known reason)."""
    whole, classes = _classes(pending, engine, known)
    hopeless = [w for w in pending if w.name in known] if known else []
    k: dict[Shape, int] = {}
    use_more = True
    stats = stats or WindowStats()
    while True:
        plan = _plan(whole, classes, k)
        _hide(engine, classes, plan, hopeless)

        def more(w: Workload, plan: _Plan = plan) -> Workload | None:
            c = scheduling_signature(w)
            names = plan.windows.get(c)
            if names is None or names[-1] != w.name or len(names) >= len(classes[c]):
                return None
            nxt = classes[c][len(names)]
            names.append(nxt.name)
            plan.pulled += 1
            return nxt

        try:
            d = engine.cycle(plan.passed, now, more=more if use_more and plan.windows else None)
        finally:
            engine.mix.hidden = None
        stats.cycles += 1
        if plan.pulled and d.preempted:
            # a preemption frees capacity: windows grown during the cycle may have missed work
            # it let in; start again from the grown windows, without growing them in the cycle
            use_more = False
            for c, names in plan.windows.items():
                k[c] = max(k.get(c, 1), len(names) + 1)
            continue
        short = _witnessed(d, plan, classes, engine.placer.holds)
        if not short:
            break
        for c in short:
            k[c] = len(classes[c]) if d.preempted else max(2 * len(plan.windows[c]), k.get(c, 1) * 2)
    stats.passed = len(plan.passed) + plan.pulled
    stats.hidden = len(pending) - stats.passed
    out = _hidden_reasons(d, plan, classes, set(engine.placer.holds.by_workload))
    out.update({w.name: known[w.name] for w in hopeless} if known else {})
    return d, out


def _hidden_reasons(
    d: Decisions, plan: _Plan, classes: dict[Shape, list[Workload]], holders: set[str]
) -> dict[str, Pending]:
    """A hidden member's reason is its class witness's, one that holds no nodes if there is
    one (a holder's reason names its own hold, which the others do not have)."""
    by_name = {p.workload: p for p in d.pending}
    out: dict[str, Pending] = {}
    for c, names in plan.windows.items():
        cands = [by_name[n] for n in reversed(names) if n in by_name and by_name[n].code in FAILED]
        witness = next((p for p in cands if p.workload not in holders), cands[0] if cands else None)
        if witness is None:
            continue
        for w in classes[c][len(names) :]:
            out[w.name] = Pending(w.name, w.queue, witness.code, witness.reason)
    return out


__all__ = ["Hopeless", "WindowStats", "windowed_cycle"]
