"""Holds and backfill: a planned start for every blocked whole-GPU workload, up to a bound.

A large gang that does not fit would otherwise wait forever while smaller work keeps taking
the devices it needs as they free. Like Slurm's backfill (``bf_max_job_test``), up to
``ResourcePool.reservations`` blocked workloads per pool get a planned start, in the cycle's
rank order: ``plan_hold`` picks the nodes that will soonest be able to host each one (from the
expected end of the work on each device, ``RunningSet.busy_ends``, and of the holds ranked
before it), and ``Holds`` keeps later work off them, except work that declares it will end
before the earliest planned start on every held node it takes (backfill). So a long backfilled
job delays none of the planned starts, the second large job's included. Holds are recomputed
every cycle: the engine keeps no state between cycles.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpupool.engine.state.cluster import ClusterState
from gpupool.engine.state.running import RunningSet
from gpupool.model import TopologyMode, TopologyScope, Workload

_INF = float("inf")


@dataclass(frozen=True, slots=True)
class Hold:
    """Nodes kept for one blocked workload: where and when it is planned to start."""

    workload: str
    queue: str
    pool: str
    nodes: frozenset[int]
    #: the planned start (engine time; inf: when running work of unknown duration ends)
    start: float
    #: the planned end: ``start`` plus its declared duration (inf: it declares none)
    end: float
    #: the running (or held) workload whose end the start waits for ("" when unknown)
    after: str
    #: the text added to the workload's pending reason
    note: str


class Holds:
    """The cycle's holds, in rank order, with the per-node bound backfill must respect.

    ``until[i]``: the earliest planned start of the holds on node ``i`` (work that may run
    there must end by then); ``busy[i]``: the latest planned end of them (a hold ranked later
    can start there only after it). Why a part of its own: the placer asks "may this workload
    use node i", the attempt asks "is there room for another hold", the planners ask "did the
    holds change": one owner keeps the three answers consistent."""

    __slots__ = ("busy", "by_pool", "by_workload", "limits", "until")

    def __init__(self, limits: dict[str, int] | None = None) -> None:
        self.limits = limits or {}
        self.by_pool: dict[str, list[Hold]] = {}
        self.by_workload: dict[str, Hold] = {}
        self.until: dict[int, float] = {}
        self.busy: dict[int, float] = {}

    def clear(self) -> None:
        """Start the cycle with no holds."""
        self.by_pool, self.by_workload, self.until, self.busy = {}, {}, {}, {}

    def __bool__(self) -> bool:
        return bool(self.by_workload)

    def in_pool(self, pool: str) -> bool:
        return pool in self.by_pool

    def of_pool(self, pool: str) -> list[Hold]:
        return self.by_pool.get(pool, [])

    def room(self, pool: str) -> bool:
        """May another blocked workload get a hold in ``pool`` this cycle?"""
        return len(self.by_pool.get(pool, ())) < self.limits.get(pool, 1)

    def add(self, h: Hold) -> None:
        self.by_pool.setdefault(h.pool, []).append(h)
        self.by_workload[h.workload] = h
        until, busy = self.until, self.busy
        for i in h.nodes:
            until[i] = min(until.get(i, _INF), h.start)
            busy[i] = max(busy.get(i, -_INF), h.end)

    def all(self) -> list[Hold]:
        return [h for hs in self.by_pool.values() for h in hs]

    def key(self) -> tuple[tuple[str, frozenset[int], float], ...]:
        """What a planner compares between cycles (who holds what, from when)."""
        return tuple((h.workload, h.nodes, h.start) for h in self.all())

    def may_backfill(self, w: Workload, pool: str, now: float) -> bool:
        """May ``w`` use every node held in ``pool``? Only if it declares it ends before the
        earliest planned start there."""
        hs = self.by_pool.get(pool)
        if not hs:
            return True
        d = w.expected_duration_s
        return d is not None and now + d <= min(h.start for h in hs)

    def usable(self, w: Workload, pool: str, now: float) -> int:
        """How many of ``pool``'s holds ``w`` may backfill around (those planned to start after
        it would end): with the holds, this fixes which held nodes it may use."""
        d = w.expected_duration_s
        if d is None:
            return 0
        end = now + d
        return sum(1 for h in self.by_pool.get(pool, ()) if end <= h.start)

    def blocked_for(self, w: Workload, now: float) -> Callable[[int], bool]:
        """``blocked(i)``: node ``i`` is held from before ``w`` would end."""
        until = self.until
        d = w.expected_duration_s
        if d is None:
            return until.__contains__
        end = now + d
        return lambda i: i in until and end > until[i]

    def holders_text(self, pool: str, other_than: str) -> str:
        """``"n node(s) are held for a, b and 2 more"``, or "" when only ``other_than`` holds."""
        hs = [h for h in self.by_pool.get(pool, ()) if h.workload != other_than]
        if not hs:
            return ""
        nodes = len(set().union(*(h.nodes for h in hs)))
        names = ", ".join(h.workload for h in hs[:2]) + (f" and {len(hs) - 2} more" if len(hs) > 2 else "")
        return f"{nodes} node(s) are held for {names}"


def plan_hold(
    w: Workload,
    pool: str,
    st: ClusterState,
    node_filter: Callable[[Workload], Callable[[int], bool]],
    runs: RunningSet,
    now: float,
    ahead: Holds | None = None,
) -> Hold | None:
    """Hold the nodes that will soonest be able to host ``w`` (a blocked whole-GPU workload),
    so that later, smaller work cannot keep fragmenting them. ``ahead``: the holds ranked
    before it; a node one of them holds is ready only at that hold's planned end (the whole
    node, an upper bound: the planned start never comes too early).

    None where no hold applies: not whole GPUs, no domain large enough, or the capacity is
    free already and something else (CPU, memory, topology) blocks it."""
    pods = [pg for pg in w.pod_groups for _ in range(pg.replicas)]
    if not pods or any(pg.request.gpus == 0 for pg in pods):
        return None
    topo = w.topology
    scope = topo.scope if topo is not None and topo.mode is TopologyMode.REQUIRED else None
    n_pods = len(pods)
    k = max(pg.request.gpus for pg in pods)
    if scope is TopologyScope.NODE:  # every pod on one node: one big pod
        k, n_pods = sum(pg.request.gpus for pg in pods), 1
    busy = ahead.busy if ahead is not None else {}
    groups = _ready_times(w, pool, st, node_filter(w), runs, now, k, scope, busy)
    best: tuple[float, str, list[tuple[float, bool, int, int]]] | None = None
    for dom, cands in sorted(groups.items()):
        if len(cands) < n_pods:
            continue
        cands.sort()
        chosen = cands[:n_pods]
        t_dom = max(c[0] for c in chosen)
        if best is None or t_dom < best[0]:
            best = (t_dom, dom, chosen)
    if best is None:
        return None
    start, _, chosen = best
    if start <= now:
        return None  # capacity is there: something else (cpu, memory, topology) blocks it
    held = frozenset(c[-1] for c in chosen)
    names = ", ".join(st.nodes[c[-1]].name for c in chosen[:4]) + (" ..." if len(chosen) > 4 else "")
    after = _after(start, chosen, st, runs, ahead)
    if start == _INF:
        when = "when running work ends"
    else:
        when = f"planned start t={start:g}" + (f", after {after} ends" if after else "")
    d = w.expected_duration_s
    end = _INF if d is None else start + d
    note = f"holding {len(held)} node(s) for it ({names}), {when}"
    return Hold(w.name, w.queue, pool, held, start, end, after, note)


def _after(
    start: float,
    chosen: list[tuple[float, bool, int, int]],
    st: ClusterState,
    runs: RunningSet,
    ahead: Holds | None,
) -> str:
    """The workload whose expected end the planned start waits for: a hold ranked before it,
    or running work on one of the chosen nodes ("" when it cannot be told)."""
    if start == _INF:
        return ""
    for *_, i in chosen:
        if ahead is not None and ahead.busy.get(i) == start:
            return next((h.workload for h in ahead.all() if i in h.nodes and h.end == start), "")
    for *_, i in chosen:
        name = runs.ending_at(st.nodes[i].name, start)
        if name:
            return name
    return ""


def _ready_times(
    w: Workload,
    pool: str,
    st: ClusterState,
    ok: Callable[[int], bool],
    runs: RunningSet,
    now: float,
    k: int,
    scope: TopologyScope | None,
    busy: dict[int, float],
) -> dict[str, list[tuple[float, bool, int, int]]]:
    """Per topology domain (one domain without a required scope), every node of ``pool`` that
    could host a ``k``-GPU pod of ``w`` as (when ``k`` devices are expected free, held for
    work ranked before ``w``, minus its free devices now, node index); ``busy``: the nodes held
    for work ranked before ``w``, free from then. At the same time a node nobody holds is
    preferred: two planned starts on one node leave the other free to be fragmented."""
    groups: dict[str, list[tuple[float, bool, int, int]]] = {}
    for ix in st.pool_indexes(pool, w.gpu_models):
        for i in ix.nodes:
            node = st.nodes[i]
            if st.healthy_gpus(i) < k or not ok(i):  # an unhealthy device frees for nobody
                continue
            free_now = st.free_whole[i]
            # time when k devices are free: the (k - free_now)-th release (an estimate: a
            # device shared by fractional pods frees when its last sharer ends)
            need = k - free_now
            if need <= 0:
                t = now
            else:
                ends = runs.busy_ends(node.name)
                t = ends[need - 1] if need <= len(ends) else _INF
            held = i in busy
            if held:
                t = max(t, busy[i])
            dom = node.domain(scope) if scope is not None and scope is not TopologyScope.NODE else ""
            groups.setdefault(dom, []).append((t, held, -free_now, i))
    return groups
