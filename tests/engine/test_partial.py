"""Partial admission (issue 11, item 4): ``gang.minMember`` relaxes quota as it relaxes placement.

The property: on a cluster with room to spare, a gang is admitted with exactly the largest
pod count between its minimum and its count that its queue's quota allows (never more than the
quota, never fewer than the minimum), or waits when even the minimum does not fit.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.engine import PendingCode, apply_decisions, decide
from gpupool.engine.invariants import check_cycle
from gpupool.engine.partial import is_partial, reduced
from gpupool.model import (
    QUOTA_RESOURCES,
    UNLIMITED,
    EngineConfig,
    Node,
    PodGroup,
    PodRequest,
    PoolQuota,
    Queue,
    ResourcePool,
    Snapshot,
    Workload,
)

N_NODES = 12  # 96 GPUs: more than any gang below asks for, so only quota binds


def _gpus(n: int) -> Any:
    """A quota vector of ``n`` GPUs, the other resources not governed (whatever their number)."""
    return (n * 1000,) + (UNLIMITED,) * (len(QUOTA_RESOURCES) - 1)


def _snapshot(guarantee: int, borrow: int, pending: tuple[Workload, ...]) -> Snapshot:
    nodes = tuple(Node(f"n{i:02d}", "H100", 8, 81920, 128_000, 1 << 20) for i in range(N_NODES))
    lim = _gpus(borrow)
    queues = (
        Queue("org", quotas=(PoolQuota("gpu", _gpus(N_NODES * 8)),)),
        Queue("a", "org", quotas=(PoolQuota("gpu", _gpus(guarantee), lim),)),
    )
    return Snapshot(
        nodes, (ResourcePool("gpu"),), queues, pending=pending, config=EngineConfig(reserve=False)
    )


def _gang(name: str, replicas: int, gpus: int, gang_min: int | None) -> Workload:
    return Workload(name, "a", (PodGroup("w", replicas, PodRequest(gpus=gpus)),), gang_min=gang_min)


def test_three_by_eight_with_minimum_two_in_sixteen_runs_two_pods() -> None:
    w = _gang("g", 3, 8, 2)
    d = decide(_snapshot(16, 0, (w,)))
    assert [len(a.pods) for a in d.admitted] == [2]
    assert "with 2 of 3 pods" in d.admitted[0].reason
    assert not d.admitted[0].borrowing


def test_within_its_guarantee_a_gang_starts_in_pass_1_with_what_the_guarantee_holds() -> None:
    """Pass 1 admits without borrowing: a gang whose minimum fits its guarantee starts there
    with the largest count the guarantee holds (2 of 3 pods in 16 GPUs), before any borrower,
    even though borrowing could give it all 3 in pass 2."""
    w = _gang("g", 3, 8, 2)
    d = decide(_snapshot(16, 8, (w,)))
    assert [(len(a.pods), a.borrowing) for a in d.admitted] == [(2, False)]


def test_the_full_count_goes_first_when_even_the_minimum_borrows() -> None:
    """Beyond its guarantee even at its minimum, a gang waits for the borrowing pass, and there
    partial admission is a fallback: a gang the cohort can lend to runs whole."""
    w = _gang("g", 3, 8, 2)
    d = decide(_snapshot(8, 16, (w,)))
    assert [(len(a.pods), a.borrowing) for a in d.admitted] == [(3, True)]


def test_a_reduced_gang_borrows_only_in_the_borrowing_pass_and_only_if_preemptible() -> None:
    """A reduced count above the guarantee borrows like a full gang; non-preemptible work
    never borrows, so it gets the count its guarantee holds."""
    w = _gang("g", 4, 8, 2)
    d = decide(_snapshot(8, 16, (w,)))
    assert [(len(a.pods), a.borrowing) for a in d.admitted] == [(3, True)]
    fixed = Workload(w.name, "a", w.pod_groups, preemptible=False, gang_min=2)
    d = decide(_snapshot(16, 8, (fixed,)))
    assert [(len(a.pods), a.borrowing) for a in d.admitted] == [(2, False)]


def test_without_minimum_quota_is_checked_for_every_pod() -> None:
    d = decide(_snapshot(16, 0, (_gang("g", 3, 8, None),)))
    assert not d.admitted and d.pending[0].code is PendingCode.QUOTA


def test_reduced_gang_drops_workers_before_its_launcher() -> None:
    launcher = PodGroup("launcher", 1, PodRequest(cpu_milli=1000))
    workers = PodGroup("worker", 4, PodRequest(gpus=8))
    w = Workload("mpi", "a", (launcher, workers), gang_min=2)
    assert [g.replicas for g in reduced(w, 3).pod_groups] == [1, 2]
    assert [g.replicas for g in reduced(w, 2).pod_groups] == [1, 1]
    assert reduced(w, 5) is w
    assert is_partial(w) and not is_partial(_gang("x", 3, 8, 3)) and not is_partial(_gang("y", 3, 8, None))


def test_reduced_gang_levels_groups_from_the_largest() -> None:
    w = Workload(
        "two",
        "a",
        (PodGroup("p", 3, PodRequest(gpus=1)), PodGroup("q", 5, PodRequest(gpus=1))),
        gang_min=2,
    )
    assert [g.replicas for g in reduced(w, 6).pod_groups] == [3, 3]
    assert [g.replicas for g in reduced(w, 5).pod_groups] == [3, 2]  # a tie: the later group
    assert reduced(w, 5).gang_min == 2


@settings(max_examples=80, deadline=None, derandomize=True)
@given(
    replicas=st.integers(1, 6),
    gpus=st.sampled_from([1, 2, 4, 8]),
    minimum=st.integers(1, 6),
    guarantee=st.integers(0, 40),
    running=st.integers(0, 3),
)
def test_admitted_pods_are_the_largest_count_quota_allows(
    replicas: int, gpus: int, minimum: int, guarantee: int, running: int
) -> None:
    """Between the minimum and the count, never above quota, and no larger count would fit."""
    minimum = min(minimum, replicas)
    # some of the queue's quota is already in use by one-GPU work admitted earlier
    fillers = tuple(_gang(f"f{i}", 1, 1, None) for i in range(running))
    snap = _snapshot(guarantee, 0, fillers)
    first = decide(snap)
    snap = apply_decisions(snap, first)
    used = sum(r.admission.quota_vec()[0] for r in snap.running) // 1000
    w = _gang("g", replicas, gpus, minimum)
    snap = Snapshot(
        snap.nodes, snap.pools, snap.queues, pending=(w,), running=snap.running, config=snap.config
    )
    d = decide(snap)
    after = apply_decisions(snap, d)
    assert check_cycle(snap, d, after) == []
    free = guarantee - used
    want = min(replicas, free // gpus)
    if want >= minimum:
        assert [len(a.pods) for a in d.admitted] == [want]
        assert want * gpus <= free
    else:
        assert not d.admitted
        assert d.pending[0].code is PendingCode.QUOTA
