"""Holds and backfill: nodes kept free for a blocked whole-GPU workload.

A large gang that does not fit would otherwise wait forever while smaller work keeps taking
the devices it needs as they free. ``plan_hold`` picks the nodes that will soonest be able to
host it (from the expected end of the work on each device, ``RunningSet.busy_ends``); the
placer then keeps later work off them, except work that declares it will end before the held
workload can start (backfill, ``Placer.may_backfill``). Holds are recomputed every cycle: the
engine keeps no state between cycles.
"""

from __future__ import annotations

from collections.abc import Callable

from gpupool.engine.state.cluster import ClusterState
from gpupool.engine.state.running import RunningSet
from gpupool.model import TopologyMode, TopologyScope, Workload


def plan_hold(
    w: Workload,
    pool: str,
    st: ClusterState,
    node_filter: Callable[[Workload], Callable[[int], bool]],
    runs: RunningSet,
    now: float,
) -> tuple[frozenset[int], float, str] | None:
    """Hold the nodes that will soonest be able to host ``w`` (a blocked whole-GPU workload),
    so that later, smaller work cannot keep fragmenting them; work that declares it will end
    before ``w`` can start may still backfill there. One hold per pool per cycle, for the
    best-ranked blocked workload; recomputed every cycle (the engine keeps no state).

    Returns the held node indices, when they are expected to be free, and the note for the
    workload's reason; None where no hold applies (not whole GPUs, no domain large enough, or
    the capacity is free already and something else blocks it)."""
    pods = [pg for pg in w.pod_groups for _ in range(pg.replicas)]
    if not pods or any(pg.request.gpus == 0 for pg in pods):
        return None
    inf = float("inf")
    topo = w.topology
    scope = topo.scope if topo is not None and topo.mode is TopologyMode.REQUIRED else None
    n_pods = len(pods)
    k = max(pg.request.gpus for pg in pods)
    if scope is TopologyScope.NODE:  # every pod on one node: one big pod
        k, n_pods = sum(pg.request.gpus for pg in pods), 1
    groups = _ready_times(w, pool, st, node_filter(w), runs, now, k, scope)
    best: tuple[float, str, list[tuple[float, int, int]]] | None = None
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
    held = frozenset(c[2] for c in chosen)
    names = ", ".join(st.nodes[c[2]].name for c in chosen[:4]) + (" ..." if len(chosen) > 4 else "")
    when = "when running work ends" if start == inf else f"expected from t={start:g}"
    return held, start, f"holding {len(held)} node(s) for it ({names}), {when}"


def _ready_times(
    w: Workload,
    pool: str,
    st: ClusterState,
    ok: Callable[[int], bool],
    runs: RunningSet,
    now: float,
    k: int,
    scope: TopologyScope | None,
) -> dict[str, list[tuple[float, int, int]]]:
    """Per topology domain (one domain without a required scope), every node of ``pool`` that
    could host a ``k``-GPU pod of ``w`` as (when ``k`` devices are expected free, minus its
    free devices now, node index)."""
    inf = float("inf")
    groups: dict[str, list[tuple[float, int, int]]] = {}
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
                busy = runs.busy_ends(node.name)
                t = busy[need - 1] if need <= len(busy) else inf
            dom = node.domain(scope) if scope is not None and scope is not TopologyScope.NODE else ""
            groups.setdefault(dom, []).append((t, -free_now, i))
    return groups
