"""The simulator's event queue: a heap of ``(time, kind, seq, subject, aux)`` tuples.

Why kinds are small ints in this order: all events at one timestamp are applied before the
cycle, and the heap pops them kind by kind, so releases (finishes, faults, failures) come before
arrivals at the same instant, and ``seq`` keeps pushes of one kind in push order. Tuples, not
objects: a long trace pushes millions of events.
"""

from __future__ import annotations

import heapq

# event kinds, in the order they are applied within one timestamp
FINISH, JOB_FAULT, NODE_FAIL, NODE_REPAIR, ARRIVAL, RETRY, TICK = range(7)

#: ``aux`` per kind: FINISH/JOB_FAULT the attempt it belongs to (a stale one is ignored);
#: NODE_FAIL/NODE_REPAIR the index of the scheduled failure (``Faults.node_failures``), or -1
#: for an MTBF failure
QueuedEvent = tuple[float, int, int, str, int]


def clean_time(t: float) -> float:
    """``t`` without float noise, to 12 significant digits: 0.1 + 0.2 is 0.30000000000000004,
    so a job admitted at 0.1 for 0.2 s would end just after an arrival at 0.3, while the same
    scenario in milliseconds (100 + 200) ends with it. Relative, so the same instants meet in
    every unit of time (docs/engine.md, "Time-scale invariance")."""
    return float(f"{t:.12g}")


class EventQueue:
    """Events in virtual time, popped by time, then kind, then push order."""

    __slots__ = ("heap", "seq")

    def __init__(self) -> None:
        self.heap: list[QueuedEvent] = []
        self.seq = 0

    def push(self, t: float, kind: int, subject: str, aux: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (clean_time(t), kind, self.seq, subject, aux))
