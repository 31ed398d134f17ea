"""Gang placement: every pod of a workload on real nodes and devices at once, or none.

Where each pod goes is a Score plugin's choice (``engine/scoring.py``: the protocol,
``binpack`` and ``spread``; ``engine/fragscore.py``: ``fragmentation`` and ``auto``); this module
holds their registry by name, the Filter step (schedulable, taints, node selector, nodes held
for a blocked head), gang placement with its rollback, topology domains, and the reason a gang
does not fit.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpupool.engine.fragscore import AutoScore, FragAware
from gpupool.engine.holds import Holds
from gpupool.engine.scoring import (
    BinPack,
    NodeFilter,
    Scorer,
    Spread,
    fits_node,
    free_devices,
    mem_for,
)
from gpupool.engine.state.cluster import N_FRAC_BUCKETS, ClusterState, PoolIndex
from gpupool.model import (
    PlacementPolicy,
    PodPlacement,
    PodRequest,
    TopologyMode,
    TopologyScope,
    Workload,
    device_noun,
)
from gpupool.quantity import format_mbps, format_mib


@dataclass(slots=True)  # internal and short-lived: a frozen __init__ costs 3x per pod
class PodSpec:
    group: str
    index: int
    req: PodRequest


#: the Score plugins by name (pools and the engine config name one); the built-in ones, and any
#: added with ``register_scorer`` (the simulator adds ``first-fit``)
SCORERS: dict[str, Scorer] = {
    "binpack": BinPack(),
    "spread": Spread(),
    "fragmentation": FragAware(),
    "auto": AutoScore(),
}


def register_scorer(scorer: Scorer) -> None:
    """Add a Score plugin; pools and the engine config refer to it by name."""
    SCORERS[scorer.name] = scorer


def expand_pods(w: Workload) -> list[PodSpec]:
    """Pods of a workload, biggest first (packing big items first wastes less)."""
    if len(w.pod_groups) == 1:  # one request shape: already in order (the sort is stable)
        g = w.pod_groups[0]
        return [PodSpec(g.name, r, g.request) for r in range(g.replicas)]
    pods = [PodSpec(g.name, r, g.request) for g in w.pod_groups for r in range(g.replicas)]
    pods.sort(key=lambda p: (-p.req.total_gpu_milli, -p.req.cpu_milli, -p.req.memory_mib))
    return pods


@dataclass(slots=True)
class PlaceResult:
    pods: list[PodPlacement] | None
    reason: str
    topology: bool = False


class Placer:
    """Places gangs on a ClusterState; successful placements stay allocated in the state."""

    def __init__(self, st: ClusterState, default_scorer: str = "binpack") -> None:
        self.st = st
        self.default_scorer = default_scorer
        #: the cycle's planned starts of blocked workloads (``engine/holds.py``)
        self.holds = Holds({p.name: p.reservations for p in st.pools.values()})
        self.now = 0.0
        self._label_maps = [n.label_map for n in st.nodes]
        self._tainted = [bool(n.taints) for n in st.nodes]

    def scorer_for(self, pool: str) -> Scorer:
        p = self.st.pools.get(pool)
        if p is not None and p.placement is PlacementPolicy.SPREAD:
            return SCORERS["spread"]
        if p is not None and p.placement is PlacementPolicy.FRAGMENTATION:
            return SCORERS["fragmentation"]
        if p is not None and p.placement is PlacementPolicy.BINPACK:
            return SCORERS["binpack"]
        return SCORERS.get(self.default_scorer, SCORERS["binpack"])

    def node_filter(self, w: Workload) -> NodeFilter:
        """Filter extension point: schedulable, taints tolerated, node selector matched."""
        nodes = self.st.nodes
        tainted = self._tainted
        tol = w.tolerations
        sel = w.node_selector
        labels = self._label_maps
        if not sel:

            def ok(i: int) -> bool:
                if not tainted[i]:
                    return True
                return all(
                    any(t.tolerates(tn) for t in tol)
                    for tn in nodes[i].taints
                    if tn.effect != "PreferNoSchedule"
                )

            return ok

        def ok_sel(i: int) -> bool:
            lm = labels[i]
            if any(lm.get(k) != v for k, v in sel):
                return False
            if not tainted[i]:
                return True
            return all(
                any(t.tolerates(tn) for t in tol) for tn in nodes[i].taints if tn.effect != "PreferNoSchedule"
            )

        return ok_sel

    # -- one pod ------------------------------------------------------------------------------
    def _place_pod(
        self, p: PodSpec, idxs: list[PoolIndex], scorer: Scorer, ok: NodeFilter
    ) -> PodPlacement | None:
        st = self.st
        r = p.req
        ok = pod_filter(st, r, ok)
        if r.gpus:
            i = scorer.pick_whole(st, idxs, r.gpus, r, ok)
            if i is None:
                return None
            return self._bind(p, i, tuple(free_devices(st, i, r.gpus)), 1000, st.nodes[i].gpu_memory_mib)
        if r.gpu_milli:
            got = scorer.pick_fraction(st, idxs, r, ok)
            if got is None:
                return None
            i, d = got
            return self._bind(p, i, (d,), r.gpu_milli, mem_for(st, i, r))
        # CPU-only pod: on the node with the fewest free GPUs that fits, so that its CPU and
        # memory are not taken from nodes whose GPUs are still free (that strands GPUs)
        i = scorer.pick_cpu(st, idxs, r, ok)
        if i is None:
            return None
        return self._bind(p, i, (), 0, 0)

    def _bind(self, p: PodSpec, i: int, devs: tuple[int, ...], milli: int, mem: int) -> PodPlacement:
        """Allocate the pod on node ``i`` (its devices, CPU, memory, RDMA, storage, bandwidth)."""
        r = p.req
        sto, net = r.storage_mib, r.network_mbps
        self.st.allocate(i, devs, milli, mem, r.cpu_milli, r.memory_mib, r.rdma, sto, net)
        name = self.st.nodes[i].name
        return PodPlacement(
            p.group, p.index, name, devs, milli, mem, r.cpu_milli, r.memory_mib, r.rdma, sto, net
        )

    def _place_in_nodes(self, p: PodSpec, nodes: list[int], ok: NodeFilter) -> PodPlacement | None:
        """Best fit restricted to a topology domain's nodes (small lists: a linear scan is fine)."""
        st = self.st
        r = p.req
        ok = pod_filter(st, r, ok)
        kind = r.accelerator if r.gpus or r.gpu_milli else None
        best: tuple[int, int, int] | None = None  # (score, node, device)
        for i in nodes:
            if not fits_node(st, i, r) or not ok(i):
                continue
            if kind is not None and st.nodes[i].accelerator != kind:
                continue
            if r.gpus:
                fw = st.free_whole[i]
                if fw >= r.gpus and (best is None or fw < best[0]):
                    best = (fw, i, -1)
            elif r.gpu_milli:
                dm = st.dev_milli[i]
                for d, free in enumerate(dm):
                    if free >= r.gpu_milli and st.dev_mem[i][d] >= mem_for(st, i, r):
                        score = free if free < 1000 else 1000 + st.free_whole[i]
                        if best is None or score < best[0]:
                            best = (score, i, d)
            else:
                best = (0, i, -1)
                break
        if best is None:
            return None
        _, i, d = best
        if r.gpus:
            return self._bind(p, i, tuple(free_devices(st, i, r.gpus)), 1000, st.nodes[i].gpu_memory_mib)
        if r.gpu_milli:
            return self._bind(p, i, (d,), r.gpu_milli, mem_for(st, i, r))
        return self._bind(p, i, (), 0, 0)

    # -- a whole gang -------------------------------------------------------------------------
    def place(self, w: Workload, pool: str, max_domain_tries: int = 64) -> PlaceResult:
        st = self.st
        idxs = st.pool_indexes(pool, w.gpu_models)
        pods = expand_pods(w)
        if not idxs:
            models = ", ".join(w.gpu_models) or "any"
            return PlaceResult(None, f"pool {pool} has no schedulable nodes with GPU model {models}")
        missing = self._missing_kind(w, pool, pods)
        if missing is not None:
            return PlaceResult(None, missing)
        ok = self.node_filter(w)
        holds = self.holds
        if holds.in_pool(pool) and not holds.may_backfill(w, pool, self.now):
            held_now = holds.blocked_for(w, self.now)
            base_ok = ok

            def ok(i: int) -> bool:
                return not held_now(i) and base_ok(i)

        need_whole = sum(p.req.gpus for p in pods)
        topo = w.topology
        if topo is not None and (len(pods) > 1 or topo.scope is not TopologyScope.NODE):
            res = self._place_topology(w, pool, pods, idxs, ok, need_whole, max_domain_tries)
            if res.pods is not None or topo.mode is TopologyMode.REQUIRED:
                return res
        return self._place_sequential(w, pool, pods, idxs, ok)

    def may_backfill(self, w: Workload, pool: str) -> bool:
        """Backfill: work may use every node held in ``pool`` only if it ends before the
        earliest planned start there (its declared duration says so)."""
        return self.holds.may_backfill(w, pool, self.now)

    def _place_sequential(
        self, w: Workload, pool: str, pods: list[PodSpec], idxs: list[PoolIndex], ok: NodeFilter
    ) -> PlaceResult:
        st = self.st
        scorer = self.scorer_for(pool)
        cp = st.checkpoint()
        out: list[PodPlacement] = []
        failed: PodSpec | None = None
        for p in pods:
            r = p.req
            mine = st.pool_indexes(pool, w.gpu_models, r.accelerator) if r.gpus or r.gpu_milli else idxs
            pl = self._place_pod(p, mine, scorer, ok)
            if pl is None:
                if failed is None:
                    failed = p
                if w.min_pods >= len(pods):
                    break
                continue
            out.append(pl)
        if len(out) >= w.min_pods:
            return PlaceResult(out, "")
        st.rollback(cp)
        assert failed is not None
        return PlaceResult(None, self._why(w, pool, failed, len(out), len(pods), idxs))

    def _missing_kind(self, w: Workload, pool: str, pods: list[PodSpec]) -> str | None:
        """A pod group asks for an accelerator kind the pool has no schedulable node of."""
        for p in pods:
            r = p.req
            if (r.gpus or r.gpu_milli) and not self.st.pool_indexes(pool, w.gpu_models, r.accelerator):
                have = ", ".join(self.st.kinds(pool)) or "none"
                return (
                    f"pod group {p.group} asks for {r.accelerator}; pool {pool} has no schedulable nodes "
                    f"of that kind{' and GPU model ' + ', '.join(w.gpu_models) if w.gpu_models else ''} "
                    f"(its kinds: {have})"
                )
        return None

    def _why(self, w: Workload, pool: str, p: PodSpec, placed: int, total: int, idxs: list[PoolIndex]) -> str:
        r = p.req
        if r.gpus or r.gpu_milli:
            idxs = self.st.pool_indexes(pool, w.gpu_models, r.accelerator)
        noun = device_noun(r.accelerator)
        models = "/".join(ix.model for ix in idxs)
        gang = (
            f"gang of {total} pods: placed {placed} before pod {p.group}-{p.index} failed; "
            if total > 1
            else ""
        )
        if r.gpus:
            largest = max(ix.largest_free_block() for ix in idxs)
            return (
                f"{gang}needs {r.gpus} free {models} {noun}s on one node (cpu {r.cpu_milli}m, memory {r.memory_mib}Mi"
                f"{_extras(r)}); "
                f"the largest free block in pool {pool} is {largest}"
            )
        if r.gpu_milli:
            best = 0
            for ix in idxs:
                if ix.largest_free_block() > 0:
                    best = 1000
                    break
                for b in range(N_FRAC_BUCKETS - 1, -1, -1):
                    if ix.partial[b]:
                        best = max(best, max(self.st.dev_milli[i][d] for i, d in ix.partial[b]))
                        break
            return (
                f"{gang}needs {r.gpu_milli / 1000:g} of one {models} {noun}"
                f"{f' with {r.gpu_memory_mib}Mi memory' if r.gpu_memory_mib else ''}; "
                f"the largest free share in pool {pool} is {best / 1000:g}"
            )
        return (
            f"{gang}needs cpu {r.cpu_milli}m and memory {r.memory_mib}Mi{_extras(r)} on one node of pool {pool}; "
            "none has room"
        )

    def _place_topology(
        self,
        w: Workload,
        pool: str,
        pods: list[PodSpec],
        idxs: list[PoolIndex],
        ok: NodeFilter,
        need_whole: int,
        max_tries: int,
    ) -> PlaceResult:
        st = self.st
        assert w.topology is not None
        scope = w.topology.scope
        models = {ix.model for ix in idxs}
        if scope is TopologyScope.NODE:
            cands: list[tuple[int, str, list[int]]] = []
            for ix in idxs:
                for j in range(max(need_whole, 0), ix.max_gpus + 1):
                    for i in ix.whole[j]:
                        cands.append((j, st.nodes[i].name, [i]))
                        if len(cands) >= max_tries * 4:
                            break
            cands.sort(key=lambda c: (c[0], c[1]))
            largest = max(ix.largest_free_block() for ix in idxs)
        else:
            doms = st.domains.get((pool, scope), {})
            cands = []
            largest = 0
            for key, nodes in doms.items():
                free = st.domain_free[(pool, scope, key)]
                largest = max(largest, free)
                if free >= need_whole:
                    sel = [i for i in nodes if st.nodes[i].gpu_model in models]
                    if sel:
                        cands.append((free, key, sel))
            cands.sort(key=lambda c: (c[0], c[1]))
        for _free, _key, nodes in cands[:max_tries]:
            cp = st.checkpoint()
            out: list[PodPlacement] = []
            for p in pods:
                pl = self._place_in_nodes(p, nodes, ok)
                if pl is None:
                    break
                out.append(pl)
            if len(out) == len(pods):
                return PlaceResult(out, "", topology=True)
            st.rollback(cp)
        label = {"node": "one node", "nvlink": "one NVLink domain", "rack": "one rack"}[scope.value]
        return PlaceResult(
            None,
            f"needs {len(pods)} pods with {need_whole} whole GPUs in {label} of pool {pool}; "
            f"the largest free block is {largest}"
            + (f" ({len(cands)} candidate domains tried, none fits every pod)" if cands else ""),
            topology=True,
        )


def pod_filter(st: ClusterState, r: PodRequest, ok: NodeFilter) -> NodeFilter:
    """Filter extension point, per pod: ephemeral storage and network bandwidth are checked like
    RDMA, but in the filter rather than in every scorer's inner loop, and only for the pods that
    ask for them (most do not, and then the workload's filter is used as it is)."""
    if not (r.storage_mib or r.network_mbps):
        return ok
    free_sto, free_net = st.free_storage, st.free_net
    sto, net = r.storage_mib, r.network_mbps
    return lambda i: free_sto[i] >= sto and free_net[i] >= net and ok(i)


def _extras(r: PodRequest) -> str:
    """The storage and bandwidth a pod asks for, for reasons (empty when it asks for neither)."""
    out = f", ephemeral-storage {format_mib(r.storage_mib)}" if r.storage_mib else ""
    return out + (f", network {format_mbps(r.network_mbps)}" if r.network_mbps else "")


# the names these helpers had before they moved to ``engine/scoring.py``: still imported from
# here by ``tests/engine/test_fragscore.py``
_mem_for = mem_for
_free_devices = free_devices
