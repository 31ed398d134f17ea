"""The Score extension point: the protocol a scorer implements, and the bucket-walking scorers.

A scorer chooses, among the nodes that pass the filters, where one pod goes: ``binpack`` (best
fit: keep whole nodes free for big jobs) and ``spread`` (worst fit: keep headroom per node). Both
walk the bucket indexes of ``ClusterState``, so a pick costs about the same on 50 nodes or
5,000. The fragmentation-aware scorers (``engine/fragscore.py``) build on these helpers, and the
registry of scorers by name lives in ``engine/placement.py``, which imports both: no module here
needs to import the other back.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from gpupool.engine.state.cluster import FRAC_BUCKET, N_FRAC_BUCKETS, ClusterState, PoolIndex
from gpupool.model import PodRequest

NodeFilter = Callable[[int], bool]


class Scorer(Protocol):
    """Score extension point: choose a node (and devices) for one pod among feasible ones.

    ``pick_cpu`` places a pod without GPUs; a scorer with no view of its own on those returns
    what ``pick_cpu_only`` says (as ``BinPack`` and ``Spread`` do)."""

    name: str

    def pick_whole(
        self, st: ClusterState, idxs: list[PoolIndex], k: int, req: PodRequest, ok: NodeFilter
    ) -> int | None: ...

    def pick_fraction(
        self, st: ClusterState, idxs: list[PoolIndex], req: PodRequest, ok: NodeFilter
    ) -> tuple[int, int] | None: ...

    def pick_cpu(
        self, st: ClusterState, idxs: list[PoolIndex], req: PodRequest, ok: NodeFilter
    ) -> int | None: ...


def mem_for(st: ClusterState, i: int, req: PodRequest) -> int:
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


def fits_node(st: ClusterState, i: int, req: PodRequest) -> bool:
    """Has node ``i`` the CPU, memory and RDMA the pod asks for (its GPUs are checked apart)?"""
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
                if fits_node(st, i, req) and ok(i):
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
                    and st.dev_mem[i][d] >= mem_for(st, i, req)
                    and fits_node(st, i, req)
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
        return node, free_devices(st, node, 1)[0]

    def pick_cpu(
        self, st: ClusterState, idxs: list[PoolIndex], req: PodRequest, ok: NodeFilter
    ) -> int | None:
        return pick_cpu_only(st, idxs, req, ok)


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
            return i, free_devices(st, i, 1)[0]
        return first_shared(
            st, idxs, range(N_FRAC_BUCKETS - 1, req.gpu_milli // FRAC_BUCKET - 1, -1), req, ok
        )

    def pick_cpu(
        self, st: ClusterState, idxs: list[PoolIndex], req: PodRequest, ok: NodeFilter
    ) -> int | None:
        return pick_cpu_only(st, idxs, req, ok)


def pick_cpu_only(st: ClusterState, idxs: list[PoolIndex], req: PodRequest, ok: NodeFilter) -> int | None:
    """The node with the fewest fully free GPUs that fits a pod without GPUs."""
    return first_whole(st, idxs, range(_top(idxs) + 1), req, ok)


def free_devices(st: ClusterState, i: int, k: int) -> list[int]:
    dm = st.dev_milli[i]
    out = [d for d in range(len(dm)) if dm[d] == 1000]
    return out[:k]
