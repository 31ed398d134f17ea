"""Minimal victims (issue 27 item 6): no chosen victim is unnecessary. With it kept running
(the other victims still gone), the preemptor must not fit as things are: otherwise the set was
not minimal (Kueue's ``minimalPreemptions`` gives such victims back; gpupool's search does too).

Before, a queue preempting its own lower-priority work with ``borrowWithinCohort: Never`` had to
end within its guarantee, so it evicted two workloads where one freed enough
(``tests/scenarios/preempt_over_guarantee.yaml``); Kueue's last attempt allows "only
candidates from the same queue, but with borrowing"."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpupool.engine import apply_decisions, decide
from gpupool.engine.decisions import Decisions, PreemptRule
from gpupool.manifests import default_priority_classes
from gpupool.model import (
    Node,
    PodGroup,
    PodRequest,
    PoolQuota,
    PreemptionPolicy,
    PriorityClass,
    Queue,
    ReclaimPolicy,
    ResourcePool,
    Snapshot,
    Workload,
    devices_only,
)

CLASSES = default_priority_classes()
POOL = "p"
LEAVES = ("a", "b", "c")
#: the preemptor: preemptible work above most of what runs (it may borrow, so every rule applies)
PREEMPTORS = tuple(c for c in CLASSES if c.preemptible and c.value >= 400)


def _g(gpus: int) -> tuple[PoolQuota, ...]:
    return (PoolQuota(POOL, devices_only(gpus * 1000)),)


@st.composite
def _cases(draw: st.DrawFn) -> tuple[Snapshot, Workload]:
    """A flat cohort of three leaves on two 8-GPU nodes, work admitted in one cycle, and one
    more workload of a random queue, size and class (a flat tree: a leaf ends within a
    guarantee only within its own, so "fits legally" is the admission's borrowing flag)."""
    pol = st.builds(
        PreemptionPolicy,
        st.sampled_from((ReclaimPolicy.LOWER_PRIORITY, ReclaimPolicy.LOWER_OR_NEWER_EQUAL_PRIORITY)),
        st.sampled_from((ReclaimPolicy.ANY, ReclaimPolicy.LOWER_PRIORITY)),
        st.sampled_from((ReclaimPolicy.NEVER, ReclaimPolicy.LOWER_PRIORITY)),
    )
    leaves = tuple(Queue(q, "org", preemption=draw(pol), quotas=_g(draw(st.integers(0, 8)))) for q in LEAVES)
    queues = (Queue("org", quotas=_g(16)), *leaves)
    nodes = tuple(Node(f"n{i}", "H100", 8, 81920, 64000, 524288) for i in range(2))

    def workload(
        k: int, classes: tuple[PriorityClass, ...] = CLASSES, sizes: tuple[int, ...] = (1, 2, 4)
    ) -> Workload:
        pc = draw(st.sampled_from(classes))
        req = PodRequest(gpus=draw(st.sampled_from(sizes)))
        pods = draw(st.integers(1, 2))
        queue = draw(st.sampled_from(LEAVES))
        return Workload(
            f"w{k}",
            queue,
            (PodGroup("main", pods, req),),
            pc.name,
            pc.value,
            pc.preemptible,
            arrival=float(k),
        )

    # small running jobs and a larger preemptor: sets of several victims, where one may be spare
    wave = tuple(workload(k) for k in range(draw(st.integers(3, 10))))
    snap = Snapshot(nodes, (ResourcePool(POOL),), queues, CLASSES, pending=wave, now=0.0)
    after = apply_decisions(snap, decide(snap), now=0.0)
    return replace(after, pending=(), now=1.0), workload(100, PREEMPTORS, (2, 4, 8))


def _issue_case() -> tuple[Snapshot, Workload]:
    """The issue's case (``preempt_over_guarantee.yaml``): team a (guarantee 8) runs two 4-GPU
    evaluation jobs, b uses 4 of its 8; a's 2x4-GPU training job needs one of them gone."""
    cls = {c.name: c for c in CLASSES}

    def job(name: str, queue: str, pc: str, pods: int = 1) -> Workload:
        c = cls[pc]
        req = PodRequest(gpus=4)
        return Workload(
            name, queue, (PodGroup("main", pods, req),), c.name, c.value, c.preemptible, arrival=0.0
        )

    queues = (Queue("org", quotas=_g(16)), Queue("a", "org", quotas=_g(8)), Queue("b", "org", quotas=_g(8)))
    nodes = tuple(Node(f"n{i}", "H100", 8, 81920, 64000, 524288) for i in range(2))
    wave = (job("e1", "a", "evaluation"), job("e2", "a", "evaluation"), job("b1", "b", "training"))
    snap = Snapshot(nodes, (ResourcePool(POOL),), queues, CLASSES, pending=wave, now=0.0)
    after = apply_decisions(snap, decide(snap), now=0.0)
    return replace(after, pending=(), now=1.0), job("train", "a", "training", pods=2)


def _fits_as_is(snap: Snapshot, w: Workload, within_guarantee: bool) -> bool:
    d = decide(replace(snap, pending=(w,)))
    return any(
        a.workload == w.name and not a.after_evicting and not (within_guarantee and a.borrowing)
        for a in d.admitted
    )


def _unneeded(snap: Snapshot, w: Workload, d: Decisions) -> list[str]:
    out: list[str] = []
    for p in d.preempted:
        gone = {v.workload for v in p.victims}
        reclaim = any(v.rule is PreemptRule.RECLAIM for v in p.victims)
        for v in gone:
            rest = replace(snap, running=tuple(r for r in snap.running if r.name not in gone - {v}))
            if _fits_as_is(rest, w, reclaim):
                out.append(v)
    return out


@settings(max_examples=120, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(case=_cases())
@example(case=_issue_case())
def test_no_chosen_victim_is_unnecessary(case: tuple[Snapshot, Workload]) -> None:
    snap, w = case
    d = decide(replace(snap, pending=(w,)))
    assert _unneeded(snap, w, d) == [], (
        f"{w.name} ({w.queue}, {w.priority}) evicted more than needed: {[p.victims for p in d.preempted]}"
    )
