"""The simulator's side of a consolidation move (the engine's ``Move``): a running job is
stopped and restarts at once on the placement the move reserved for it.

Why apart from ``simulator.py``: that module is at its size limit, and a move is accounted for
unlike an eviction: the job never waits (it is not requeued), but its work so far is lost (the
model has no checkpoints), so it runs its whole duration again from the move.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpupool.model import Admission, Running
from gpupool.sim.events import FINISH
from gpupool.sim.results import Event

if TYPE_CHECKING:
    from gpupool.engine import Decisions
    from gpupool.sim.simulator import Simulation


def apply_moves(sim: Simulation, d: Decisions, t: float) -> None:
    """Carry the cycle's moves out on the simulator's records (before ``Engine.apply``)."""
    for m in d.moved:
        r, rec = sim.running.get(m.workload), sim.jobs[m.workload]
        if r is None or rec.start is None:
            continue
        lost = sim._units(m.workload) * (t - rec.start)
        rec.lost_gpu_s += lost
        sim.moved_lost_gpu_s += lost
        sim.moves += 1
        sim._charge(m.workload, rec.start, t)
        for p in r.admission.pods:
            sim.on_node.get(p.node, set()).discard(m.workload)
        sim.running[m.workload] = Running(r.workload, Admission(m.pool, m.pods, r.admission.borrowing, t))
        for p in m.pods:
            sim.on_node.setdefault(p.node, set()).add(m.workload)
        rec.attempt += 1
        rec.start = t
        rec.starts.append(t)
        sim.queue.push(t + rec.spec.duration, FINISH, m.workload, rec.attempt)
        sim.events.append(Event(t, "moved", m.workload, m.reason))
