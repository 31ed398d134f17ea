"""Quota and preemption semantics (issue 11; docs/engine.md, "Quota and preemption semantics").

Unit tests of the quota-tree queries the rules rest on, the manifest spelling of the policies,
and a property over random three-level queue trees: every cycle's decisions replayed in order
keep the rules (victims only from queues borrowing below the common ancestor, reclaim only when
the preemptor ends within a guarantee below that ancestor, preempting above every guarantee only
with borrowWithinCohort, non-preemptible work never borrowing), and preemption never loops.
The scenarios under tests/scenarios/ (reclaim_*, parent_guarantee*, non_preemptible_*,
preempt_*, within_queue_newer_equal) show each rule on one small cluster.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpupool.engine import apply_decisions, decide
from gpupool.engine.cohorts import borrowing_below, fit_depth
from gpupool.engine.decisions import Decisions, PreemptRule
from gpupool.engine.invariants import check_cycle
from gpupool.engine.preemption import fair_sharing as fair
from gpupool.engine.preemption.ordering import within_queue_victim
from gpupool.engine.state.quota import QuotaState
from gpupool.manifests import ManifestError, default_priority_classes, parse_documents
from gpupool.manifests import build as build_bundle
from gpupool.model import (
    ZERO,
    Admission,
    Node,
    PodGroup,
    PodRequest,
    PoolQuota,
    PreemptionPolicy,
    Queue,
    ReclaimPolicy,
    ResourcePool,
    Running,
    Snapshot,
    Workload,
    devices_only,
)

CLASSES = default_priority_classes()
POOL = "p"


def _g(gpus: int) -> PoolQuota:
    return PoolQuota(POOL, devices_only(gpus * 1000))


def _tree() -> QuotaState:
    """org (16) -> dept (8 of its own) -> x (0), y (2); org -> team-c (8)."""
    qs = [
        Queue("org", quotas=(_g(16),)),
        Queue("dept", "org", quotas=(_g(8),)),
        Queue("x", "dept", quotas=(_g(0),)),
        Queue("y", "dept", quotas=(_g(2),)),
        Queue("team-c", "org", quotas=(_g(8),)),
    ]
    return QuotaState(qs, [POOL], {POOL: devices_only(16000)})


def _v(gpus: int) -> tuple[int, int, int, int, int]:
    """A request or use of ``gpus`` GPUs and nothing else."""
    return (gpus * 1000, *ZERO[1:])


def _use(q: QuotaState, leaf: str, gpus: int) -> None:
    q.add(leaf, POOL, _v(gpus))


# -- the quota tree's answers ------------------------------------------------------------------
def test_fit_depth_is_the_lowest_guarantee_that_holds_the_admission() -> None:
    q = _tree()
    assert fit_depth(q, "y", POOL, _v(2)) == 0  # y's own 2
    assert fit_depth(q, "x", POOL, _v(4)) == 1  # x has none: dept's own 8
    assert fit_depth(q, "x", POOL, _v(9)) is None  # beyond dept: the whole cohort
    _use(q, "y", 6)
    assert fit_depth(q, "x", POOL, _v(4)) is None  # dept's 8 hold only 2 more
    assert fit_depth(q, "x", POOL, _v(2)) == 1
    # negative parts: what evicting 4 of y's would leave room for
    assert fit_depth(q, "y", POOL, _v(-4)) == 0


def test_a_queue_that_is_its_own_root_fits_within_its_own_guarantee() -> None:
    q = QuotaState([Queue("solo", quotas=(_g(4),))], [POOL], {POOL: devices_only(8000)})
    assert fit_depth(q, "solo", POOL, _v(4)) == 0
    assert fit_depth(q, "solo", POOL, _v(5)) is None


def test_a_leaf_within_its_guarantee_is_not_borrowing_whatever_its_parent_does() -> None:
    q = _tree()
    _use(q, "y", 2)  # y within its own 2
    _use(q, "x", 10)  # x borrows: dept (8) now uses 12
    assert borrowing_below(q, "x", POOL, "org")
    assert not borrowing_below(q, "y", POOL, "org")  # the old rule said yes: dept borrows
    assert q.is_borrowing("y", POOL, "org")  # (the old query, still there for the preview)


def test_a_subtree_within_its_guarantee_lends_only_among_its_children() -> None:
    q = _tree()
    _use(q, "x", 6)  # x above its 0, but dept at 6 of its 8
    assert not borrowing_below(q, "x", POOL, "org")  # team-c may not reclaim from x
    assert borrowing_below(q, "x", POOL, "dept")  # y may: their common ancestor is dept
    assert not borrowing_below(q, "x", POOL, "x")  # nothing below the leaf itself


def test_borrowing_below_reads_the_usage_it_is_given() -> None:
    q = _tree()
    before = dict(q.U)
    _use(q, "team-c", 12)
    assert borrowing_below(q, "team-c", POOL, "org")
    assert not borrowing_below(q, "team-c", POOL, "org", before)


# -- withinQueue: LowerOrNewerEqualPriority ---------------------------------------------------
def _w(name: str, priority: int, arrival: float) -> Workload:
    return Workload(name, "q", (PodGroup("main", 1, PodRequest(gpus=1)),), priority=priority, arrival=arrival)


def test_within_queue_victims_by_policy() -> None:
    old, new = _w("old", 5, 1.0), _w("new", 5, 2.0)
    low = _w("low", 1, 9.0)
    assert within_queue_victim(old, low, newer_equal=False)
    assert not within_queue_victim(old, new, newer_equal=False)  # LowerPriority: equal is safe
    assert within_queue_victim(old, new, newer_equal=True)
    assert not within_queue_victim(new, old, newer_equal=True)  # never the older one: no loop
    assert not within_queue_victim(low, old, newer_equal=True)  # never higher priority
    same = _w("same", 5, 1.0)
    # equal arrival: the name decides, so exactly one of the pair may evict the other
    assert within_queue_victim(old, same, True) != within_queue_victim(same, old, True)


def _queue_doc(preemption: str) -> str:
    return (
        "apiVersion: gpupool.io/v1alpha1\nkind: Queue\nmetadata: {name: q}\n"
        f"spec: {{preemption: {preemption}, quotas: [{{pool: gpu, guarantee: {{nvidia.com/gpu: 8}}}}]}}\n"
    )


def _build_queue(preemption: str) -> Queue:
    b = build_bundle(parse_documents(_queue_doc(preemption), "t.yaml"))
    return b.queues[0]


def test_the_manifest_spells_the_policies_as_kueue_does() -> None:
    q = _build_queue("{withinQueue: LowerOrNewerEqualPriority}")
    assert q.preemption.within_queue is ReclaimPolicy.LOWER_OR_NEWER_EQUAL_PRIORITY
    # the defaults stay gpupool's (docs/engine.md, "Where gpupool and Kueue differ")
    d = _build_queue("{}").preemption
    assert (d.within_queue, d.reclaim_within_cohort, d.borrow_within_cohort) == (
        ReclaimPolicy.LOWER_PRIORITY,
        ReclaimPolicy.ANY,
        ReclaimPolicy.NEVER,
    )


@pytest.mark.parametrize(
    ("preemption", "field"),
    [
        ("{reclaimWithinCohort: LowerOrNewerEqualPriority}", "reclaimWithinCohort"),
        ("{withinQueue: Any}", "withinQueue"),
        ("{borrowWithinCohort: Any}", "borrowWithinCohort"),
    ],
)
def test_a_policy_where_kueue_has_none_is_refused_naming_the_field(preemption: str, field: str) -> None:
    with pytest.raises(ManifestError) as e:
        _build_queue(preemption)
    assert field in str(e.value)


def test_borrow_within_cohort_takes_kueues_object_form_with_a_threshold() -> None:
    """Kueue writes ``borrowWithinCohort: {policy, maxPriorityThreshold}``; the short string form
    stays valid, and a threshold without ``policy: LowerPriority`` is refused naming the field."""
    q = _build_queue("{borrowWithinCohort: {policy: LowerPriority, maxPriorityThreshold: 100}}")
    assert q.preemption.borrow_within_cohort is ReclaimPolicy.LOWER_PRIORITY
    assert q.preemption.borrow_max_priority == 100
    assert _build_queue("{borrowWithinCohort: LowerPriority}").preemption.borrow_max_priority is None
    for bad, field in [
        ("{borrowWithinCohort: {maxPriorityThreshold: 100}}", "borrowWithinCohort.maxPriorityThreshold"),
        ("{borrowWithinCohort: {policy: LowerPriority, maxPriorityThreshold: high}}", "maxPriorityThreshold"),
        ("{borrowWithinCohort: {policy: LowerPriority, threshold: 1}}", "threshold"),
    ]:
        with pytest.raises(ManifestError) as e:
            _build_queue(bad)
        assert field in str(e.value), str(e.value)


def test_fair_sharing_is_set_on_a_cohort_root_only() -> None:
    root = "apiVersion: gpupool.io/v1alpha1\nkind: Queue\nmetadata: {name: org}\nspec: {fairSharing: {preemption: true}}\n"
    b = build_bundle(parse_documents(root, "t.yaml"))
    assert b.queues[0].fair_sharing_preemption
    child = root.replace("{name: org}", "{name: team}").replace("spec: {", "spec: {parent: org, ")
    with pytest.raises(ManifestError) as e:
        build_bundle(parse_documents(root + "---\n" + child, "t.yaml"))
    assert "spec.fairSharing" in str(e.value) and "cohort root" in str(e.value)
    with pytest.raises(ManifestError):
        build_bundle(parse_documents(root.replace("preemption: true", "preemption: often"), "t.yaml"))


# -- the rules hold on random trees -----------------------------------------------------------
@st.composite
def _trees(draw: st.DrawFn, fair_on: bool | None = None) -> tuple[Queue, ...]:
    """org -> departments (each with a guarantee of its own beyond its leaves') -> leaves, and
    leaves directly under org; random policies."""
    pol = st.builds(
        PreemptionPolicy,
        st.sampled_from((ReclaimPolicy.LOWER_PRIORITY, ReclaimPolicy.LOWER_OR_NEWER_EQUAL_PRIORITY)),
        st.sampled_from((ReclaimPolicy.ANY, ReclaimPolicy.LOWER_PRIORITY)),
        st.sampled_from((ReclaimPolicy.NEVER, ReclaimPolicy.LOWER_PRIORITY)),
    )
    out: list[Queue] = []
    total = 0
    for d in range(draw(st.integers(1, 2))):
        leaves = [draw(st.integers(0, 6)) for _ in range(draw(st.integers(1, 2)))]
        own = sum(leaves) + draw(st.integers(0, 6))
        total += own
        out.append(Queue(f"d{d}", "org", quotas=(_g(own),)))
        out += [
            Queue(f"d{d}l{i}", f"d{d}", preemption=draw(pol), quotas=(_g(g),)) for i, g in enumerate(leaves)
        ]
    for i in range(draw(st.integers(1, 2))):
        g = draw(st.integers(0, 8))
        total += g
        out.append(Queue(f"t{i}", "org", preemption=draw(pol), quotas=(_g(g),)))
    fair = draw(st.booleans()) if fair_on is None else fair_on  # fair-sharing preemption on the root
    return (Queue("org", quotas=(_g(max(total, 16)),), fair_sharing_preemption=fair), *out)


@st.composite
def _cases(draw: st.DrawFn, fair_on: bool | None = None) -> tuple[Snapshot, list[list[Workload]]]:
    queues = draw(_trees(fair_on))
    leaves = [q.name for q in queues if q.name != "org" and not any(c.parent == q.name for c in queues)]
    nodes = tuple(Node(f"n{i}", "H100", 8, 81920, 64000, 524288) for i in range(draw(st.integers(2, 3))))
    pool = ResourcePool(POOL)
    waves = []
    k = 0
    for _ in range(draw(st.integers(1, 3))):
        wave = []
        for _ in range(draw(st.integers(1, 5))):
            pc = draw(st.sampled_from(CLASSES))
            gpus = draw(st.sampled_from((1, 2, 4, 8)))
            wave.append(
                Workload(
                    f"w{k}",
                    draw(st.sampled_from(leaves)),
                    (PodGroup("main", draw(st.integers(1, 2)), PodRequest(gpus=gpus)),),
                    pc.name,
                    pc.value,
                    pc.preemptible,
                    arrival=float(k),
                )
            )
            k += 1
        waves.append(wave)
    return Snapshot(nodes, (pool,), queues, CLASSES), waves


#: victims by rule over the property's examples (the last test checks the examples preempt)
SEEN: dict[str, int] = {}
#: which of the two properties ran in this process (pytest -n may put either on another worker)
RAN: set[str] = set()


def _replay_rules(before: Snapshot, d: Decisions) -> list[str]:
    """Replay the admissions in the order the engine made them (each preemptor's victims gone
    first) and check, at the moment of each preemption, the rules on the preemptor's side."""
    q = QuotaState(before.queues, [POOL], {POOL: ZERO})
    running: dict[str, Running] = {r.name: r for r in before.running}
    for r in running.values():
        q.add(r.workload.queue, POOL, r.admission.quota_vec())
    pending = {w.name: w for w in before.pending}
    preempts = {p.preemptor: p for p in d.preempted}
    errs = []
    for a in d.admitted:
        for name in a.after_evicting:
            r = running.pop(name)
            q.remove(r.workload.queue, POOL, r.admission.quota_vec())
        w = pending[a.workload]
        r = Running(w, Admission(POOL, a.pods, a.borrowing, before.now))
        q.add(w.queue, POOL, r.admission.quota_vec())
        running[w.name] = r
        if a.borrowing and not w.preemptible:
            errs.append(f"{w.name}: non-preemptible work admitted borrowing")
        p = preempts.get(w.name)
        if p is None:
            continue
        f = fit_depth(q, w.queue, POOL, ZERO)
        pol = q.queues[w.queue].preemption
        fair_victims = [v for v in p.victims if v.rule is PreemptRule.FAIR_SHARE]
        # only its own queue's victims: it may end borrowing what is idle (Kueue's last attempt)
        own_only = all(v.rule is PreemptRule.WITHIN_QUEUE for v in p.victims)
        borrow_ok = pol.borrow_within_cohort is not ReclaimPolicy.NEVER or own_only
        if f is None and not borrow_ok and not fair_victims:
            errs.append(f"{w.name}: preempted and ends above every guarantee without borrowWithinCohort")
        for v in fair_victims:
            lca = q.common_ancestor(w.queue, v.queue)
            mine, theirs = fair.side(q, w.queue, lca), fair.side(q, v.queue, lca)
            if not fair.weighted_share(q, mine) <= fair.weighted_share(q, theirs):
                errs.append(f"{w.name}: fair-sharing victim {v.workload} left its side below the preemptor's")
        for v in p.victims:
            if v.rule is PreemptRule.RECLAIM:
                depth = q.path[w.queue].index(q.common_ancestor(w.queue, v.queue) or "org")
                if f is None or f >= depth:
                    errs.append(f"{w.name}: reclaimed {v.workload} without a guarantee below their ancestor")
    return errs


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(case=_cases(fair_on=False))
def test_random_trees_keep_the_rules_and_never_loop(case: tuple[Snapshot, list[list[Workload]]]) -> None:
    RAN.add("classical")
    _run_until_quiet(*case)


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(case=_cases(fair_on=True))
def test_fair_sharing_cohorts_keep_the_rules_and_never_loop(
    case: tuple[Snapshot, list[list[Workload]]],
) -> None:
    RAN.add("fair")
    _run_until_quiet(*case)


def _run_until_quiet(snap: Snapshot, waves: list[list[Workload]]) -> None:
    """Cycles with the waves arriving, victims requeued, then no arrivals until two cycles in a
    row preempt nothing; every cycle checked, and no victim ever evicts its preemptor."""
    evicted_by: set[tuple[str, str]] = set()
    quiet = 0
    for n in range(len(waves) + 12):
        wave = waves[n] if n < len(waves) else []
        snap = replace(snap, pending=snap.pending + tuple(wave), now=float(n))
        d = decide(snap)
        after = apply_decisions(snap, d, now=float(n))
        assert not check_cycle(snap, d, after)
        assert not _replay_rules(snap, d)
        for p in d.preempted:
            for v in p.victims:
                SEEN[v.rule] = SEEN.get(v.rule, 0) + 1
                # a victim never evicts the workload that evicted it: no preemption loop
                assert (v.workload, p.preemptor) not in evicted_by
                evicted_by.add((p.preemptor, v.workload))
        by_name = {w.name: w for w in snap.pending} | {r.name: r.workload for r in snap.running}
        snap = replace(after, pending=after.pending + tuple(by_name[v] for v in d.victims()))
        quiet = quiet + 1 if not d.preempted and n >= len(waves) else 0
        if quiet >= 2:
            break
    assert quiet >= 2, "preemption did not settle once arrivals stopped"


def test_the_property_saw_every_rule() -> None:
    """The properties are only worth something if their examples preempt by every rule (they run
    derandomized: the same examples every run; at present 58 reclaim, 66 within-queue, 3
    borrowing and 5 fair-sharing victims)."""
    # run alone, or on another worker than one or both properties (pytest -n): run what is missing
    if "classical" not in RAN:
        test_random_trees_keep_the_rules_and_never_loop()
    if "fair" not in RAN:
        test_fair_sharing_cohorts_keep_the_rules_and_never_loop()
    assert all(SEEN.get(r, 0) >= 3 for r in PreemptRule), SEEN
