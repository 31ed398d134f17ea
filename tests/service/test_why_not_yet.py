"""Why not yet, and when (issue 29): ``explain`` names the running work holding what a pending
workload needs (largest first, owners where the caller may read them, "(another team)" where
not), the scope, the usage per pool and per queue, and an estimated start from declared
durations on the controller's clock (the virtual backend's time scale applied)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from gpupool.cli import app
from gpupool.engine import Engine
from gpupool.model import PoolQuota, Queue, Snapshot, devices_only
from gpupool.service.holders import HIDDEN, NO_DURATION, Holder, Wait, WaitReader, present
from tests.engine.clusters import POOL, nodes, queues, running
from tests.engine.clusters import job as engine_job
from tests.test_service_support import Api, running_app, wait_for, wl

H100 = "h100-training"
L40S = "l40s-experiment"


def job(
    name: str, queue: str, pods: int, gpus: int, pool: str, duration: str | None = None
) -> dict[str, Any]:
    m = wl(name, queue=queue, gpus=gpus, duration=duration, pool=pool)
    m["spec"]["podGroups"][0]["replicas"] = pods
    return m


def submit(api: Api, m: dict[str, Any], token: str | None = None) -> None:
    r = api.req("POST", "/v1/workloads", token=token, json=m)
    assert r.status_code == 201, r.text


def explained(api: Api, name: str, code: str, token: str | None = None) -> dict[str, Any]:
    """``explain`` once the scheduler has given ``name`` a reason with ``code``."""

    def probe() -> dict[str, Any] | None:
        r = api.req("GET", f"/v1/workloads/{name}/explain", token=token)
        assert r.status_code == 200, r.text
        ex: dict[str, Any] = r.json()
        return ex if ex.get("code") == code and "holders" in ex else None

    got: dict[str, Any] = wait_for(probe, 120, f"{name} pending with {code}")
    return got


def epoch(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


# ---------------------------------------------------------------------- a quota wait
@pytest.fixture(scope="module")
def quota_world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Api, dict[str, str]]]:
    """llm-team at its guarantee (40 of h100-training) and vision-team's kept 16: alice's 16 more
    GPUs would take the cohort ai-org past its 64, so they wait on the cohort."""
    with running_app(tmp_path_factory.mktemp("why-quota")) as api:
        tok = {
            "qadmin": api.token_for("qadmin", "queue-admin", "llm-team"),
            "alice": api.token_for("alice", "member", "llm-research"),
        }
        submit(api, job("p-big", "llm-pretrain", 3, 8, H100, "1000h"), tok["qadmin"])
        submit(api, job("p-small", "llm-pretrain", 1, 8, H100, "2000h"), tok["qadmin"])
        submit(api, job("a-run", "llm-research", 1, 8, H100, "3000h"), tok["alice"])
        for n in ("p-big", "p-small", "a-run"):
            api.wait_phase(n, "Running", timeout=120)
        submit(api, job("a-wait", "llm-research", 2, 8, H100), tok["alice"])
        yield api, tok


def test_a_quota_wait_names_the_holders_largest_first_with_owners(
    quota_world: tuple[Api, dict[str, str]],
) -> None:
    api, _ = quota_world
    ex = explained(api, "a-wait", "QuotaExceeded")
    assert ex["scope"] == {"kind": "cohort", "name": "ai-org", "pool": H100}
    names = [(h["name"], h["owner"], h["queue"], h["gpus"]) for h in ex["holders"]]
    assert names == [
        ("p-big", "qadmin", "llm-pretrain", 24),
        ("a-run", "alice", "llm-research", 8),
        ("p-small", "qadmin", "llm-pretrain", 8),
    ]
    assert ex["usage"] == f"pool {H100}: 40 of 64 GPUs allocated; cohort ai-org: in use 40 of 64"
    # p-big ends first and frees enough: the estimate is its expected end
    big = ex["holders"][0]
    assert ex["estimatedStart"] == big["expectedEnd"] is not None
    assert [a["name"] for a in ex["after"]] == ["p-big"]
    assert ex["estimate"].startswith("estimated start ") and ex["estimate"].endswith(", after p-big ends")


def test_another_teams_holder_is_not_named_to_a_member(quota_world: tuple[Api, dict[str, str]]) -> None:
    api, tok = quota_world
    ex = explained(api, "a-wait", "QuotaExceeded", tok["alice"])
    rows = [(h["name"], h.get("owner"), h["gpus"]) for h in ex["holders"]]
    assert rows == [(HIDDEN, None, 24), ("a-run", "alice", 8), (HIDDEN, None, 8)]
    assert all("owner" not in h for h in ex["holders"] if h["name"] == HIDDEN)
    assert ex["after"][0]["name"] == HIDDEN and ex["estimate"].endswith(f"after {HIDDEN} ends")
    assert "p-big" not in str(ex) and "qadmin" not in str(ex)


def test_gpupool_explain_prints_the_usage_the_estimate_and_the_holders(
    quota_world: tuple[Api, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    api, tok = quota_world
    explained(api, "a-wait", "QuotaExceeded")

    class Through:  # the CLI's client, answered by the in-process app with alice's token
        def __init__(self, server: str | None, token: str | None) -> None:
            pass

        def call(self, method: str, path: str, **kw: Any) -> Any:
            r = api.req(method, path, token=tok["alice"], **kw)
            assert r.status_code == 200, r.text
            return r.json()

    monkeypatch.setattr("gpupool.cli.client.workloads.Api", Through)
    res = CliRunner().invoke(app, ["explain", "a-wait"])
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert f"  pool {H100}: 40 of 64 GPUs allocated; cohort ai-org: in use 40 of 64" in lines
    assert any(x.startswith("  estimated start ") and x.endswith(f"after {HIDDEN} ends") for x in lines)
    assert f"  held by running work of cohort ai-org in pool {H100}:" in lines
    head = next(i for i, x in enumerate(lines) if x.startswith("WORKLOAD"))
    assert head and lines[head].split()[:4] == ["WORKLOAD", "OWNER", "QUEUE", "GPUS"]
    rows = [x.split() for x in lines[head + 1 : head + 4]]
    assert [r[:2] for r in rows] == [["(another", "team)"], ["a-run", "alice"], ["(another", "team)"]]


# ---------------------------------------------------------------------- capacity waits
@pytest.fixture(scope="module")
def capacity_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    """Four of the eight H100 nodes and one of the four L40S nodes cordoned, at 60 virtual
    seconds per wall second (``gpupool serve``'s default)."""
    with running_app(tmp_path_factory.mktemp("why-capacity"), time_scale=60.0) as api:
        for n in ("h100-001", "h100-002", "h100-003", "h100-004", "l40s-004"):
            r = api.req("POST", f"/v1/nodes/{n}/cordon")
            assert r.status_code == 200, r.text
        yield api


def test_a_capacity_wait_starts_when_the_named_holder_is_expected_to_end(
    capacity_api: Api,
) -> None:
    api = capacity_api
    before = time.time()
    submit(api, job("c-r1", "llm-pretrain", 2, 8, H100, "10h"))
    submit(api, job("c-r2", "llm-pretrain", 1, 8, H100, "30h"))
    submit(api, job("c-r3", "llm-research", 1, 8, H100, "5h"))
    for n in ("c-r1", "c-r2", "c-r3"):
        api.wait_phase(n, "Running", timeout=120)
    after_running = time.time()
    submit(api, job("c-wait", "llm-pretrain", 2, 8, H100))
    ex = explained(api, "c-wait", "InsufficientCapacity")
    assert ex["scope"]["kind"] == "pool" and ex["scope"]["name"] == H100
    # it is held two nodes: the one c-r3 frees first and one of c-r1's; it starts when c-r1 ends
    assert [(h["name"], h["gpus"]) for h in ex["holders"]] == [("c-r1", 8), ("c-r3", 8)]
    r1 = ex["holders"][0]
    assert ex["estimatedStart"] == r1["expectedEnd"]
    assert [a["name"] for a in ex["after"]] == ["c-r1", "c-r3"]
    assert ex["estimate"].endswith(", after c-r1 and 1 more end")
    # 10 virtual hours at 60 per second: 600 s of wall time from its start (never 36,000)
    end = epoch(r1["expectedEnd"])
    assert before + 600 - 1 <= end <= after_running + 600 + 1, (end - before, end - after_running)
    assert (
        ex["usage"] == f"pool {H100}: 32 of 64 GPUs allocated; queue llm-pretrain: in use 24 of guarantee 32"
    )


def test_without_declared_durations_there_is_no_estimate(capacity_api: Api) -> None:
    api = capacity_api
    submit(api, job("n-r1", "llm-research", 1, 4, L40S))
    submit(api, job("n-v1", "vision-team", 2, 4, L40S))
    for n in ("n-r1", "n-v1"):
        api.wait_phase(n, "Running", timeout=120)
    submit(api, job("n-wait", "llm-research", 1, 4, L40S))
    ex = explained(api, "n-wait", "InsufficientCapacity")
    assert ex["estimatedStart"] is None and ex["after"] == []
    assert ex["estimate"] == NO_DURATION == "no estimate: running work declares no duration"
    assert {h["name"] for h in ex["holders"]} <= {"n-r1", "n-v1"} and ex["holders"]
    assert all(h["expectedEnd"] is None for h in ex["holders"])


# ---------------------------------------------------------------------- the reader, pure
def _wait(
    runs: list[tuple[float, float | None]], pods: int, code: str, scale: float, now: float, k: float
) -> Wait | None:
    """One 8-GPU job per node (admitted at, duration), every time multiplied by ``k``; a gang of
    ``pods`` 8-GPU pods waits with ``code`` (the cohort is full for a quota wait)."""
    full = len(runs) * 8 if code == "QuotaExceeded" else 100
    eng = Engine(Snapshot(nodes(len(runs)), (POOL,), queues({"a": 8 * len(runs)}, root_gpus=full)))
    for i, (at, d) in enumerate(runs):
        w = engine_job(f"r{i}", "a", 8, expected_duration_s=None if d is None else d * k)
        eng.add_running(running(w, f"n{i}", tuple(range(8)), at=at * k))
    return WaitReader(eng, scale).read(engine_job("w", "a", 8, replicas=pods), code, now * k)


@settings(max_examples=60, deadline=None)
@given(
    runs=st.lists(
        st.tuples(
            st.floats(0, 100, allow_nan=False), st.one_of(st.none(), st.floats(1, 1000, allow_nan=False))
        ),
        min_size=1,
        max_size=4,
    ),
    pods=st.integers(1, 4),
    code=st.sampled_from(["QuotaExceeded", "InsufficientCapacity"]),
    scale=st.sampled_from([1.0, 60.0]),
)
def test_scaling_every_time_names_the_same_workloads(
    runs: list[tuple[float, float | None]], pods: int, code: str, scale: float
) -> None:
    """Scaling every time by 1000 names the same holders and waits for the same ones; the
    estimate is the expected end of the first workload it waits for, never before now."""
    pods = min(pods, len(runs))
    one, big = (_wait(runs, pods, code, scale, 100.0, k) for k in (1.0, 1000.0))
    assert one is not None and big is not None
    assert [h.name for h in one.holders] == [h.name for h in big.holders]
    assert [h.name for h in one.after] == [h.name for h in big.after]
    assert one.why_none == big.why_none and (one.start is None) == (big.start is None)
    if one.start is not None and big.start is not None:
        assert big.start == pytest.approx(one.start * 1000)
        assert one.start >= 100.0 and one.after and one.after[0].end is not None
        assert one.start == max(one.after[0].end, 100.0)
        assert all(h.end is not None and h.end <= one.start for h in one.after)


def test_work_past_its_expected_end_is_not_called_too_few_nodes() -> None:
    """A run whose declared duration has passed (its end not yet reported) gives no estimate,
    and the sentence says the GPUs are past their expected end, not that no nodes could free."""
    got = _wait([(0.0, 10.0), (0.0, 10.0)], 2, "InsufficientCapacity", 1.0, 100.0, 1.0)
    assert got is not None and got.start is None and got.after == []
    assert "past their expected end" in got.why_none and [h.name for h in got.holders] == ["r0", "r1"]


def test_a_queue_wait_names_only_that_queues_subtree_and_its_figures() -> None:
    """Queue a (16 guaranteed, no borrowing) is full; b's work in the same cohort holds none of
    a's quota, so it is not named; the estimate is a's first end."""
    qs = (
        Queue("root", quotas=(PoolQuota("p0", devices_only(100_000)),)),
        Queue("a", parent="root", quotas=(PoolQuota("p0", devices_only(16_000), devices_only(0)),)),
        Queue("b", parent="root", quotas=(PoolQuota("p0", devices_only(16_000)),)),
    )
    eng = Engine(Snapshot(nodes(4), (POOL,), qs))
    for name, q, node, d in (
        ("a-long", "a", "n0", 50.0),
        ("a-short", "a", "n1", 20.0),
        ("b-big", "b", "n2", 5.0),
    ):
        eng.add_running(running(engine_job(name, q, 8, expected_duration_s=d), node, tuple(range(8))))
    got = WaitReader(eng, 1.0).read(engine_job("w", "a", 8), "QuotaExceeded", 1.0)
    assert got is not None and got.scope == {"kind": "queue", "name": "a", "pool": "p0"}
    assert [h.name for h in got.holders] == ["a-long", "a-short"]
    assert got.start == 20.0 and [h.name for h in got.after] == ["a-short"]
    assert got.usage == "pool p0: 24 of 32 GPUs allocated; queue a: in use 16 of guarantee 16"


def test_the_top_five_holders_are_shown_and_the_rest_counted() -> None:
    hs = [Holder(f"h{i}", "a", (10 - i) * 1000, None) for i in range(7)]
    wait = Wait({"kind": "queue", "name": "a", "pool": "p0"}, hs, "u", 0.0, why_none=NO_DURATION)
    out = present(wait, lambda q: True, lambda n: "o")
    assert [h["name"] for h in out["holders"]] == ["h0", "h1", "h2", "h3", "h4"]
    assert out["holdersNotShown"] == 2 and out["estimatedStart"] is None and out["estimate"] == NO_DURATION
    assert out["holders"][0] == {"name": "h0", "queue": "a", "owner": "o", "gpus": 10, "expectedEnd": None}


def test_describe_workload_prints_the_estimate_and_the_holders_too(
    quota_world: tuple[Api, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``describe workload`` fetches the same explanation; it printed only the reason."""
    api, tok = quota_world
    explained(api, "a-wait", "QuotaExceeded")

    class Through:
        def __init__(self, server: str | None, token: str | None) -> None:
            pass

        def call(self, method: str, path: str, **kw: Any) -> Any:
            r = api.req(method, path, token=tok["alice"], **kw)
            assert r.status_code == 200, r.text
            return r.json()

    monkeypatch.setattr("gpupool.cli.client.objects.Api", Through)
    res = CliRunner().invoke(app, ["describe", "workload", "a-wait"])
    assert res.exit_code == 0, res.output
    assert f"  held by running work of cohort ai-org in pool {H100}:" in res.stdout.splitlines()
    assert any(x.startswith("  estimated start ") for x in res.stdout.splitlines())
