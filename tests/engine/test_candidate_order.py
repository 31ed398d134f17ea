"""The preemption candidate order, stated as a rule (the model is Kueue's
``preemption/common/ordering.go``): the candidate with the smallest ``candidate_order`` key is
evicted first."""

from __future__ import annotations

from gpupool.engine.preemption.ordering import candidate_order
from gpupool.model import Admission, PodGroup, PodRequest, Running, Workload


def _running(name: str, queue: str, priority: int = 0, admitted_at: float = 0.0) -> Running:
    w = Workload(name, queue, (PodGroup("main", 1, PodRequest(gpus=1)),), priority=priority)
    return Running(w, Admission("gpu", (), False, admitted_at))


def _order(cands: list[Running], preemptor_queue: str = "mine") -> list[str]:
    return [r.name for r in sorted(cands, key=lambda r: candidate_order(r, preemptor_queue))]


def test_other_queues_come_before_the_preemptors_own_queue() -> None:
    # even a higher-priority borrower of another queue goes before own lower-priority work:
    # taking back borrowed capacity leaves the preemptor's queue its own work
    own = _running("own", "mine", priority=0)
    other = _running("other", "theirs", priority=5)
    assert _order([own, other]) == ["other", "own"]


def test_lower_priority_first() -> None:
    assert _order([_running("hi", "theirs", 3), _running("lo", "theirs", 1)]) == ["lo", "hi"]
    assert _order([_running("hi", "mine", 3), _running("lo", "mine", 1)]) == ["lo", "hi"]


def test_most_recently_admitted_first_among_equal_priority() -> None:
    # the newest has lost the least progress
    old = _running("old", "theirs", 1, admitted_at=10.0)
    new = _running("new", "theirs", 1, admitted_at=20.0)
    assert _order([old, new]) == ["new", "old"]


def test_name_breaks_the_remaining_ties() -> None:
    # a total order: the result never depends on the order candidates were collected in
    a, b = _running("a", "theirs"), _running("b", "theirs")
    assert _order([b, a]) == _order([a, b]) == ["a", "b"]


def test_criteria_apply_in_order() -> None:
    cands = [
        _running("own-low-new", "mine", 0, admitted_at=9.0),
        _running("other-high", "theirs", 7, admitted_at=1.0),
        _running("other-low-old", "theirs", 2, admitted_at=1.0),
        _running("other-low-new", "theirs", 2, admitted_at=5.0),
        _running("own-low-old", "mine", 0, admitted_at=1.0),
    ]
    assert _order(cands) == ["other-low-new", "other-low-old", "other-high", "own-low-new", "own-low-old"]
