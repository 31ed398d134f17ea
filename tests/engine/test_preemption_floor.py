"""The guarantee floor and ``reclaimWithinCohort: LowerOrEqualPriority`` (issue 27 item 4):
the manifest fields with located errors, and the floor as a property on random flat cohorts
(YuniKorn: a preemption by another queue never leaves a floored queue below its guarantee)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpupool.engine import apply_decisions, decide
from gpupool.manifests import ManifestError, default_priority_classes, parse_documents
from gpupool.manifests import build as build_bundle
from gpupool.model import (
    Node,
    PodGroup,
    PodRequest,
    PoolQuota,
    PreemptionPolicy,
    Queue,
    ReclaimPolicy,
    ResourcePool,
    Snapshot,
    Workload,
    devices_only,
)

CLASSES = default_priority_classes()
POOL = "p"


def _queue(preemption: str) -> str:
    return (
        "apiVersion: gpupool.io/v1alpha1\nkind: Queue\nmetadata: {name: team}\n"
        f"spec: {{preemption: {preemption}, quotas: [{{pool: gpu, guarantee: {{nvidia.com/gpu: 4}}}}]}}\n"
    )


def test_manifest_takes_the_floor_and_lower_or_equal_priority() -> None:
    q = build_bundle(
        parse_documents(_queue("{guaranteeFloor: true, reclaimWithinCohort: LowerOrEqualPriority}"), "t.yaml")
    ).queues[0]
    assert q.preemption.guarantee_floor is True
    assert q.preemption.reclaim_within_cohort is ReclaimPolicy.LOWER_OR_EQUAL_PRIORITY
    default = build_bundle(parse_documents(_queue("{}"), "t.yaml")).queues[0]
    assert default.preemption.guarantee_floor is False


@pytest.mark.parametrize(
    ("preemption", "field"),
    [
        ("{guaranteeFloor: sometimes}", "spec.preemption.guaranteeFloor"),
        # equal priorities within one queue would evict each other back and forth
        ("{withinQueue: LowerOrEqualPriority}", "spec.preemption.withinQueue"),
    ],
)
def test_bad_values_name_the_field(preemption: str, field: str) -> None:
    with pytest.raises(ManifestError) as e:
        build_bundle(parse_documents(_queue(preemption), "t.yaml"))
    assert field in str(e.value) and "t.yaml" in str(e.value)


def _g(gpus: int) -> tuple[PoolQuota, ...]:
    return (PoolQuota(POOL, devices_only(gpus * 1000)),)


@st.composite
def _cases(draw: st.DrawFn) -> tuple[Snapshot, Workload, dict[str, int]]:
    """Three leaves of one cohort on two 8-GPU nodes, each maybe floored, work admitted in one
    cycle, and a preemptible high-priority workload for a random queue."""
    g = {q: draw(st.integers(0, 8)) for q in ("a", "b", "c")}
    pols = {q: PreemptionPolicy(guarantee_floor=draw(st.booleans())) for q in g}
    queues = (Queue("org", quotas=_g(16)), *(Queue(q, "org", preemption=pols[q], quotas=_g(g[q])) for q in g))
    nodes = tuple(Node(f"n{i}", "H100", 8, 81920, 64000, 524288) for i in range(2))
    low = [c for c in CLASSES if c.preemptible and c.value < 400]
    wave = tuple(
        Workload(
            f"w{k}",
            draw(st.sampled_from(sorted(g))),
            (PodGroup("main", 1, PodRequest(gpus=draw(st.sampled_from((1, 2, 4, 8))))),),
            pc.name,
            pc.value,
            True,
            arrival=float(k),
        )
        for k in range(draw(st.integers(2, 8)))
        for pc in [draw(st.sampled_from(low))]
    )
    snap = Snapshot(nodes, (ResourcePool(POOL),), queues, CLASSES, pending=wave, now=0.0)
    after = replace(apply_decisions(snap, decide(snap), now=0.0), pending=(), now=1.0)
    pc = next(c for c in CLASSES if c.name == "training")
    req = PodRequest(gpus=draw(st.sampled_from((1, 2, 4, 8))))
    w = Workload("p", draw(st.sampled_from(sorted(g))), (PodGroup("main", 1, req),), pc.name, pc.value, True)
    floors = {q: g[q] for q in g if pols[q].guarantee_floor}
    return after, w, floors


@settings(max_examples=120, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(case=_cases())
def test_no_preemption_leaves_a_floored_queue_below_its_guarantee(
    case: tuple[Snapshot, Workload, dict[str, int]],
) -> None:
    snap, w, floors = case
    d = decide(replace(snap, pending=(w,)))
    after = apply_decisions(replace(snap, pending=(w,)), d, now=1.0)
    for p in d.preempted:
        for q in {v.queue for v in p.victims if v.queue != w.queue and v.queue in floors}:
            used = sum(r.admission.quota_vec()[0] for r in after.running if r.workload.queue == q)
            assert used >= floors[q] * 1000, f"queue {q} left at {used} GPU milli, guarantee {floors[q]}"
