"""Free capacity of every node and device for one scheduling cycle, with checkpoint and rollback.

The engine tries admissions and preemptions on this state and rolls back what it does not keep
(KAI's "statement" idea), so a cycle never needs to copy the cluster. Nodes are kept in buckets
by free whole devices and partially used devices in buckets by free milli-device (YuniKorn's
idea of a sorted node structure), so placement never rescans the cluster. The quota tree is
``state/quota.py``'s.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sortedcontainers import SortedSet

from gpupool.model import GPU, ZERO, Node, PodPlacement, ResourcePool, TopologyScope, Vec, vadd

FRAC_BUCKET = 50  # milli-GPU per bucket of the partial-device index
N_FRAC_BUCKETS = 1000 // FRAC_BUCKET


class PoolIndex:
    """Per pool and device model: nodes by free whole devices, partial devices by free milli.

    ``accelerator`` is the kind's resource name of the model's devices (a model is of one kind),
    so that a pod asking for NPUs walks only NPU indexes."""

    __slots__ = ("accelerator", "max_gpus", "model", "nodes", "partial", "whole")

    def __init__(self, model: str, max_gpus: int, accelerator: str = GPU) -> None:
        self.model = model
        self.accelerator = accelerator
        self.max_gpus = max_gpus
        self.nodes: list[int] = []
        # Buckets are sorted sets, so ties always break by node order, never by the history of
        # allocations and rollbacks: the same snapshot gives the same placement.
        # whole[k]: node indices with exactly k fully free devices
        self.whole: list[SortedSet] = [SortedSet() for _ in range(max_gpus + 1)]
        # partial[b]: (node, device) with free milli in [b*50, b*50+50), 0 < free < 1000
        self.partial: list[SortedSet] = [SortedSet() for _ in range(N_FRAC_BUCKETS)]

    def largest_free_block(self) -> int:
        for k in range(self.max_gpus, -1, -1):
            if self.whole[k]:
                return k
        return 0


class ClusterState:
    """Free capacity of every node and device, and the indexes over it."""

    def __init__(self, nodes: Iterable[Node], pools: Iterable[ResourcePool]) -> None:
        self.nodes: list[Node] = list(nodes)
        self.index: dict[str, int] = {n.name: i for i, n in enumerate(self.nodes)}
        self.free_cpu = [n.cpu_milli for n in self.nodes]
        self.free_mem = [n.memory_mib for n in self.nodes]
        self.free_rdma = [n.rdma for n in self.nodes]
        self.free_storage = [n.ephemeral_storage_mib for n in self.nodes]
        self.free_net = [n.network_mbps for n in self.nodes]
        self.dev_milli = [[1000] * n.gpu_count for n in self.nodes]
        self.dev_mem = [[n.gpu_memory_mib] * n.gpu_count for n in self.nodes]
        self.free_whole = [n.gpu_count for n in self.nodes]
        self.pools: dict[str, ResourcePool] = {p.name: p for p in pools}
        self.pool_of: list[str | None] = []
        self.by_pool: dict[str, dict[str, PoolIndex]] = {p: {} for p in self.pools}
        self.capacity: dict[str, Vec] = {p: ZERO for p in self.pools}
        #: GPU milli allocated per pool (kept up to date by every allocate/release)
        self.pool_used: dict[str, int] = dict.fromkeys(self.pools, 0)
        # topology: (pool, scope) -> domain -> [node indices]; free whole GPUs per (pool, scope, domain)
        self.domains: dict[tuple[str, TopologyScope], dict[str, list[int]]] = {}
        self.domain_free: dict[tuple[str, TopologyScope, str], int] = {}
        self._node_domains: list[tuple[tuple[str, TopologyScope, str], ...]] = []
        self.log: list[tuple[int, int, tuple[int, ...], int, int, int, int, int, int, int]] = []
        self._idx_cache: dict[tuple[str, tuple[str, ...], str | None], list[PoolIndex]] = {}
        #: per-cycle context of the fragmentation Score plugin (engine.fragscore.FragContext)
        self.frag: Any = None
        #: the fragmentation plugin's index of nodes by state class (engine.fragscore.ClassIndex),
        #: and the nodes whose free capacity changed since it last looked (None: nobody watches)
        self.frag_index: Any = None
        self.touched: set[int] | None = None
        #: devices out of placement (unhealthy), node index -> device -> why: held whole, so no
        #: pod lands there, and known apart from running work, so reasons never blame work
        self.withheld: dict[int, dict[int, str]] = {}
        #: changes whenever the inventory does (a device withheld): what is memoised over it
        #: (``feasible.Unsatisfiable``) starts afresh
        self.inventory_version = 0
        for i, n in enumerate(self.nodes):
            pool = next((p.name for p in self.pools.values() if p.selects(n)), None)
            self.pool_of.append(pool)
            doms: list[tuple[str, TopologyScope, str]] = []
            if pool is not None and n.schedulable:
                self.capacity[pool] = vadd(
                    self.capacity[pool],
                    (n.gpu_count * 1000, n.cpu_milli, n.memory_mib, n.ephemeral_storage_mib, n.network_mbps),
                )
                idx = self.by_pool[pool].get(n.gpu_model)
                if idx is None:
                    idx = self.by_pool[pool][n.gpu_model] = PoolIndex(n.gpu_model, n.gpu_count, n.accelerator)
                if n.gpu_count > idx.max_gpus:
                    idx.whole.extend(SortedSet() for _ in range(n.gpu_count - idx.max_gpus))
                    idx.max_gpus = n.gpu_count
                idx.nodes.append(i)
                idx.whole[n.gpu_count].add(i)
                for scope in (TopologyScope.NVLINK, TopologyScope.RACK):
                    key = n.domain(scope)
                    self.domains.setdefault((pool, scope), {}).setdefault(key, []).append(i)
                    dk = (pool, scope, key)
                    self.domain_free[dk] = self.domain_free.get(dk, 0) + n.gpu_count
                    doms.append(dk)
            self._node_domains.append(tuple(doms))

    # -- transactions -------------------------------------------------------------------------
    def checkpoint(self) -> int:
        return len(self.log)

    def rollback(self, cp: int) -> None:
        log = self.log
        while len(log) > cp:
            sign, i, devs, milli, mem, cpu, nmem, rdma, sto, net = log.pop()
            self._apply(-sign, i, devs, milli, mem, cpu, nmem, rdma, sto, net)

    def allocate(
        self,
        i: int,
        devs: tuple[int, ...],
        milli: int,
        mem: int,
        cpu: int,
        nmem: int,
        rdma: int,
        storage: int = 0,
        net: int = 0,
    ) -> None:
        self._apply(1, i, devs, milli, mem, cpu, nmem, rdma, storage, net)
        self.log.append((1, i, devs, milli, mem, cpu, nmem, rdma, storage, net))

    def release(
        self,
        i: int,
        devs: tuple[int, ...],
        milli: int,
        mem: int,
        cpu: int,
        nmem: int,
        rdma: int,
        storage: int = 0,
        net: int = 0,
    ) -> None:
        self._apply(-1, i, devs, milli, mem, cpu, nmem, rdma, storage, net)
        self.log.append((-1, i, devs, milli, mem, cpu, nmem, rdma, storage, net))

    def allocate_pod(self, p: PodPlacement) -> None:
        self.allocate(self.index[p.node], *_pod_args(p))

    def release_pod(self, p: PodPlacement) -> None:
        self.release(self.index[p.node], *_pod_args(p))

    def commit(self) -> None:
        """Forget the undo log (the caller keeps what it did)."""
        self.log.clear()

    def _apply(
        self,
        sign: int,
        i: int,
        devs: tuple[int, ...],
        milli: int,
        mem: int,
        cpu: int,
        nmem: int,
        rdma: int,
        storage: int = 0,
        net: int = 0,
    ) -> None:
        self.free_cpu[i] -= sign * cpu
        self.free_mem[i] -= sign * nmem
        self.free_rdma[i] -= sign * rdma
        if storage or net:  # most pods ask for neither
            self.free_storage[i] -= sign * storage
            self.free_net[i] -= sign * net
        if self.touched is not None:
            self.touched.add(i)
        if not devs:
            return
        pool = self.pool_of[i]
        idx = (
            self.by_pool[pool][self.nodes[i].gpu_model]
            if pool is not None and self.nodes[i].schedulable
            else None
        )
        if idx is not None:
            self.pool_used[pool] += sign * milli * len(devs)  # type: ignore[index]
        dm = self.dev_milli[i]
        dmem = self.dev_mem[i]
        old_whole = self.free_whole[i]
        whole = old_whole
        for d in devs:
            before = dm[d]
            after = before - sign * milli
            dm[d] = after
            dmem[d] -= sign * mem
            if before == 1000:
                whole -= 1
            if after == 1000:
                whole += 1
            if idx is not None:
                if 0 < before < 1000:
                    idx.partial[before // FRAC_BUCKET].discard((i, d))
                if 0 < after < 1000:
                    idx.partial[after // FRAC_BUCKET].add((i, d))
        if whole != old_whole:
            self.free_whole[i] = whole
            if idx is not None:
                idx.whole[old_whole].discard(i)
                idx.whole[whole].add(i)
                delta = whole - old_whole
                for dk in self._node_domains[i]:
                    self.domain_free[dk] += delta

    # -- queries ------------------------------------------------------------------------------
    def pool_indexes(self, pool: str, models: tuple[str, ...], kind: str | None = None) -> list[PoolIndex]:
        """The indexes of a pool's device models (all, or those named), of one accelerator kind
        where ``kind`` names it (None: every kind, as for pods without devices)."""
        key = (pool, models, kind)
        got = self._idx_cache.get(key)
        if got is None:
            per_model = self.by_pool.get(pool, {})
            got = [
                per_model[m]
                for m in sorted(per_model)
                if (not models or m in models) and (kind is None or per_model[m].accelerator == kind)
            ]
            self._idx_cache[key] = got
        return got

    def withhold(self, i: int, d: int, why: str) -> None:
        """Take device ``d`` of node ``i`` out of placement (held whole), recording why; a device
        already in use is left to the caller (its work must be evicted first)."""
        if 0 <= d < len(self.dev_milli[i]) and self.dev_milli[i][d] == 1000:
            self.allocate(i, (d,), 1000, self.dev_mem[i][d], 0, 0, 0)
            self.withheld.setdefault(i, {})[d] = why
            self.inventory_version += 1

    def healthy_gpus(self, i: int) -> int:
        """Node ``i``'s devices that are not withheld: what it could host with nothing running."""
        return self.nodes[i].gpu_count - len(self.withheld.get(i, ()))

    def kinds(self, pool: str) -> tuple[str, ...]:
        """The accelerator kinds (resource names) of a pool's schedulable nodes."""
        return tuple(sorted({ix.accelerator for ix in self.by_pool.get(pool, {}).values()}))

    def used_gpu_milli(self, pool: str | None = None) -> int:
        total = 0
        for i, n in enumerate(self.nodes):
            if pool is not None and self.pool_of[i] != pool:
                continue
            total += n.gpu_count * 1000 - sum(self.dev_milli[i])
        return total


def _pod_args(p: PodPlacement) -> tuple[tuple[int, ...], int, int, int, int, int, int, int]:
    return (
        p.devices,
        p.gpu_milli,
        p.gpu_memory_mib,
        p.cpu_milli,
        p.memory_mib,
        p.rdma,
        p.storage_mib,
        p.network_mbps,
    )
