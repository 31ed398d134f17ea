"""In-process API tests (FastAPI TestClient, controller running), SQLite and PostgreSQL."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tests.test_service_support import Api, db_url, running_app, wait_for, wl

__all__ = ["db_url"]


@pytest.fixture
def api(tmp_path: Path, db_url: str) -> Api:
    with running_app(tmp_path, db_url) as a:
        yield a


def test_submit_runs_and_is_idempotent(api: Api) -> None:
    r = api.req("POST", "/v1/workloads", json=wl("job-a", duration="1h"))
    assert r.status_code == 201, r.text
    assert r.json()["phase"] == "Pending"
    again = api.req("POST", "/v1/workloads", json=wl("job-a", duration="1h"))
    assert again.status_code == 200 and again.json()["seq"] == r.json()["seq"]
    clash = api.req("POST", "/v1/workloads", json=wl("job-a", gpus=2))
    assert clash.status_code == 409
    assert "different manifest" in clash.json()["error"]["message"]
    w = api.wait_phase("job-a", "Running")
    assert w["placement"]["pool"] == "h100-training"
    ev = [e["reason"] for e in api.get("/v1/workloads/job-a/events")["items"]]
    assert ev[:3] == ["Submitted", "Admitted", "Running"]
    # it finishes after its declared duration (1h at 3600x = 1s)
    api.wait_phase("job-a", "Succeeded", timeout=15)
    actions = [r["action"] for r in api.get("/v1/audit", params={"limit": 1000})["items"]]
    assert {"workload.submit", "workload.admit", "workload.finish"} <= set(actions)


def test_explain_cancel_and_queue_position(api: Api) -> None:
    # llm-research may hold 8 + borrow; ask for more than the cohort has so two wait
    for i in range(3):
        assert (
            api.req(
                "POST",
                "/v1/workloads",
                json=wl(
                    f"big-{i}",
                    gpus=8,
                    **{
                        "podGroups": [
                            {"replicas": 5, "resources": {"nvidia.com/gpu": 8, "cpu": 8, "memory": "64Gi"}}
                        ]
                    },
                ),
            ).status_code
            == 201
        )
    api.wait_phase("big-0", "Running")

    def considered() -> dict[str, object] | None:
        e: dict[str, object] = api.get("/v1/workloads/big-2/explain")
        return e if e.get("code") not in (None, "NotConsidered") else None

    ex = wait_for(considered)
    assert ex["phase"] == "Pending" and ex["position"] == 2 and ex["queueLength"] == 2
    assert ex["code"] in ("QuotaExceeded", "InsufficientCapacity") and ex["reason"]
    c = api.req("POST", "/v1/workloads/big-0/cancel")
    assert c.status_code == 200 and c.json()["phase"] == "Cancelled"
    assert api.req("POST", "/v1/workloads/big-0/cancel").json()["phase"] == "Cancelled"  # idempotent
    api.wait_phase("big-1", "Running")
    assert api.get("/v1/workloads/big-2/explain")["position"] == 1


def test_pending_reason_is_shown_in_get_and_list(api: Api) -> None:
    big = {"podGroups": [{"replicas": 5, "resources": {"nvidia.com/gpu": 8, "cpu": 8, "memory": "64Gi"}}]}
    for i in range(3):
        assert api.req("POST", "/v1/workloads", json=wl(f"big-{i}", **big)).status_code == 201

    def reason() -> str:
        w = api.get("/v1/workloads/big-2")
        return str(w["reason"]) if w["phase"] == "Pending" else ""

    got = wait_for(reason, what="a stored pending reason")
    code, _, why = got.partition(": ")
    ex = api.get("/v1/workloads/big-2/explain")
    assert code == ex["code"] and why == ex["reason"]
    listed = {w["name"]: w["reason"] for w in api.get("/v1/workloads", params={"phase": "Pending"})["items"]}
    assert listed["big-2"] == got and listed["big-1"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"kind": "Workload"}, "apiVersion"),
        (wl("x", queue="nope"), "spec.queue"),
        (wl("x", queue="llm-team"), "spec.queue"),
        (wl("x", gpus="lots"), "spec.podGroups[0].resources.nvidia.com/gpu"),
        (wl("Bad_Name"), "metadata.name"),
        (wl("x", priorityClass="vip"), "spec.priorityClass"),
        (wl("x", pool="nope"), "spec.pool"),
        (wl("x", bogus=1), "spec.bogus"),
        (
            wl("x", gpus=8, **{"podGroups": [{"replicas": 20, "resources": {"nvidia.com/gpu": 8}}]}),
            "spec.podGroups",
        ),
        (wl("x", exception={"duration": "1h"}), "spec.exception.reason"),
        ([1, 2], "body"),
    ],
)
def test_bad_input_is_4xx_with_field(api: Api, body: object, field: str) -> None:
    r = api.req("POST", "/v1/workloads", json=body)
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert any(field in e["field"] for e in err["errors"]), err
    assert api.get("/v1/workloads")["items"] == []  # nothing half-applied


def test_bad_requests_never_500(api: Api) -> None:
    cases = [
        ("POST", "/v1/workloads", {"content": b"{not json", "headers": {"content-type": "application/json"}}),
        ("POST", "/v1/tokens", {"json": {"name": "x", "role": "emperor"}}),
        ("POST", "/v1/tokens", {"json": {"name": "x", "role": "member"}}),
        ("POST", "/v1/apply", {"json": {"items": []}}),
        (
            "POST",
            "/v1/apply",
            {
                "json": {
                    "items": [
                        {
                            "apiVersion": "gpupool.io/v1alpha1",
                            "kind": "Queue",
                            "metadata": {"name": "q"},
                            "spec": {"parent": "ghost"},
                        }
                    ]
                }
            },
        ),
        ("GET", "/v1/workloads", {"params": {"limit": "-1"}}),
        ("GET", "/v1/workloads", {"params": {"phase": "Sleeping"}}),
        ("GET", "/v1/config/widgets", {}),
        ("GET", "/v1/nodes/ghost", {}),
        ("POST", "/v1/workloads/ghost/reject", {"json": {}}),
        ("GET", "/v1/audit/export", {"params": {"format": "xml"}}),
        ("DELETE", "/v1/tokens/abc", {}),
        ("GET", "/nowhere", {}),
    ]
    for method, path, kw in cases:
        headers = kw.pop("headers", {}) if isinstance(kw, dict) else {}
        r = api.c.request(method, path, headers={**api.h(), **headers}, **kw)
        assert 400 <= r.status_code < 500, (method, path, r.status_code, r.text)
        body = r.json()["error"]
        assert body["message"] and "Traceback" not in r.text


def test_config_apply_validates_whole_set_and_deletes_safely(api: Api) -> None:
    pool = {
        "apiVersion": "gpupool.io/v1alpha1",
        "kind": "ResourcePool",
        "metadata": {"name": "spare"},
        "spec": {"nodeSelector": {"gpupool.io/environment": "none"}},
    }
    bad_queue = {
        "apiVersion": "gpupool.io/v1alpha1",
        "kind": "Queue",
        "metadata": {"name": "q2"},
        "spec": {"parent": "ai-org", "quotas": [{"pool": "missing", "guarantee": {"nvidia.com/gpu": 1}}]},
    }
    r = api.req("POST", "/v1/apply", json={"items": [pool, bad_queue]})
    assert r.status_code == 422 and any(
        "spec.quotas[0].pool" in e["field"] for e in r.json()["error"]["errors"]
    )
    assert api.req("GET", "/v1/config/pools/spare").status_code == 404  # nothing half-applied
    r = api.req("POST", "/v1/apply", json={"items": [pool]})
    assert r.json()["results"] == [{"kind": "ResourcePool", "name": "spare", "result": "created"}]
    assert api.req("POST", "/v1/apply", json={"items": [pool]}).json()["results"][0]["result"] == "unchanged"
    # a pool referenced by a queue cannot be deleted
    r = api.req("DELETE", "/v1/config/pools/h100-training")
    assert r.status_code == 409, r.text
    assert api.req("DELETE", "/v1/config/pools/spare").status_code == 200
    assert api.req("DELETE", "/v1/config/queues/llm-team").status_code == 409  # has children
    pcs = {i["metadata"]["name"] for i in api.get("/v1/config/priorityclasses")["items"]}
    assert {"training", "experiment"} <= pcs


def test_approval_flow_and_exception(api: Api) -> None:
    q = api.get("/v1/config/queues/vision-team")
    q["spec"]["requiresApproval"] = True
    q["metadata"].pop("resourceVersion")
    assert api.req("PUT", "/v1/config/queues/vision-team", json=q).status_code == 200
    approver = api.token_for("vera", "queue-admin", "ai-org")
    r = api.req("POST", "/v1/workloads", json=wl("needs-ok", queue="vision-team"))
    assert r.status_code == 201 and r.json()["phase"] == "AwaitingApproval"
    ex = api.get("/v1/workloads/needs-ok/explain")
    assert ex["code"] == "AwaitingApproval" and ex["approvals"][0]["state"] == "Pending"
    # the requester may not approve its own request (four eyes)
    assert api.req("POST", "/v1/workloads/needs-ok/approve", json={}).status_code == 409
    ok = api.req("POST", "/v1/workloads/needs-ok/approve", token=approver, json={"reason": "fine"})
    assert ok.status_code == 200, ok.text
    api.wait_phase("needs-ok", "Running")
    r = api.req("POST", "/v1/workloads", json=wl("nope-ok", queue="vision-team"))
    assert r.json()["phase"] == "AwaitingApproval"
    assert api.req("POST", "/v1/workloads/nope-ok/reject", token=approver, json={}).status_code == 422
    rej = api.req("POST", "/v1/workloads/nope-ok/reject", token=approver, json={"reason": "no budget"})
    assert rej.json()["phase"] == "Rejected"
    # above the queue's limit: refused without an exception, AwaitingApproval with one
    capped = {
        "apiVersion": "gpupool.io/v1alpha1",
        "kind": "Queue",
        "metadata": {"name": "capped"},
        "spec": {
            "parent": "ai-org",
            "quotas": [
                {
                    "pool": "h100-training",
                    "guarantee": {"nvidia.com/gpu": 0},
                    "borrowingLimit": {"nvidia.com/gpu": 8},
                }
            ],
        },
    }
    assert api.req("POST", "/v1/apply", json={"items": [capped]}).status_code == 200
    big = {"podGroups": [{"replicas": 2, "resources": {"nvidia.com/gpu": 8, "cpu": 8, "memory": "64Gi"}}]}
    r = api.req("POST", "/v1/workloads", json=wl("huge", queue="capped", **big))
    assert r.status_code == 422 and "spec.exception" in r.json()["error"]["message"]
    r = api.req(
        "POST",
        "/v1/workloads",
        json=wl("huge", queue="capped", exception={"reason": "deadline", "duration": "2h"}, **big),
    )
    assert r.status_code == 201 and r.json()["phase"] == "AwaitingApproval"
    ok = api.req(
        "POST", "/v1/workloads/huge/approve", token=approver, json={"duration": "1h", "reason": "once"}
    )
    assert ok.status_code == 200 and ok.json()["approval"]["until"]
    w = api.wait_phase("huge", "Running")
    assert len(w["placement"]["pods"]) == 2
    actions = [(r["action"], r["name"]) for r in api.get("/v1/audit", params={"limit": 1000})["items"]]
    assert ("workload.approve", "huge") in actions and ("workload.reject", "nope-ok") in actions


def test_views_metrics_health(api: Api) -> None:
    assert (
        api.req("POST", "/v1/workloads", json=wl("v1", gpus="500m", pool="l40s-experiment")).status_code
        == 201
    )
    api.wait_phase("v1", "Running")
    nodes = api.get("/v1/nodes")["items"]
    assert len(nodes) == 16 and sum(n["gpuAllocated"] for n in nodes) == 0.5
    node = next(n for n in nodes if n["gpuAllocated"])
    devs = api.get(f"/v1/nodes/{node['name']}")["devices"]
    assert [d["workloads"][0]["workload"] for d in devs if d["workloads"]] == ["v1"]
    cl = api.get("/v1/cluster")
    assert {p["name"] for p in cl["pools"]} == {"h100-training", "a100-inference", "l40s-experiment"}
    quota = api.get("/v1/quota", params={"queue": "llm-research"})["items"]
    assert any(q["pool"] == "l40s-experiment" and q["used"]["gpu"] == 0.5 for q in quota)
    assert api.c.get("/healthz").json() == {"status": "ok"}
    assert api.c.get("/readyz").status_code == 200
    m = api.req("GET", "/metrics").text
    for name in (
        "gpupool_admission_wait_time_seconds_bucket",
        'gpupool_workloads{phase="Running"} 1.0',
        'gpupool_gpu_allocated{pool="l40s-experiment"} 0.5',
    ):
        assert name in m
    spec = api.c.get("/openapi.json").json()
    assert "/v1/workloads/{name}/explain" in spec["paths"]
    r = api.req("POST", "/v1/nodes/h100-001/cordon")
    assert r.json() == {"name": "h100-001", "schedulable": False}
    assert next(n for n in api.get("/v1/nodes")["items"] if n["name"] == "h100-001")["schedulable"] is False
    assert api.req("POST", "/v1/nodes/h100-001/uncordon").json()["schedulable"] is True


def test_audit_tamper_detected_through_api(tmp_path: Path) -> None:
    with running_app(tmp_path) as api:
        for i in range(3):
            api.req("POST", "/v1/workloads", json=wl(f"t{i}"))
        api.wait_phase("t2", "Running")
        good = api.get("/v1/audit/verify")
        assert good["ok"] and good["count"] >= 6
        export = api.req("GET", "/v1/audit/export", params={"format": "csv"}).text
        assert export.startswith("seq,at,actor,action")
        with sqlite3.connect(tmp_path / "gpupool.db") as db:
            db.execute("UPDATE audit SET actor = 'mallory' WHERE seq = 4")
        bad = api.get("/v1/audit/verify")
        assert bad["ok"] is False and bad["firstBadSeq"] == 4 and "edited" in bad["problem"]


def test_create_app_names_where_the_kubernetes_backend_is_built() -> None:
    """Regression: create_app called make_backend("kubernetes") with the virtual backend's
    options and failed with a TypeError at start-up."""
    from gpupool.service.api import create_app
    from gpupool.service.config import ServiceConfig

    with pytest.raises(ValueError, match=r"gpupool\.kube\.wiring"):
        create_app(ServiceConfig(backend="kubernetes"))
