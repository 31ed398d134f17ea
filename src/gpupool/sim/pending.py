"""The simulator's pending set: per queue, *classes* of workloads with one scheduling shape.

Why classes: the window planner (``gpupool.sim.windows``) gives the engine only the first few
members of each class, and proves afterwards that the rest would have fared the same. That
proof needs members of one class to be interchangeable to the engine but for their order,
which is what the engine's ``scheduling_signature`` captures (with the declared duration by its
band, a third of a decade: the window rule handles backfill by exact durations itself, ``by_dur``).
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import Counter

from gpupool.engine.fragscore import add_shapes
from gpupool.engine.ordering import workload_order_key
from gpupool.engine.signature import scheduling_signature
from gpupool.model import Workload

#: a class member as its class keeps it: the engine's order key, then the name
Member = tuple[tuple[int, float, str], str]


def declared_duration(w: Workload) -> float:
    """How long ``w`` says it runs (infinite when it does not say): what backfill goes by."""
    return math.inf if w.expected_duration_s is None else w.expected_duration_s


class PendingSet:
    """Pending workloads per queue and class, each class ordered by the engine's order key
    (and, for backfill, by declared duration)."""

    def __init__(self, one_head: bool = False, track_shapes: bool = False) -> None:
        self.one_head = one_head
        self.w: dict[str, Workload] = {}
        #: a class is named by a small int: its key (a tuple of dataclasses) is hashed once, here
        self.class_ids: dict[tuple[object, ...], int] = {}
        self.cls_of: dict[str, int] = {}
        self.by_class: dict[int, list[Member]] = {}
        self.by_dur: dict[int, list[tuple[float, tuple[int, float, str], str]]] = {}
        self.by_queue: dict[str, dict[int, None]] = {}
        self.count: dict[str, int] = {}
        #: classes and queues whose first member changed, and every workload added, since the last cycle
        self.touched: set[int] = set()
        self.touched_queues: set[str] = set()
        self.new: set[str] = set()
        #: pod shapes of every pending workload (for the fragmentation scorer's mix)
        self.shapes: Counter[object] | None = Counter() if track_shapes else None

    def __len__(self) -> int:
        return len(self.w)

    def add(self, w: Workload) -> None:
        ck = self.class_ids.setdefault(scheduling_signature(w, by_band=True), len(self.class_ids))
        self.w[w.name] = w
        self.cls_of[w.name] = ck
        self.new.add(w.name)
        key = (workload_order_key(w), w.name)
        lst = self.by_class.setdefault(ck, [])
        # a newcomer behind a member that is already waiting can only move when that one can
        if not lst or key < lst[0]:
            self.touched.add(ck)
        qcls = self.by_queue.setdefault(w.queue, {})
        if w.queue not in self.touched_queues and (
            self.one_head or all(key < self.by_class[c][0] for c in qcls if self.by_class[c])
        ):
            self.touched_queues.add(w.queue)
        insort(lst, key)
        insort(self.by_dur.setdefault(ck, []), (declared_duration(w), *key))
        if self.shapes is not None:
            add_shapes(self.shapes, [w])  # type: ignore[arg-type]
        qcls[ck] = None
        self.count[w.queue] = self.count.get(w.queue, 0) + 1

    def remove(self, name: str) -> Workload | None:
        w = self.w.pop(name, None)
        if w is None:
            return None
        self.new.discard(name)
        if self.shapes is not None:
            add_shapes(self.shapes, [w], sign=-1)  # type: ignore[arg-type]
        ck = self.cls_of.pop(name)
        key = (workload_order_key(w), name)
        lst = self.by_class[ck]
        del lst[bisect_left(lst, key)]
        dl = self.by_dur[ck]
        del dl[bisect_left(dl, (declared_duration(w), *key))]
        if not lst:
            del self.by_class[ck]
            del self.by_dur[ck]
            del self.by_queue[w.queue][ck]
        self.count[w.queue] -= 1
        return w

    def eligible(self, ck: int, max_dur: float, skip: set[str], k: int) -> list[str]:
        """Up to ``k`` members in order, not in ``skip``, whose declared duration is <= max_dur."""
        dl = self.by_dur[ck]
        if not dl or dl[0][0] > max_dur:
            return []
        m = bisect_left(dl, (max_dur, (math.inf,)))  # members short enough: dl[:m]
        if m <= 4 * k + len(skip):  # few: take the earliest of them in order
            got = sorted(e[1:] for e in dl[:m] if e[2] not in skip)
            return [n for _, n in got[:k]]
        # many: walk the class in order and stop at k (no set over the whole class per call)
        out: list[str] = []
        ws = self.w
        for _, n in self.by_class[ck]:
            if n in skip or declared_duration(ws[n]) > max_dur:
                continue
            out.append(n)
            if len(out) >= k:
                break
        return out
