"""The fake API server over HTTP: CRUD, conflicts, selectors, paging, finalizers, cascading
deletes, status subresource, discovery and CRD registration."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gpupool.kube.fake import FakeApiServer

PODS = "/api/v1/namespaces/default/pods"
JOBS = "/apis/batch/v1/namespaces/default/jobs"
CM = "/api/v1/namespaces/default/configmaps"


def pod(name: str, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"schedulerName": "gpupool", "containers": [{"name": "c", "image": "busybox"}], **spec},
    }


@pytest.fixture
def api(fake_server: FakeApiServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=fake_server.url, headers={"Authorization": "Bearer fake"}) as c:
        yield c


def test_create_sets_server_fields_and_refuses_duplicates(api: httpx.Client) -> None:
    r = api.post(PODS, json=pod("p1"))
    assert r.status_code == 201
    md = r.json()["metadata"]
    assert md["uid"] and md["creationTimestamp"].endswith("Z") and md["generation"] == 1
    assert int(md["resourceVersion"]) > 1
    assert api.get(f"{PODS}/p1").json()["status"]["phase"] == "Pending"
    dup = api.post(PODS, json=pod("p1"))
    assert dup.status_code == 409
    body = dup.json()
    assert body["kind"] == "Status" and body["reason"] == "AlreadyExists" and body["code"] == 409
    assert body["status"] == "Failure" and "p1" in body["message"]


def test_generate_name_and_missing_namespace(api: httpx.Client) -> None:
    body = {"metadata": {"generateName": "cfg-"}, "data": {"a": "1"}}
    names = {api.post(CM, json=body).json()["metadata"]["name"] for _ in range(3)}
    assert len(names) == 3 and all(n.startswith("cfg-") for n in names)
    r = api.post("/api/v1/namespaces/nope/configmaps", json={"metadata": {"name": "x"}})
    assert r.status_code == 404 and r.json()["reason"] == "NotFound" and "nope" in r.json()["message"]
    r = api.post(PODS, json={"metadata": {"name": "bad"}, "spec": {}})
    assert r.status_code == 422 and "spec.containers" in r.json()["message"]


def test_resource_versions_increase_and_stale_update_conflicts(api: httpx.Client) -> None:
    a = api.post(CM, json={"metadata": {"name": "a"}, "data": {"k": "1"}}).json()
    b = api.post(CM, json={"metadata": {"name": "b"}}).json()
    assert int(b["metadata"]["resourceVersion"]) > int(a["metadata"]["resourceVersion"])
    a["data"]["k"] = "2"
    ok = api.put(f"{CM}/a", json=a)
    assert ok.status_code == 200 and ok.json()["data"]["k"] == "2"
    a["data"]["k"] = "3"  # still carries the old resourceVersion
    stale = api.put(f"{CM}/a", json=a)
    assert stale.status_code == 409 and stale.json()["reason"] == "Conflict"
    assert api.get(f"{CM}/a").json()["data"]["k"] == "2"


def test_generation_bumps_on_spec_change_only_and_status_is_separate(api: httpx.Client) -> None:
    job = {
        "metadata": {"name": "j"},
        "spec": {"suspend": True, "template": {"spec": {"containers": [{"name": "c", "image": "x"}]}}},
    }
    created = api.post(JOBS, json=job).json()
    assert created["metadata"]["generation"] == 1
    cur = api.get(f"{JOBS}/j").json()
    cur["metadata"]["labels"] = {"x": "y"}
    cur["status"] = {"active": 99}
    upd = api.put(f"{JOBS}/j", json=cur).json()
    assert upd["metadata"]["generation"] == 1 and upd["status"].get("active") != 99
    upd["spec"]["parallelism"] = 3
    upd2 = api.put(f"{JOBS}/j", json=upd).json()
    assert upd2["metadata"]["generation"] == 2
    st = api.patch(
        f"{JOBS}/j/status",
        json={"status": {"active": 7}, "spec": {"parallelism": 9}},
        headers={"content-type": "application/merge-patch+json"},
    ).json()
    assert st["status"]["active"] == 7 and st["spec"]["parallelism"] == 3


def test_label_selectors_set_based(api: httpx.Client) -> None:
    for name, labels in [("a", {"app": "x", "tier": "1"}), ("b", {"app": "y"}), ("c", {"tier": "2"})]:
        api.post(CM, json={"metadata": {"name": name, "labels": labels}})

    def names(sel: str) -> list[str]:
        r = api.get(CM, params={"labelSelector": sel})
        assert r.status_code == 200, r.text
        return [o["metadata"]["name"] for o in r.json()["items"]]

    assert names("app=x") == ["a"] and names("app==y") == ["b"]
    assert names("app!=x") == ["b", "c"]
    assert names("app in (x,y)") == ["a", "b"] and names("app notin (x)") == ["b", "c"]
    assert names("tier") == ["a", "c"] and names("!tier") == ["b"]
    assert names("app in (x, y),tier") == ["a"]
    assert api.get(CM, params={"labelSelector": "app in x"}).status_code == 400


def test_field_selectors_and_all_namespaces(api: httpx.Client, fake_server: FakeApiServer) -> None:
    fake_server.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"}})
    api.post(PODS, json=pod("p1"))
    api.post("/api/v1/namespaces/team/pods", json=pod("p2", schedulerName="default-scheduler"))
    fake_server.bind("default", "p1", "n1")

    def names(path: str, sel: str) -> list[str]:
        return [o["metadata"]["name"] for o in api.get(path, params={"fieldSelector": sel}).json()["items"]]

    assert names("/api/v1/pods", "spec.nodeName=n1") == ["p1"]
    assert names("/api/v1/pods", "spec.nodeName=") == ["p2"]
    assert names("/api/v1/pods", "spec.schedulerName=gpupool,status.phase=Pending") == ["p1"]
    assert names("/api/v1/pods", "metadata.namespace=team") == ["p2"]
    assert names("/api/v1/pods", "metadata.name!=p1") == ["p2"]
    assert names(PODS, "") == ["p1"]


def test_list_paging_with_limit_and_continue(api: httpx.Client) -> None:
    for i in range(7):
        api.post(CM, json={"metadata": {"name": f"cm-{i}"}})
    seen, token, pages = [], None, 0
    while True:
        params: dict[str, Any] = {"limit": 3}
        if token:
            params["continue"] = token
        body = api.get(CM, params=params).json()
        seen += [o["metadata"]["name"] for o in body["items"]]
        pages += 1
        assert body["metadata"]["resourceVersion"]
        token = body["metadata"].get("continue")
        if not token:
            break
    assert pages == 3 and seen == [f"cm-{i}" for i in range(7)]
    assert api.get(CM, params={"continue": "garbage"}).status_code == 400


def test_finalizers_hold_the_object_until_removed(api: httpx.Client) -> None:
    api.post(CM, json={"metadata": {"name": "f", "finalizers": ["example.com/hold"]}})
    r = api.delete(f"{CM}/f")
    assert r.status_code == 200 and r.json()["metadata"]["deletionTimestamp"]
    assert api.get(f"{CM}/f").status_code == 200
    api.patch(
        f"{CM}/f",
        json={"metadata": {"finalizers": None}},
        headers={"content-type": "application/merge-patch+json"},
    )
    assert api.get(f"{CM}/f").status_code == 404


def test_delete_preconditions_and_not_found_status(api: httpx.Client) -> None:
    api.post(CM, json={"metadata": {"name": "x"}})
    r = api.request("DELETE", f"{CM}/x", json={"preconditions": {"uid": "not-the-uid"}})
    assert r.status_code == 409
    assert api.delete(f"{CM}/x").status_code == 200
    gone = api.get(f"{CM}/x")
    assert gone.status_code == 404 and gone.json() | {"details": None} == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'configmaps "x" not found',
        "reason": "NotFound",
        "code": 404,
        "details": None,
    }


def test_background_cascade_deletes_owned_objects(api: httpx.Client, fake_server: FakeApiServer) -> None:
    dep = {
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "c", "image": "x"}]},
            },
        },
    }
    assert api.post("/apis/apps/v1/namespaces/default/deployments", json=dep).status_code == 201
    fake_server.wait_for(lambda: len(fake_server.list("pods", "default", "app=web")) == 2, what="2 pods")
    r = api.delete(
        "/apis/apps/v1/namespaces/default/deployments/web", params={"propagationPolicy": "Background"}
    )
    assert r.status_code == 200
    fake_server.wait_for(lambda: not fake_server.list("pods", "default", "app=web"), what="pods gone")
    assert fake_server.list("replicasets.apps") == []


def test_orphan_keeps_dependents_without_owner(api: httpx.Client, fake_server: FakeApiServer) -> None:
    owner = fake_server.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owner"}})
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"]}
    fake_server.create(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "dep", "ownerReferences": [ref]}}
    )
    api.delete(f"{CM}/owner", params={"propagationPolicy": "Orphan"})
    assert fake_server.get("configmaps", "default", "dep")["metadata"]["ownerReferences"] == []


def test_discovery_lists_resources_and_subresources(api: httpx.Client) -> None:
    assert api.get("/version").json()["major"] == "1"
    core = {r["name"]: r for r in api.get("/api/v1").json()["resources"]}
    assert {"pods", "pods/binding", "pods/eviction", "pods/status", "nodes", "events"} <= set(core)
    assert core["pods"]["namespaced"] and not core["nodes"]["namespaced"] and "watch" in core["pods"]["verbs"]
    assert core["pods/binding"]["verbs"] == ["create"] and "po" in core["pods"]["shortNames"]
    groups = {g["name"] for g in api.get("/apis").json()["groups"]}
    assert {"batch", "apps", "coordination.k8s.io", "scheduling.k8s.io", "events.k8s.io"} <= groups
    batch = {r["name"] for r in api.get("/apis/batch/v1").json()["resources"]}
    assert {"jobs", "jobs/status"} <= batch
    assert api.get("/apis/nope.io/v1").status_code == 404


def test_crd_registration_serves_the_new_kind(api: httpx.Client) -> None:
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "shortNames": ["wd"]},
            "versions": [{"name": "v1", "served": True, "storage": True, "subresources": {"status": {}}}],
        },
    }
    path = "/apis/example.com/v1/namespaces/default/widgets"
    assert api.get(path).status_code == 404
    r = api.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd)
    assert r.status_code == 201
    assert any(c["type"] == "Established" for c in r.json()["status"]["conditions"])
    assert "example.com" in {g["name"] for g in api.get("/apis").json()["groups"]}
    assert api.post(path, json={"metadata": {"name": "w1"}, "spec": {"size": 3}}).status_code == 201
    assert api.get(f"{path}/w1").json()["kind"] == "Widget"
    bad = dict(crd, metadata={"name": "wrong.example.com"})
    assert api.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=bad).status_code == 422


def test_preloaded_training_crds_are_served(api: httpx.Client) -> None:
    assert api.get("/apis/kubeflow.org/v1/namespaces/default/pytorchjobs").status_code == 200
    assert api.get("/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets").status_code == 200


def test_leases_conflict_on_stale_resource_version(api: httpx.Client) -> None:
    path = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases"
    spec = {"holderIdentity": "a", "leaseDurationSeconds": 15}
    lease = api.post(path, json={"metadata": {"name": "gpupool"}, "spec": spec}).json()
    a, b = dict(lease), dict(lease)
    a["spec"] = {**spec, "holderIdentity": "a", "renewTime": "2026-01-01T00:00:00.000000Z"}
    b["spec"] = {**spec, "holderIdentity": "b"}
    assert api.put(f"{path}/gpupool", json=a).status_code == 200
    assert api.put(f"{path}/gpupool", json=b).status_code == 409
    assert api.get(f"{path}/gpupool").json()["spec"]["holderIdentity"] == "a"


def test_pod_node_name_changes_only_through_binding(api: httpx.Client) -> None:
    api.post(PODS, json=pod("p"))
    r = api.patch(
        f"{PODS}/p",
        json={"spec": {"nodeName": "n1"}},
        headers={"content-type": "application/merge-patch+json"},
    )
    assert r.status_code == 422 and "binding" in r.json()["message"]


def test_events_core_and_events_k8s_io(api: httpx.Client) -> None:
    ev = {
        "metadata": {"generateName": "p."},
        "involvedObject": {"kind": "Pod", "name": "p", "namespace": "default"},
        "reason": "Waiting",
        "message": "m",
        "type": "Normal",
    }
    assert api.post("/api/v1/namespaces/default/events", json=ev).status_code == 201
    got = api.get(
        "/api/v1/namespaces/default/events", params={"fieldSelector": "involvedObject.name=p"}
    ).json()
    assert [e["reason"] for e in got["items"]] == ["Waiting"]
    new = {
        "metadata": {"generateName": "p."},
        "regarding": {"kind": "Pod", "name": "p"},
        "reason": "R",
        "note": "n",
        "type": "Normal",
        "action": "Scheduling",
        "reportingController": "gpupool",
        "reportingInstance": "gpupool-0",
        "eventTime": "2026-01-01T00:00:00.000000Z",
    }
    assert api.post("/apis/events.k8s.io/v1/namespaces/default/events", json=new).status_code == 201
    core = api.get("/api/v1/namespaces/default/events", params={"fieldSelector": "reason=R"}).json()["items"]
    assert [(e["message"], e["involvedObject"]["name"]) for e in core] == [("n", "p")]


def test_write_that_changes_nothing_keeps_the_resource_version(api: httpx.Client) -> None:
    rv = api.post(CM, json={"metadata": {"name": "same", "labels": {"a": "1"}}}).json()["metadata"][
        "resourceVersion"
    ]
    again = api.patch(
        f"{CM}/same",
        json={"metadata": {"labels": {"a": "1"}}},
        headers={"content-type": "application/merge-patch+json"},
    )
    assert again.json()["metadata"]["resourceVersion"] == rv


def test_foreground_delete_waits_for_dependents(api: httpx.Client, fake_server: FakeApiServer) -> None:
    owner = fake_server.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owner"}})
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"]}
    dep = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "dep", "ownerReferences": [ref], "finalizers": ["x/hold"]},
    }
    fake_server.create(dep)
    out = api.delete(f"{CM}/owner", params={"propagationPolicy": "Foreground"}).json()
    assert out["metadata"]["deletionTimestamp"] and "foregroundDeletion" in out["metadata"]["finalizers"]
    assert fake_server.get("configmaps", "default", "dep")["metadata"]["deletionTimestamp"]
    fake_server.patch("configmaps", "default", "dep", {"metadata": {"finalizers": None}})
    assert api.get(f"{CM}/dep").status_code == 404
    assert api.get(f"{CM}/owner").status_code == 404


def test_delete_collection_by_label(api: httpx.Client) -> None:
    for name, app in (("a", "x"), ("b", "x"), ("c", "y")):
        api.post(CM, json={"metadata": {"name": name, "labels": {"app": app}}})
    r = api.delete(CM, params={"labelSelector": "app=x"})
    assert r.status_code == 200 and [o["metadata"]["name"] for o in r.json()["items"]] == ["a", "b"]
    assert [o["metadata"]["name"] for o in api.get(CM).json()["items"]] == ["c"]


def test_bad_query_values_are_400_with_the_parameter_named(
    api: httpx.Client, fake_server: FakeApiServer
) -> None:
    for params in (
        {"limit": "many"},
        {"watch": "1", "timeoutSeconds": "soon"},
        {"watch": "1", "resourceVersion": "x"},
    ):
        r = api.get(CM, params=params)
        assert r.status_code == 400 and next(iter(params.keys() - {"watch"})) in r.json()["message"]
    assert api.post(CM, content=b"{not json", headers={"content-type": "application/json"}).status_code == 400
    assert api.post(CM, json=["a", "list"]).status_code == 400
    assert fake_server.stats.server_errors == []


def test_priority_admission_from_priority_classes(api: httpx.Client, fake_server: FakeApiServer) -> None:
    pcs = "/apis/scheduling.k8s.io/v1/priorityclasses"
    api.post(pcs, json={"metadata": {"name": "high"}, "value": 1000, "preemptionPolicy": "Never"})
    got = api.post(PODS, json=pod("hi", priorityClassName="high")).json()
    assert got["spec"]["priority"] == 1000 and got["spec"]["preemptionPolicy"] == "Never"
    assert api.post(PODS, json=pod("plain")).json()["spec"]["priority"] == 0
    missing = api.post(PODS, json=pod("nope", priorityClassName="missing"))
    assert missing.status_code == 403 and "no PriorityClass with name missing" in missing.json()["message"]
    assert api.post(PODS, json=pod("self", priority=5)).status_code == 403
    api.post(pcs, json={"metadata": {"name": "dflt"}, "value": 7, "globalDefault": True})
    assert api.post(PODS, json=pod("d")).json()["spec"]["priorityClassName"] == "dflt"
    assert api.get(f"{pcs}/system-cluster-critical").json()["value"] == 2000000000


def test_stats_count_requests_by_kubernetes_verb(api: httpx.Client, fake_server: FakeApiServer) -> None:
    api.post(CM, json={"metadata": {"name": "s"}})
    api.get(CM)
    api.get(f"{CM}/s")
    api.patch(f"{CM}/s", json={"data": {"a": "1"}}, headers={"content-type": "application/merge-patch+json"})
    api.delete(CM)
    api.post(PODS, json=pod("sp"))
    api.post(f"{PODS}/sp/binding", json={"metadata": {"name": "sp"}, "target": {"name": "n"}})
    got = fake_server.stats.requests
    for key in (
        "create configmaps",
        "list configmaps",
        "get configmaps",
        "patch configmaps",
        "deletecollection configmaps",
        "create pods",
        "create pods/binding",
    ):
        assert got.get(key) == 1, (key, got)
    assert (
        fake_server.stats.binds == 1
        and fake_server.stats.requests_per_bind() == fake_server.stats.total_requests
    )
