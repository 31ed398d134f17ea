"""Every list answers in pages: newest first by default, a continue token to the next page, the
filters (queue, phase, owner, type) applied by the server, and nothing dropped or repeated."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.test_service_support import Api, running_app, wl


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    state = tmp_path_factory.mktemp("paging")
    with running_app(state, f"sqlite:///{state}/gpupool.db", time_scale=1.0) as a:
        for i in range(23):
            queue = "vision-team" if i % 3 == 0 else "llm-research"
            spec: dict[str, Any] = {"type": "inference"} if i % 5 == 0 else {}
            r = a.req("POST", "/v1/workloads", json=wl(f"p{i:02d}", queue=queue, duration="1h", **spec))
            assert r.status_code == 201, r.text
        yield a


def pages(api: Api, **params: Any) -> list[list[str]]:
    out: list[list[str]] = []
    q = dict(params)
    while True:
        data = api.get("/v1/workloads", params=q)
        out.append([w["name"] for w in data["items"]])
        token = data["metadata"]["continue"]
        if not token:
            return out
        q["continue"] = token


def test_pages_newest_first_without_loss_or_repeat(api: Api) -> None:
    got = pages(api, limit=10)
    assert [len(p) for p in got] == [10, 10, 3]
    names = [n for p in got for n in p]
    assert names == [f"p{i:02d}" for i in range(22, -1, -1)]


def test_oldest_first_on_request(api: Api) -> None:
    names = [n for p in pages(api, limit=7, order="oldest") for n in p]
    assert names == [f"p{i:02d}" for i in range(23)]


def test_filters_are_applied_by_the_server(api: Api) -> None:
    vision = [n for p in pages(api, limit=3, queue="vision-team") for n in p]
    assert vision == [f"p{i:02d}" for i in range(21, -1, -3)]
    inference = [n for p in pages(api, limit=2, type="inference") for n in p]
    assert inference == ["p20", "p15", "p10", "p05", "p00"]
    batch = [n for p in pages(api, limit=50, type="batch") for n in p]
    assert len(batch) == 23 - 5  # a manifest without a type is batch
    assert pages(api, owner="nobody") == [[]]
    owner = api.get("/v1/workloads", params={"limit": 1})["items"][0]["owner"]
    assert len([n for p in pages(api, owner=owner, limit=100) for n in p]) == 23


def test_a_bad_continue_token_names_the_field(api: Api) -> None:
    r = api.req("GET", "/v1/workloads", params={"continue": "not-a-token"})
    assert r.status_code == 422
    assert r.json()["error"]["errors"][0]["field"] == "continue"


def test_after_keeps_arrival_order_paging(api: Api) -> None:
    first = api.get("/v1/workloads", params={"order": "oldest", "limit": 1})["items"][0]
    data = api.get("/v1/workloads", params={"after": first["seq"], "limit": 2})
    assert [w["name"] for w in data["items"]] == ["p01", "p02"]


def test_approvals_page_newest_first(api: Api) -> None:
    q = api.get("/v1/config/queues/serving")
    q["spec"]["requiresApproval"] = True
    q["metadata"].pop("resourceVersion")
    assert api.req("PUT", "/v1/config/queues/serving", json=q).status_code == 200
    for i in range(5):
        r = api.req("POST", "/v1/workloads", json=wl(f"ask{i}", queue="serving", duration="1h"))
        assert r.status_code == 201 and r.json()["phase"] == "AwaitingApproval", r.text
    seen: list[str] = []
    params: dict[str, Any] = {"limit": 2, "state": "Pending"}
    while True:
        data = api.get("/v1/approvals", params=params)
        seen += [a["workload"] for a in data["items"]]
        if not data["metadata"]["continue"]:
            break
        params["continue"] = data["metadata"]["continue"]
    assert seen == [f"ask{i}" for i in range(4, -1, -1)]
