"""``holds.plan_hold``: which nodes are kept free for a blocked whole-GPU workload."""

from __future__ import annotations

from gpupool.engine.holds import plan_hold
from gpupool.model import PodRequest, Workload
from tests.engine.clusters import engine, job, running


def _plan(eng_now: float, w: Workload, busy: list[tuple[str, float | None]]) -> object:
    """Two 8-GPU nodes; each entry fills a node with an 8-GPU job of that duration."""
    eng = engine(2, {"a": 16})
    for i, (node, d) in enumerate(busy):
        eng.add_running(running(job(f"r{i}", "a", 8, expected_duration_s=d), node, tuple(range(8))))
    st = eng.cluster
    return plan_hold(w, "p0", st, eng.placer.node_filter, eng.runs, eng_now)


def test_the_node_that_frees_soonest_is_held() -> None:
    got = _plan(1.0, job("big", "a", 8), [("n0", 100.0), ("n1", 20.0)])
    assert got is not None
    held, start, note = got  # type: ignore[misc]
    assert held == frozenset({1}) and start == 20.0
    assert note == "holding 1 node(s) for it (n1), expected from t=20"


def test_work_of_unknown_duration_is_held_for_until_it_ends() -> None:
    got = _plan(1.0, job("big", "a", 8), [("n0", None), ("n1", None)])
    assert got is not None and got[2].endswith("when running work ends")  # type: ignore[index]


def test_no_hold_for_fractional_pods_or_when_the_capacity_is_free() -> None:
    frac = job("f", "a", 0)
    frac = Workload(
        "f", "a", (frac.pod_groups[0].__class__("main", 1, PodRequest(gpu_milli=500, cpu_milli=100)),)
    )
    assert _plan(1.0, frac, [("n0", 10.0), ("n1", 10.0)]) is None
    assert _plan(1.0, job("big", "a", 8), [("n0", 10.0)]) is None  # n1 is free: something else blocks it


def test_a_gang_is_held_as_many_nodes_as_it_has_pods() -> None:
    got = _plan(0.0, job("g", "a", 8, replicas=2), [("n0", 30.0), ("n1", 10.0)])
    assert got is not None and got[0] == frozenset({0, 1}) and got[1] == 30.0  # type: ignore[index]
