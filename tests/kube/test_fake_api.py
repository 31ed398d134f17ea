"""The fake API server over HTTP: CRUD, conflicts, selectors, paging, finalizers, cascading
deletes, status subresource, discovery and CRD registration.

The tests taking ``api`` run on the fake and on the real API server (``kube_api``), each in a
namespace of its own, so what they assert is what the real server does; those taking
``fake_api`` check what only the fake has (its stats, its preloaded CRDs, its controllers)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gpupool.kube.fake import FakeApiServer
from tests.kube.conftest import KubeTarget

PODS = "/api/v1/namespaces/default/pods"
#: the ConfigMap the real controller manager publishes in every namespace (the fake does not)
ROOT_CA = "kube-root-ca.crt"
CM = "/api/v1/namespaces/default/configmaps"


def pod(name: str, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"schedulerName": "gpupool", "containers": [{"name": "c", "image": "busybox"}], **spec},
    }


@pytest.fixture
def fake_api(fake_server: FakeApiServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=fake_server.url, headers={"Authorization": "Bearer fake"}) as c:
        yield c


@pytest.fixture
def api(kube_api: KubeTarget) -> KubeTarget:
    return kube_api


def test_create_sets_server_fields_and_refuses_duplicates(api: KubeTarget) -> None:
    r = api.http.post(api.path("pods"), json=pod("p1"))
    assert r.status_code == 201
    md = r.json()["metadata"]
    assert md["uid"] and md["creationTimestamp"].endswith("Z") and md["generation"] == 1
    assert int(md["resourceVersion"]) > 1
    assert api.http.get(api.path("pods", "p1")).json()["status"]["phase"] == "Pending"
    dup = api.http.post(api.path("pods"), json=pod("p1"))
    assert dup.status_code == 409
    body = dup.json()
    assert body["kind"] == "Status" and body["reason"] == "AlreadyExists" and body["code"] == 409
    assert body["status"] == "Failure" and "p1" in body["message"]


def test_a_pod_gets_the_admission_defaults_of_a_real_server(api: KubeTarget) -> None:
    """The ServiceAccount and DefaultTolerationSeconds admission plugins: a pod without a service
    account runs as ``default``, and one that does not tolerate ``not-ready`` / ``unreachable``
    gets a NoExecute toleration of 300 s for each (what a scheduler checks taints against); a
    toleration of its own is kept in place of the default. The fake had neither: ``kubectl
    describe pod`` lined up differently and the tolerations were missing."""
    got = api.http.post(api.path("pods"), json=pod("plain")).json()["spec"]
    assert (got["serviceAccountName"], got["serviceAccount"]) == ("default", "default")
    defaults = [
        {
            "key": f"node.kubernetes.io/{k}",
            "operator": "Exists",
            "effect": "NoExecute",
            "tolerationSeconds": 300,
        }
        for k in ("not-ready", "unreachable")
    ]
    assert got["tolerations"] == defaults
    own = {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"}
    got = api.http.post(api.path("pods"), json=pod("own", tolerations=[own])).json()["spec"]
    assert got["tolerations"] == [own, defaults[1]]
    anything = {"operator": "Exists"}
    got = api.http.post(api.path("pods"), json=pod("all", tolerations=[anything])).json()["spec"]
    assert got["tolerations"] == [anything]


def test_generate_name_and_missing_namespace(api: KubeTarget) -> None:
    body = {"metadata": {"generateName": "cfg-"}, "data": {"a": "1"}}
    names = {api.http.post(api.path("configmaps"), json=body).json()["metadata"]["name"] for _ in range(3)}
    assert len(names) == 3 and all(n.startswith("cfg-") for n in names)
    r = api.http.post("/api/v1/namespaces/nope/configmaps", json={"metadata": {"name": "x"}})
    assert r.status_code == 404 and r.json()["reason"] == "NotFound" and "nope" in r.json()["message"]
    r = api.http.post(api.path("pods"), json={"metadata": {"name": "bad"}, "spec": {}})
    assert r.status_code == 422 and "spec.containers" in r.json()["message"]


def test_resource_versions_increase_and_stale_update_conflicts(api: KubeTarget) -> None:
    a = api.http.post(api.path("configmaps"), json={"metadata": {"name": "a"}, "data": {"k": "1"}}).json()
    b = api.http.post(api.path("configmaps"), json={"metadata": {"name": "b"}}).json()
    assert int(b["metadata"]["resourceVersion"]) > int(a["metadata"]["resourceVersion"])
    a["data"]["k"] = "2"
    ok = api.http.put(api.path("configmaps", "a"), json=a)
    assert ok.status_code == 200 and ok.json()["data"]["k"] == "2"
    a["data"]["k"] = "3"  # still carries the old resourceVersion
    stale = api.http.put(api.path("configmaps", "a"), json=a)
    assert stale.status_code == 409 and stale.json()["reason"] == "Conflict"
    assert api.http.get(api.path("configmaps", "a")).json()["data"]["k"] == "2"


def test_generation_bumps_on_spec_change_only_and_status_is_separate(api: KubeTarget) -> None:
    job = {
        "metadata": {"name": "j"},
        "spec": {
            "suspend": True,
            "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}},
        },
    }
    created = api.http.post(api.path("jobs", group="batch"), json=job).json()
    assert created["metadata"]["generation"] == 1
    path = api.path("jobs", "j", group="batch")

    def labelled(cur: dict[str, Any]) -> None:
        cur["metadata"]["labels"] = {**(cur["metadata"].get("labels") or {}), "x": "y"}
        cur["status"] = {"active": 99}

    upd = _update(api, path, labelled)
    assert upd["metadata"]["generation"] == 1 and upd["status"].get("active") != 99
    upd2 = _update(api, path, lambda cur: cur["spec"].update(parallelism=3))
    assert upd2["metadata"]["generation"] == 2
    st = api.http.patch(
        api.path("jobs", "j/status", group="batch"),
        json={"status": {"active": 7}, "spec": {"parallelism": 9}},
        headers={"content-type": "application/merge-patch+json"},
    ).json()
    assert st["status"]["active"] == 7 and st["spec"]["parallelism"] == 3


def _update(api: KubeTarget, path: str, change: Any, timeout: float = 30.0) -> dict[str, Any]:
    """GET, change, PUT, again on a conflict: the real Job controller writes the Job's status
    right after it is created, so a first PUT may be stale."""
    deadline = time.monotonic() + timeout
    while True:
        cur = api.http.get(path).json()
        change(cur)
        r = api.http.put(path, json=cur)
        if r.status_code != 409 or time.monotonic() > deadline:
            assert r.status_code == 200, r.text
            return dict(r.json())


def test_label_selectors_set_based(api: KubeTarget) -> None:
    for name, labels in [("a", {"app": "x", "tier": "1"}), ("b", {"app": "y"}), ("c", {"tier": "2"})]:
        api.http.post(api.path("configmaps"), json={"metadata": {"name": name, "labels": labels}})

    def names(sel: str) -> list[str]:
        r = api.http.get(api.path("configmaps"), params={"labelSelector": sel})
        assert r.status_code == 200, r.text
        return [o["metadata"]["name"] for o in r.json()["items"] if o["metadata"]["name"] != ROOT_CA]

    assert names("app=x") == ["a"] and names("app==y") == ["b"]
    assert names("app!=x") == ["b", "c"]
    assert names("app in (x,y)") == ["a", "b"] and names("app notin (x)") == ["b", "c"]
    assert names("tier") == ["a", "c"] and names("!tier") == ["b"]
    assert names("app in (x, y),tier") == ["a"]
    assert api.http.get(api.path("configmaps"), params={"labelSelector": "app in x"}).status_code == 400


def test_field_selectors_and_all_namespaces(api: KubeTarget) -> None:
    team = f"{api.namespace}-team"
    assert api.http.post("/api/v1/namespaces", json={"metadata": {"name": team}}).status_code == 201
    try:
        _field_selectors(api, team)
    finally:
        api.http.delete(f"/api/v1/namespaces/{team}")


def _field_selectors(api: KubeTarget, team: str) -> None:
    ours = {api.namespace, team}
    if api.kind == "real":  # pods need the namespace's default service account there
        deadline = time.monotonic() + 60
        while api.http.get(f"/api/v1/namespaces/{team}/serviceaccounts/default").status_code != 200:
            assert time.monotonic() < deadline, "no default service account"
            time.sleep(0.2)
    assert api.http.post(api.path("pods"), json=pod("p1")).status_code == 201
    p2 = pod("p2", schedulerName="default-scheduler")
    assert api.http.post(f"/api/v1/namespaces/{team}/pods", json=p2).status_code == 201
    binding = {"metadata": {"name": "p1"}, "target": {"kind": "Node", "name": "n1"}}
    assert api.http.post(api.path("pods", "p1/binding"), json=binding).status_code == 201

    def names(path: str, sel: str) -> list[str]:
        items = api.http.get(path, params={"fieldSelector": sel}).json()["items"]
        return [o["metadata"]["name"] for o in items if o["metadata"]["namespace"] in ours]

    assert names("/api/v1/pods", "spec.nodeName=n1") == ["p1"]
    assert names("/api/v1/pods", "spec.nodeName=") == ["p2"]
    assert names("/api/v1/pods", "spec.schedulerName=gpupool,status.phase=Pending") == ["p1"]
    assert names("/api/v1/pods", f"metadata.namespace={team}") == ["p2"]
    assert sorted(names("/api/v1/pods", "metadata.name!=p1")) == ["p2"]
    assert names(api.path("pods"), "") == ["p1"]


def test_list_paging_with_limit_and_continue(api: KubeTarget) -> None:
    for i in range(7):
        api.http.post(api.path("configmaps"), json={"metadata": {"name": f"cm-{i}"}})
    seen, token, pages = [], None, 0
    while True:
        params: dict[str, Any] = {"limit": 3}
        if token:
            params["continue"] = token
        body = api.http.get(api.path("configmaps"), params=params).json()
        seen += [o["metadata"]["name"] for o in body["items"] if o["metadata"]["name"] != ROOT_CA]
        pages += 1
        assert body["metadata"]["resourceVersion"]
        token = body["metadata"].get("continue")
        if not token:
            break
    assert pages == 3 and seen == [f"cm-{i}" for i in range(7)]
    assert api.http.get(api.path("configmaps"), params={"continue": "garbage"}).status_code == 400


def test_finalizers_hold_the_object_until_removed(api: KubeTarget) -> None:
    api.http.post(
        api.path("configmaps"), json={"metadata": {"name": "f", "finalizers": ["example.com/hold"]}}
    )
    r = api.http.delete(api.path("configmaps", "f"))
    assert r.status_code == 200 and r.json()["metadata"]["deletionTimestamp"]
    assert api.http.get(api.path("configmaps", "f")).status_code == 200
    api.http.patch(
        api.path("configmaps", "f"),
        json={"metadata": {"finalizers": None}},
        headers={"content-type": "application/merge-patch+json"},
    )
    assert api.http.get(api.path("configmaps", "f")).status_code == 404


def test_delete_preconditions_and_not_found_status(api: KubeTarget) -> None:
    api.http.post(api.path("configmaps"), json={"metadata": {"name": "x"}})
    r = api.http.request(
        "DELETE", api.path("configmaps", "x"), json={"preconditions": {"uid": "not-the-uid"}}
    )
    assert r.status_code == 409
    assert api.http.delete(api.path("configmaps", "x")).status_code == 200
    gone = api.http.get(api.path("configmaps", "x"))
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


def test_background_cascade_deletes_owned_objects(fake_api: httpx.Client, fake_server: FakeApiServer) -> None:
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
    assert fake_api.post("/apis/apps/v1/namespaces/default/deployments", json=dep).status_code == 201
    fake_server.wait_for(lambda: len(fake_server.list("pods", "default", "app=web")) == 2, what="2 pods")
    r = fake_api.delete(
        "/apis/apps/v1/namespaces/default/deployments/web", params={"propagationPolicy": "Background"}
    )
    assert r.status_code == 200
    fake_server.wait_for(lambda: not fake_server.list("pods", "default", "app=web"), what="pods gone")
    assert fake_server.list("replicasets.apps") == []


def test_orphan_keeps_dependents_without_owner(fake_api: httpx.Client, fake_server: FakeApiServer) -> None:
    owner = fake_server.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owner"}})
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"]}
    fake_server.create(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "dep", "ownerReferences": [ref]}}
    )
    fake_api.delete(f"{CM}/owner", params={"propagationPolicy": "Orphan"})
    assert fake_server.get("configmaps", "default", "dep")["metadata"]["ownerReferences"] == []


def test_discovery_lists_resources_and_subresources(api: KubeTarget) -> None:
    assert api.http.get("/version").json()["major"] == "1"
    core = {r["name"]: r for r in api.http.get("/api/v1").json()["resources"]}
    assert {"pods", "pods/binding", "pods/eviction", "pods/status", "nodes", "events"} <= set(core)
    assert core["pods"]["namespaced"] and not core["nodes"]["namespaced"] and "watch" in core["pods"]["verbs"]
    assert core["pods/binding"]["verbs"] == ["create"] and "po" in core["pods"]["shortNames"]
    groups = {g["name"] for g in api.http.get("/apis").json()["groups"]}
    assert {"batch", "apps", "coordination.k8s.io", "scheduling.k8s.io", "events.k8s.io"} <= groups
    batch = {r["name"] for r in api.http.get("/apis/batch/v1").json()["resources"]}
    assert {"jobs", "jobs/status"} <= batch
    assert api.http.get("/apis/nope.io/v1").status_code == 404


def test_crd_registration_serves_the_new_kind(fake_api: httpx.Client) -> None:
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
    assert fake_api.get(path).status_code == 404
    r = fake_api.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd)
    assert r.status_code == 201
    assert any(c["type"] == "Established" for c in r.json()["status"]["conditions"])
    assert "example.com" in {g["name"] for g in fake_api.get("/apis").json()["groups"]}
    assert fake_api.post(path, json={"metadata": {"name": "w1"}, "spec": {"size": 3}}).status_code == 201
    assert fake_api.get(f"{path}/w1").json()["kind"] == "Widget"
    bad = dict(crd, metadata={"name": "wrong.example.com"})
    assert (
        fake_api.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=bad).status_code == 422
    )


def test_preloaded_training_crds_are_served(fake_api: httpx.Client) -> None:
    assert fake_api.get("/apis/kubeflow.org/v1/namespaces/default/pytorchjobs").status_code == 200
    assert fake_api.get("/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets").status_code == 200


def test_leases_conflict_on_stale_resource_version(api: KubeTarget) -> None:
    path = api.path("leases", group="coordination.k8s.io")
    spec = {"holderIdentity": "a", "leaseDurationSeconds": 15}
    lease = api.http.post(path, json={"metadata": {"name": "gpupool"}, "spec": spec}).json()
    a, b = dict(lease), dict(lease)
    a["spec"] = {**spec, "holderIdentity": "a", "renewTime": "2026-01-01T00:00:00.000000Z"}
    b["spec"] = {**spec, "holderIdentity": "b"}
    assert api.http.put(f"{path}/gpupool", json=a).status_code == 200
    assert api.http.put(f"{path}/gpupool", json=b).status_code == 409
    assert api.http.get(f"{path}/gpupool").json()["spec"]["holderIdentity"] == "a"


def test_pod_node_name_changes_only_through_binding(api: KubeTarget) -> None:
    api.http.post(api.path("pods"), json=pod("p"))
    r = api.http.patch(
        api.path("pods", "p"),
        json={"spec": {"nodeName": "n1"}},
        headers={"content-type": "application/merge-patch+json"},
    )
    assert r.status_code == 422 and "pod updates may not change fields other than" in r.json()["message"]


def test_a_pod_spec_changes_only_where_the_real_server_allows(api: KubeTarget) -> None:
    """Images, additions to tolerations and removals of scheduling gates pass; a new container
    does not (the fake let a pod's container list grow)."""
    gated = pod("g", schedulingGates=[{"name": "gpupool.io/admission"}])
    assert api.http.post(api.path("pods"), json=gated).status_code == 201
    merge = {"content-type": "application/strategic-merge-patch+json"}
    ok = {
        "spec": {
            "containers": [{"name": "c", "image": "busybox:2"}],
            "tolerations": [{"key": "k", "operator": "Exists"}],
        }
    }
    r = api.http.patch(api.path("pods", "g"), json=ok, headers=merge)
    assert r.status_code == 200, r.text
    assert (
        api.http.patch(
            api.path("pods", "g"), json={"spec": {"schedulingGates": None}}, headers=merge
        ).status_code
        == 200
    )
    grow = {"spec": {"containers": [{"name": "c", "image": "busybox:2"}, {"name": "d", "image": "x"}]}}
    r = api.http.patch(api.path("pods", "g"), json=grow, headers=merge)
    assert r.status_code == 422 and "pod updates may not add or remove containers" in r.json()["message"]
    regate = {"spec": {"schedulingGates": [{"name": "again"}]}}
    assert api.http.patch(api.path("pods", "g"), json=regate, headers=merge).status_code == 422


def test_a_pods_grace_period_is_fixed_and_its_deadline_only_shortens(api: KubeTarget) -> None:
    """``terminationGracePeriodSeconds`` cannot change once the pod exists (the real server lets
    only a negative one become 1), and ``activeDeadlineSeconds`` may be set or shortened but not
    lengthened or removed: the fake let both change freely, which a backend test relied on and
    the real server refused (issue 24)."""
    assert api.http.post(api.path("pods"), json=pod("p", terminationGracePeriodSeconds=30)).status_code == 201
    merge = {"content-type": "application/merge-patch+json"}

    def patch(spec: dict[str, Any]) -> httpx.Response:
        return api.http.patch(api.path("pods", "p"), json={"spec": spec}, headers=merge)

    r = patch({"terminationGracePeriodSeconds": 100})
    assert r.status_code == 422 and "pod updates may not change fields other than" in r.json()["message"]
    assert patch({"activeDeadlineSeconds": 100}).status_code == 200
    assert patch({"activeDeadlineSeconds": 50}).status_code == 200
    r = patch({"activeDeadlineSeconds": 80})
    assert r.status_code == 422, r.text
    assert "spec.activeDeadlineSeconds" in r.json()["message"]
    assert "must be less than or equal to previous value" in r.json()["message"]
    r = patch({"activeDeadlineSeconds": None})
    assert r.status_code == 422, r.text
    assert "must not update from a positive integer to nil value" in r.json()["message"]
    got = api.http.get(api.path("pods", "p")).json()["spec"]
    assert (got["terminationGracePeriodSeconds"], got["activeDeadlineSeconds"]) == (30, 50)


def test_a_deployments_pods_restart_always(api: KubeTarget) -> None:
    """A Deployment's pod template may only restart ``Always`` (the default): the real server
    refuses ``Never``, which the fake took, and a backend test sent (issue 24)."""

    def deployment(name: str, **spec: Any) -> dict[str, Any]:
        return {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name},
            "spec": {
                "replicas": 0,
                "selector": {"matchLabels": {"app": name}},
                "template": {"metadata": {"labels": {"app": name}}, "spec": pod(name, **spec)["spec"]},
            },
        }

    path = f"/apis/apps/v1/namespaces/{api.namespace}/deployments"
    r = api.http.post(path, json=deployment("never", restartPolicy="Never"))
    assert r.status_code == 422, r.text
    assert r.json()["message"] == (
        'Deployment.apps "never" is invalid: spec.template.spec.restartPolicy: '
        'Unsupported value: "Never": supported values: "Always"'
    )
    r = api.http.post(path, json=deployment("plain"))
    assert r.status_code == 201, r.text
    assert r.json()["spec"]["template"]["spec"]["restartPolicy"] == "Always"


def test_listed_items_carry_no_kind_but_watched_objects_do(api: KubeTarget) -> None:
    """The real server writes ``kind``/``apiVersion`` once on a list of built-in objects, not on
    its items (a watch event's object and a GET carry them). The fake put them on every item, so
    a backend that read an owner's kind from its cache worked on the fake only: a Job listed at
    start-up could not be suspended on the real server (issue 24)."""
    assert api.http.post(api.path("pods"), json=pod("p")).status_code == 201
    listed = api.http.get(api.path("pods")).json()
    assert (listed["kind"], listed["apiVersion"]) == ("PodList", "v1")
    (item,) = listed["items"]
    assert "kind" not in item and "apiVersion" not in item
    got = api.http.get(api.path("pods", "p")).json()
    assert (got["kind"], got["apiVersion"]) == ("Pod", "v1")
    rv = listed["metadata"]["resourceVersion"]
    with api.http.stream("GET", api.path("pods"), params={"watch": "true", "resourceVersion": rv}) as w:
        api.http.patch(
            api.path("pods", "p"),
            json={"metadata": {"labels": {"seen": "yes"}}},
            headers={"content-type": "application/merge-patch+json"},
        )
        event = json.loads(next(w.iter_lines()))
    assert event["type"] == "MODIFIED"
    assert (event["object"]["kind"], event["object"]["apiVersion"]) == ("Pod", "v1")


def test_events_core_and_events_k8s_io(api: KubeTarget) -> None:
    ev = {
        "metadata": {"generateName": "p."},
        "involvedObject": {"kind": "Pod", "name": "p", "namespace": api.namespace},
        "reason": "Waiting",
        "message": "m",
        "type": "Normal",
    }
    assert api.http.post(api.path("events"), json=ev).status_code == 201
    got = api.http.get(api.path("events"), params={"fieldSelector": "involvedObject.name=p"}).json()
    assert [e["reason"] for e in got["items"]] == ["Waiting"]
    new = {
        "metadata": {"generateName": "p-"},  # "p." is refused here (a DNS subdomain), taken in core
        "regarding": {"kind": "Pod", "name": "p", "namespace": api.namespace},
        "reason": "R",
        "note": "n",
        "type": "Normal",
        "action": "Scheduling",
        "reportingController": "gpupool",
        "reportingInstance": "gpupool-0",
        "eventTime": "2026-01-01T00:00:00.000000Z",
    }
    dotted = {**new, "metadata": {"generateName": "p."}}
    refused = api.http.post(api.path("events", group="events.k8s.io"), json=dotted)
    assert refused.status_code == 422 and "metadata.generateName" in refused.json()["message"]
    made = api.http.post(api.path("events", group="events.k8s.io"), json=new)
    assert made.status_code == 201, made.text
    core = api.http.get(api.path("events"), params={"fieldSelector": "reason=R"}).json()["items"]
    assert [(e["message"], e["involvedObject"]["name"]) for e in core] == [("n", "p")]


def test_write_that_changes_nothing_keeps_the_resource_version(api: KubeTarget) -> None:
    rv = api.http.post(
        api.path("configmaps"), json={"metadata": {"name": "same", "labels": {"a": "1"}}}
    ).json()["metadata"]["resourceVersion"]
    again = api.http.patch(
        api.path("configmaps", "same"),
        json={"metadata": {"labels": {"a": "1"}}},
        headers={"content-type": "application/merge-patch+json"},
    )
    assert again.json()["metadata"]["resourceVersion"] == rv


def test_foreground_delete_waits_for_dependents(fake_api: httpx.Client, fake_server: FakeApiServer) -> None:
    owner = fake_server.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owner"}})
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"]}
    dep = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "dep", "ownerReferences": [ref], "finalizers": ["x/hold"]},
    }
    fake_server.create(dep)
    out = fake_api.delete(f"{CM}/owner", params={"propagationPolicy": "Foreground"}).json()
    assert out["metadata"]["deletionTimestamp"] and "foregroundDeletion" in out["metadata"]["finalizers"]
    assert fake_server.get("configmaps", "default", "dep")["metadata"]["deletionTimestamp"]
    fake_server.patch("configmaps", "default", "dep", {"metadata": {"finalizers": None}})
    assert fake_api.get(f"{CM}/dep").status_code == 404
    assert fake_api.get(f"{CM}/owner").status_code == 404


def test_delete_collection_by_label(api: KubeTarget) -> None:
    for name, app in (("a", "x"), ("b", "x"), ("c", "y")):
        api.http.post(api.path("configmaps"), json={"metadata": {"name": name, "labels": {"app": app}}})
    r = api.http.delete(api.path("configmaps"), params={"labelSelector": "app=x"})
    assert r.status_code == 200 and [o["metadata"]["name"] for o in r.json()["items"]] == ["a", "b"]
    left = [o["metadata"]["name"] for o in api.http.get(api.path("configmaps")).json()["items"]]
    assert [n for n in left if n != ROOT_CA] == ["c"]


def test_bad_query_values_are_400_with_the_parameter_named(
    fake_api: httpx.Client, fake_server: FakeApiServer
) -> None:
    for params in (
        {"limit": "many"},
        {"watch": "1", "timeoutSeconds": "soon"},
        {"watch": "1", "resourceVersion": "x"},
    ):
        r = fake_api.get(CM, params=params)
        assert r.status_code == 400 and next(iter(params.keys() - {"watch"})) in r.json()["message"]
    assert (
        fake_api.post(CM, content=b"{not json", headers={"content-type": "application/json"}).status_code
        == 400
    )
    assert fake_api.post(CM, json=["a", "list"]).status_code == 400
    assert fake_server.stats.server_errors == []


def test_priority_admission_from_priority_classes(fake_api: httpx.Client, fake_server: FakeApiServer) -> None:
    pcs = "/apis/scheduling.k8s.io/v1/priorityclasses"
    fake_api.post(pcs, json={"metadata": {"name": "high"}, "value": 1000, "preemptionPolicy": "Never"})
    got = fake_api.post(PODS, json=pod("hi", priorityClassName="high")).json()
    assert got["spec"]["priority"] == 1000 and got["spec"]["preemptionPolicy"] == "Never"
    assert fake_api.post(PODS, json=pod("plain")).json()["spec"]["priority"] == 0
    missing = fake_api.post(PODS, json=pod("nope", priorityClassName="missing"))
    assert missing.status_code == 403 and "no PriorityClass with name missing" in missing.json()["message"]
    assert fake_api.post(PODS, json=pod("self", priority=5)).status_code == 403
    fake_api.post(pcs, json={"metadata": {"name": "dflt"}, "value": 7, "globalDefault": True})
    assert fake_api.post(PODS, json=pod("d")).json()["spec"]["priorityClassName"] == "dflt"
    assert fake_api.get(f"{pcs}/system-cluster-critical").json()["value"] == 2000000000


def test_stats_count_requests_by_kubernetes_verb(fake_api: httpx.Client, fake_server: FakeApiServer) -> None:
    fake_api.post(CM, json={"metadata": {"name": "s"}})
    fake_api.get(CM)
    fake_api.get(f"{CM}/s")
    fake_api.patch(
        f"{CM}/s", json={"data": {"a": "1"}}, headers={"content-type": "application/merge-patch+json"}
    )
    fake_api.delete(CM)
    fake_api.post(PODS, json=pod("sp"))
    fake_api.post(f"{PODS}/sp/binding", json={"metadata": {"name": "sp"}, "target": {"name": "n"}})
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
