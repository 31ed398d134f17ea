"""``holds.plan_hold`` and ``Holds``: which nodes are kept free for blocked whole-GPU workloads,
up to a pool's ``reservations``, and which work may backfill around them."""

from __future__ import annotations

from dataclasses import replace

from gpupool.engine import Decisions, Engine
from gpupool.engine.holds import Hold, Holds, plan_hold
from gpupool.model import PodRequest, Snapshot, Workload
from tests.engine.clusters import POOL, engine, job, nodes, queues, running


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
    assert got.nodes == frozenset({1}) and got.start == 20.0  # type: ignore[attr-defined]
    assert got.note == "holding 1 node(s) for it (n1), planned start t=20, after r1 ends"  # type: ignore[attr-defined]


def test_work_of_unknown_duration_is_held_for_until_it_ends() -> None:
    got = _plan(1.0, job("big", "a", 8), [("n0", None), ("n1", None)])
    assert got is not None and got.note.endswith("when running work ends")  # type: ignore[attr-defined]


def test_no_hold_for_fractional_pods_or_when_the_capacity_is_free() -> None:
    frac = job("f", "a", 0)
    frac = Workload(
        "f", "a", (frac.pod_groups[0].__class__("main", 1, PodRequest(gpu_milli=500, cpu_milli=100)),)
    )
    assert _plan(1.0, frac, [("n0", 10.0), ("n1", 10.0)]) is None
    assert _plan(1.0, job("big", "a", 8), [("n0", 10.0)]) is None  # n1 is free: something else blocks it


def test_a_gang_is_held_as_many_nodes_as_it_has_pods() -> None:
    got = _plan(0.0, job("g", "a", 8, replicas=2), [("n0", 30.0), ("n1", 10.0)])
    assert got is not None and got.nodes == frozenset({0, 1}) and got.start == 30.0  # type: ignore[attr-defined]


# -- a planned start for every blocked job (Slurm's backfill, ``bf_max_job_test``) -----------


def _half_busy(reservations: int) -> Engine:
    """Two 8-GPU nodes, each half used: 4 GPUs of n0 free at t=10, 4 of n1 at t=20."""
    pool = replace(POOL, reservations=reservations)
    eng = Engine(Snapshot(nodes(2), (pool,), queues({"a": 16})))
    for i, end in enumerate((10.0, 20.0)):
        eng.add_running(running(job(f"r{i}", "a", 4, expected_duration_s=end), f"n{i}", (0, 1, 2, 3)))
    return eng


def _cycle(reservations: int, *extra: Workload) -> tuple[Engine, Decisions]:
    """Two blocked 8-GPU jobs ranked first, then ``extra``."""
    eng = _half_busy(reservations)
    big = [job(f"big{i}", "a", 8, t=float(i), expected_duration_s=50.0) for i in (1, 2)]
    return eng, eng.cycle([*big, *extra], now=0.0)


#: 4 GPUs for 25 s: ends after both nodes' planned starts
LONG = job("long", "a", 4, t=3.0, expected_duration_s=25.0)


def test_every_blocked_job_up_to_the_bound_gets_its_own_planned_start() -> None:
    eng, d = _cycle(2)
    assert [(h.workload, h.nodes, h.start) for h in eng.placer.holds.all()] == [
        ("big1", frozenset({0}), 10.0),
        ("big2", frozenset({1}), 20.0),
    ]
    why = {p.workload: p.reason for p in d.pending}
    assert "planned start t=10, after r0 ends" in why["big1"]
    assert "planned start t=20, after r1 ends" in why["big2"]


def test_backfill_delays_none_of_the_planned_starts() -> None:
    """Slurm: a lower-priority job starts early only if it delays no higher-priority job's
    expected start. With one reservation ``long`` takes big2's node n1 (and delays big2 from
    t=20 to t=25); with two it may not."""
    _, one = _cycle(1, LONG)
    assert one.admitted_names() == ["long"] and one.admitted[0].pods[0].node == "n1"
    _, two = _cycle(2, LONG)
    assert two.admitted_names() == []
    assert "node(s) are held for big1, big2" in {p.workload: p.reason for p in two.pending}["long"]


def test_work_that_ends_before_the_planned_starts_still_backfills() -> None:
    short = job("short", "a", 4, t=3.0, expected_duration_s=8.0)  # ends at 8: before t=10
    mid = job("mid", "a", 4, t=4.0, expected_duration_s=15.0)  # ends at 15: n1 only (t=20)
    _, d = _cycle(2, short, mid)
    assert {a.workload: a.pods[0].node for a in d.admitted} == {"short": "n0", "mid": "n1"}


def test_a_later_hold_waits_for_the_planned_end_of_the_one_before_on_a_shared_node() -> None:
    """One node, two blocked 8-GPU jobs: the second is planned after the first's planned end."""
    pool = replace(POOL, reservations=2)
    eng = Engine(Snapshot(nodes(1), (pool,), queues({"a": 8})))
    eng.add_running(running(job("r0", "a", 8, expected_duration_s=10.0), "n0", tuple(range(8))))
    d = eng.cycle(
        [
            job("b1", "a", 8, t=1.0, expected_duration_s=30.0),
            job("b2", "a", 8, t=2.0, expected_duration_s=5.0),
        ],
        now=0.0,
    )
    hs = {h.workload: h for h in eng.placer.holds.all()}
    assert (hs["b1"].start, hs["b1"].end) == (10.0, 40.0)
    assert (hs["b2"].start, hs["b2"].after) == (40.0, "b1")
    assert "planned start t=40, after b1 ends" in {p.workload: p.reason for p in d.pending}["b2"]


def test_reservations_zero_holds_nothing() -> None:
    eng, d = _cycle(0, LONG)
    assert not eng.placer.holds and d.admitted_names() == ["long"]


def test_holds_as_a_part_room_backfill_bounds_and_per_node_limits() -> None:
    """``Holds`` on its own: room per pool, which work may use which held node, and the key a
    planner compares between cycles."""
    holds = Holds({"p0": 2})
    assert holds.room("p0") and not holds and holds.room("other")  # an unlisted pool: one
    holds.add(Hold("a", "q", "p0", frozenset({0}), 10.0, 40.0, "", ""))
    holds.add(Hold("b", "q", "p0", frozenset({0, 1}), 40.0, 90.0, "a", ""))
    assert not holds.room("p0") and holds.until == {0: 10.0, 1: 40.0} and holds.busy == {0: 90.0, 1: 90.0}
    short, mid, undeclared = (
        job(n, "a", 1, expected_duration_s=d) for n, d in (("s", 5.0), ("m", 20.0), ("u", None))
    )
    assert holds.may_backfill(short, "p0", 0.0) and not holds.may_backfill(mid, "p0", 0.0)
    assert [holds.usable(w, "p0", 0.0) for w in (short, mid, undeclared)] == [2, 1, 0]
    blocked = holds.blocked_for(mid, 0.0)
    assert blocked(0) and not blocked(1) and not blocked(7)  # ends at 20: after a's start only
    assert holds.blocked_for(undeclared, 0.0)(1)
    assert holds.holders_text("p0", "a") == "2 node(s) are held for b"
    assert holds.key() == (("a", frozenset({0}), 10.0), ("b", frozenset({0, 1}), 40.0))
    holds.clear()
    assert not holds and holds.room("p0")
