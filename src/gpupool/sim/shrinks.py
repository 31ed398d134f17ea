"""The simulator's side of an elastic shrink (the engine's ``Shrink``): a running gang loses
only the pods above its minimum and keeps running with the rest.

Why apart from ``simulator.py``: the accounting differs from an eviction in three ways, and the
simulator module is at its size limit. Only the removed pods' work is lost (their units times
the run so far), the queue's usage counts them until now and the rest until the job ends (the
simulator's ``shrunk`` units are taken off what the job holds from here on), and the job is not
requeued: it keeps its start and its completion time (the model has no slow-down per pod).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from gpupool.engine.state.running import vec_of
from gpupool.model import Running
from gpupool.sim.results import Event

if TYPE_CHECKING:
    from gpupool.engine import Decisions
    from gpupool.sim.simulator import Simulation


def apply_shrinks(sim: Simulation, d: Decisions, t: float) -> int:
    """Carry the cycle's shrinks out on the simulator's records; how many pods were removed."""
    removed = 0
    for pe in d.preempted:
        for sh in pe.shrinks:
            name = sh.workload
            r, rec = sim.running.get(name), sim.jobs[name]
            if r is None or rec.start is None:
                continue
            held = vec_of(sh.pods)[sim.res]
            units = held / 1000.0
            rec.lost_gpu_s += units * (t - rec.start)
            q = rec.spec.queue
            sim.qusage[q] = sim.qusage.get(q, 0.0) + units * (t - rec.start)
            sim.shrunk[name] = sim.shrunk.get(name, 0.0) + units
            sim.alloc -= held
            gone = set(sh.pods)
            left = tuple(p for p in r.admission.pods if p not in gone)
            sim.running[name] = Running(r.workload, replace(r.admission, pods=left))
            for node in {p.node for p in sh.pods} - {p.node for p in left}:
                sim.on_node.get(node, set()).discard(name)
            why = f"{sh.rule} by {pe.preemptor}: {len(sh.pods)} pod(s) removed, {sh.replicas} keep running"
            sim.events.append(Event(t, "shrunk", name, why))
            removed += len(sh.pods)
    return removed
