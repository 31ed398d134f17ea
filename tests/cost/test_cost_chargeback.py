"""Chargeback: known answers, and the reconciliation rule over random histories."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.cost.chargeback import (
    PoolCost,
    cents,
    chargeback,
    pools_of,
    reconciles,
    split_cents,
)
from gpupool.cost.history import History, Resources, Run, Wait, WorkloadInfo
from gpupool.cost.metering import GPU_HOUR, Window, meter
from gpupool.cost.policy import CostPolicySpec, PolicyError, parse_policy
from tests.cost.test_cost_metering import example_bundle

T0 = datetime(2026, 11, 2, tzinfo=UTC)
HOUR = Window(T0, T0 + timedelta(hours=1))


def info(name: str, queue: str, gpus: int = 4, cls: str = "", typ: str = "training") -> WorkloadInfo:
    return WorkloadInfo(name, queue, cls, typ, gpus * 1000, 8000, 1024, "", "Running", "")


def run(name: str, pool: str, gpus: int, start_s: int, end_s: int | None, outcome: str = "Succeeded") -> Run:
    end = None if end_s is None else T0 + timedelta(seconds=end_s)
    res = Resources(pool, "H100-80GB", gpus * 1000, gpus, 1000, 8000, 1024)
    return Run(name, 1, T0 + timedelta(seconds=start_s), end, outcome, res)


def test_known_answer_one_pool() -> None:
    """8 GPUs at 2.90 for an hour is 23.20; 4 GPUs for 30 min is 5.80 of it, idle the rest."""
    h = History({"a": info("a", "team-a")}, [run("a", "p", 4, 0, 1800)], [], [])
    pools = {"p": PoolCost("p", Decimal("2.90"), 8)}
    cb = chargeback(h, meter(h, HOUR), pools, HOUR, CostPolicySpec())
    (pc,) = cb.pools
    assert (pc.total_cents, pc.charges, pc.idle_cents) == (2320, {("team-a", ""): 580}, 1740)
    assert reconciles(pc)


def test_multiplier_is_a_surcharge_and_idle_spreads_by_guarantee() -> None:
    h = History(
        {"a": info("a", "team-a", cls="high"), "b": info("b", "team-b")},
        [run("a", "p", 2, 0, 3600), run("b", "p", 2, 0, 3600)],
        [],
        [],
    )
    pools = {"p": PoolCost("p", Decimal("1.00"), 8, {"team-a": 6000, "team-b": 2000})}
    pol = parse_policy(
        {"kind": "CostPolicy", "spec": {"priorityMultipliers": {"high": 1.5}, "spreadIdleByGuarantee": True}}
    )
    cb = chargeback(h, meter(h, HOUR), pools, HOUR, pol)
    (pc,) = cb.pools
    assert pc.charges == {("team-a", "high"): 200, ("team-b", ""): 200}
    assert cb.surcharges == {"team-a": 100}
    assert pc.idle_shares == {"team-a": 300, "team-b": 100}  # 4.00 idle, 3:1 by guarantee
    assert reconciles(pc)


def test_waiting_cost_and_preemption_loss() -> None:
    h = History(
        {"a": info("a", "team-a", gpus=2, typ="batch")},
        [run("a", "p", 2, 0, 600, "Preempted")],
        [Wait("a", T0 + timedelta(seconds=600), None, False, "quota")],
        [],
    )
    pools = {"p": PoolCost("p", Decimal("3.00"), 8)}
    cb = chargeback(h, meter(h, HOUR), pools, HOUR, CostPolicySpec())
    # 2 GPUs waited 50 min: 1.6667 GPU-hours, at 3.00 = 5.00
    assert cb.waiting == {("team-a", "batch"): (2 * 1000 * 3000 * 10**6, 500)}
    assert cb.losses == {("team-a", "preempted"): 2 * 1000 * 600 * 10**6}


def test_pools_from_the_example_configuration() -> None:
    pools = pools_of(example_bundle())
    h100 = pools["h100-training"]
    assert h100.price == Decimal("2.9") and h100.gpus > 0
    # llm-team's guarantee is its children's: the most specific holders are charged idle
    assert "llm-team" not in h100.guarantees and "llm-pretrain" in h100.guarantees


def test_bad_policy_names_the_field() -> None:
    with pytest.raises(PolicyError, match=r"spec\.retentionDays"):
        parse_policy({"kind": "CostPolicy", "spec": {"retentionDays": 0}})
    with pytest.raises(PolicyError, match=r"spec\.priorityMultipliers\.x"):
        parse_policy({"kind": "CostPolicy", "spec": {"priorityMultipliers": {"x": -1}}})
    with pytest.raises(PolicyError, match=r"spec\.colour"):
        parse_policy({"kind": "CostPolicy", "spec": {"colour": 1}})


@given(st.integers(0, 10**9), st.dictionaries(st.text(max_size=3), st.integers(0, 10**15), max_size=6))
def test_split_cents_sums_exactly(total: int, weights: dict[str, int]) -> None:
    out = split_cents(total, weights)
    assert set(out) == set(weights)
    if sum(weights.values()):
        assert sum(out.values()) == total
        assert all(v >= 0 for v in out.values())


runs_st = st.lists(
    st.tuples(
        st.sampled_from(["q1", "q2", "q3"]),
        st.sampled_from(["p1", "p2"]),
        st.integers(1, 8000),  # milli-GPUs
        st.integers(-3600, 7200),  # start, s (runs may start before and end after the window)
        st.integers(1, 7200),  # length, s
        st.booleans(),  # still running
        st.integers(0, 999_999),  # microseconds
    ),
    max_size=25,
)


@settings(max_examples=200, deadline=None)
@given(runs_st, st.decimals("0.01", "50", places=2), st.integers(1, 64), st.booleans())
def test_reconciliation_to_the_cent(
    runs: list[tuple[str, str, int, int, int, bool, int]], price: Decimal, gpus: int, spread: bool
) -> None:
    """Every queue's list charge plus idle equals capacity x price x hours, to the cent."""
    wl: dict[str, WorkloadInfo] = {}
    hist_runs: list[Run] = []
    for i, (q, pool, milli, start, length, live, us) in enumerate(runs):
        name = f"w{i}"
        wl[name] = info(name, q)
        begin = T0 + timedelta(seconds=start, microseconds=us)
        end = None if live else begin + timedelta(seconds=length)
        hist_runs.append(
            Run(
                name,
                1,
                begin,
                end,
                "Running" if live else "Succeeded",
                Resources(pool, "m", milli, 1, milli, 0, 0),
            )
        )
    h = History(wl, hist_runs, [], [])
    pools = {
        "p1": PoolCost("p1", price, gpus, {"q1": 1000, "q2": 3000}),
        "p2": PoolCost("p2", price * 2, gpus * 2),
    }
    win = Window(T0, T0 + timedelta(hours=1, microseconds=123))
    metered = meter(h, win)
    cb = chargeback(h, metered, pools, win, CostPolicySpec(spreadIdleByGuarantee=spread))
    for pc in cb.pools:
        assert reconciles(pc)
        assert pc.allocated == sum(m.gpu for m in metered if m.pool == pc.pool)
        assert pc.capacity == max(pools[pc.pool].gpus * 1000 * win.us, pc.allocated)
        for (q, _), charged in pc.charges.items():  # each share is its exact price, within rounding
            alloc = sum(m.gpu for m in metered if m.pool == pc.pool and m.queue == q)
            assert abs(charged - cents(alloc, pc.price)) < 2
        if spread and pc.pool == "p1" and pc.idle_cents:
            assert sum(pc.idle_shares.values()) == pc.idle_cents
    assert sum(m.gpu for m in metered) <= sum(pc.capacity for pc in cb.pools)
    assert GPU_HOUR == 3_600_000_000_000
