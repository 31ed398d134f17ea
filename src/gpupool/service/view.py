"""Lookups on a configuration (queue tree, pools, quota limits) that submission checks need.

Why a separate view: ``POST /v1/apply`` must check workloads against the configuration as it
*will be* once the set's queues and pools are applied — a new Queue and a workload in it, in one
request — before anything is written, so that a set applies whole or not at all. The controller
offers the same lookups on the configuration in force; both share ``ConfigLookups``.
"""

from __future__ import annotations

from gpupool.engine import Engine
from gpupool.manifests import Bundle
from gpupool.model import Queue, ResourcePool, Snapshot


class ConfigLookups:
    """Queue-tree and quota lookups over ``parents``, ``children`` and ``engine``."""

    parents: dict[str, str | None]
    children: dict[str, list[str]]
    engine: Engine
    _limit_cache: dict[tuple[str, str], int]

    def is_in_subtree(self, queue: str, root: str) -> bool:
        """Is ``queue`` ``root`` or below it? (for gpupool.auth.authorize)"""
        seen = set()
        cur: str | None = queue
        while cur is not None and cur not in seen:
            if cur == root:
                return True
            seen.add(cur)
            cur = self.parents.get(cur)
        return False

    def queue_path(self, queue: str) -> list[str]:
        out, cur = [], queue
        while cur is not None and cur in self.parents and cur not in out:
            out.append(cur)
            cur = self.parents[cur]  # type: ignore[assignment]
        return out

    def is_leaf(self, queue: str) -> bool:
        return queue in self.children and not self.children[queue]

    def queue_limit_gpu_milli(self, queue: str, pool: str) -> int:
        """The most GPU (milli) a workload in ``queue`` can ever get in ``pool`` under its quotas.

        Cached until the configuration changes: the limits change only with it, and every
        submit asks."""
        hit = self._limit_cache.get((queue, pool))
        if hit is not None:
            return hit
        q = self.engine.quota
        lims = [q.limit[(n, pool)][0] for n in q.path.get(queue, ()) if (n, pool) in q.limit]
        out = min(lims) if lims else 0
        self._limit_cache[(queue, pool)] = out
        return out


def tree_of(queues: list[Queue]) -> tuple[dict[str, str | None], dict[str, list[str]]]:
    """Parent and children maps of a queue list."""
    parents = {q.name: q.parent for q in queues}
    children: dict[str, list[str]] = {q.name: [] for q in queues}
    for q in queues:
        if q.parent in children:
            children[q.parent].append(q.name)
    return parents, children


class ConfigView(ConfigLookups):
    """A configuration that is not (yet) in force, with nothing running on it."""

    def __init__(self, bundle: Bundle) -> None:
        self.bundle = bundle
        self.parents, self.children = tree_of(bundle.queues)
        snap = Snapshot(
            tuple(bundle.nodes), tuple(bundle.pools), tuple(bundle.queues), tuple(bundle.priority_classes)
        )
        self.engine = Engine(snap)
        self.pools_by_name: dict[str, ResourcePool] = {p.name: p for p in bundle.pools}
        self.queues_by_name: dict[str, Queue] = {q.name: q for q in bundle.queues}
        self._limit_cache = {}


__all__ = ["ConfigLookups", "ConfigView", "tree_of"]
