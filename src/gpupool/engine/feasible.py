"""Can a workload ever run on a pool as the pool is now, even with nothing else running?

Why: a workload that cannot fit the pool's healthy, schedulable inventory waits for nothing that
running work will free. Left as "insufficient capacity" it had nodes held for it "when running
work ends" (with nothing running) and, at the head of a StrictFIFO queue, it blocked the whole
queue: one unhealthy GPU left 62 of 64 idle. ``unsatisfiable`` names why such a workload cannot
run (the attempt reports it as ``Unsatisfiable``, holds nothing for it and does not let it block
its queue); it changes when the inventory does (a device healthy again, a node uncordoned).

The check uses necessary conditions only (enough healthy devices per pod group, in total, and in
one domain where a topology is required), so it never calls a satisfiable workload hopeless;
a partial gang (which may start with fewer pods) is not judged.
"""

from __future__ import annotations

from collections.abc import Callable

from gpupool.engine.state.cluster import ClusterState
from gpupool.model import GPU, PodGroup, TopologyMode, TopologyScope, Vec, Workload, device_noun
from gpupool.quantity import format_cpu, format_mib

#: unhealthy devices named in a reason before "and N more"
_NAMED = 3


def unsatisfiable(w: Workload, pool: str, st: ClusterState, ok: Callable[[int], bool]) -> str | None:
    """Why ``w`` can never run in ``pool`` on its inventory now (None: it could, or this check
    cannot tell). ``ok`` is the placer's node filter for ``w`` (selectors, taints)."""
    groups = [g for g in w.pod_groups if g.request.gpus > 0]
    if not groups or w.min_pods < w.pod_count:
        return None
    for g in groups:
        idxs = st.pool_indexes(pool, w.gpu_models, g.request.accelerator)
        mine = [i for ix in idxs for i in ix.nodes if ok(i)]
        need = g.replicas
        slots = sum(st.healthy_gpus(i) // g.request.gpus for i in mine)
        if slots < need:
            head = f"can never run in pool {pool} as it is now, even with nothing else running: pod group {g.name}"
            if not idxs:  # the kind (or model) itself is missing: say that, as the placer does
                models = f" and GPU model {', '.join(w.gpu_models)}" if w.gpu_models else ""
                kinds = ", ".join(st.kinds(pool)) or "none"
                return (
                    f"{head} asks for {g.request.accelerator}; pool {pool} has no schedulable nodes of that "
                    f"kind{models} (its kinds: {kinds})"
                )
            noun = device_noun(g.request.accelerator)
            what = f"{g.request.gpus} {'/'.join(ix.model for ix in idxs)} {noun}s"
            hosts = sum(1 for i in mine if st.healthy_gpus(i) >= g.request.gpus)
            return (
                f"{head} needs {need} pod(s) of {what} on one node each, and {hosts} node(s) there have "
                f"{g.request.gpus} healthy {noun}s{_withheld(st, mine)}"
            )
    return _topology(w, pool, st, ok, groups)


class Unsatisfiable:
    """``unsatisfiable`` remembered per pool and placement shape for the engine's life.

    Why: it reads only the inventory (healthy devices, domains, the nodes a filter admits) and
    fields of the placement signature (pod groups, models, topology, tolerations, selector,
    gang minimum), never what runs; yet it was asked again after every failed placement, each
    time walking the pool's nodes (5% of a Philly replay's CPU). The inventory changes only
    when a device is withheld (``ClusterState.inventory_version``), which starts it afresh."""

    __slots__ = ("_memo", "_version", "st")

    def __init__(self, st: ClusterState) -> None:
        self.st = st
        self._memo: dict[tuple[str, object], str | None] = {}
        self._version = st.inventory_version

    def of(self, w: Workload, pool: str, shape: object, ok: Callable[[int], bool]) -> str | None:
        """``unsatisfiable(w, pool, ...)`` for ``w`` of placement shape ``shape`` (an id of
        ``signature.placement_signature``), ``ok`` the placer's filter for it."""
        if self._version != self.st.inventory_version:
            self._memo.clear()
            self._version = self.st.inventory_version
        key = (pool, shape)
        if key in self._memo:
            return self._memo[key]
        got = self._memo[key] = unsatisfiable(w, pool, self.st, ok)
        return got


def beyond_pool(w: Workload, vec: Vec, pool: str, st: ClusterState) -> str | None:
    """Why ``w`` asks for more devices than ``pool`` has healthy in all (None: it does not).
    Checked where the quota refuses, O(unhealthy devices): a request larger than the pool is
    not waiting for quota (its reason said "capacity 8, in use 5, requested 16; 3 idle")."""
    if not vec[0] or w.min_pods < w.pod_count:
        return None
    cap = st.capacity.get(pool, (0,))[0]
    healthy = cap - 1000 * sum(len(d) for i, d in st.withheld.items() if st.pool_of[i] == pool)
    if vec[0] <= healthy:
        return None
    noun = device_noun(next((g.request.accelerator for g in w.pod_groups if g.request.gpus), GPU))
    return (
        f"can never run in pool {pool} as it is now, even with nothing else running: it requests "
        f"{vec[0] / 1000:g} {noun}s and the pool has {healthy / 1000:g} healthy in all"
        f"{_withheld(st, [i for i in st.withheld if st.pool_of[i] == pool])}"
    )


def beyond_capacity(w: Workload, vec: Vec, pool: str, st: ClusterState) -> str | None:
    """Why ``w`` asks for more CPU or memory than ``pool``'s schedulable nodes have in all (None:
    it does not). O(1), checked before placement: a CPU-only gang of 100,000 pods passes every
    GPU test and placement tried ~1,500 of its pods each cycle before it failed."""
    if w.min_pods < w.pod_count:
        return None
    cap = st.capacity.get(pool)
    if cap is None:
        return None
    for d, noun, fmt in ((1, "CPU", format_cpu), (2, "memory", format_mib)):
        if vec[d] > cap[d]:
            return (
                f"can never run in pool {pool} as it is now, even with nothing else running: its "
                f"{w.pod_count} pods request {fmt(vec[d])} {noun} and the pool's schedulable nodes "
                f"have {fmt(cap[d])} in all"
            )
    return None


def _topology(
    w: Workload, pool: str, st: ClusterState, ok: Callable[[int], bool], groups: list[PodGroup]
) -> str | None:
    """A required topology domain (one node, rack or NVLink domain) too small for the gang."""
    topo = w.topology
    if topo is None or topo.mode is not TopologyMode.REQUIRED:
        return None
    total = sum(g.replicas * g.request.gpus for g in groups)
    if topo.scope is TopologyScope.NODE:
        doms = {st.nodes[i].name: [i] for i in range(len(st.nodes)) if st.pool_of[i] == pool and ok(i)}
    else:
        doms = {d: [i for i in ix if ok(i)] for d, ix in st.domains.get((pool, topo.scope), {}).items()}
    best = max((sum(st.healthy_gpus(i) for i in ix) for ix in doms.values()), default=0)
    if best >= total:
        return None
    label = {"node": "one node", "nvlink": "one NVLink domain", "rack": "one rack"}[topo.scope.value]
    return (
        f"can never run in pool {pool} as it is now, even with nothing else running: it needs {total} "
        f"GPUs in {label} and the largest there has {best} healthy"
        f"{_withheld(st, [i for ix in doms.values() for i in ix])}"
    )


def _withheld(st: ClusterState, nodes: list[int] | set[int]) -> str:
    """``; unhealthy: n-001 GPU 5 (XID 79), ...`` for the withheld devices among ``nodes``."""
    bad = [
        (st.nodes[i].name, d, why) for i in sorted(nodes) for d, why in sorted(st.withheld.get(i, {}).items())
    ]
    if not bad:
        return ""
    named = ", ".join(f"{n} GPU {d} ({why})" if why else f"{n} GPU {d}" for n, d, why in bad[:_NAMED])
    more = f" and {len(bad) - _NAMED} more" if len(bad) > _NAMED else ""
    return f"; unhealthy: {named}{more}"
