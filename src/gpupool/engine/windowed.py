"""The engine, given a window of the pending set, deciding as if it were given all of it.

Why: the engine's cost grows with the pending list, and most of a long backlog cannot move. A
caller (the simulator, the controller) may pass only a *window* of the pending workloads when it
can show the rest would decide the same way (see gpupool.sim.simulator and
gpupool.service.windows for the rules). One thing a window would change by itself: the
``fragmentation`` scorer (and ``auto`` where it weighs the mix) weighs placements against the
mix of pod shapes that wait. ``MixEngine`` counts the shapes of the workloads left out of a
cycle (``hidden``) in for its duration, so the scorer sees exactly the mix it would see with
every pending workload. The engine itself is unchanged.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from gpupool.engine.core import Engine
from gpupool.engine.decisions import Decisions
from gpupool.model import Workload


class MixEngine(Engine):
    """``Engine`` whose cycles also count the pod shapes of ``hidden`` pending workloads."""

    hidden: Counter[object] | None = None

    def cycle(self, pending: Iterable[Workload], now: float | None = None, **kw: Any) -> Decisions:
        hidden = self.hidden
        if not hidden or not self.mix.on:
            return super().cycle(pending, now, **kw)
        shapes = self.mix.running
        shapes.update(hidden)
        try:
            return super().cycle(pending, now, **kw)
        finally:
            shapes.subtract(hidden)


__all__ = ["MixEngine"]
