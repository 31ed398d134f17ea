"""``engine/over_quota.py``: the water-filling of fair shares and the OverQuota measure."""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gpupool.engine.over_quota import demand, fair_shares, water_fill
from gpupool.engine.state.quota import QuotaState
from gpupool.manifests import Bundle, ManifestError, build, parse_documents
from gpupool.model import FairSharingMode, PoolQuota, Queue, Vec, devices_only

_TOL = 1e-6


def test_deserved_first_then_the_surplus_by_weight() -> None:
    # deserved 2 and 6, over-quota weights 3 and 1, 16 GPUs, both ask for 16: 2 + 6 first,
    # the surplus of 8 by 3:1
    assert water_fill(16.0, [(2.0, 16.0, 3.0), (6.0, 16.0, 1.0)]) == pytest.approx([8.0, 8.0])
    # weights 1 and 3: the surplus goes 2 and 6
    assert water_fill(16.0, [(2.0, 16.0, 1.0), (6.0, 16.0, 3.0)]) == pytest.approx([4.0, 12.0])


def test_what_a_queue_cannot_use_is_split_again() -> None:
    # the first asks for 3 only: it keeps 3, the 9 left go 1:2
    got = water_fill(16.0, [(2.0, 3.0, 1.0), (2.0, 16.0, 1.0), (2.0, 16.0, 2.0)])
    assert got == pytest.approx([3.0, 5.0, 8.0])


def test_a_weight_of_zero_gets_its_deserved_quota_only() -> None:
    assert water_fill(10.0, [(2.0, 10.0, 0.0), (2.0, 10.0, 1.0)]) == pytest.approx([2.0, 8.0])


def test_oversubscribed_deserved_quotas_are_scaled_alike() -> None:
    assert water_fill(6.0, [(4.0, 10.0, 1.0), (8.0, 10.0, 1.0)]) == pytest.approx([2.0, 4.0])


_claims = st.lists(
    st.tuples(
        st.floats(0, 100, allow_nan=False),
        st.floats(0, 100, allow_nan=False),
        st.floats(0, 10, allow_nan=False),
    ),
    min_size=0,
    max_size=8,
)


@settings(max_examples=300, deadline=None)
@given(st.floats(0, 500, allow_nan=False), _claims)
@example(98.5, [(0.0, 100.0, 5e-324)])  # a subnormal weight: (left * w) / sum rounded past left
def test_water_fill_invariants(capacity: float, claims: list[tuple[float, float, float]]) -> None:
    """No share above its demand; each at least min(deserved, demand) when the deserved
    quotas fit; the shares sum to min(capacity, total demand) (a weight-0 claim counting only
    its deserved part); the same result on every call (deterministic)."""
    got = water_fill(capacity, claims)
    assert got == water_fill(capacity, claims)
    assert len(got) == len(claims)
    want = [m for _, m, _ in claims]
    floor = [min(d, m) for d, m, _ in claims]
    for x, m in zip(got, want, strict=True):
        assert -_TOL <= x <= m + _TOL
    total = sum(got)
    assert total <= capacity + _TOL * max(1.0, capacity)
    if sum(floor) <= capacity:
        for x, f in zip(got, floor, strict=True):
            assert x >= f - _TOL
    # a weight-0 claim can get its floor only; every other claim up to its demand
    reachable = sum(m if wt > 0 else min(d, m) for d, m, wt in claims)
    assert math.isclose(total, min(capacity, reachable), rel_tol=1e-6, abs_tol=1e-6)
    if all(wt > 0 for _, _, wt in claims):
        assert math.isclose(total, min(capacity, sum(want)), rel_tol=1e-6, abs_tol=1e-6)


@settings(max_examples=100, deadline=None)
@given(st.floats(1, 500, allow_nan=False), _claims, st.integers(0, 7))
def test_more_demand_never_lowers_capacity_left_to_others_below_their_floor(
    capacity: float, claims: list[tuple[float, float, float]], k: int
) -> None:
    """A queue asking for more never takes anything below another's min(deserved, demand)."""
    if not claims:
        return
    i = k % len(claims)
    more = list(claims)
    d, m, wt = more[i]
    more[i] = (d, m + 50.0, wt)
    got = water_fill(capacity, more)
    floor = [min(d_, m_) for d_, m_, _ in more]
    if sum(floor) <= capacity:
        for j, (x, f) in enumerate(zip(got, floor, strict=True)):
            if j != i:
                assert x >= f - _TOL


def _gpus(n: int) -> Vec:
    return (n * 1000, 0, 0, 0, 0)


def _tree() -> QuotaState:
    """org (16, OverQuota) -> dept (deserves 8, weight 1) -> {x: 2, y: 2}; solo (deserves 4,
    weight 1). Two levels: dept's fair share is split again among its children."""
    g = lambda n: (PoolQuota("p", devices_only(n * 1000)),)  # noqa: E731
    qs = [
        Queue("org", quotas=g(16), fair_sharing_mode=FairSharingMode.OVER_QUOTA),
        Queue("dept", "org", quotas=g(8), over_quota_weight=1.0),
        Queue("x", "dept", quotas=g(2), over_quota_weight=1.0),
        Queue("y", "dept", quotas=g(2), over_quota_weight=3.0),
        Queue("solo", "org", quotas=g(4), over_quota_weight=1.0),
    ]
    return QuotaState(qs, ["p"], {"p": (16000, 10**6, 10**6, 0, 0)})


def test_fair_shares_descend_the_tree() -> None:
    q = _tree()
    ask = _gpus(16)
    want = demand(q, ["org"], [("x", ask, ["p"]), ("y", ask, ["p"]), ("solo", _gpus(4), ["p"])])
    f = fair_shares(q, ["org"], want)
    # org 16: dept deserves 8, solo 4 (and asks 4, its whole demand): the surplus of 4 goes
    # to dept, 12. dept's 12: x and y get their deserved 2 and 2 first, then the 8 left by 1:3
    assert f[("org", "p")][0] == pytest.approx(16000)
    assert f[("solo", "p")][0] == pytest.approx(4000)
    assert f[("dept", "p")][0] == pytest.approx(12000)
    assert f[("x", "p")][0] == pytest.approx(4000)
    assert f[("y", "p")][0] == pytest.approx(8000)
    # CPU is guaranteed by nobody: every node is measured against the pool's CPU, as by default
    assert f[("x", "p")][1] == pytest.approx(10**6)


def test_the_measure_is_usage_over_fair_share_without_the_queue_weight() -> None:
    q = _tree()
    q.add("x", "p", _gpus(2))
    q.add("y", "p", _gpus(2))
    before = (q.weighted_share("x"), q.weighted_share("y"))
    assert before == pytest.approx((1.0, 1.0))  # by guarantee until fair shares are set
    ask = _gpus(16)
    want = demand(q, ["org"], [("x", ask, ["p"]), ("y", ask, ["p"])])
    q.set_fair_shares(fair_shares(q, ["org"], want))
    # solo asks for nothing: dept's fair share is all 16; x 2 and y 2 first,
    # the 12 left by 1:3: 5 and 11
    assert q.weighted_share("x") == pytest.approx(2000 / 5000)
    assert q.weighted_share("y") == pytest.approx(2000 / 11000)


def _queues(yaml_text: str) -> list[Queue]:
    return build(parse_documents(yaml_text, "q.yaml"), Bundle()).queues


def test_manifest_fields_reach_the_model() -> None:
    qs = _queues(
        "apiVersion: gpupool.io/v1alpha1\nkind: Queue\nmetadata: {name: org}\n"
        "spec: {fairSharing: {mode: OverQuota}}\n---\n"
        "apiVersion: gpupool.io/v1alpha1\nkind: Queue\nmetadata: {name: a}\n"
        "spec: {parent: org, overQuotaWeight: 2.5}\n"
    )
    by = {q.name: q for q in qs}
    assert by["org"].fair_sharing_mode is FairSharingMode.OVER_QUOTA
    assert by["a"].over_quota_weight == 2.5
    assert by["a"].fair_sharing_mode is FairSharingMode.GUARANTEE_WEIGHTED  # read at the root only


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ("{overQuotaWeight: -1}", "spec.overQuotaWeight"),
        ("{overQuotaWeight: 1e9}", "spec.overQuotaWeight"),
        ("{fairSharing: {mode: Proportional}}", "spec.fairSharing.mode"),
    ],
)
def test_bad_settings_are_errors_at_their_field(spec: str, field: str) -> None:
    with pytest.raises(ManifestError) as ei:
        _queues(f"apiVersion: gpupool.io/v1alpha1\nkind: Queue\nmetadata: {{name: org}}\nspec: {spec}\n")
    assert f"q.yaml: document 1 (Queue/org): {field}" in str(ei.value)
