"""The API keeps the promises of its OpenAPI document (deterministic checks; the fuzz is in
tests/service/test_openapi_fuzz.py): objects read with GET can be PUT back, a stale resourceVersion is
a 409, 405 answers say what is allowed, and the document declares the error answers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.test_service_support import Api, running_app


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    with running_app(tmp_path) as a:
        yield a


def test_an_object_read_with_get_can_be_put_back_unchanged(api: Api) -> None:
    q = api.get("/v1/config/queues/llm-research")
    assert q["metadata"]["resourceVersion"]
    r = api.req("PUT", "/v1/config/queues/llm-research", json=q)
    assert r.status_code == 200, r.text
    assert r.json()["result"] == "unchanged"
    assert api.get("/v1/config/queues/llm-research") == q


def test_a_stale_resource_version_is_a_conflict_and_writes_nothing(api: Api) -> None:
    q = api.get("/v1/config/queues/llm-research")
    first = {**q, "metadata": {**q["metadata"], "labels": {"team": "first"}}}
    r = api.req("PUT", "/v1/config/queues/llm-research", json=first)
    assert r.status_code == 200, r.text
    assert r.json()["result"] != "unchanged"
    stale = {**q, "metadata": {**q["metadata"], "labels": {"team": "second"}}}
    r = api.req("PUT", "/v1/config/queues/llm-research", json=stale)
    assert r.status_code == 409, r.text
    assert r.json()["error"]["errors"][0]["field"] == "metadata.resourceVersion"
    now = api.get("/v1/config/queues/llm-research")
    assert now["metadata"]["labels"] == {"team": "first"}
    assert int(now["metadata"]["resourceVersion"]) == int(q["metadata"]["resourceVersion"]) + 1


def test_a_resource_version_the_server_never_returned_is_a_located_422(api: Api) -> None:
    q = api.get("/v1/config/queues/llm-research")
    bad: dict[str, Any] = {**q, "metadata": {**q["metadata"], "resourceVersion": "abc"}}
    r = api.req("PUT", "/v1/config/queues/llm-research", json=bad)
    assert r.status_code == 422, r.text
    assert [e["field"] for e in r.json()["error"]["errors"]] == ["metadata.resourceVersion"]


def test_apply_without_resource_version_stays_unconditional(api: Api) -> None:
    q = api.get("/v1/config/queues/llm-research")
    plain = {**q, "metadata": {"name": "llm-research", "labels": {"team": "x"}}}
    r = api.req("POST", "/v1/apply", json={"items": [plain]})
    assert r.status_code == 200, r.text
    assert r.json()["results"][0]["result"] != "unchanged"


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [("PATCH", "/v1/workloads", "GET, POST"), ("POST", "/v1/whoami", "GET"), ("PUT", "/v1/apply", "POST")],
)
def test_405_names_every_allowed_method(api: Api, method: str, path: str, allow: str) -> None:
    r = api.req(method, path)
    assert r.status_code == 405
    assert r.headers["allow"] == allow
    assert r.json()["error"]["status"] == 405
    assert allow in r.json()["error"]["message"]


def test_audit_export_declares_and_answers_ndjson_and_csv(api: Api) -> None:
    doc = api.c.get("/openapi.json").json()
    content = doc["paths"]["/v1/audit/export"]["get"]["responses"]["200"]["content"]
    assert set(content) == {"application/x-ndjson", "text/csv"}
    for fmt, media in [("jsonl", "application/x-ndjson"), ("csv", "text/csv")]:
        r = api.req("GET", f"/v1/audit/export?format={fmt}")
        assert r.status_code == 200
        assert r.headers["content-type"].split(";")[0] == media


def test_every_v1_operation_declares_401_and_the_house_error_body(api: Api) -> None:
    doc = api.c.get("/openapi.json").json()
    assert "ErrorBody" in doc["components"]["schemas"]
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            codes = op["responses"]
            if path.startswith("/v1/"):
                assert "401" in codes, f"{method} {path}"
            for code, resp in codes.items():
                if code.startswith(("4", "5")) and path != "/readyz":
                    schema = resp["content"]["application/json"]["schema"]
                    assert schema == {"$ref": "#/components/schemas/ErrorBody"}, f"{method} {path} {code}"
