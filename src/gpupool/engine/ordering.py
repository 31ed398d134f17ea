"""The order extension point: which queue's head goes next (Kueue's ``fair_sharing_iterator.go``).

``fair-share`` (the default): at every level of the queue tree the child with the best
*(head priority, weighted dominant share, head arrival)* goes next, so an inference-critical
head is tried before training heads in any queue, and among equals the subtree that has used
least of its guarantee (relative to its weight) goes first. ``fifo``: arrival only, across all
queues (a cluster without a scheduler). Within a queue the caller keeps its workloads sorted by
``workload_order_key``: priority, then arrival, then name.

One heap per tree node holds its children by key. A pick pops the path from the virtual top to
a leaf queue and pushes it back with fresh keys afterwards: only the chosen path's usage can
have changed, so the other entries never go stale.
"""

from __future__ import annotations

import heapq

from gpupool.engine.state.quota import QuotaState
from gpupool.model import Workload

_TOP = ""  # a virtual parent of all cohort roots


def workload_order_key(w: Workload) -> tuple[int, float, str]:
    """Order extension point within a queue: priority first, then arrival, then name."""
    return (-w.priority, w.arrival, w.name)


class FairShareOrder:
    """Hands out the leaf queue whose head goes next, over ``by_queue`` (leaf queue -> its
    pending workloads in order). ``pos[q]`` is the index of ``q``'s head: the caller advances it
    as it takes workloads (and may insert later ones behind it)."""

    __slots__ = ("_heaps", "_key", "_path", "_solo", "by_queue", "pos")

    def __init__(self, quota: QuotaState, by_queue: dict[str, list[Workload]], fifo: bool) -> None:
        self.by_queue = by_queue
        self.pos = pos = dict.fromkeys(by_queue, 0)
        self._heaps: dict[str, list[tuple[tuple[object, ...], str]]] = {}
        self._path: list[tuple[str, str]] = []
        self._solo = True
        heaps = self._heaps
        weight = quota.share_weight  # 1 in an over-quota tree: its fair shares hold the weights

        # a closure, not a method: it runs for every node of every pick
        def key(n: str) -> tuple[object, ...]:
            if fifo:
                if n in by_queue:
                    return (0, 0.0, by_queue[n][pos[n]].arrival, n)
                return (0, 0.0, heaps[n][0][0][2], n)
            share = quota.share(n) / weight[n]
            if n in by_queue:
                head = by_queue[n][pos[n]]
                return (-head.priority, share, head.arrival, n)
            best = heaps[n][0][0]
            return (best[0], share, best[2], n)

        self._key = key
        self._build(quota)

    def _build(self, quota: QuotaState) -> None:
        """One heap per tree node over the children with pending work, keyed bottom-up."""
        heaps, by_queue = self._heaps, self.by_queue

        def parent_of(n: str) -> str:
            p = quota.queues[n].parent
            return p if p is not None and p in quota.queues and quota.root[n] != n else _TOP

        for q in sorted(by_queue):
            if not by_queue[q]:
                continue
            child = q
            while True:
                par = parent_of(child)
                fresh = par not in heaps
                heaps.setdefault(par, []).append((((), 0.0, 0.0, ""), child))  # key filled below
                if par == _TOP or not fresh:
                    break
                child = par
        # compute keys bottom-up (children before parents), then heapify
        order = sorted(heaps, key=lambda n: -len(quota.path[n]) if n else 1)
        key = self._key
        for par in order:
            heaps[par] = [(key(c), c) for _, c in heaps[par]]
            heapq.heapify(heaps[par])

    def next_queue(self) -> str | None:
        """The path to the leaf queue whose head goes next (None: nothing left). The caller
        takes one or more of its workloads, then calls ``put_back``. The path stays at the top
        of its heaps meanwhile (nothing else touches them): ``put_back`` replaces each entry
        in one sift instead of a pop now and a push later."""
        heaps, by_queue = self._heaps, self.by_queue
        if not heaps.get(_TOP):
            return None
        path: list[tuple[str, str]] = []
        n = _TOP
        while n not in by_queue:
            child = heaps[n][0][1]
            path.append((n, child))
            n = child
        self._path = path
        # while a workload changes no usage (deferred, failed, skipped), the queue keeps its
        # share: if its next head is still the smallest key, it may go on without the heaps
        solo = True
        for i in range(len(path) - 1):  # a plain loop: this runs for every pick
            if len(heaps[path[i][0]]) > 1:
                solo = False
                break
        self._solo = solo
        return n

    def still_first(self, q: str) -> bool:
        """After a pick that changed no usage: does ``q``'s next head still go before every
        other queue's (so the caller may take it without a round through the heaps)?"""
        if not self._solo:
            return False
        sib = self._heaps[self._path[-1][0]]  # q's entry at its top, its siblings below
        if len(sib) == 1:
            return True
        best = sib[1] if len(sib) == 2 or sib[1] < sib[2] else sib[2]  # the next smallest
        return not self._key(q) > best[0]

    def put_back(self) -> None:
        """Put the picked path back with fresh keys (queues with nothing left drop out)."""
        heaps, by_queue, pos, key = self._heaps, self.by_queue, self.pos, self._key
        for par, child in reversed(self._path):
            alive = pos[child] < len(by_queue[child]) if child in by_queue else bool(heaps.get(child))
            if alive:
                heapq.heapreplace(heaps[par], (key(child), child))
            else:
                heapq.heappop(heaps[par])
