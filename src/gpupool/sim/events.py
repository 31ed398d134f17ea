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
#: NODE_FAIL/NODE_REPAIR the repair time in ms, or -1 for an MTBF failure
QueuedEvent = tuple[float, int, int, str, int]


class EventQueue:
    """Events in virtual time, popped by time, then kind, then push order."""

    __slots__ = ("heap", "seq")

    def __init__(self) -> None:
        self.heap: list[QueuedEvent] = []
        self.seq = 0

    def push(self, t: float, kind: int, subject: str, aux: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, kind, self.seq, subject, aux))
