"""The API under attack: takeover of another team's queue, half-applied sets, oversized and
hostile bodies, huge integers, leaks through error messages, orphaned tokens, the last admin
(issue 9: critical hole 3 and the other findings). Each test failed on the code before."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gpupool.service.api import create_app
from gpupool.service.config import ServiceConfig
from tests.test_service_support import Api, db_url, running_app, wl

__all__ = ["db_url"]


@pytest.fixture
def api(tmp_path: Path, db_url: str) -> Api:
    with running_app(tmp_path, db_url) as a:
        yield a


def queue(name: str, parent: str | None, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "gpupool.io/v1alpha1",
        "kind": "Queue",
        "metadata": {"name": name},
        "spec": {"parent": parent, **spec},
    }


def _names(api: Api) -> set[str]:
    return {w["name"] for w in api.get("/v1/workloads")["items"]}


# ---------------------------------------------------------------------- critical 3
def test_a_queue_admin_cannot_move_another_teams_queue_under_its_own(api: Api) -> None:
    # a queue-admin of vision-team tries to take llm-research (under llm-team)
    mallory = api.token_for("mallory", "queue-admin", "vision-team")
    assert api.req("POST", "/v1/workloads", json=wl("theirs", duration="1h")).status_code == 201
    r = api.req(
        "PUT", "/v1/config/queues/llm-research", token=mallory, json=queue("llm-research", "vision-team")
    )
    assert r.status_code == 403, r.text
    assert "llm-research" in r.json()["error"]["message"]
    assert api.get("/v1/config/queues/llm-research")["spec"]["parent"] == "llm-team"
    # same through /v1/apply, and the owner keeps access
    r = api.req("POST", "/v1/apply", token=mallory, json={"items": [queue("llm-research", "vision-team")]})
    assert r.status_code == 403
    assert api.req("GET", "/v1/workloads/theirs", token=mallory).status_code == 404
    # a queue-admin may still create and move queues inside its own subtree
    assert (
        api.req("PUT", "/v1/config/queues/cv-a", token=mallory, json=queue("cv-a", "vision-team")).status_code
        == 200
    )
    assert (
        api.req("PUT", "/v1/config/queues/cv-b", token=mallory, json=queue("cv-b", "vision-team")).status_code
        == 200
    )
    assert (
        api.req("PUT", "/v1/config/queues/cv-b", token=mallory, json=queue("cv-b", "cv-a")).status_code == 200
    )
    # ... but not move its own queue out of its subtree
    r = api.req("PUT", "/v1/config/queues/cv-b", token=mallory, json=queue("cv-b", "llm-team"))
    assert r.status_code == 403


# ---------------------------------------------------------------------- sets applied whole
def test_apply_is_all_or_nothing(api: Api) -> None:
    items = [queue("new-q", "llm-team"), wl("good-1", queue="new-q"), wl("bad-1", queue="no-such-queue")]
    r = api.req("POST", "/v1/apply", json={"items": items})
    assert r.status_code == 422, r.text
    errs = r.json()["error"]["errors"]
    assert any("items[2]" in e.get("message", "") or "items[2]" in e["field"] for e in errs), errs
    assert api.req("GET", "/v1/config/queues/new-q").status_code == 404
    assert "good-1" not in _names(api)
    # the same set without the bad workload applies whole, the workload in the new queue too
    r = api.req("POST", "/v1/apply", json={"items": items[:2]})
    assert r.status_code == 200, r.text
    assert [x["result"] for x in r.json()["results"]] == ["created", "created"]
    assert "good-1" in _names(api)


def test_apply_refuses_duplicates_and_taken_names_before_writing(api: Api) -> None:
    dup = [wl("twice"), wl("twice", gpus=2)]
    r = api.req("POST", "/v1/apply", json={"items": dup})
    assert r.status_code == 422 and "duplicate" in r.text, r.text
    assert "twice" not in _names(api)
    assert api.req("POST", "/v1/workloads", json=wl("taken")).status_code == 201
    r = api.req("POST", "/v1/apply", json={"items": [queue("q-x", "llm-team"), wl("taken", gpus=2)]})
    assert r.status_code == 409, r.text
    assert api.req("GET", "/v1/config/queues/q-x").status_code == 404


# ---------------------------------------------------------------------- leaks and orphans
def test_a_name_collision_does_not_reveal_the_other_owner(api: Api) -> None:
    alice = api.token_for("alice", "member", "llm-research")
    bob = api.token_for("bob", "member", "vision-team")
    assert api.req("POST", "/v1/workloads", token=alice, json=wl("shared-name")).status_code == 201
    # another team's name answers as a fresh one (tests/service/test_name_scopes.py has the matrix)
    other = api.req("POST", "/v1/workloads", token=bob, json=wl("shared-name", queue="vision-team"))
    assert other.status_code == 201 and other.json()["name"] == "shared-name"
    assert "alice" not in other.text and "llm-research" not in other.text
    mine = api.req("POST", "/v1/workloads", token=alice, json=wl("shared-name", gpus=2))
    assert mine.status_code == 409
    assert "owner" not in mine.json()["error"]["message"].split(";")[0].replace("or owner", "")


def test_tokens_scoped_to_a_deleted_queue_die_with_it(api: Api) -> None:
    assert api.req("PUT", "/v1/config/queues/tmp-q", json=queue("tmp-q", "llm-team")).status_code == 200
    t = api.token_for("temp", "member", "tmp-q")
    assert api.req("GET", "/v1/whoami", token=t).status_code == 200
    assert api.req("DELETE", "/v1/config/queues/tmp-q").status_code == 200
    # another team creates a queue of the same name: the old token must not reach it
    assert api.req("PUT", "/v1/config/queues/tmp-q", json=queue("tmp-q", "vision-team")).status_code == 200
    assert api.req("GET", "/v1/whoami", token=t).status_code == 401
    tokens = {x["name"]: x for x in api.get("/v1/tokens")["items"]}
    assert tokens["temp"]["revoked"]


def test_the_last_platform_admin_token_cannot_be_revoked(api: Api) -> None:
    me = next(t for t in api.get("/v1/tokens")["items"] if t["role"] == "platform-admin")
    r = api.req("DELETE", f"/v1/tokens/{me['id']}")
    assert r.status_code == 409 and "last platform-admin" in r.text, r.text
    assert api.req("GET", "/v1/whoami").status_code == 200
    second = api.token_for("admin-2", "platform-admin")
    assert api.req("DELETE", f"/v1/tokens/{me['id']}", token=second).status_code == 200


def test_metrics_need_a_cluster_wide_token(api: Api) -> None:
    assert api.c.get("/metrics").status_code == 401
    member = api.token_for("m1", "member", "llm-research")
    assert api.req("GET", "/metrics", token=member).status_code == 403
    viewer = api.token_for("v1", "viewer")
    assert api.req("GET", "/metrics", token=viewer).status_code == 200


def test_metrics_can_be_public(tmp_path: Path) -> None:
    with running_app(tmp_path, metrics_public=True) as api:
        assert api.c.get("/metrics").status_code == 200


# ---------------------------------------------------------------------- hostile input
@pytest.mark.parametrize(
    "method,path,kw",
    [
        ("GET", "/v1/workloads", {"params": {"after": "9" * 40}}),
        ("GET", "/v1/audit", {"params": {"after": 2**64}}),
        ("GET", "/v1/audit/verify", {"params": {"expected_count": 2**70}}),
        ("DELETE", f"/v1/tokens/{2**64}", {}),
        ("POST", "/v1/workloads/x/approve", {"json": {"duration": "99999999999d"}}),
        (
            "POST",
            "/v1/workloads/x/approve",
            {"content": b"{not json", "headers": {"content-type": "application/json"}},
        ),
        ("POST", "/v1/workloads", {"json": wl("n", gpus="1e400")}),
        ("POST", "/v1/workloads", {"content": b"[" * 100_000 + b"]" * 100_000}),
        ("POST", "/v1/workloads", {"content": json.dumps({"a": "x\u0000"}).encode()}),
        ("GET", "/v1/workloads/a%00b", {}),
        ("GET", "/v1/workloads", {"params": {"queue": "a\x00b"}}),
        ("POST", "/v1/apply", {"json": {"items": [{"kind": "Workload", "metadata": "abc"}]}}),
    ],
)
def test_no_input_produces_a_server_error_and_every_error_names_a_field(
    api: Api, method: str, path: str, kw: dict[str, Any]
) -> None:
    headers = {**api.h(), **kw.pop("headers", {})}
    r = api.c.request(method, path, headers=headers, **kw)
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    errors = r.json()["error"]["errors"]
    if r.status_code in (413, 422):
        assert errors and all(e["field"] for e in errors), errors


def test_a_body_over_the_limit_is_refused_with_413(tmp_path: Path) -> None:
    with running_app(tmp_path, max_body_bytes=10_000) as api:
        big = wl("big")
        big["metadata"]["annotations"] = {"pad": "x" * 20_000}
        r = api.req("POST", "/v1/workloads", json=big)
        assert r.status_code == 413 and r.json()["error"]["errors"][0]["field"] == "body"
        assert api.req("POST", "/v1/workloads", json=wl("small")).status_code == 201


def test_an_unexpected_error_is_answered_inside_the_app(tmp_path: Path) -> None:
    """An exception escaping the app made uvicorn drop the kept-alive connection after the 500;
    the guard answers it inside the app, so nothing escapes (TestClient re-raises what does)."""
    app = create_app(ServiceConfig(state_dir=tmp_path, time_scale=3600.0, tick_s=0.05))

    @app.get("/boom")
    def boom() -> None:
        raise RuntimeError("a bug")

    with TestClient(app, raise_server_exceptions=True) as c:
        r = c.get("/boom")
        assert r.status_code == 500 and r.json()["error"]["message"].startswith(
            "internal error (RuntimeError)"
        )
        assert c.get("/healthz").status_code == 200


def test_errors_name_the_field_for_unparseable_bodies_and_annotations(api: Api) -> None:
    assert (
        api.req(
            "POST", "/v1/workloads", json=wl("exc-1", exception={"reason": "x", "duration": "1h"})
        ).status_code
        == 201
    )
    for verb in ("approve", "reject"):
        r = api.c.post(
            f"/v1/workloads/exc-1/{verb}",
            content=b"{bad",
            headers={**api.h(), "content-type": "application/json"},
        )
        assert r.status_code == 422 and r.json()["error"]["errors"] == [
            {"field": "body", "problem": "invalid JSON at character 1"}
        ], r.text
    body = wl("frac")
    body["metadata"]["annotations"] = {"gpu-fraction": "abc"}
    body["spec"]["podGroups"][0]["resources"] = {"cpu": 1}
    r = api.req("POST", "/v1/workloads", json=body)
    assert r.status_code == 422
    assert r.json()["error"]["errors"][0]["field"] == "metadata.annotations.gpu-fraction", r.text
