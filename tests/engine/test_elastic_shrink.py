"""Elastic shrink (issue 27 item 5): a running gang above ``gang.minMember`` loses only the
pods above its minimum when they free enough (Volcano's elastic jobs: the pods above
``minAvailable`` are preempted first; KAI's elastic workloads: part of the pods is evicted and
the workload keeps running). Properties: a shrink never takes a gang below its minimum, it
takes only pods the gang runs, and no pod it takes is unneeded (with that one pod kept, the
other victims gone, the preemptor does not fit as things are)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from rich.console import Console

from gpupool.cli.render import decisions_json, decisions_table
from gpupool.engine import Engine, apply_decisions, decide
from gpupool.engine.decisions import Decisions, PreemptRule, Shrink
from gpupool.engine.invariants import check_cycle
from gpupool.manifests import default_priority_classes
from gpupool.model import (
    Node,
    PodGroup,
    PodRequest,
    PoolQuota,
    Queue,
    ResourcePool,
    Running,
    Snapshot,
    Workload,
    devices_only,
)

CLASSES = {c.name: c for c in default_priority_classes()}
POOL = "p"


def _g(gpus: int) -> tuple[PoolQuota, ...]:
    return (PoolQuota(POOL, devices_only(gpus * 1000)),)


def _job(name: str, queue: str, pc: str, pods: int, gpus: int, gang_min: int | None, k: int) -> Workload:
    c = CLASSES[pc]
    group = (PodGroup("main", pods, PodRequest(gpus=gpus)),)
    return Workload(name, queue, group, c.name, c.value, c.preemptible, gang_min=gang_min, arrival=float(k))


@st.composite
def _cases(draw: st.DrawFn) -> tuple[Snapshot, Workload]:
    """Two leaves of one cohort on two 8-GPU nodes running elastic gangs (and some rigid work)
    of low classes, admitted in one cycle; then a training workload of a random size."""
    leaves = tuple(Queue(q, "org", quotas=_g(draw(st.integers(0, 16)))) for q in ("a", "b"))
    queues = (Queue("org", quotas=_g(16)), *leaves)
    nodes = tuple(Node(f"n{i}", "H100", 8, 81920, 64000, 524288) for i in range(2))
    wave = []
    for k in range(draw(st.integers(3, 8))):
        pods = draw(st.integers(1, 4))
        elastic = draw(st.integers(0, 2)) > 0
        wave.append(
            _job(
                f"w{k}",
                draw(st.sampled_from(("a", "b"))),
                draw(st.sampled_from(("evaluation", "experiment"))),
                pods,
                draw(st.sampled_from((1, 2, 4))),
                draw(st.integers(1, pods)) if elastic else None,
                k,
            )
        )
    snap = Snapshot(nodes, (ResourcePool(POOL),), queues, tuple(CLASSES.values()), pending=tuple(wave))
    after = apply_decisions(snap, decide(snap), now=0.0)
    pre = _job("pre", draw(st.sampled_from(("a", "b"))), "training", draw(st.integers(1, 2)), 0, None, 100)
    pre = replace(
        pre,
        pod_groups=(PodGroup("main", pre.pod_count, PodRequest(gpus=draw(st.sampled_from((1, 2, 4, 8))))),),
    )
    return replace(after, pending=(), now=1.0), pre


def _fits_as_is(snap: Snapshot, w: Workload, within_guarantee: bool) -> bool:
    d = decide(replace(snap, pending=(w,)))
    return any(
        a.workload == w.name
        and not a.after_evicting
        and not a.after_shrinking
        and not (within_guarantee and a.borrowing)
        for a in d.admitted
    )


def _keeping(snap: Snapshot, d: Decisions, keep: tuple[str, object] | None) -> Snapshot:
    """``snap`` with the cycle's victims gone and its shrinks applied, but for ``keep``: a whole
    victim's name, or (a shrunk workload's name, one of its removed pods) left running."""
    gone = set(d.victims())
    taken = {s.workload: set(s.pods) for s in d.shrinks()}
    if keep is not None and keep[1] is None:
        gone.discard(keep[0])
    elif keep is not None:
        taken[keep[0]].discard(keep[1])
    out = []
    for r in snap.running:
        if r.name in gone:
            continue
        pods = tuple(p for p in r.admission.pods if p not in taken.get(r.name, set()))
        out.append(Running(r.workload, replace(r.admission, pods=pods)))
    return replace(snap, running=tuple(out))


def _check_shrink(snap: Snapshot, sh: Shrink) -> None:
    r = next(r for r in snap.running if r.name == sh.workload)
    assert r.workload.gang_min is not None
    assert sh.replicas >= r.workload.min_pods, f"{sh.workload} below its minimum: {sh}"
    assert set(sh.pods) <= set(r.admission.pods) and sh.replicas == len(r.admission.pods) - len(sh.pods)


@settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(case=_cases())
def test_shrink_keeps_the_minimum_and_takes_no_pod_not_needed(case: tuple[Snapshot, Workload]) -> None:
    snap, w = case
    before = replace(snap, pending=(w,))
    d = decide(before)
    event("shrinks" if d.shrinks() else "evictions only" if d.victims() else "no preemption")
    assert check_cycle(before, d, apply_decisions(before, d)) == []
    reclaim = any(v.rule is PreemptRule.RECLAIM for p in d.preempted for v in (*p.victims, *p.shrinks))
    for sh in d.shrinks():
        _check_shrink(snap, sh)
        for pod in sh.pods:
            assert not _fits_as_is(_keeping(snap, d, (sh.workload, pod)), w, reclaim), (
                f"{sh.workload} lost pod {pod.group}-{pod.index} that {w.name} did not need: {sh}"
            )
    if d.shrinks():
        for v in d.victims():
            assert not _fits_as_is(_keeping(snap, d, (v, None)), w, reclaim), f"{v} not needed"


def test_extras_go_before_a_whole_job_of_the_same_class() -> None:
    """An elastic gang of 4 pods (minimum 2) and a rigid job, both evaluation, share the nodes:
    a 4-GPU training pod takes one extra pod rather than the rigid job (taking extras loses
    less than killing a job)."""
    nodes = tuple(Node(f"n{i}", "H100", 8, 81920, 64000, 524288) for i in range(2))
    queues = (Queue("org", quotas=_g(16)), Queue("a", "org", quotas=_g(16)))
    wave = (_job("rigid", "a", "evaluation", 1, 8, None, 0), _job("el", "a", "evaluation", 4, 2, 2, 1))
    snap = Snapshot(nodes, (ResourcePool(POOL),), queues, tuple(CLASSES.values()), pending=wave)
    snap = replace(apply_decisions(snap, decide(snap), now=0.0), pending=(), now=1.0)
    w = _job("t", "a", "training", 1, 2, None, 9)
    d = decide(replace(snap, pending=(w,)))
    assert d.victims() == []
    [sh] = d.shrinks()
    assert (sh.workload, sh.replicas, len(sh.pods)) == ("el", 3, 1)
    assert "above minMember 2 removed, 3 keep running" in sh.reason


def test_the_decisions_json_and_table_show_the_shrink() -> None:
    """``gpupool`` offline output (``cli/render.py``) lists the shrink beside the victims."""
    nodes = tuple(Node(f"n{i}", "H100", 8, 81920, 64000, 524288) for i in range(2))
    queues = (Queue("org", quotas=_g(16)), Queue("a", "org", quotas=_g(16)))
    snap = Snapshot(
        nodes,
        (ResourcePool(POOL),),
        queues,
        tuple(CLASSES.values()),
        pending=(_job("el", "a", "evaluation", 4, 4, 2, 0),),
    )
    snap = replace(apply_decisions(snap, decide(snap), now=0.0), pending=(), now=1.0)
    w = _job("t", "a", "training", 1, 4, None, 9)
    d = decide(replace(snap, pending=(w,)))
    out = decisions_json(d)
    [pre] = out["preempted"]
    assert pre["victims"] == [] and [
        (s["workload"], s["replicas"], len(s["pods"])) for s in pre["shrinks"]
    ] == [("el", 3, 1)]
    assert out["admitted"][0]["afterShrinking"] == ["el"] and out["summary"]["shrinks"] == 1
    console = Console(record=True, width=200)
    console.print(decisions_table(d, {w.name: w}))
    assert "shrink" in console.export_text()


@settings(max_examples=120, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(case=_cases())
def test_a_cycle_with_shrinks_rolls_back_and_applies_like_a_fresh_engine(
    case: tuple[Snapshot, Workload],
) -> None:
    """The incremental engine (the simulator's, the controller's): a cycle that shrinks leaves
    the state as it found it, and ``apply`` then gives the state a fresh engine builds from
    ``apply_decisions``' snapshot (the shrunk gang with only its kept pods)."""
    snap, w = case
    before = replace(snap, pending=(w,))
    eng = Engine(before)
    state = ([list(d) for d in eng.cluster.dev_milli], dict(eng.quota.E), dict(eng.running))
    d = eng.cycle(before.pending)
    assert ([list(d) for d in eng.cluster.dev_milli], dict(eng.quota.E), dict(eng.running)) == state
    assert eng.cycle(before.pending) == d == decide(before)
    eng.apply(d, before.pending, 1.0)
    fresh = Engine(apply_decisions(before, d, now=1.0))
    assert fresh.cluster.dev_milli == eng.cluster.dev_milli and fresh.quota.E == eng.quota.E
    assert {n: r.admission.pods for n, r in fresh.running.items()} == {
        n: r.admission.pods for n, r in eng.running.items()
    }
