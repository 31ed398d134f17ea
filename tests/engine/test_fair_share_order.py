"""``ordering.FairShareOrder``: which queue's head goes next."""

from __future__ import annotations

from gpupool.engine.ordering import FairShareOrder
from gpupool.model import Workload
from tests.engine.clusters import engine, job, running


def _drain(order: FairShareOrder, by_queue: dict[str, list[Workload]]) -> list[str]:
    """Take one head at a time, as the cycle does when each changes nothing."""
    out = []
    while (q := order.next_queue()) is not None:
        out.append(by_queue[q][order.pos[q]].name)
        order.pos[q] += 1
        order.put_back()
    return out


def test_the_queue_that_used_least_of_its_guarantee_goes_first() -> None:
    eng = engine(1, {"a": 4, "b": 4})
    eng.add_running(running(job("ra", "a", 2), "n0", (0, 1)))
    by_queue = {"a": [job("a1", "a", 1, t=0.0)], "b": [job("b1", "b", 1, t=5.0)]}
    assert _drain(FairShareOrder(eng.quota, by_queue, fifo=False), by_queue) == ["b1", "a1"]


def test_a_higher_priority_head_goes_before_a_smaller_share() -> None:
    eng = engine(1, {"a": 4, "b": 4})
    eng.add_running(running(job("ra", "a", 2), "n0", (0, 1)))
    by_queue = {"a": [job("a1", "a", 1, prio=10)], "b": [job("b1", "b", 1)]}
    assert _drain(FairShareOrder(eng.quota, by_queue, fifo=False), by_queue) == ["a1", "b1"]


def test_fifo_takes_arrival_order_across_queues() -> None:
    eng = engine(1, {"a": 4, "b": 4})
    by_queue = {
        "a": [job("a1", "a", 1, prio=10, t=3.0), job("a2", "a", 1, t=4.0)],
        "b": [job("b1", "b", 1, t=1.0), job("b2", "b", 1, t=5.0)],
    }
    assert _drain(FairShareOrder(eng.quota, by_queue, fifo=True), by_queue) == ["b1", "a1", "a2", "b2"]


def test_still_first_lets_a_queue_go_on_only_while_it_stays_ahead() -> None:
    """A queue whose head changed no usage may take its next head at once while that head still
    goes before every other queue's."""
    eng = engine(1, {"a": 4, "b": 4})
    by_queue = {"a": [job("a1", "a", 1, prio=5), job("a2", "a", 1, prio=5)], "b": [job("b1", "b", 1, prio=1)]}
    order = FairShareOrder(eng.quota, by_queue, fifo=False)
    assert order.next_queue() == "a"
    order.pos["a"] += 1
    assert order.still_first("a")  # a2 (priority 5) still goes before b1 (priority 1)
    by_queue["a"][1] = job("a2", "a", 1, prio=0)
    assert not order.still_first("a")
