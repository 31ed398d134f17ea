"""The controller's cycle over windows of the pending set: the one window planner
(``gpupool.engine.windows``) over a backlog built for the cycle, and the hopeless set.

Why: a cycle's cost grows with the pending list, and it holds the interpreter while it runs; a
burst of thousands of identical submissions (a sweep, a retry storm) made every cycle pay for
all of them, though after the first that cannot start none of the others can either. Pending
workloads are grouped into *classes* of identical scheduling shape: everything the engine reads
but the name and the arrival (queue, priority, pod groups, topology, tolerations, selector,
gang, pool, type, the exact declared duration). The planner gives the first member of each
class, grows a window inside the cycle while the engine admits its last member, and proves the
windows exact or enlarges them and runs the cycle again (the window rule at the top of
``gpupool.engine.windows``). Here, unlike in the simulator, there are no queue windows and no
blocked heads, and nothing is remembered between cycles: StrictFIFO queues (and over-quota
trees, whose fair shares are water-filled from all of their pending demand) are given whole,
and every class is given its window on every cycle. The members left out get their class
witness's reason. ``tests/service/test_windows.py`` checks on generated clusters and backlogs
that the decisions equal those of a cycle given everything.

Workloads the engine found ``Unsatisfiable`` in every pool they may use (``Hopeless``) are kept
out of the cycles that follow, with that reason, until the controller installs a new engine
(nodes, health, cordons, configuration or quota changed): such a workload cannot run even with
nothing else running, so no admission or eviction changes that, and it holds and evicts
nothing. Its pod shapes stay in the fragmentation mix (as a window's hidden members do), so
the others' decisions are those of a cycle given it. Why: a gang of 100,000 pods was tried
every cycle, at the cost of every other team's wait.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpupool.engine import Decisions, Engine, Pending, PendingCode
from gpupool.engine.backlog import Backlog
from gpupool.engine.fragscore import add_shapes
from gpupool.engine.windows import WindowPlanner
from gpupool.model import QueueingStrategy, Workload


@dataclass(slots=True)
class WindowStats:
    cycles: int = 0  # engine calls, reruns included
    passed: int = 0  # workloads given to the last call
    hidden: int = 0  # workloads left out of it


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


def _backlog(
    pending: Sequence[Workload], engine: Engine, known: Mapping[str, Pending] | None
) -> tuple[list[Workload], Backlog, list[Workload]]:
    """The workloads given whole, the backlog of the rest by class, the hopeless ones."""
    whole: list[Workload] = []
    classed: list[Workload] = []
    hopeless: list[Workload] = []
    queues, root = engine.quota.queues, engine.quota.root
    # an over-quota tree's fair shares are water-filled from all of its pending demand: a window
    # would hide demand and change the shares, so its work is passed whole (as StrictFIFO's is)
    over_quota = set(engine.quota.over_quota_roots)
    for w in pending:
        if known and w.name in known:
            hopeless.append(w)
            continue
        q = queues.get(w.queue)
        if q is None or q.strategy is QueueingStrategy.STRICT_FIFO or root.get(w.queue) in over_quota:
            whole.append(w)
        else:
            classed.append(w)
    backlog = Backlog(durations="exact", track_shapes=engine.mix.on)
    backlog.extend(classed)
    if backlog.shapes is not None and hopeless:
        add_shapes(backlog.shapes, hopeless)  # type: ignore[arg-type]
    return whole, backlog, hopeless


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
    whole, backlog, hopeless = _backlog(pending, engine, known)
    planner = WindowPlanner(blocked_heads=False)
    d, passed = planner.decide(engine, backlog, now, whole=whole)
    stats = stats or WindowStats()
    stats.cycles += planner.engine_calls
    stats.passed = len(passed)
    stats.hidden = len(pending) - stats.passed
    out = planner.left_out(d)
    out.update({w.name: known[w.name] for w in hopeless} if known else {})
    return d, out


__all__ = ["Hopeless", "WindowStats", "windowed_cycle"]
