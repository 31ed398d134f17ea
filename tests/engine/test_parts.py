"""The engine's parts through their own interfaces (``docs/architecture.md``, "The engine's
parts"): each is made with what it needs and works without the ``Engine`` around it."""

from __future__ import annotations

from gpupool.engine import Engine
from gpupool.engine.decisions import Decisions, PendingCode, PreemptRule
from gpupool.engine.facts import WorkloadFacts
from gpupool.engine.hints import BlockedHints
from gpupool.engine.partial import PartialAdmitter
from gpupool.engine.preemption.candidates import CandidateFinder
from gpupool.engine.preemption.search import Preemptor
from gpupool.engine.rounds import BORROW_ANY, BorrowRounds
from gpupool.engine.session import Session
from gpupool.engine.shape_mix import ShapeMix
from gpupool.model import EngineConfig, PoolQuota, Queue, Snapshot, Workload, devices_only
from tests.engine.clusters import POOL, engine, job, nodes, running


def _session(guarantees: dict[str, int], n_nodes: int = 1) -> Session:
    return engine(n_nodes, guarantees).ssn


def test_the_engine_holds_its_parts_over_one_session() -> None:
    eng = engine()
    parts = (eng.preemptor, eng.partial, eng.hints, eng.attempt, eng.passes)
    assert all(p.ssn is eng.ssn for p in parts)
    assert eng.partial.preemptor is eng.preemptor is eng.attempt.preemptor
    assert eng.cluster is eng.ssn.cluster and eng.running is eng.ssn.runs.by_name


def test_charge_and_discharge_are_each_others_reverse() -> None:
    ssn = _session({"a": 8})
    r = running(job("r", "a", 2), "n0", (0, 1))
    ssn.charge(r)
    assert ssn.cluster.pool_used["p0"] == 2000 and ssn.quota.U[("a", "p0")][0] == 2000
    ssn.discharge(r)
    assert ssn.cluster.pool_used["p0"] == 0 and ssn.quota.U[("a", "p0")][0] == 0 and not ssn.runs.by_name


def test_borrow_rounds_run_pass_one_then_each_level_then_the_whole_cohort() -> None:
    """A three-level tree (root, mid, leaf): pass 2 has a round for the middle level and one
    for the cohort; each round gets what the last one left."""
    qs = (
        Queue("root", quotas=(PoolQuota("p0", devices_only(16000)),)),
        Queue("mid", parent="root", quotas=(PoolQuota("p0", devices_only(8000)),)),
        Queue("leaf", parent="mid", quotas=(PoolQuota("p0", devices_only(4000)),)),
    )
    eng = Engine(Snapshot(nodes(2), (POOL,), qs))
    rounds = BorrowRounds(eng.quota, eng.pools)
    seen: list[tuple[int, bool, list[str]]] = []
    w = job("w", "leaf", 1)

    def one_pass(
        by_queue: dict[str, list[Workload]], out: Decisions, borrow: bool
    ) -> dict[str, list[Workload]]:
        seen.append((rounds.level, borrow, sorted(by_queue)))
        return by_queue

    assert rounds.run({"leaf": [w]}, Decisions(), False, one_pass) == {"leaf": [w]}
    rounds.run({"leaf": [w]}, Decisions(), True, one_pass)
    assert seen == [(0, False, ["leaf"]), (1, True, ["leaf"]), (BORROW_ANY, True, ["leaf"])]
    rounds.level = 1  # within the middle queue's guarantee: this round; beyond it: a later one
    assert not rounds.beyond_round(w, "p0", devices_only(6000))
    assert rounds.beyond_round(w, "p0", devices_only(10000))


def test_workload_facts_order_pools_and_remember_per_workload_object() -> None:
    eng = engine()
    facts = WorkloadFacts(eng.quota, eng.pools, eng.cluster)
    w = job("w", "a", 1)
    assert facts.candidate_pools(w) == ["p0"]
    assert facts.candidate_pools(job("x", "a", 1, pool="p9")) == []
    assert facts.of(w) is facts.of(w)
    assert facts.of(job("w", "a", 2)) is not facts.of(w)  # a new workload under an old name


def test_the_preemptor_changes_nothing_when_no_victim_makes_room() -> None:
    ssn = _session({"a": 8})
    ssn.charge(running(job("hi", "a", 8, prio=10), "n0", tuple(range(8))))
    ssn.stmt.commit()
    ssn.begin(frozenset(), None)
    pre = Preemptor(ssn, CandidateFinder(ssn))
    out = Decisions()
    w = job("w", "a", 4, prio=5)
    assert not pre.try_preempt(w, "p0", w.quota_vec(), out, 0)
    assert not out.preempted and set(ssn.runs.by_name) == {"hi"}
    assert pre.candidates.find(w, "p0", w.quota_vec()) == []  # only higher priority runs


def test_the_preemptor_evicts_the_cheapest_set_and_admits() -> None:
    ssn = _session({"a": 8})
    for i in range(4):
        ssn.charge(running(job(f"lo{i}", "a", 2, prio=1), "n0", (2 * i, 2 * i + 1), at=float(i)))
    ssn.stmt.commit()
    ssn.begin(frozenset(), None)
    pre = Preemptor(ssn, CandidateFinder(ssn))
    out = Decisions()
    w = job("w", "a", 4, prio=5)
    assert pre.try_preempt(w, "p0", w.quota_vec(), out, 0)
    (p,) = out.preempted
    assert {v.workload for v in p.victims} == {"lo2", "lo3"}  # the most recently admitted go
    assert all(v.rule is PreemptRule.WITHIN_QUEUE for v in p.victims)
    assert "w" in ssn.runs.by_name and ssn.cs.evicted == {"lo2", "lo3"}
    ssn.stmt.discard()


def test_the_partial_admitter_starts_a_gang_with_what_the_guarantee_holds() -> None:
    ssn = _session({"a": 3}, n_nodes=1)
    ssn.begin(frozenset(), None)
    part = PartialAdmitter(ssn, Preemptor(ssn, CandidateFinder(ssn)))
    out = Decisions()
    g = job("g", "a", 1, replicas=5, gang_min=2)
    assert part.in_guarantee(g, ["p0"], out)
    (a,) = out.admitted
    assert len(a.pods) == 3 and not a.borrowing
    ssn.stmt.discard()


def test_blocked_hints_prove_work_that_can_neither_fit_nor_preempt() -> None:
    eng = engine(1, {"a": 8})
    eng.add_running(running(job("hi", "a", 8, prio=10), "n0", tuple(range(8))))
    hints = BlockedHints(eng.ssn, eng.facts)
    assert hints.blocked_at_start(job("w", "a", 4, prio=5))
    assert not hints.blocked_at_start(job("v", "a", 4, prio=20))  # it may evict "hi"


def test_the_shape_mix_is_kept_only_where_a_scorer_weighs_it() -> None:
    off = engine(config=EngineConfig(score="binpack"))
    mix = ShapeMix(Snapshot(nodes(1), (POOL,), (), config=EngineConfig(score="binpack")), off.placer)
    mix.add([job("w", "a", 1)])
    assert not mix.on and not mix.running and not mix.weighs(True)
    on = engine(config=EngineConfig(score="fragmentation"))
    on.add_running(running(job("r", "a", 1), "n0", (0,)))
    assert on.mix.on and on.mix.weighs() and sum(on.mix.running.values()) == 1
    on.remove_running("r")
    assert not +on.mix.running


def test_an_attempt_defers_borrowers_to_pass_two_and_says_why_work_stays_pending() -> None:
    eng = engine(1, {"a": 2})
    eng.ssn.begin(frozenset(), None)
    out = Decisions()
    w = job("w", "a", 4)
    assert eng.attempt.must_borrow(w)
    assert eng.attempt.run(w, out, allow_borrow=False) is None  # pass 1: only by borrowing
    eng.rounds.level = BORROW_ANY  # the last round of pass 2
    assert eng.attempt.run(w, out, allow_borrow=True) is True
    assert out.admitted[0].borrowing
    assert eng.attempt.run(job("big", "a", 16), out, allow_borrow=True) is False
    (p,) = out.pending
    assert p.code is PendingCode.UNSATISFIABLE and p.workload == "big"  # a 16-GPU pod, 8-GPU nodes
    eng.ssn.stmt.discard()
