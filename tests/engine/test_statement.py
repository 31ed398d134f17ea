"""``state.statement.Statement``: one transaction over cluster, quota and running set."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.engine.session import Session
from tests.engine.clusters import engine, job, running


def _state(ssn: Session) -> tuple[object, ...]:
    """Everything a rollback must restore, as plain values."""
    cl, q, runs = ssn.cluster, ssn.quota, ssn.runs
    return (
        list(cl.free_whole),
        dict(cl.pool_used),
        dict(q.U),
        dict(q.E),
        dict(runs.by_name),
        {k: dict(v) for k, v in runs.by_pq.items()},
    )


def test_rollback_returns_all_three_to_the_checkpoint() -> None:
    eng = engine(1, {"a": 8, "b": 8})
    ssn = eng.ssn
    eng.add_running(running(job("r0", "a", 2), "n0", (0, 1)))
    ssn.begin(frozenset(), None)
    start = _state(ssn)
    cp = ssn.stmt.checkpoint()
    ssn.charge(running(job("r1", "b", 1), "n0", (2,)))
    ssn.discharge(ssn.runs.by_name["r0"])
    assert _state(ssn) != start
    ssn.stmt.rollback(cp)
    assert _state(ssn) == start
    ssn.stmt.discard()


def test_discard_undoes_the_cycle_and_close_keeps_it() -> None:
    eng = engine()
    ssn = eng.ssn
    before = _state(ssn)
    ssn.begin(frozenset(), None)
    ssn.charge(running(job("r1", "a", 1), "n0", (0,)))
    ssn.stmt.discard()
    assert _state(ssn) == before
    ssn.begin(frozenset(), None)
    ssn.charge(running(job("r1", "a", 1), "n0", (0,)))
    ssn.stmt.close()
    assert "r1" in ssn.runs.by_name and ssn.cluster.pool_used["p0"] == 1000


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 7), st.booleans()), max_size=12), st.integers(0, 12))
def test_any_sequence_of_changes_rolls_back_exactly(steps: list[tuple[int, bool]], at: int) -> None:
    """Charges and discharges in any order, a checkpoint anywhere: rolling back to it restores
    cluster, quota and running set as they were there."""
    eng = engine(1, {"a": 4, "b": 4})
    ssn = eng.ssn
    ssn.begin(frozenset(), None)
    cp, seen = None, None
    for i, (dev, other_queue) in enumerate(steps):
        if i == at:
            cp, seen = ssn.stmt.checkpoint(), _state(ssn)
        name = f"r{dev}"
        if name in ssn.runs.by_name:
            ssn.discharge(ssn.runs.by_name[name])
        else:
            ssn.charge(running(job(name, "b" if other_queue else "a", 1), "n0", (dev,)))
    if cp is None:
        cp, seen = ssn.stmt.checkpoint(), _state(ssn)
    ssn.stmt.rollback(cp)
    assert _state(ssn) == seen
