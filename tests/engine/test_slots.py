"""``preemption.slots.WholeSlots``: whole free devices by count, a necessary condition."""

from __future__ import annotations

from gpupool.engine.decisions import PreemptRule
from gpupool.engine.preemption.candidates import Candidate
from gpupool.engine.preemption.slots import WholeSlots
from gpupool.model import PodGroup, PodRequest, Workload
from tests.engine.clusters import engine, job, running


def test_only_one_shape_whole_gpu_work_is_counted() -> None:
    eng = engine(1)
    two = Workload("t", "a", (PodGroup("x", 1, PodRequest(gpus=1)), PodGroup("y", 1, PodRequest(gpus=2))))
    assert WholeSlots.of(eng.cluster, two, "p0") is None
    assert WholeSlots.of(eng.cluster, job("c", "a", 0), "p0") is None
    s = WholeSlots.of(eng.cluster, job("w", "a", 4, replicas=3), "p0")
    assert s is not None and (s.k, s.n, s.total) == (4, 3, 2)  # two 4-GPU slots on 8 free devices


def test_could_fit_after_counts_the_devices_the_gone_work_holds() -> None:
    eng = engine(2)
    r0 = running(job("r0", "a", 4), "n0", (0, 1, 2, 3))
    r1 = running(job("r1", "a", 4), "n1", (0, 1, 2, 3))
    eng.add_running(r0)
    eng.add_running(r1)
    s = WholeSlots.of(eng.cluster, job("w", "a", 8, replicas=2), "p0")
    assert s is not None and s.total == 0
    assert not s.could_fit_after([r0])
    assert s.could_fit_after([r0, r1])


def test_enough_follows_a_release_on_the_live_state() -> None:
    eng = engine(1)
    r0 = running(job("r0", "a", 6), "n0", tuple(range(6)))
    eng.add_running(r0)
    w = job("w", "a", 4)
    s = WholeSlots.of(eng.cluster, w, "p0")
    assert s is not None and s.total == 0
    c = Candidate(r0, PreemptRule.WITHIN_QUEUE, w, "p0", "root")
    eng.ssn.discharge(r0)
    assert s.enough(c) and s.total == 2


def test_a_gang_minimum_counts_only_the_pods_it_needs() -> None:
    eng = engine(1)
    s = WholeSlots.of(eng.cluster, job("w", "a", 4, replicas=3, gang_min=2), "p0")
    assert s is not None and (s.n, s.total) == (2, 2)
    assert s.could_fit_after([])  # two 4-GPU slots are free: nothing need go


def test_could_fit_without_frees_each_candidates_devices_but_never_past_a_nodes_size() -> None:
    eng = engine(1)
    a = running(job("a", "a", 1), "n0", (0, 1, 2, 3))
    b = running(job("b", "a", 1), "n0", (0, 1, 2, 3))  # the same four devices, shared
    eng.add_running(a)
    w = job("w", "a", 4, replicas=3)
    s = WholeSlots.of(eng.cluster, w, "p0")
    assert s is not None and s.total == 1
    cands = [Candidate(r, PreemptRule.WITHIN_QUEUE, w, "p0", "root") for r in (a, b)]
    # a and b free 4 + 4 devices on paper, but n0 has 8 in all: two slots, not three
    assert not s.could_fit_without(cands)
    assert WholeSlots.of(eng.cluster, job("v", "a", 4, replicas=2), "p0").could_fit_without(cands[:1])  # type: ignore[union-attr]
