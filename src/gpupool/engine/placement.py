"""Gang placement: every pod of a workload on real nodes and devices at once, or none.

Scoring is a plugin (the Score extension point): ``binpack`` keeps whole nodes free for big
jobs, ``spread`` keeps headroom per node. Both walk the bucket indexes of ``ClusterState`` so a
placement costs about the same on 50 nodes or 5,000.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from gpupool.engine.state import FRAC_BUCKET, N_FRAC_BUCKETS, ClusterState, PoolIndex
from gpupool.model import (
    PlacementPolicy,
    PodPlacement,
    PodRequest,
    TopologyMode,
    TopologyScope,
    Workload,
)

NodeFilter = Callable[[int], bool]


@dataclass(slots=True)  # internal and short-lived: a frozen __init__ costs 3x per pod
class PodSpec:
    group: str
    index: int
    req: PodRequest


class Scorer(Protocol):
    """Score extension point: choose a node (and devices) for one pod among feasible ones."""

    name: str

    def pick_whole(
        self, st: ClusterState, idxs: list[PoolIndex], k: int, req: PodRequest, ok: NodeFilter
    ) -> int | None: ...

    def pick_fraction(
        self, st: ClusterState, idxs: list[PoolIndex], req: PodRequest, ok: NodeFilter
    ) -> tuple[int, int] | None: ...


def _mem_for(st: ClusterState, i: int, req: PodRequest) -> int:
    """GPU memory a fractional pod is limited to: as requested, else its compute share of the device."""
    if req.gpu_memory_mib:
        return req.gpu_memory_mib
    return req.gpu_milli * st.nodes[i].gpu_memory_mib // 1000


def _with_device_memory(st: ClusterState, req: PodRequest, ok: NodeFilter) -> NodeFilter:
    """A fresh device must also hold the fractional pod's GPU memory (nodes differ in GPU model)."""
    if not req.gpu_memory_mib:
        return ok
    need = req.gpu_memory_mib
    return lambda i: st.nodes[i].gpu_memory_mib >= need and ok(i)


def _fits_node(st: ClusterState, i: int, req: PodRequest) -> bool:
    return (
        st.free_cpu[i] >= req.cpu_milli and st.free_mem[i] >= req.memory_mib and st.free_rdma[i] >= req.rdma
    )


def first_whole(
    st: ClusterState, idxs: list[PoolIndex], buckets: Iterable[int], req: PodRequest, ok: NodeFilter
) -> int | None:
    """The first feasible node, walking the free-GPU buckets in the order given."""
    for j in buckets:
        for ix in idxs:
            if j > ix.max_gpus:
                continue
            for i in ix.whole[j]:
                if _fits_node(st, i, req) and ok(i):
                    return i
    return None


def first_shared(
    st: ClusterState, idxs: list[PoolIndex], buckets: Iterable[int], req: PodRequest, ok: NodeFilter
) -> tuple[int, int] | None:
    """The first partly used device that holds the fractional pod, walking free-milli buckets."""
    m = req.gpu_milli
    for b in buckets:
        for ix in idxs:
            for i, d in ix.partial[b]:
                if (
                    st.dev_milli[i][d] >= m
                    and st.dev_mem[i][d] >= _mem_for(st, i, req)
                    and _fits_node(st, i, req)
                    and ok(i)
                ):
                    return i, d
    return None


def _top(idxs: list[PoolIndex]) -> int:
    return max((ix.max_gpus for ix in idxs), default=0)


class BinPack:
    """Best fit: the node with the fewest free GPUs that still fits; the fullest shared device."""

    name = "binpack"

    def pick_whole(
        self, st: ClusterState, idxs: list[PoolIndex], k: int, req: PodRequest, ok: NodeFilter
    ) -> int | None:
        return first_whole(st, idxs, range(k, _top(idxs) + 1), req, ok)

    def pick_fraction(
        self, st: ClusterState, idxs: list[PoolIndex], req: PodRequest, ok: NodeFilter
    ) -> tuple[int, int] | None:
        got = first_shared(st, idxs, range(req.gpu_milli // FRAC_BUCKET, N_FRAC_BUCKETS), req, ok)
        if got is not None:
            return got
        node = self.pick_whole(st, idxs, 1, req, _with_device_memory(st, req, ok))
        if node is None:
            return None
        return node, _free_devices(st, node, 1)[0]


class Spread:
    """Worst fit: the node with the most free GPUs, to keep per-node headroom (inference pools)."""

    name = "spread"

    def pick_whole(
        self, st: ClusterState, idxs: list[PoolIndex], k: int, req: PodRequest, ok: NodeFilter
    ) -> int | None:
        return first_whole(st, idxs, range(_top(idxs), k - 1, -1), req, ok)

    def pick_fraction(
        self, st: ClusterState, idxs: list[PoolIndex], req: PodRequest, ok: NodeFilter
    ) -> tuple[int, int] | None:
        i = self.pick_whole(st, idxs, 1, req, _with_device_memory(st, req, ok))
        if i is not None:
            return i, _free_devices(st, i, 1)[0]
        return first_shared(
            st, idxs, range(N_FRAC_BUCKETS - 1, req.gpu_milli // FRAC_BUCKET - 1, -1), req, ok
        )


SCORERS: dict[str, Scorer] = {"binpack": BinPack(), "spread": Spread()}


def _register_builtin() -> None:
    from gpupool.engine.fragscore import AutoScore, FragAware

    SCORERS["fragmentation"] = FragAware()
    SCORERS["auto"] = AutoScore()


def register_scorer(scorer: Scorer) -> None:
    """Add a Score plugin; pools and the engine config refer to it by name."""
    SCORERS[scorer.name] = scorer


_register_builtin()


def pick_cpu_only(st: ClusterState, idxs: list[PoolIndex], req: PodRequest, ok: NodeFilter) -> int | None:
    """The node with the fewest fully free GPUs that fits a pod without GPUs."""
    return first_whole(st, idxs, range(_top(idxs) + 1), req, ok)


def _free_devices(st: ClusterState, i: int, k: int) -> list[int]:
    dm = st.dev_milli[i]
    out = [d for d in range(len(dm)) if dm[d] == 1000]
    return out[:k]


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
        # pool -> (reserved node indices, expected start of the reserving workload, its name)
        self.reserved: dict[str, tuple[frozenset[int], float, str]] = {}
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
        if r.gpus:
            i = scorer.pick_whole(st, idxs, r.gpus, r, ok)
            if i is None:
                return None
            devs = tuple(_free_devices(st, i, r.gpus))
            mem = st.nodes[i].gpu_memory_mib
            st.allocate(i, devs, 1000, mem, r.cpu_milli, r.memory_mib, r.rdma)
            return PodPlacement(
                p.group, p.index, st.nodes[i].name, devs, 1000, mem, r.cpu_milli, r.memory_mib, r.rdma
            )
        if r.gpu_milli:
            got = scorer.pick_fraction(st, idxs, r, ok)
            if got is None:
                return None
            i, d = got
            mem = _mem_for(st, i, r)
            st.allocate(i, (d,), r.gpu_milli, mem, r.cpu_milli, r.memory_mib, r.rdma)
            return PodPlacement(
                p.group, p.index, st.nodes[i].name, (d,), r.gpu_milli, mem, r.cpu_milli, r.memory_mib, r.rdma
            )
        # CPU-only pod: on the node with the fewest free GPUs that fits, so that its CPU and
        # memory are not taken from nodes whose GPUs are still free (that strands GPUs)
        pick_cpu = getattr(scorer, "pick_cpu", None)
        i = pick_cpu(st, idxs, r, ok) if pick_cpu is not None else pick_cpu_only(st, idxs, r, ok)
        if i is None:
            return None
        st.allocate(i, (), 0, 0, r.cpu_milli, r.memory_mib, r.rdma)
        return PodPlacement(p.group, p.index, st.nodes[i].name, (), 0, 0, r.cpu_milli, r.memory_mib, r.rdma)

    def _place_in_nodes(self, p: PodSpec, nodes: list[int], ok: NodeFilter) -> PodPlacement | None:
        """Best fit restricted to a topology domain's nodes (small lists: a linear scan is fine)."""
        st = self.st
        r = p.req
        best: tuple[int, int, int] | None = None  # (score, node, device)
        for i in nodes:
            if not _fits_node(st, i, r) or not ok(i):
                continue
            if r.gpus:
                fw = st.free_whole[i]
                if fw >= r.gpus and (best is None or fw < best[0]):
                    best = (fw, i, -1)
            elif r.gpu_milli:
                dm = st.dev_milli[i]
                for d, free in enumerate(dm):
                    if free >= r.gpu_milli and st.dev_mem[i][d] >= _mem_for(st, i, r):
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
            devs = tuple(_free_devices(st, i, r.gpus))
            mem = st.nodes[i].gpu_memory_mib
            st.allocate(i, devs, 1000, mem, r.cpu_milli, r.memory_mib, r.rdma)
            return PodPlacement(
                p.group, p.index, st.nodes[i].name, devs, 1000, mem, r.cpu_milli, r.memory_mib, r.rdma
            )
        if r.gpu_milli:
            mem = _mem_for(st, i, r)
            st.allocate(i, (d,), r.gpu_milli, mem, r.cpu_milli, r.memory_mib, r.rdma)
            return PodPlacement(
                p.group, p.index, st.nodes[i].name, (d,), r.gpu_milli, mem, r.cpu_milli, r.memory_mib, r.rdma
            )
        st.allocate(i, (), 0, 0, r.cpu_milli, r.memory_mib, r.rdma)
        return PodPlacement(p.group, p.index, st.nodes[i].name, (), 0, 0, r.cpu_milli, r.memory_mib, r.rdma)

    # -- a whole gang -------------------------------------------------------------------------
    def place(self, w: Workload, pool: str, max_domain_tries: int = 64) -> PlaceResult:
        st = self.st
        idxs = st.pool_indexes(pool, w.gpu_models)
        pods = expand_pods(w)
        if not idxs:
            models = ", ".join(w.gpu_models) or "any"
            return PlaceResult(None, f"pool {pool} has no schedulable nodes with GPU model {models}")
        ok = self.node_filter(w)
        held = self.reserved.get(pool)
        if held is not None and not self.may_backfill(w, pool):
            nodes_held = held[0]
            base_ok = ok

            def ok(i: int) -> bool:
                return i not in nodes_held and base_ok(i)

        need_whole = sum(p.req.gpus for p in pods)
        topo = w.topology
        if topo is not None and (len(pods) > 1 or topo.scope is not TopologyScope.NODE):
            res = self._place_topology(w, pool, pods, idxs, ok, need_whole, max_domain_tries)
            if res.pods is not None or topo.mode is TopologyMode.REQUIRED:
                return res
        return self._place_sequential(w, pool, pods, idxs, ok)

    def may_backfill(self, w: Workload, pool: str) -> bool:
        """Backfill: work may use nodes held for a blocked head only if it ends before the head
        can start (its declared duration says so)."""
        held = self.reserved.get(pool)
        if held is None:
            return True
        d = w.expected_duration_s
        return d is not None and self.now + d <= held[1]

    def _place_sequential(
        self, w: Workload, pool: str, pods: list[PodSpec], idxs: list[PoolIndex], ok: NodeFilter
    ) -> PlaceResult:
        st = self.st
        scorer = self.scorer_for(pool)
        cp = st.checkpoint()
        out: list[PodPlacement] = []
        failed: PodSpec | None = None
        for p in pods:
            pl = self._place_pod(p, idxs, scorer, ok)
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

    def _why(self, w: Workload, pool: str, p: PodSpec, placed: int, total: int, idxs: list[PoolIndex]) -> str:
        r = p.req
        models = "/".join(ix.model for ix in idxs)
        gang = (
            f"gang of {total} pods: placed {placed} before pod {p.group}-{p.index} failed; "
            if total > 1
            else ""
        )
        if r.gpus:
            largest = max(ix.largest_free_block() for ix in idxs)
            return (
                f"{gang}needs {r.gpus} free {models} GPUs on one node (cpu {r.cpu_milli}m, memory {r.memory_mib}Mi); "
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
                f"{gang}needs {r.gpu_milli / 1000:g} of one {models} GPU"
                f"{f' with {r.gpu_memory_mib}Mi memory' if r.gpu_memory_mib else ''}; "
                f"the largest free share in pool {pool} is {best / 1000:g}"
            )
        return f"{gang}needs cpu {r.cpu_milli}m and memory {r.memory_mib}Mi on one node of pool {pool}; none has room"

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
