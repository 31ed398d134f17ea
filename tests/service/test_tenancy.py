"""Tenant isolation: every role against every endpoint, with the expected status.

Rule under test: a workload outside the caller's queue subtree is 404 for every verb (its
existence is not revealed); a permitted view with a forbidden action is 403 with the reason;
no or a bad token is 401.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.test_service_support import Api, running_app, wl

ROLES = {
    # name: (role, scope)
    "admin": ("platform-admin", None),
    "qadmin": ("queue-admin", "llm-team"),
    "alice": ("member", "llm-research"),  # team A
    "bob": ("member", "vision-team"),  # team B
    "viewer": ("viewer", None),
    "lviewer": ("viewer", "llm-team"),
}
ORDER = ["admin", "qadmin", "alice", "bob", "viewer", "lviewer"]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Api, dict[str, str]]]:
    with running_app(tmp_path_factory.mktemp("tenancy")) as api:
        tokens = {"admin": api.token}
        for n, (role, scope) in ROLES.items():
            if n != "admin":
                tokens[n] = api.token_for(n, role, scope)
        tokens["carol"] = api.token_for("carol", "member", "llm-research")
        assert api.req("POST", "/v1/workloads", token=tokens["alice"], json=wl("wa")).status_code == 201
        assert api.req("POST", "/v1/workloads", token=tokens["carol"], json=wl("wc")).status_code == 201
        assert (
            api.req(
                "POST", "/v1/workloads", token=tokens["bob"], json=wl("wb", queue="vision-team")
            ).status_code
            == 201
        )
        yield api, tokens


def queue_doc(name: str, parent: str) -> dict[str, Any]:
    return {
        "apiVersion": "gpupool.io/v1alpha1",
        "kind": "Queue",
        "metadata": {"name": name},
        "spec": {"parent": parent},
    }


POOL = {
    "apiVersion": "gpupool.io/v1alpha1",
    "kind": "ResourcePool",
    "metadata": {"name": "extra"},
    "spec": {"nodeSelector": {"none": "none"}},
}

# (id, method, path, body or callable(role)->body, expected statuses in ORDER)
MATRIX: list[tuple[str, str, str, Any, list[int]]] = [
    ("list-queues", "GET", "/v1/config/queues", None, [200] * 6),
    ("get-pool", "GET", "/v1/config/pools/h100-training", None, [200] * 6),
    ("apply-pool", "PUT", "/v1/config/pools/extra", POOL, [200, 403, 403, 403, 403, 403]),
    (
        "apply-subqueue",
        "POST",
        "/v1/apply",
        lambda r: {"items": [queue_doc(f"sub-{r}", "llm-pretrain")]},
        [200, 200, 403, 403, 403, 403],
    ),
    (
        "apply-rootqueue",
        "POST",
        "/v1/apply",
        lambda r: {"items": [queue_doc(f"root-{r}", "ai-org")]},
        [200, 403, 403, 403, 403, 403],
    ),
    ("delete-pc", "DELETE", "/v1/config/priorityclasses/ghost", None, [404, 403, 403, 403, 403, 403]),
    ("submit-team-a", "POST", "/v1/workloads", lambda r: wl(f"a-{r}"), [201, 201, 201, 403, 403, 403]),
    (
        "submit-team-b",
        "POST",
        "/v1/workloads",
        lambda r: wl(f"b-{r}", queue="vision-team"),
        [201, 403, 403, 201, 403, 403],
    ),
    ("list-workloads", "GET", "/v1/workloads", None, [200] * 6),
    ("get-a", "GET", "/v1/workloads/wa", None, [200, 200, 200, 404, 200, 200]),
    ("get-b", "GET", "/v1/workloads/wb", None, [200, 404, 404, 200, 200, 404]),
    ("events-b", "GET", "/v1/workloads/wb/events", None, [200, 404, 404, 200, 200, 404]),
    ("explain-b", "GET", "/v1/workloads/wb/explain", None, [200, 404, 404, 200, 200, 404]),
    ("explain-a", "GET", "/v1/workloads/wa/explain", None, [200, 200, 200, 404, 200, 200]),
    ("cancel-b", "POST", "/v1/workloads/wb/cancel", None, [200, 404, 404, 200, 403, 404]),
    ("cancel-c", "POST", "/v1/workloads/wc/cancel", None, [200, 200, 403, 404, 403, 403]),
    ("approve-a", "POST", "/v1/workloads/wa/approve", {}, [409, 409, 403, 404, 403, 403]),
    ("reject-b", "POST", "/v1/workloads/wb/reject", {"reason": "x"}, [409, 404, 404, 403, 403, 404]),
    ("approvals", "GET", "/v1/approvals", None, [200] * 6),
    ("nodes", "GET", "/v1/nodes", None, [200] * 6),
    ("node", "GET", "/v1/nodes/h100-001", None, [200] * 6),
    ("cluster", "GET", "/v1/cluster", None, [200] * 6),
    ("quota", "GET", "/v1/quota", None, [200] * 6),
    ("cordon", "POST", "/v1/nodes/l40s-004/uncordon", None, [200, 403, 403, 403, 403, 403]),
    ("audit-verify", "GET", "/v1/audit/verify", None, [200, 403, 403, 403, 403, 403]),
    ("audit-export", "GET", "/v1/audit/export", None, [200, 403, 403, 403, 403, 403]),
    ("tokens-list", "GET", "/v1/tokens", None, [200, 403, 403, 403, 403, 403]),
    (
        "tokens-create",
        "POST",
        "/v1/tokens",
        lambda r: {"name": f"t-{r}", "role": "viewer"},
        [201, 403, 403, 403, 403, 403],
    ),
    ("whoami", "GET", "/v1/whoami", None, [200] * 6),
]


@pytest.mark.parametrize(("case", "method", "path", "body", "expected"), MATRIX, ids=[m[0] for m in MATRIX])
def test_role_matrix(
    world: tuple[Api, dict[str, str]], case: str, method: str, path: str, body: Any, expected: list[int]
) -> None:
    api, tokens = world
    got = []
    for role in ORDER:
        b = body(role) if callable(body) else body
        r = api.req(method, path, token=tokens[role], **({"json": b} if b is not None else {}))
        got.append(r.status_code)
        if r.status_code >= 400:
            msg = r.json()["error"]["message"]
            assert msg, r.text
            if r.status_code == 403:
                assert (msg.startswith("forbidden: ") and role.split("-")[0] in msg) or ROLES[role][0] in msg
            if r.status_code == 404 and ROLES[role][1]:
                assert "not found" in msg
    assert dict(zip(ORDER, got, strict=True)) == dict(zip(ORDER, expected, strict=True)), case
    # without a token, or with a wrong one: 401 and why
    for tok in ("", "gpt_nonsense"):
        r = api.req(
            method,
            path,
            token=tok,
            **({"json": body("x") if callable(body) else body} if body is not None else {}),
        )
        assert r.status_code == 401, (case, tok, r.text)
        assert "authentication" in r.json()["error"]["message"]


def test_lists_only_show_own_subtree(world: tuple[Api, dict[str, str]]) -> None:
    api, tokens = world

    def names(role: str) -> set[str]:
        return {w["name"] for w in api.get("/v1/workloads", token=tokens[role])["items"]}

    assert "wb" not in names("alice") and "wa" in names("alice")
    assert "wa" not in names("bob") and "wb" in names("bob")
    assert {"wa", "wb", "wc"} <= names("viewer")
    assert "wb" not in names("lviewer")
    r = api.get("/v1/workloads", token=tokens["alice"], params={"queue": "vision-team"})
    assert r["items"] == []
    quota = api.get("/v1/quota", token=tokens["alice"])["items"]
    assert {q["queue"] for q in quota} == {"llm-research"}
    # node view names only visible workloads
    for n in api.get("/v1/nodes", token=tokens["alice"])["items"]:
        for d in api.get(f"/v1/nodes/{n['name']}", token=tokens["alice"])["devices"]:
            for w in d["workloads"]:
                assert w["workload"] != "wb"


def test_denied_mutations_are_audited(world: tuple[Api, dict[str, str]]) -> None:
    api, tokens = world
    api.req("POST", "/v1/workloads", token=tokens["viewer"], json=wl("denied-one"))
    recs = api.get("/v1/audit", params={"limit": 10_000})["items"]
    assert any(
        r["action"] == "request.denied" and r["actor"] == "viewer" and r["name"] == "denied-one" for r in recs
    )
