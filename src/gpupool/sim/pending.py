"""The simulator's pending set: the window planner's ``Backlog``, kept across cycles, and what
changed in it since the last cycle.

Why classes: the window planner (``gpupool.engine.windows``) gives the engine only the first
few members of each class, and proves afterwards that the rest would have fared the same. That
proof needs members of one class to be interchangeable to the engine but for their order, which
is what the engine's ``scheduling_signature`` captures, here without the declared duration:
the window rule handles backfill by exact durations itself (``Backlog.by_dur``) and the one
other thing the engine reads of it, the preemption wait's horizon, by its band (a witness that
waited proves only the members of its band). Where a pool plans several starts
(``reservations``) the classes keep the band: a window must then hold a member short enough to
backfill around every hold, and on classes of all durations it seldom did (the deep-backlog
test with 16 reservations ran 1.5x the CPU). Why the changes: while the state is unchanged, a cycle is given only the
classes and queues whose first member changed and the newcomers (``engine.windows.Changes``).
"""

from __future__ import annotations

from gpupool.engine.backlog import Backlog, Changes
from gpupool.model import Workload


class PendingSet:
    """Pending workloads per queue and class (``backlog``), and the ``Changes`` since the last
    cycle took them."""

    __slots__ = ("backlog", "changes", "one_head")

    def __init__(self, one_head: bool = False, track_shapes: bool = False, one_start: bool = True) -> None:
        self.one_head = one_head
        # one planned start per pool: classes without the duration (the planner proves the
        # wait horizon by band); several: by band, whose windows more often hold a member
        # short enough to witness for backfill around every hold
        self.backlog = Backlog("none" if one_start else "band", track_shapes=track_shapes)
        self.changes = Changes()

    def __len__(self) -> int:
        return len(self.backlog.w)

    def add(self, w: Workload) -> None:
        b, ch = self.backlog, self.changes
        ck, key = b.place(w)
        ch.new.add(w.name)
        lst = b.by_class.get(ck)
        # a newcomer behind a member that is already waiting can only move when that one can
        if not lst or key < lst[0]:
            ch.classes.add(ck)
        if w.queue not in ch.queues and (
            self.one_head or all(key < b.by_class[c][0] for c in b.by_queue.get(w.queue, ()))
        ):
            ch.queues.add(w.queue)
        b.insert(w, ck, key)

    def remove(self, name: str) -> Workload | None:
        self.changes.new.discard(name)
        return self.backlog.remove(name)

    def take_changes(self) -> Changes:
        """The changes since the last call (and start counting afresh)."""
        ch, self.changes = self.changes, Changes()
        return ch
