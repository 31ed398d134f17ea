"""The invariant checker holds every reclaim victim to its preemptor's ``reclaimWithinCohort``.

It checked ``LowerPriority`` only: a reclaim of a *more* important borrower under
``LowerOrEqualPriority``, or any reclaim from a queue whose policy is ``Never``, passed the
checker, so the property tests that lean on it (``tests/engine/test_semantics.py``) could not catch an
engine that broke either rule. The decisions here are the engine's own on
``reclaim_lower_or_equal.yaml``; the checker is then shown a state in which they are illegal.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from gpupool.engine import Decisions, decide
from gpupool.engine.invariants import check_decisions
from gpupool.model import ReclaimPolicy, Snapshot
from tests.scenario_runner import _bundle, load_scenario, run_scenario

SCENARIO = Path(__file__).parent.parent / "scenarios" / "reclaim_lower_or_equal.yaml"


def _reclaim_cycle() -> tuple[Snapshot, Decisions]:
    """The state before ``a-new`` reclaims ``b-eq`` (equal priority), and that decision."""
    scn = load_scenario(SCENARIO)
    scn["cycles"] = scn["cycles"][:1]
    ((_, snap),) = run_scenario(scn)
    a_new = next(w for w in _bundle(load_scenario(SCENARIO)).workloads if w.name == "a-new")
    before = replace(snap, pending=(*snap.pending, a_new), now=1.0)
    d = decide(before)
    assert [v.workload for p in d.preempted for v in p.victims] == ["b-eq"]
    return before, d


def _with_victim_priority(snap: Snapshot, name: str, priority: int) -> Snapshot:
    running = tuple(
        replace(r, workload=replace(r.workload, priority=priority)) if r.name == name else r
        for r in snap.running
    )
    return replace(snap, running=running)


def _with_reclaim_policy(snap: Snapshot, queue: str, policy: ReclaimPolicy) -> Snapshot:
    queues = tuple(
        replace(q, preemption=replace(q.preemption, reclaim_within_cohort=policy)) if q.name == queue else q
        for q in snap.queues
    )
    return replace(snap, queues=queues)


def test_an_equal_priority_reclaim_is_legal_under_lower_or_equal_priority() -> None:
    before, d = _reclaim_cycle()
    assert check_decisions(before, d) == []


def test_a_more_important_victim_breaks_lower_or_equal_priority() -> None:
    before, d = _reclaim_cycle()
    a_new = next(w for w in before.pending if w.name == "a-new")
    tampered = _with_victim_priority(before, "b-eq", a_new.priority + 1)
    errs = check_decisions(tampered, d)
    assert any("b-eq" in e and "priority" in e for e in errs), errs


def test_a_reclaim_breaks_a_never_policy() -> None:
    before, d = _reclaim_cycle()
    errs = check_decisions(_with_reclaim_policy(before, "team-a", ReclaimPolicy.NEVER), d)
    assert any("b-eq" in e and "Never" in e for e in errs), errs
