"""Over-quota fair share on random cohorts: the rules hold and preemption settles.

The trees and workloads are ``tests/engine/test_semantics.py``'s, with the root set to
``fairSharing.mode: OverQuota`` (fair-sharing preemption on) and random over-quota weights.
Checked every cycle: the invariant checker, that each fair-sharing victim's side keeps a
measure at least the preemptor's (replayed with the fair shares the engine fixes at the start
of the cycle), and, once arrivals stop (every queue's demand is then fixed, so are the fair
shares), that preemption settles and no victim evicts the workload that evicted it.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpupool.engine import apply_decisions, decide
from gpupool.engine.decisions import Decisions, PreemptRule
from gpupool.engine.invariants import check_cycle
from gpupool.engine.over_quota import demand, fair_shares
from gpupool.engine.preemption import fair_sharing as fair
from gpupool.engine.state.quota import QuotaState
from gpupool.model import ZERO, Admission, FairSharingMode, Running, Snapshot, Workload
from tests.engine.test_semantics import POOL, _cases

SEEN: dict[str, int] = {}


@st.composite
def _over_quota_cases(draw: st.DrawFn) -> tuple[Snapshot, list[list[Workload]]]:
    snap, waves = draw(_cases(fair_on=True))
    queues = tuple(
        replace(q, fair_sharing_mode=FairSharingMode.OVER_QUOTA)
        if q.parent is None
        else replace(q, over_quota_weight=draw(st.sampled_from((0.0, 1.0, 2.0, 5.0))))
        for q in snap.queues
    )
    return replace(snap, queues=queues), waves


def _fair_share_errors(before: Snapshot, d: Decisions) -> list[str]:
    """Replay the admissions in order; at each preemption, every fair-sharing victim's side
    must measure at least the preemptor's side, by the fair shares of the cycle's start."""
    q = QuotaState(before.queues, [POOL], {POOL: ZERO})
    running = {r.name: r for r in before.running}
    for r in running.values():
        q.add(r.workload.queue, POOL, r.admission.quota_vec())
    roots = [n for n, qu in q.queues.items() if qu.parent is None]
    pend = [(w.queue, w.quota_vec(), [POOL]) for w in before.pending]
    q.set_fair_shares(fair_shares(q, roots, demand(q, roots, pend)))
    pending = {w.name: w for w in before.pending}
    victims = {p.preemptor: p.victims for p in d.preempted}
    errs = []
    for a in d.admitted:
        for name in a.after_evicting:
            r = running.pop(name)
            q.remove(r.workload.queue, POOL, r.admission.quota_vec())
        w = pending[a.workload]
        q.add(
            w.queue, POOL, Running(w, Admission(POOL, a.pods, a.borrowing, before.now)).admission.quota_vec()
        )
        for v in victims.get(w.name, ()):
            if v.rule is not PreemptRule.FAIR_SHARE:
                continue
            lca = q.common_ancestor(w.queue, v.queue)
            mine, theirs = fair.side(q, w.queue, lca), fair.side(q, v.queue, lca)
            if not fair.weighted_share(q, mine) <= fair.weighted_share(q, theirs) + 1e-9:
                errs.append(f"{w.name}: fair-sharing victim {v.workload} left its side below the preemptor's")
    return errs


@settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(case=_over_quota_cases())
def test_over_quota_cohorts_keep_the_rules_and_settle(case: tuple[Snapshot, list[list[Workload]]]) -> None:
    snap, waves = case
    evicted_by: set[tuple[str, str]] = set()
    quiet = 0
    for n in range(len(waves) + 12):
        wave = waves[n] if n < len(waves) else []
        snap = replace(snap, pending=snap.pending + tuple(wave), now=float(n))
        d = decide(snap)
        assert d == decide(snap)  # deterministic
        after = apply_decisions(snap, d, now=float(n))
        assert not check_cycle(snap, d, after)
        assert not _fair_share_errors(snap, d)
        for p in d.preempted:
            for v in p.victims:
                SEEN[v.rule] = SEEN.get(v.rule, 0) + 1
                if n >= len(waves):  # demand fixed: no victim evicts its evictor back
                    assert (v.workload, p.preemptor) not in evicted_by
                evicted_by.add((p.preemptor, v.workload))
        by_name = {w.name: w for w in snap.pending} | {r.name: r.workload for r in snap.running}
        snap = replace(after, pending=after.pending + tuple(by_name[v] for v in d.victims()))
        quiet = quiet + 1 if not d.preempted and n >= len(waves) else 0
        if quiet >= 2:
            break
    assert quiet >= 2, "preemption did not settle once arrivals stopped"


def test_the_property_preempts_for_fair_sharing() -> None:
    """Worth something only if its examples preempt for fair sharing and reclaim."""
    if not SEEN:
        test_over_quota_cohorts_keep_the_rules_and_settle()
    assert SEEN.get(PreemptRule.FAIR_SHARE, 0) >= 3 and SEEN.get(PreemptRule.RECLAIM, 0) >= 3, SEEN
