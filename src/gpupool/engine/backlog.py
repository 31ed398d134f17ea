"""The window planner's backlog: pending workloads per queue and *class*, each class in the
engine's order (``gpupool.engine.windows`` gives a cycle the first members of each class).

Why classes: the planner proves that the members it left out would have fared as the witness it
gave; that needs members of one class to be interchangeable to the engine but for their order,
which is what ``scheduling_signature`` captures (with the exact declared duration, only its
band, or none of it, ``Backlog.durations``: without the exact one the planner handles backfill
by exact durations, ``by_dur``, and without the band also the wait horizon it fixes).
The simulator keeps one backlog across cycles and says what changed (``Changes``,
``gpupool.sim.pending``); the controller builds one for each cycle (``Backlog.extend``,
``gpupool.service.windows``).
"""

from __future__ import annotations

import gc
import math
from bisect import bisect_left, insort
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from gpupool.engine.fragscore import add_shapes
from gpupool.engine.ordering import workload_order_key
from gpupool.engine.signature import DurationKey, scheduling_signature
from gpupool.model import Workload

#: a class member as its class keeps it: the engine's order key, then the name
Member = tuple[tuple[int, float, str], str]


def declared_duration(w: Workload) -> float:
    """How long ``w`` says it runs (infinite when it does not say): what backfill goes by."""
    return math.inf if w.expected_duration_s is None else w.expected_duration_s


class Backlog:
    """Pending workloads per queue and class, each class ordered by the engine's order key
    (and, for backfill, by declared duration). A class is named by a small int: its signature
    (a tuple of dataclasses) is hashed once, when a member is added."""

    __slots__ = (
        "by_band",
        "by_class",
        "by_dur",
        "by_queue",
        "class_ids",
        "cls_of",
        "count",
        "durations",
        "shapes",
        "w",
    )

    def __init__(self, durations: DurationKey = "band", track_shapes: bool = False) -> None:
        #: how classes count the declared duration (``signature.scheduling_signature``)
        self.durations: DurationKey = durations
        #: the planner handles backfill by exact durations (classes are not by exact duration)
        self.by_band = durations != "exact"
        self.w: dict[str, Workload] = {}
        self.class_ids: dict[tuple[object, ...], int] = {}
        self.cls_of: dict[str, int] = {}
        self.by_class: dict[int, list[Member]] = {}
        self.by_dur: dict[int, list[tuple[float, tuple[int, float, str], str]]] = {}
        self.by_queue: dict[str, dict[int, None]] = {}
        self.count: dict[str, int] = {}
        #: pod shapes of every pending workload (for the fragmentation scorer's mix)
        self.shapes: Counter[object] | None = Counter() if track_shapes else None

    def __len__(self) -> int:
        return len(self.w)

    def place(self, w: Workload) -> tuple[int, Member]:
        """``w``'s class and its place in it (nothing is added)."""
        sig = scheduling_signature(w, duration=self.durations)
        return self.class_ids.setdefault(sig, len(self.class_ids)), (workload_order_key(w), w.name)

    def insert(self, w: Workload, ck: int, key: Member) -> None:
        """Add ``w`` to class ``ck`` at ``key`` (what ``place`` said)."""
        self.w[w.name] = w
        self.cls_of[w.name] = ck
        insort(self.by_class.setdefault(ck, []), key)
        if self.by_band:
            insort(self.by_dur.setdefault(ck, []), (declared_duration(w), *key))
        if self.shapes is not None:
            add_shapes(self.shapes, [w])  # type: ignore[arg-type]
        self.by_queue.setdefault(w.queue, {})[ck] = None
        self.count[w.queue] = self.count.get(w.queue, 0) + 1

    def extend(self, workloads: Iterable[Workload]) -> None:
        """Add many at once: each class is sorted once instead of inserted into one by one."""
        # a member per workload and no reference cycles: pausing the cyclic GC halves the cost
        gc_was_on = gc.isenabled()
        gc.disable()
        try:
            self._extend(workloads)
        finally:
            if gc_was_on:
                gc.enable()

    def _extend(self, workloads: Iterable[Workload]) -> None:
        band, durations = self.by_band, self.durations
        groups: dict[tuple[object, ...], list[Workload]] = {}
        for w in workloads:
            groups.setdefault(scheduling_signature(w, duration=durations), []).append(w)
        ids = self.class_ids
        for sig, ws in groups.items():
            ck = ids.setdefault(sig, len(ids))
            names = [w.name for w in ws]
            keys = list(zip(map(workload_order_key, ws), names, strict=True))
            lst = self.by_class.setdefault(ck, [])
            lst.extend(keys)
            lst.sort()
            if band:
                dl = self.by_dur.setdefault(ck, [])
                dl.extend((declared_duration(w), *key) for w, key in zip(ws, keys, strict=True))
                dl.sort()
            self.w.update(zip(names, ws, strict=True))
            self.cls_of.update(dict.fromkeys(names, ck))
            q = ws[0].queue  # the queue is part of the signature
            self.by_queue.setdefault(q, {})[ck] = None
            self.count[q] = self.count.get(q, 0) + len(ws)
            if self.shapes is not None:
                add_shapes(self.shapes, ws)  # type: ignore[arg-type]

    def remove(self, name: str) -> Workload | None:
        w = self.w.pop(name, None)
        if w is None:
            return None
        if self.shapes is not None:
            add_shapes(self.shapes, [w], sign=-1)  # type: ignore[arg-type]
        ck = self.cls_of.pop(name)
        key = (workload_order_key(w), name)
        lst = self.by_class[ck]
        del lst[bisect_left(lst, key)]
        if self.by_band:
            dl = self.by_dur[ck]
            del dl[bisect_left(dl, (declared_duration(w), *key))]
        if not lst:
            del self.by_class[ck]
            self.by_dur.pop(ck, None)
            del self.by_queue[w.queue][ck]
        self.count[w.queue] -= 1
        return w

    def eligible(self, ck: int, max_dur: float, skip: set[str], k: int) -> list[str]:
        """Up to ``k`` members in order, not in ``skip``, whose declared duration is <= max_dur
        (classes by band only: in a class of one exact duration every member is as short)."""
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


@dataclass(slots=True)
class Changes:
    """What changed in a backlog since the last cycle, for a caller that keeps one across
    cycles: classes and queues whose first member changed, and the workloads added."""

    classes: set[int] = field(default_factory=set)
    queues: set[str] = field(default_factory=set)
    new: set[str] = field(default_factory=set)
