"""Fair to everyone (issue 30): pending limits per queue and user, a submit rate per token, and a
cycle whose cost two huge unsatisfiable gangs cannot blow up.

Run as a script (``python -m tests.service.test_tenant_limits``) it prints the controller's CPU per
cycle with the two huge gangs pending (``time.process_time``), the figure the issue asks for.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.manifests.convert import workload_model
from gpupool.model import PendingLimits
from gpupool.service.controller import Controller
from gpupool.service.limits import PendingCounter, TenantLimits, TokenBuckets, parse_rate
from gpupool.store import Store
from tests.test_service_support import Api, db_url, in_process_controller, running_app, wait_for, wl

__all__ = ["db_url"]  # the fixture, imported for the tests below

#: a node selector no node has: such a workload passes admission and stays Pending
NOWHERE = {"nodeSelector": {"gpupool.io/test": "nowhere"}}


def pending_wl(name: str, queue: str = "llm-research", replicas: int = 1) -> dict[str, Any]:
    m = wl(name, queue=queue, nodeSelector=NOWHERE["nodeSelector"])
    m["spec"]["podGroups"][0]["replicas"] = replicas
    return m


def with_limits(api: Api, queue: str, **limits: int) -> None:
    q = api.get(f"/v1/config/queues/{queue}")
    q["spec"]["limits"] = limits
    r = api.req("PUT", f"/v1/config/queues/{queue}", json=q)
    assert r.status_code == 200, r.text


@pytest.fixture()
def api(tmp_path: Path) -> Iterator[Api]:
    with running_app(tmp_path) as a:
        yield a


def submit(api: Api, m: dict[str, Any], token: str | None = None) -> Any:
    return api.req("POST", "/v1/workloads", token=token, json=m)


# ---------------------------------------------------------------------- pending limits
def test_queue_limits_are_checked_with_the_field_named(api: Api) -> None:
    q = api.get("/v1/config/queues/llm-research")
    q["spec"]["limits"] = {"maxPendingPods": -1}
    r = api.req("PUT", "/v1/config/queues/llm-research", json=q)
    assert r.status_code == 422
    assert "spec.limits.maxPendingPods" in r.text
    q["spec"]["limits"] = {"maxPendingJobs": 3}
    r = api.req("PUT", "/v1/config/queues/llm-research", json=q)
    assert r.status_code == 422 and "spec.limits.maxPendingJobs" in r.text
    assert "limits" not in api.get("/v1/config/queues/llm-research")["spec"]  # nothing applied


def test_a_queue_at_its_pending_workload_limit_refuses_naming_limit_queue_and_count(api: Api) -> None:
    with_limits(api, "llm-team", maxPendingWorkloads=2)  # a parent: it bounds its whole subtree
    assert submit(api, pending_wl("a1")).status_code == 201
    assert submit(api, pending_wl("a2", queue="llm-pretrain")).status_code == 201
    r = submit(api, pending_wl("a3"))
    assert r.status_code == 429, r.text
    msg = r.json()["error"]["message"]
    assert "maxPendingWorkloads is 2" in msg and "llm-team" in msg and "2 workloads pending" in msg
    assert r.json()["error"]["errors"][0]["field"] == "spec.queue"
    assert submit(api, pending_wl("a1")).status_code == 200  # a resubmission is still idempotent
    assert submit(api, pending_wl("v1", queue="vision-team")).status_code == 201  # another team
    api.req("DELETE", "/v1/workloads/a1")
    api.wait_phase("a1", "Cancelled")
    assert submit(api, pending_wl("a3")).status_code == 201  # room again


def test_pod_limits_per_user_and_a_workload_alone_over_the_limit(api: Api) -> None:
    with_limits(api, "llm-research", maxPendingPodsPerUser=4, maxPendingPods=50)
    alice = api.token_for("alice", "member", "llm-research")
    carol = api.token_for("carol", "member", "llm-research")
    assert submit(api, pending_wl("p1", replicas=3), alice).status_code == 201
    r = submit(api, pending_wl("p2", replicas=2), alice)
    assert r.status_code == 429
    assert "user alice has 3 pods pending" in r.json()["error"]["message"]
    assert "maxPendingPodsPerUser is 4" in r.json()["error"]["message"]
    assert submit(api, pending_wl("p3", replicas=2), carol).status_code == 201  # carol's own count
    r = submit(api, pending_wl("p4", replicas=51), carol)
    assert r.status_code == 422  # it alone passes the limit: it could never be accepted
    assert r.json()["error"]["errors"][0]["field"] == "spec.podGroups"
    assert "maxPendingPods 50" in r.json()["error"]["message"]


def test_the_server_default_bounds_a_leaf_that_sets_none(tmp_path: Path) -> None:
    limits = TenantLimits(default=PendingLimits(workloads=1))
    with running_app(tmp_path, tenant_limits=limits) as api:
        assert submit(api, pending_wl("d1")).status_code == 201
        r = submit(api, pending_wl("d2"))
        assert r.status_code == 429 and "default maxPendingWorkloads is 1" in r.text
        with_limits(api, "llm-research", maxPendingWorkloads=5)  # the queue's own limit wins
        assert submit(api, pending_wl("d2")).status_code == 201


def test_apply_is_refused_whole_over_a_limit_and_its_checks_do_not_linger(api: Api) -> None:
    with_limits(api, "llm-research", maxPendingWorkloads=2)
    r = api.req("POST", "/v1/apply", json={"items": [pending_wl(f"b{i}") for i in range(4)]})
    assert r.status_code == 422 and "maxPendingWorkloads is 2" in r.text  # checked places count
    assert api.get("/v1/workloads?queue=llm-research")["items"] == []  # nothing applied
    ctl = api.c.app.state.svc.controller  # type: ignore[attr-defined]
    seen = ctl.cycles
    wait_for(lambda: ctl.cycles > seen + PendingCounter.LAPSE_CYCLES, 30, "cycles")
    assert [submit(api, pending_wl(f"c{i}")).status_code for i in range(3)] == [201, 201, 429]


def test_the_kubernetes_source_gets_the_same_refusal(api: Api) -> None:
    from gpupool.kube.wiring import ServiceSubmitter

    with_limits(api, "llm-research", maxPendingWorkloads=1)
    svc = api.c.app.state.svc  # type: ignore[attr-defined]
    out = ServiceSubmitter(svc).submit_many([pending_wl("k1"), pending_wl("k2")])
    assert [o.result for o in out] == ["created", "refused"]
    assert "maxPendingWorkloads is 1" in out[1].message


# ---------------------------------------------------------------------- submit rate per token
def test_a_flooding_token_gets_429_with_retry_after_and_another_token_is_not_refused(tmp_path: Path) -> None:
    with running_app(tmp_path, tenant_limits=TenantLimits(submit_rate=0.5, submit_burst=3)) as api:
        flood = api.token_for("flood", "member", "llm-research")
        calm = api.token_for("calm", "member", "vision-team")
        codes = [submit(api, pending_wl(f"f{i}"), flood).status_code for i in range(8)]
        assert codes[:3] == [201, 201, 201] and set(codes[3:]) == {429}
        r = submit(api, pending_wl("f-more"), flood)
        assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1
        err = r.json()["error"]
        assert err["status"] == 429 and err["errors"][0]["field"] == "submit-rate"
        assert "0.5 workloads a second" in err["message"]
        calm_codes = [
            submit(api, pending_wl(f"c{i}", queue="vision-team"), calm).status_code for i in range(3)
        ]
        assert calm_codes == [201, 201, 201]


@settings(max_examples=60, deadline=None)
@given(
    rate=st.floats(0.1, 100.0),
    burst=st.integers(1, 20),
    gaps=st.lists(st.floats(0.0, 5.0), min_size=1, max_size=60),
)
def test_token_bucket_admits_no_more_than_burst_plus_rate_times_elapsed(
    rate: float, burst: int, gaps: list[float]
) -> None:
    now = [0.0]
    b = TokenBuckets(rate, burst, clock=lambda: now[0])
    admitted = 0
    for g in gaps:
        now[0] += g
        wait = b.take("t")
        if wait is None:
            admitted += 1
        else:
            assert wait > 0
            later = now[0] + wait  # after the wait it says, the next take is admitted
            probe = TokenBuckets(rate, burst, clock=lambda t=later: t)  # type: ignore[misc]
            probe._buckets = dict(b._buckets)
            assert probe.take("t") is None
        assert admitted <= burst + rate * now[0] + 1e-6
    assert b.take("other") is None  # another key has its own bucket


def test_submit_rate_parses_with_the_unit_and_refuses_nonsense() -> None:
    assert parse_rate("10/s") == 10 and parse_rate("600/m") == 10 and parse_rate("2") == 2
    for bad in ("0/s", "-1", "ten/s", "5/week", "nan"):
        with pytest.raises(ValueError, match="not a rate"):
            parse_rate(bad)


def test_serve_refuses_bad_fairness_options_naming_them(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from gpupool.cli.main import app
    from gpupool.cli.server_limits import tenant_limits

    state = ["--state-dir", str(tmp_path / "state"), "--port", "1"]
    cases = [
        (["--submit-rate", "5/week"], "--submit-rate '5/week' is not a rate"),
        (["--submit-burst", "0"], "--submit-burst 0: must be 1 or more"),
        (["--pending-limit", "maxPendingJobs=3"], "--pending-limit 'maxPendingJobs=3'"),
        (["--pending-limit", "maxPendingPods=-1"], "N must be a whole number"),
    ]
    for args, words in cases:
        r = CliRunner().invoke(app, ["serve", *state, *args], env={"COLUMNS": "300"})
        assert r.exit_code == 2 and words in r.output and "Traceback" not in r.output, (args, r.output)
    got = tenant_limits(["maxPendingPods=500", "maxPendingWorkloadsPerUser=20"], "600/m", 5)
    assert got == TenantLimits(PendingLimits(pods=500, workloads_per_user=20), 10.0, 5)


# ---------------------------------------------------------------------- huge gangs and the cycle
def huge_gangs() -> list[dict[str, Any]]:
    """The issue's two accepted gangs: 100,000 replicas in one, 10,000 pod groups in the other
    (CPU only, so no GPU quota refuses them: placement tried ~1,500 pods each cycle)."""
    a = wl("huge-replicas", gpus=0)
    a["spec"]["podGroups"][0]["replicas"] = 100_000
    b = wl("huge-groups", gpus=0)
    b["spec"]["podGroups"] = [
        {"name": f"g{i}", "resources": {"cpu": 1, "memory": "1Gi"}} for i in range(10_000)
    ]
    return [a, b]


def _submit(store: Store, ctl: Controller, m: dict[str, Any], owner: str = "t") -> None:
    rec, _ = store.submit_workload(m, owner=owner)
    ctl.submitted(rec, workload_model(m, ctl.bundle.priority_classes, 0.0))


def test_the_huge_gangs_are_accepted_by_the_api(api: Api) -> None:
    for m in huge_gangs():
        assert submit(api, m).status_code == 201


def test_huge_gangs_pending_do_not_delay_another_teams_canary(db_url: str, tmp_path: Path) -> None:
    store, ctl, _ = in_process_controller(db_url, tmp_path)
    ctl.recover()
    for m in huge_gangs():
        _submit(store, ctl, m)
    ctl.cycle()
    for name in ("huge-replicas", "huge-groups"):
        assert ctl.reasons[name].code == "Unsatisfiable", ctl.reasons[name]
    cycles = ctl.cycles
    _submit(store, ctl, wl("canary", queue="vision-team"), owner="vision")
    ctl.cycle()
    assert store.get_workload("canary").phase in ("Admitted", "Running")
    assert ctl.cycles - cycles == 1  # the very next cycle
    # and that cycle did not try the gangs again: their failure is kept until the engine changes
    assert ctl.window_stats.passed == 1 and ctl.window_stats.hidden == 2
    assert ctl.reasons["huge-groups"].code == "Unsatisfiable"
    ctl.reload_config()  # the inventory or quota may have changed: they are tried again
    ctl.cycle()
    assert ctl.window_stats.passed == 2 and ctl.reasons["huge-replicas"].code == "Unsatisfiable"
    store.close()


def test_a_gang_beyond_the_pools_cpu_is_unsatisfiable_before_any_placement(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpupool.engine.placement import Placer

    tried: list[str] = []
    place = Placer.place

    def counting(self: Placer, w: Any, *a: Any, **kw: Any) -> Any:
        tried.append(w.name)
        return place(self, w, *a, **kw)

    monkeypatch.setattr(Placer, "place", counting)
    store, ctl, _ = in_process_controller(f"sqlite:///{tmp_path}/g.db", tmp_path)
    ctl.recover()
    for m in huge_gangs():
        _submit(store, ctl, m)
    ctl.cycle()
    assert tried == []  # the O(1) capacity test refused them; no pod was tried
    why = ctl.reasons["huge-replicas"].reason
    assert "its 100000 pods request 200000 CPU" in why and "schedulable nodes have" in why
    store.close()


def cpu_per_cycle(tmp: Path, cycles: int = 5) -> float:
    """Mean controller CPU seconds per cycle with the two huge gangs pending."""
    store, ctl, _ = in_process_controller(f"sqlite:///{tmp}/g.db", tmp)
    ctl.recover()
    for m in huge_gangs():
        _submit(store, ctl, m)
    ctl.cycle()
    t = time.process_time()
    for _ in range(cycles):
        ctl.wake()
        ctl.cycle()
    return (time.process_time() - t) / cycles


if __name__ == "__main__":
    import tempfile

    print(f"CPU per cycle, two huge gangs pending: {cpu_per_cycle(Path(tempfile.mkdtemp())) * 1000:.1f} ms")
