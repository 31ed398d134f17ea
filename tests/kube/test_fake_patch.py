"""Patches of the three kinds over HTTP, on objects and on their status."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gpupool.kube.fake import FakeApiServer
from gpupool.kube.fake.patch import json_patch, merge_patch, strategic_merge

PODS = "/api/v1/namespaces/default/pods"
MERGE, JSON, SMP = (
    "application/merge-patch+json",
    "application/json-patch+json",
    "application/strategic-merge-patch+json",
)


@pytest.fixture
def api(fake_server: FakeApiServer) -> Iterator[httpx.Client]:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "labels": {"a": "1", "b": "2"}, "finalizers": ["x/one"]},
        "spec": {
            "schedulerName": "gpupool",
            "schedulingGates": [{"name": "gpupool.io/admission"}],
            "containers": [
                {"name": "main", "image": "v1", "env": [{"name": "A", "value": "1"}]},
                {"name": "side", "image": "s1"},
            ],
        },
    }
    fake_server.create(pod)
    with httpx.Client(base_url=fake_server.url) as c:
        yield c


def patch(api: httpx.Client, body: Any, ctype: str, sub: str = "") -> httpx.Response:
    return api.patch(f"{PODS}/p{sub}", json=body, headers={"content-type": ctype})


def test_merge_patch_sets_and_deletes_keys(api: httpx.Client) -> None:
    got = patch(api, {"metadata": {"labels": {"a": None, "c": "3"}, "annotations": {"k": "v"}}}, MERGE).json()
    assert got["metadata"]["labels"] == {"b": "2", "c": "3"} and got["metadata"]["annotations"] == {"k": "v"}


def test_merge_patch_replaces_lists(api: httpx.Client) -> None:
    got = patch(api, {"spec": {"schedulingGates": []}}, MERGE).json()
    assert got["spec"]["schedulingGates"] == []


def test_json_patch_ops_and_test_failure(api: httpx.Client) -> None:
    ops = [
        {"op": "add", "path": "/metadata/labels/gpupool.io~1queue", "value": "q"},
        {"op": "remove", "path": "/spec/schedulingGates/0"},
        {"op": "replace", "path": "/spec/containers/1/image", "value": "s2"},
    ]
    got = patch(api, ops, JSON).json()
    assert got["metadata"]["labels"]["gpupool.io/queue"] == "q"
    assert got["spec"]["schedulingGates"] == [] and got["spec"]["containers"][1]["image"] == "s2"
    bad = patch(api, [{"op": "test", "path": "/metadata/labels/a", "value": "nope"}], JSON)
    assert bad.status_code == 422
    assert patch(api, {"not": "a list"}, JSON).status_code == 400


def test_strategic_merge_keys_containers_by_name(api: httpx.Client) -> None:
    body = {"spec": {"containers": [{"name": "side", "image": "s3"}, {"name": "new", "image": "n"}]}}
    got = patch(api, body, SMP).json()
    assert [(c["name"], c["image"]) for c in got["spec"]["containers"]] == [
        ("main", "v1"),
        ("side", "s3"),
        ("new", "n"),
    ]
    assert got["spec"]["containers"][0]["env"] == [{"name": "A", "value": "1"}]


def test_strategic_merge_delete_directive_and_finalizer_set(api: httpx.Client) -> None:
    body = {
        "metadata": {"finalizers": ["x/two"]},
        "spec": {
            "schedulingGates": [{"name": "gpupool.io/admission", "$patch": "delete"}],
            "$setElementOrder/containers": [{"name": "main"}, {"name": "side"}],
        },
    }
    got = patch(api, body, SMP).json()
    assert got["spec"]["schedulingGates"] == [] and got["metadata"]["finalizers"] == ["x/one", "x/two"]
    got = patch(api, {"metadata": {"$deleteFromPrimitiveList/finalizers": ["x/one"]}}, SMP).json()
    assert got["metadata"]["finalizers"] == ["x/two"]


def test_strategic_merge_on_status_merges_conditions_by_type(api: httpx.Client) -> None:
    c1 = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "waiting"}
    patch(api, {"status": {"conditions": [c1]}}, SMP, "/status")
    c2 = {"type": "gpupool.io/Admitted", "status": "True"}
    got = patch(
        api, {"status": {"conditions": [c2, {**c1, "message": "still waiting"}]}}, SMP, "/status"
    ).json()
    assert [(c["type"], c.get("message")) for c in got["status"]["conditions"]] == [
        ("PodScheduled", "still waiting"),
        ("gpupool.io/Admitted", None),
    ]
    assert got["status"]["phase"] == "Pending"


def test_status_patch_ignores_spec_and_spec_patch_ignores_status(api: httpx.Client) -> None:
    got = patch(api, {"status": {"phase": "Running"}, "spec": {"priority": 5}}, MERGE, "/status").json()
    assert got["status"]["phase"] == "Running" and got["spec"]["priority"] == 0
    got = patch(api, {"status": {"phase": "Failed"}}, MERGE).json()
    assert got["status"]["phase"] == "Running"


def test_patch_with_stale_resource_version_conflicts(api: httpx.Client) -> None:
    assert patch(api, {"metadata": {"resourceVersion": "1", "labels": {"z": "1"}}}, MERGE).status_code == 409


def test_unknown_patch_type_is_415(api: httpx.Client) -> None:
    r = patch(api, {"metadata": {}}, "application/x-yaml")
    assert r.status_code == 415 and r.json()["reason"] == "UnsupportedMediaType"


def test_server_side_apply_creates_then_merges(api: httpx.Client) -> None:
    cm = "/api/v1/namespaces/default/configmaps/applied"
    ctype = {"content-type": "application/apply-patch+yaml"}
    body = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: applied\ndata:\n  a: '1'\n"
    r = api.patch(cm, content=body, headers=ctype, params={"fieldManager": "t"})
    assert r.status_code == 200 and r.json()["data"] == {"a": "1"} and r.json()["metadata"]["uid"]
    r = api.patch(cm, content=body.replace("a: '1'", "b: '2'"), headers=ctype, params={"fieldManager": "t"})
    assert r.json()["data"] == {"a": "1", "b": "2"}
    got = patch(
        api, {"spec": {"containers": [{"name": "side", "image": "s9"}]}}, "application/apply-patch+yaml"
    )
    assert [c["image"] for c in got.json()["spec"]["containers"]] == ["v1", "s9"]


def test_dry_run_checks_but_stores_nothing(api: httpx.Client, fake_server: FakeApiServer) -> None:
    rv = fake_server.store.rv
    r = api.post(
        "/api/v1/namespaces/default/configmaps", params={"dryRun": "All"}, json={"metadata": {"name": "d"}}
    )
    assert r.status_code == 201 and r.json()["metadata"]["name"] == "d"
    assert patch_dry(api).json()["metadata"]["labels"]["dry"] == "1"
    assert api.delete(f"{PODS}/p", params={"dryRun": "All"}).status_code == 200
    dup = api.post(
        PODS,
        params={"dryRun": "All"},
        json={"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "x"}]}},
    )
    assert dup.status_code == 409
    assert (
        fake_server.store.rv == rv and api.get("/api/v1/namespaces/default/configmaps/d").status_code == 404
    )
    assert "dry" not in api.get(f"{PODS}/p").json()["metadata"]["labels"]


def patch_dry(api: httpx.Client) -> httpx.Response:
    return api.patch(
        f"{PODS}/p",
        params={"dryRun": "All"},
        json={"metadata": {"labels": {"dry": "1"}}},
        headers={"content-type": MERGE},
    )


def test_patch_functions_do_not_modify_their_inputs() -> None:
    target = {"a": {"b": [1]}, "containers": [{"name": "x", "v": 1}]}
    snapshot = repr(target)
    merge_patch(target, {"a": {"b": [2]}})
    json_patch(target, [{"op": "add", "path": "/a/b/-", "value": 3}])
    strategic_merge(target, {"containers": [{"name": "x", "v": 2}]})
    assert repr(target) == snapshot
