"""What the API shows of the controller's state: pool capacity and allocation, quota per queue
and pool, device allocation, pending and running counts.

Why a read model: the engine's state is built for the scheduling cycle (one-letter quota
vectors, bucket indexes, undo logs) and changes shape when the engine does. The routes ask
these questions instead of reading ``ctl.engine``, so an engine change touches one small module,
and each answer is taken under the controller's lock (a consistent picture between cycles).
Values are integers as the engine keeps them (GPU in milli); the routes format them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpupool.model import ZERO, Node, ResourcePool

if TYPE_CHECKING:
    from gpupool.service.controller import Controller

#: a quota vector: device milli, CPU milli, memory MiB, ephemeral storage MiB, bandwidth Mbit/s
#: (UNLIMITED where there is no limit); the engine's own vector type
Vec = tuple[int, int, int, int, int]


@dataclass(frozen=True, slots=True)
class PoolUsage:
    """One pool of the configuration in force, with what it holds and what is handed out."""

    pool: ResourcePool
    capacity_gpu_milli: int
    allocated_gpu_milli: int
    nodes: int


@dataclass(frozen=True, slots=True)
class ClusterSummary:
    pools: list[PoolUsage]
    nodes: int
    gpus: int
    pending: int
    running: int
    cycles: int


@dataclass(frozen=True, slots=True)
class QuotaRow:
    """A queue's quota in one pool: guarantee, limit (guarantee + borrowing) and subtree use."""

    queue: str
    pool: str
    parent: str | None
    guarantee: Vec
    limit: Vec
    used: Vec


@dataclass(frozen=True, slots=True)
class DeviceUse:
    """One running pod's share of one device."""

    workload: str
    queue: str
    gpu_milli: int


class ControllerReadModel:
    """Read-only questions the API asks of a controller (never cached: the engine is replaced
    whenever the configuration changes)."""

    def __init__(self, controller: Controller) -> None:
        self._ctl = controller

    def pool_usage(self) -> list[PoolUsage]:
        """Every pool in configuration order (for /v1/cluster and the metrics)."""
        ctl = self._ctl
        with ctl.lock:
            eng = ctl.engine
            return [
                PoolUsage(
                    pool,
                    eng.quota.capacity.get(pool.name, ZERO)[0],
                    eng.cluster.used_gpu_milli(pool.name),
                    sum(1 for n in ctl.bundle.nodes if pool.selects(n)),
                )
                for pool in ctl.bundle.pools
            ]

    def cluster_summary(self) -> ClusterSummary:
        ctl = self._ctl
        with ctl.lock:
            nodes = ctl.bundle.nodes
            return ClusterSummary(
                self.pool_usage(),
                len(nodes),
                sum(n.gpu_count for n in nodes),
                len(ctl.pending),
                len(ctl.engine.running),
                ctl.cycles,
            )

    def quota(
        self, queue: str | None = None, pool: str | None = None, visible: list[str] | None = None
    ) -> list[QuotaRow]:
        """Rows for the (queue, pool) pairs a queue may use, queues in configuration order;
        ``visible`` (None: all) limits the queues, ``queue`` and ``pool`` filter."""
        with self._ctl.lock:
            return list(self._quota_rows(queue, pool, visible))

    def _quota_rows(
        self, queue: str | None, pool: str | None, visible: list[str] | None
    ) -> Iterator[QuotaRow]:
        q = self._ctl.engine.quota
        for qn in q.queues:
            if (queue is not None and qn != queue) or (visible is not None and qn not in visible):
                continue
            for pl in q.pools:
                key = (qn, pl)
                if (pool is not None and pl != pool) or not q.usable.get(key):
                    continue
                f = q.figures(qn, pl)
                if f is not None:
                    yield QuotaRow(qn, pl, q.queues[qn].parent, f.guarantee, f.limit, f.used)

    def device_uses(self) -> dict[str, dict[int, list[DeviceUse]]]:
        """Node -> device index -> the running pods sharing it, in admission order."""
        out: dict[str, dict[int, list[DeviceUse]]] = {}
        for r in self._ctl.running_view().values():
            for pod in r.admission.pods:
                per_node = out.setdefault(pod.node, {})
                for d in pod.devices:
                    per_node.setdefault(d, []).append(DeviceUse(r.name, r.workload.queue, pod.gpu_milli))
        return out

    def nodes(self) -> list[tuple[Node, str | None]]:
        """Every node with the first pool (configuration order) that selects it."""
        bundle = self._ctl.bundle
        return [(n, next((pl.name for pl in bundle.pools if pl.selects(n)), None)) for n in bundle.nodes]

    def running_in_pool(self, pool: str) -> list[str]:
        """Names of the workloads placed in ``pool`` (a pool in use cannot be deleted)."""
        with self._ctl.lock:
            return [r.name for r in self._ctl.engine.running.values() if r.admission.pool == pool]


__all__ = ["ClusterSummary", "ControllerReadModel", "DeviceUse", "PoolUsage", "QuotaRow", "Vec"]
