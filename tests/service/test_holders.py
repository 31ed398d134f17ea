"""``explain``'s estimate with several planned starts (``service/holders.py``): a workload
ranked behind another blocked one is estimated after that one's planned end, as the engine
planned it (Slurm's ``squeue --start``), not as if it were first in line."""

from __future__ import annotations

from dataclasses import replace

from gpupool.engine import Engine
from gpupool.model import Snapshot
from gpupool.service.holders import WaitReader, present
from tests.engine.clusters import POOL, job, nodes, queues, running


def _one_node(reservations: int) -> tuple[Engine, list[object]]:
    """One 8-GPU node busy until t=10; b1 (30 s) and b2 (5 s), both 8 GPUs, blocked."""
    eng = Engine(Snapshot(nodes(1), (replace(POOL, reservations=reservations),), queues({"a": 8})))
    eng.add_running(running(job("r0", "a", 8, expected_duration_s=10.0), "n0", tuple(range(8))))
    blocked = [
        job("b1", "a", 8, t=1.0, expected_duration_s=30.0),
        job("b2", "a", 8, t=2.0, expected_duration_s=5.0),
    ]
    eng.cycle(blocked, now=0.0)  # the holds stay on the engine until its next cycle
    return eng, blocked  # type: ignore[return-value]


def test_the_second_blocked_job_is_estimated_after_the_first_ones_planned_end() -> None:
    eng, (_, b2) = _one_node(2)
    wait = WaitReader(eng).read(b2, "InsufficientCapacity", 0.0)  # type: ignore[arg-type]
    assert wait is not None and wait.start == 40.0
    shown = present(wait, lambda q: True, lambda n: None)
    assert [a["name"] for a in shown["after"]] == ["b1", "r0"]  # the planned job first
    assert shown["estimate"].endswith("after b1 and 1 more end")


def test_a_job_without_a_hold_of_its_own_is_estimated_after_every_hold_in_its_pool() -> None:
    """One reservation: b1 holds, b2 does not; b2's estimate still comes after b1's planned
    end, and b1's own is when r0 ends."""
    eng, (b1, b2) = _one_node(1)
    reader = WaitReader(eng)
    second = reader.read(b2, "InsufficientCapacity", 0.0)  # type: ignore[arg-type]
    first = reader.read(b1, "InsufficientCapacity", 0.0)  # type: ignore[arg-type]
    assert second is not None and second.start == 40.0 and second.after[0].name == "b1"
    assert first is not None and first.start == 10.0 and [h.name for h in first.after] == ["r0"]
