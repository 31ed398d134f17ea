"""Patches of the three kinds over HTTP, on objects and on their status: on the fake and on the
real API server (``kube_api``), so the fake's patch semantics are held to the real ones."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gpupool.kube.fake.patch import json_patch, merge_patch, strategic_merge
from tests.kube.conftest import KubeTarget

MERGE, JSON, SMP = (
    "application/merge-patch+json",
    "application/json-patch+json",
    "application/strategic-merge-patch+json",
)


@pytest.fixture
def api(kube_api: KubeTarget) -> Iterator[KubeTarget]:
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
    r = kube_api.http.post(kube_api.path("pods"), json=pod)
    assert r.status_code == 201, r.text
    yield kube_api


def patch(api: KubeTarget, body: Any, ctype: str, sub: str = "") -> httpx.Response:
    return api.http.patch(api.path("pods", "p" + sub), json=body, headers={"content-type": ctype})


def test_merge_patch_sets_and_deletes_keys(api: KubeTarget) -> None:
    got = patch(api, {"metadata": {"labels": {"a": None, "c": "3"}, "annotations": {"k": "v"}}}, MERGE).json()
    assert got["metadata"]["labels"] == {"b": "2", "c": "3"} and got["metadata"]["annotations"] == {"k": "v"}


def test_merge_patch_replaces_lists(api: KubeTarget) -> None:
    got = patch(api, {"spec": {"schedulingGates": []}}, MERGE).json()
    assert got["spec"].get("schedulingGates", []) == []  # the real server omits the empty list


def test_json_patch_ops_and_test_failure(api: KubeTarget) -> None:
    ops = [
        {"op": "add", "path": "/metadata/labels/gpupool.io~1queue", "value": "q"},
        {"op": "remove", "path": "/spec/schedulingGates/0"},
        {"op": "replace", "path": "/spec/containers/1/image", "value": "s2"},
    ]
    got = patch(api, ops, JSON).json()
    assert got["metadata"]["labels"]["gpupool.io/queue"] == "q"
    assert got["spec"].get("schedulingGates", []) == [] and got["spec"]["containers"][1]["image"] == "s2"
    bad = patch(api, [{"op": "test", "path": "/metadata/labels/a", "value": "nope"}], JSON)
    assert bad.status_code == 422
    assert patch(api, {"not": "a list"}, JSON).status_code == 400


def test_strategic_merge_keys_containers_by_name(api: KubeTarget) -> None:
    """On a Deployment's pod template: a pod's own container list cannot grow (the real server
    refuses that update)."""
    containers = [
        {"name": "main", "image": "v1", "env": [{"name": "A", "value": "1"}]},
        {"name": "side", "image": "s1"},
    ]
    deploy = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "d"},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"app": "d"}},
            "template": {"metadata": {"labels": {"app": "d"}}, "spec": {"containers": containers}},
        },
    }
    path = api.path("deployments", group="apps")
    assert api.http.post(path, json=deploy).status_code == 201
    body = {
        "spec": {
            "template": {
                "spec": {"containers": [{"name": "side", "image": "s3"}, {"name": "new", "image": "n"}]}
            }
        }
    }
    r = api.http.patch(f"{path}/d", json=body, headers={"content-type": SMP})
    assert r.status_code == 200, r.text
    got = r.json()["spec"]["template"]["spec"]["containers"]
    assert [(c["name"], c["image"]) for c in got] == [("main", "v1"), ("side", "s3"), ("new", "n")]
    assert got[0]["env"] == [{"name": "A", "value": "1"}]


def test_strategic_merge_delete_directive_and_finalizer_set(api: KubeTarget) -> None:
    body = {
        "metadata": {"finalizers": ["x/two"]},
        "spec": {
            "schedulingGates": [{"name": "gpupool.io/admission", "$patch": "delete"}],
            "$setElementOrder/containers": [{"name": "main"}, {"name": "side"}],
        },
    }
    got = patch(api, body, SMP).json()
    assert got["spec"].get("schedulingGates", []) == []
    assert got["metadata"]["finalizers"] == ["x/two", "x/one"]  # the patch's first, as the real server
    got = patch(api, {"metadata": {"$deleteFromPrimitiveList/finalizers": ["x/one"]}}, SMP).json()
    assert got["metadata"]["finalizers"] == ["x/two"]


def test_strategic_merge_on_status_merges_conditions_by_type(api: KubeTarget) -> None:
    c1 = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "waiting"}
    patch(api, {"status": {"conditions": [c1]}}, SMP, "/status")
    c2 = {"type": "gpupool.io/Admitted", "status": "True"}
    got = patch(
        api, {"status": {"conditions": [c2, {**c1, "message": "still waiting"}]}}, SMP, "/status"
    ).json()
    # the patch's order, as the real server orders a merged list (the fake kept the live order)
    assert [(c["type"], c.get("message")) for c in got["status"]["conditions"]] == [
        ("gpupool.io/Admitted", None),
        ("PodScheduled", "still waiting"),
    ]
    assert got["status"]["phase"] == "Pending"


def test_status_patch_ignores_spec_and_spec_patch_ignores_status(api: KubeTarget) -> None:
    got = patch(api, {"status": {"phase": "Running"}, "spec": {"priority": 5}}, MERGE, "/status").json()
    assert got["status"]["phase"] == "Running" and got["spec"]["priority"] == 0
    got = patch(api, {"status": {"phase": "Failed"}}, MERGE).json()
    assert got["status"]["phase"] == "Running"


def test_patch_with_stale_resource_version_conflicts(api: KubeTarget) -> None:
    assert patch(api, {"metadata": {"resourceVersion": "1", "labels": {"z": "1"}}}, MERGE).status_code == 409


def test_unknown_patch_type_is_415(api: KubeTarget) -> None:
    r = patch(api, {"metadata": {}}, "application/x-yaml")
    assert r.status_code == 415 and r.json()["reason"] == "UnsupportedMediaType"


def test_server_side_apply_creates_then_merges(api: KubeTarget) -> None:
    cm = api.path("configmaps", "applied")
    ctype = {"content-type": "application/apply-patch+yaml"}
    body = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: applied\ndata:\n  a: '1'\n"
    r = api.http.patch(cm, content=body, headers=ctype, params={"fieldManager": "t"})
    assert r.status_code == 201 and r.json()["data"] == {"a": "1"} and r.json()["metadata"]["uid"]
    # another manager's fields join (the same manager dropping a field would remove it on the
    # real server: the fake does not track field managers)
    r = api.http.patch(
        cm, content=body.replace("a: '1'", "b: '2'"), headers=ctype, params={"fieldManager": "u"}
    )
    assert r.status_code == 200 and r.json()["data"] == {"a": "1", "b": "2"}
    applied = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}
    applied["spec"] = {"containers": [{"name": "side", "image": "s9"}]}
    pod, apply = api.path("pods", "p"), {"content-type": "application/apply-patch+yaml"}
    assert api.http.patch(pod, json=applied, headers=apply, params={"force": "true"}).status_code == 422
    bare = {"spec": applied["spec"]}
    r = api.http.patch(pod, json=bare, headers=apply, params={"fieldManager": "t", "force": "true"})
    assert r.status_code == 400 and "invalid object type" in r.json()["message"]
    got = api.http.patch(pod, json=applied, headers=apply, params={"fieldManager": "t", "force": "true"})
    assert [c["image"] for c in got.json()["spec"]["containers"]] == ["v1", "s9"]


def test_dry_run_checks_but_stores_nothing(api: KubeTarget) -> None:
    rv = api.fake.store.rv if api.fake else None
    r = api.http.post(api.path("configmaps"), params={"dryRun": "All"}, json={"metadata": {"name": "d"}})
    assert r.status_code == 201 and r.json()["metadata"]["name"] == "d"
    assert patch_dry(api).json()["metadata"]["labels"]["dry"] == "1"
    assert api.http.delete(api.path("pods", "p"), params={"dryRun": "All"}).status_code == 200
    dup = api.http.post(
        api.path("pods"),
        params={"dryRun": "All"},
        json={"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "x"}]}},
    )
    assert dup.status_code == 409
    assert api.fake is None or api.fake.store.rv == rv
    assert api.http.get(api.path("configmaps", "d")).status_code == 404
    assert "dry" not in api.http.get(api.path("pods", "p")).json()["metadata"]["labels"]


def patch_dry(api: KubeTarget) -> httpx.Response:
    return api.http.patch(
        api.path("pods", "p"),
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
