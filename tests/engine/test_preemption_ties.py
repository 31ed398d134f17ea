"""Newest-first ties (issue 27 item 8): among candidates of equal tier and priority admitted at
the same time, the latest arrival is evicted first, then the name decides (Kueue's
``CandidatesOrdering`` takes the most recently admitted first; Volcano and Kueue fall back to
creation order, which is gpupool's ``arrival``)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpupool.engine.preemption.ordering import candidate_order
from gpupool.model import Admission, PodGroup, PodRequest, Running, Workload


def _running(name: str, arrival: float, admitted_at: float = 5.0, priority: int = 0) -> Running:
    w = Workload(
        name, "theirs", (PodGroup("main", 1, PodRequest(gpus=1)),), priority=priority, arrival=arrival
    )
    return Running(w, Admission("gpu", (), False, admitted_at))


def _order(cands: list[Running]) -> list[str]:
    return [r.name for r in sorted(cands, key=lambda r: candidate_order(r, "mine"))]


def test_latest_arrival_first_among_work_admitted_in_the_same_cycle() -> None:
    # before: by name, "a-first" went although it was submitted first
    assert _order([_running("a-first", 1.0), _running("z-second", 2.0)]) == ["z-second", "a-first"]


def test_admission_time_decides_before_arrival() -> None:
    old_admit = _running("late-arrival", 9.0, admitted_at=1.0)
    new_admit = _running("early-arrival", 1.0, admitted_at=3.0)
    assert _order([old_admit, new_admit]) == ["early-arrival", "late-arrival"]


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3)), min_size=2, max_size=6))
def test_order_is_admission_then_arrival_then_name(specs: list[tuple[int, int]]) -> None:
    cands = [_running(f"w{i}", float(arr), float(adm)) for i, (adm, arr) in enumerate(specs)]
    got = _order(cands)
    want = sorted(cands, key=lambda r: (-r.admission.admitted_at, -r.workload.arrival, r.name))
    assert got == [r.name for r in want]
