"""Hardening, round three (issue 30): integers past what a column holds answer the same on
SQLite and PostgreSQL (they answered 500 on PostgreSQL), and a request body that is absent, not
JSON or not UTF-8 is refused naming ``body`` on every route that takes one (it was a 400 that
named nothing). Each test failed on the code before."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpupool.store import NotFound, Store
from tests.test_service_support import Api, db_url, running_app, wl

__all__ = ["db_url"]

INT_MAX = 2**31 - 1  # what an INTEGER column holds on PostgreSQL
API_MAX = 2**63 - 1  # the API's own bound on every id and cursor


@pytest.fixture
def api(tmp_path: Path, db_url: str) -> Iterator[Api]:
    with running_app(tmp_path, db_url) as a:
        yield a


def _continue(newest: bool, seq: int) -> str:
    raw = json.dumps({"o": "n" if newest else "o", "s": seq}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _located(r: Any, field: str) -> None:
    assert r.json()["error"]["errors"], r.text
    assert [e["field"] for e in r.json()["error"]["errors"]] == [field], r.text


# ---------------------------------------------------------------------- integer ranges
@pytest.mark.parametrize("after", [INT_MAX, INT_MAX + 1, API_MAX])
def test_a_cursor_past_the_columns_range_means_nothing_after_it(api: Api, after: int) -> None:
    for n in ("c-1", "c-2"):
        assert api.req("POST", "/v1/workloads", json=wl(n)).status_code == 201
    r = api.req("GET", "/v1/workloads", params={"after": after})
    assert r.status_code == 200 and r.json()["items"] == [], r.text
    r = api.req("GET", "/v1/audit", params={"after": after})
    assert r.status_code == 200 and r.json()["items"] == [], r.text
    # a continue token: nothing after it oldest first, everything before it newest first
    r = api.req("GET", "/v1/workloads", params={"continue": _continue(False, after)})
    assert r.status_code == 200 and r.json()["items"] == [], r.text
    r = api.req("GET", "/v1/workloads", params={"continue": _continue(True, after)})
    assert r.status_code == 200, r.text
    assert [w["name"] for w in r.json()["items"]] == ["c-2", "c-1"]


@pytest.mark.parametrize("token_id", [INT_MAX + 1, API_MAX])
def test_a_token_id_past_the_columns_range_is_404_naming_it(api: Api, token_id: int) -> None:
    r = api.req("DELETE", f"/v1/tokens/{token_id}")
    assert r.status_code == 404, r.text
    _located(r, "token_id")
    assert f"token {token_id} not found" in r.json()["error"]["message"]


def test_values_past_the_apis_bound_are_422_naming_the_parameter(api: Api) -> None:
    r = api.req("GET", "/v1/workloads", params={"after": API_MAX + 1})
    assert r.status_code == 422 and "after" in r.text, r.text
    r = api.req("GET", "/v1/audit", params={"after": API_MAX + 1})
    assert r.status_code == 422 and "after" in r.text, r.text
    assert api.req("DELETE", f"/v1/tokens/{API_MAX + 1}").status_code == 422
    # a continue token carrying a seq no id can reach (SQLite could not bind it: OverflowError)
    for newest in (True, False):
        r = api.req("GET", "/v1/workloads", params={"continue": _continue(newest, 2**70)})
        assert r.status_code == 422, r.text
        _located(r, "continue")


BOUNDARIES = [0, 1, INT_MAX, INT_MAX + 1, API_MAX, API_MAX + 1, 2**70]


def _int_requests(v: int) -> list[tuple[str, str, dict[str, Any]]]:
    """Every path and query parameter the API reads as an integer, set to ``v``."""
    return [
        ("GET", "/v1/workloads", {"params": {"after": v}}),
        ("GET", "/v1/workloads", {"params": {"limit": v}}),
        ("GET", "/v1/workloads", {"params": {"continue": _continue(True, v)}}),
        ("GET", "/v1/workloads", {"params": {"continue": _continue(False, v)}}),
        ("GET", "/v1/approvals", {"params": {"limit": v}}),
        ("GET", "/v1/approvals", {"params": {"continue": _continue(True, v)}}),
        ("GET", "/v1/audit", {"params": {"after": v}}),
        ("GET", "/v1/audit", {"params": {"limit": v}}),
        ("GET", "/v1/audit/verify", {"params": {"expected_count": v}}),
        ("GET", "/v1/audit/verify", {"params": {"checkpoint_count": v, "checkpoint_head": "0" * 64}}),
        ("DELETE", f"/v1/tokens/{v}", {}),
        ("POST", f"/v1/alerts/{v}/ack", {"json": {}}),
        ("POST", f"/v1/alerts/{v}/resolve", {"json": {"note": "done"}}),
        ("GET", f"/v1/revisions/queues/llm-research/{v}", {}),
        ("GET", "/v1/revisions/queues/llm-research/diff", {"params": {"from": v}}),
        ("GET", "/v1/revisions/queues/llm-research/diff", {"params": {"to": v}}),
        ("GET", "/v1/workloads/b-1/logs", {"params": {"pod": v}}),
        ("POST", f"/v1/nodes/no-such-node/devices/{v}/health", {"json": {"healthy": True}}),
    ]


@pytest.mark.parametrize("v", BOUNDARIES)
def test_boundary_integers_never_answer_500_on_either_database(api: Api, v: int) -> None:
    assert api.req("POST", "/v1/workloads", json=wl("b-1")).status_code == 201
    for method, path, kw in _int_requests(v):
        r = api.req(method, path, **kw)
        # 501 is the virtual backend's answer for logs; what must never come is the 500
        assert r.status_code < 500 or r.status_code == 501, (method, path, kw, r.status_code, r.text)
        if r.status_code == 422:
            assert all(e["field"] for e in r.json()["error"]["errors"]), (path, kw, r.text)


def test_the_store_answers_ids_past_the_columns_range_itself(tmp_path: Path, db_url: str) -> None:
    """The same bound below the API, for every caller of the store (the CLI, the controller)."""
    store = Store.open(db_url)
    try:
        store.ensure_bootstrap_admin()
        store.submit_workload(wl("s-1"), owner="t")
        for big in (INT_MAX + 1, API_MAX):
            assert store.audit_records(after_seq=big) == []
            assert store.list_workloads(after_seq=big) == []
            assert store.page_workloads(from_seq=big, newest_first=False) == ([], False)
            recs, more = store.page_workloads(from_seq=big, newest_first=True)
            assert [r.name for r in recs] == ["s-1"] and not more
            with pytest.raises(NotFound):
                store.revoke_token(big)
            with pytest.raises(NotFound):
                store.get_approval(big)
            with pytest.raises(NotFound):
                store.decide_approval(big, approver="x", approve=True)
            with pytest.raises(NotFound):
                store.ack_incident(big, "x")
    finally:
        store.close()


# ---------------------------------------------------------------------- bodies named
def _body_routes(api: Api) -> list[str]:
    node = api.get("/v1/nodes")["items"][0]["name"]
    assert api.req("POST", "/v1/workloads", json=wl("exc-1", exception={"reason": "x", "duration": "1h"}))
    return [
        f"/v1/nodes/{node}/drain",
        "/v1/workloads/exc-1/approve",
        "/v1/workloads/exc-1/reject",
        "/v1/alerts/1/ack",
        "/v1/alerts/1/resolve",
        f"/v1/nodes/{node}/devices/0/health",
        "/v1/tokens",
        "/v1/onboard",
        "/v1/apply",
        "/v1/workloads",
        "/v1/config/queues/q-body",
    ]


#: (body, content type, what the problem says); None: send no content type
BAD_BODIES = [
    (b"\x80abc", "application/json", "not UTF-8"),
    (b'{"reason": "caf\xe9"}', "application/json", "not UTF-8"),
    (b"{bad", "application/json", "invalid JSON at character 1"),
    (b"[1, 2]", "application/json", "must be a JSON object"),
    (b'"text"', "application/json", "must be a JSON object"),
    (b"a=b", "application/x-www-form-urlencoded", "must be a JSON object"),
    (b"hello", "text/plain", "must be a JSON object"),
]


@pytest.mark.parametrize("raw,ctype,problem", BAD_BODIES)
def test_an_unreadable_body_is_422_naming_the_body_on_every_route(
    tmp_path: Path, raw: bytes, ctype: str, problem: str
) -> None:
    with running_app(tmp_path) as api:
        for path in _body_routes(api):
            method = "PUT" if path.startswith("/v1/config/") else "POST"
            r = api.c.request(method, path, content=raw, headers={**api.h(), "content-type": ctype})
            assert r.status_code == 422, (path, r.status_code, r.text)
            _located(r, "body")
            assert problem in r.json()["error"]["errors"][0]["problem"], (path, r.text)
            assert r.json()["error"]["message"].startswith("invalid request: body: "), (path, r.text)


def test_an_absent_body_is_422_naming_the_body_where_one_is_required(tmp_path: Path) -> None:
    with running_app(tmp_path) as api:
        optional = ("/drain", "/approve")  # these take an optional body: none is fine
        for path in _body_routes(api):
            method = "PUT" if path.startswith("/v1/config/") else "POST"
            for headers in ({"content-type": "application/json"}, {}):
                r = api.c.request(method, path, content=b"", headers={**api.h(), **headers})
                if path.endswith(optional):
                    assert r.status_code != 422 or r.json()["error"]["errors"][0]["field"] != "body"
                    continue
                assert r.status_code == 422, (path, r.status_code, r.text)
                _located(r, "body")
                assert r.json()["error"]["errors"][0]["problem"] == (
                    "the request body must be a JSON object; none was sent"
                ), (path, r.text)


def test_an_unknown_workload_type_filter_is_a_located_error(tmp_path: Path) -> None:
    """GET /v1/workloads?type=... takes the workload types only (the fuzzer's negative case: a
    value outside the schema was answered 200 with an empty list)."""
    with running_app(tmp_path) as api:
        ok = api.req("GET", "/v1/workloads", params={"type": "training"})
        assert ok.status_code == 200, ok.text
        bad = api.req("GET", "/v1/workloads", params={"type": "gaming"})
        assert bad.status_code == 422, bad.text
        assert "type" in bad.text
