"""Lookups on a configuration (queue tree, pools, quota limits) that submission checks need.

Why a separate view: ``POST /v1/apply`` must check workloads against the configuration as it
*will be* once the set's queues and pools are applied — a new Queue and a workload in it, in one
request — before anything is written, so that a set applies whole or not at all. The controller
offers the same lookups on the configuration in force; each holds a ``QueueTree``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from gpupool.engine import Engine
from gpupool.manifests import Bundle
from gpupool.model import Queue, ResourcePool, Snapshot


class ConfigLookups(Protocol):
    """What submission checks and authorization ask of a configuration: its queue tree and
    quota limits (``QueueTree`` answers; the controller and ``ConfigView`` hold one)."""

    @property
    def parents(self) -> dict[str, str | None]: ...

    @property
    def children(self) -> dict[str, list[str]]: ...

    def is_in_subtree(self, queue: str, root: str) -> bool: ...

    def queue_path(self, queue: str) -> list[str]: ...

    def is_leaf(self, queue: str) -> bool: ...

    def queue_limit_gpu_milli(self, queue: str, pool: str) -> int: ...


class QueueTree:
    """The queue tree (队列树) of one configuration and the lookups on it, with the quota limits
    read from that configuration's engine (``engine()``: the controller's is replaced when
    nodes change, the tree only with the configuration)."""

    __slots__ = ("_engine", "_limit_cache", "children", "parents")

    def __init__(self, queues: Sequence[Queue], engine: Callable[[], Engine]) -> None:
        self.parents, self.children = tree_of(list(queues))
        self._engine = engine
        self._limit_cache: dict[tuple[str, str], int] = {}

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
        q = self._engine().quota
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


class ConfigView:
    """A configuration that is not (yet) in force, with nothing running on it (a
    ``ConfigLookups`` through its ``tree``)."""

    def __init__(self, bundle: Bundle) -> None:
        self.bundle = bundle
        snap = Snapshot(
            tuple(bundle.nodes), tuple(bundle.pools), tuple(bundle.queues), tuple(bundle.priority_classes)
        )
        self.engine = Engine(snap)
        self.tree = QueueTree(bundle.queues, lambda: self.engine)
        self.parents, self.children = self.tree.parents, self.tree.children
        self.pools_by_name: dict[str, ResourcePool] = {p.name: p for p in bundle.pools}
        self.queues_by_name: dict[str, Queue] = {q.name: q for q in bundle.queues}

    def is_in_subtree(self, queue: str, root: str) -> bool:
        return self.tree.is_in_subtree(queue, root)

    def queue_path(self, queue: str) -> list[str]:
        return self.tree.queue_path(queue)

    def is_leaf(self, queue: str) -> bool:
        return self.tree.is_leaf(queue)

    def queue_limit_gpu_milli(self, queue: str, pool: str) -> int:
        return self.tree.queue_limit_gpu_milli(queue, pool)


__all__ = ["ConfigLookups", "ConfigView", "QueueTree", "tree_of"]
