"""The admission webhooks with AdmissionReview v1 bodies as the API server sends them.

The patch is checked by applying it (a small RFC 6902 applier below) to the object that was
sent, as the API server would, and reading the result, not by comparing patch texts.
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gpupool.service.api import create_app
from gpupool.service.config import ServiceConfig
from gpupool.service.routes.webhooks import webhook_app

TOLERATION = {"key": "gpupool.io/managed", "operator": "Equal", "value": "true", "effect": "NoSchedule"}


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with TestClient(webhook_app()) as c:
        yield c


def review(obj: dict[str, Any] | None, group: str, kind: str, operation: str = "CREATE") -> dict[str, Any]:
    """An AdmissionReview v1 request shaped as kube-apiserver sends it."""
    version = {"": "v1", "batch": "v1", "jobset.x-k8s.io": "v1alpha2", "kubeflow.org": "v1"}.get(
        group, "v1alpha1"
    )
    plural = kind.lower() + "s"
    meta = (obj or {}).get("metadata")
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": group, "version": version, "kind": kind},
            "resource": {"group": group, "version": version, "resource": plural},
            "requestKind": {"group": group, "version": version, "kind": kind},
            "requestResource": {"group": group, "version": version, "resource": plural},
            "name": meta.get("name", "") if isinstance(meta, dict) else "",
            "namespace": "team-a",
            "operation": operation,
            "userInfo": {"username": "admin", "uid": "014fbff9a07c", "groups": ["system:authenticated"]},
            "object": obj,
            "oldObject": None,
            "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def apply_patch(doc: Any, ops: list[dict[str, Any]]) -> Any:
    """RFC 6902 add/remove/replace, enough to apply what the webhook answers."""
    doc = copy.deepcopy(doc)
    for op in ops:
        parts = [_unescape(p) for p in op["path"].split("/")[1:]]
        if not parts:
            doc = op["value"]
            continue
        parent = doc
        for p in parts[:-1]:
            parent = parent[int(p)] if isinstance(parent, list) else parent[p]
        last = parts[-1]
        if op["op"] == "remove":
            del parent[int(last) if isinstance(parent, list) else last]
        elif op["op"] == "replace":
            assert (int(last) < len(parent)) if isinstance(parent, list) else last in parent, op
            parent[int(last) if isinstance(parent, list) else last] = op["value"]
        elif op["op"] == "add":
            if isinstance(parent, list):
                parent.insert(len(parent) if last == "-" else int(last), op["value"])
            else:
                parent[last] = op["value"]
        else:
            raise AssertionError(f"unexpected op {op}")
    return doc


def mutated(
    client: TestClient, obj: dict[str, Any], group: str, kind: str, query: str = ""
) -> dict[str, Any]:
    r = client.post(f"/webhooks/mutate{query}", json=review(obj, group, kind))
    assert r.status_code == 200, r.text
    resp = r.json()["response"]
    assert r.json()["apiVersion"] == "admission.k8s.io/v1" and r.json()["kind"] == "AdmissionReview"
    assert resp["uid"] == "705ab4f5-6393-11e8-b7cc-42010a800002" and resp["allowed"] is True, resp
    if "patch" not in resp:
        return obj
    assert resp["patchType"] == "JSONPatch"
    return apply_patch(obj, json.loads(base64.b64decode(resp["patch"])))  # type: ignore[no-any-return]


def pod(labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "team-a", "labels": labels or {}},
        "spec": {"containers": [{"name": "main", "image": "trainer:1"}], **spec},
    }


def job(labels: dict[str, str]) -> dict[str, Any]:
    template = {
        "metadata": {},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "w", "image": "t"}]},
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train", "namespace": "team-a", "labels": labels},
        "spec": {"parallelism": 2, "completions": 2, "template": template},
    }


def test_a_kueue_labelled_job_is_suspended_and_its_pods_go_to_gpupool(client: TestClient) -> None:
    out = mutated(client, job({"kueue.x-k8s.io/queue-name": "training"}), "batch", "Job")
    assert out["spec"]["suspend"] is True
    spec = out["spec"]["template"]["spec"]
    assert spec["schedulerName"] == "gpupool" and spec["tolerations"] == [TOLERATION]
    assert spec["containers"] == [{"name": "w", "image": "t"}] and out["spec"]["parallelism"] == 2


def test_objects_for_no_queue_are_left_alone(client: TestClient) -> None:
    obj = job({"app": "web"})
    r = client.post("/webhooks/mutate", json=review(obj, "batch", "Job"))
    assert r.status_code == 200 and r.json()["response"] == {
        "uid": review(obj, "batch", "Job")["request"]["uid"],
        "allowed": True,
    }


def test_a_namespace_bound_to_a_queue_mutates_unlabelled_pods(client: TestClient) -> None:
    out = mutated(client, pod(tolerations=[{"key": "x", "operator": "Exists"}]), "", "Pod", "/namespace")
    assert out["spec"]["schedulerName"] == "gpupool"
    assert out["spec"]["tolerations"] == [{"key": "x", "operator": "Exists"}, TOLERATION]


def test_mutation_is_idempotent(client: TestClient) -> None:
    once = mutated(client, pod({"gpupool.io/queue": "research"}), "", "Pod")
    r = client.post("/webhooks/mutate", json=review(once, "", "Pod"))
    assert "patch" not in r.json()["response"]


def test_jobset_and_pytorchjob_are_suspended_in_their_own_fields(client: TestClient) -> None:
    tmpl = {"spec": {"containers": [{"name": "c", "image": "i"}]}}
    jobset = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "js", "labels": {"gpupool.io/queue": "training"}},
        "spec": {"replicatedJobs": [{"name": "w", "replicas": 2, "template": {"spec": {"template": tmpl}}}]},
    }
    out = mutated(client, jobset, "jobset.x-k8s.io", "JobSet")
    assert out["spec"]["suspend"] is True
    assert (
        out["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["schedulerName"] == "gpupool"
    )
    ptj = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "ptj", "labels": {"gpupool.io/queue": "training"}},
        "spec": {
            "pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "template": tmpl},
                "Worker": {"replicas": 3, "template": tmpl},
            }
        },
    }
    out = mutated(client, ptj, "kubeflow.org", "PyTorchJob")
    assert out["spec"]["runPolicy"] == {"suspend": True} and "suspend" not in out["spec"]
    for role in ("Master", "Worker"):
        assert out["spec"]["pytorchReplicaSpecs"][role]["template"]["spec"]["tolerations"] == [TOLERATION]


def test_kai_fraction_annotations_become_hami_resources(client: TestClient) -> None:
    p = pod({"gpupool.io/queue": "research"})
    p["metadata"]["annotations"] = {"gpu-fraction": "0.5", "gpu-memory": "20000", "team": "a"}
    out = mutated(client, p, "", "Pod")
    assert out["metadata"]["annotations"] == {"team": "a"}  # moved, not stated twice
    limits = out["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"nvidia.com/gpu": 1, "nvidia.com/gpucores": 50, "nvidia.com/gpumem": 20000}


def test_hami_keys_are_gpupools_form_already(client: TestClient) -> None:
    p = pod({"gpupool.io/queue": "research"})
    gpu = {
        "name": "gpu",
        "image": "i",
        "resources": {
            "limits": {"nvidia.com/gpu": 1, "nvidia.com/gpucores": 30, "nvidia.com/gpumem": "10Gi"}
        },
    }
    p["spec"]["containers"].append(gpu)
    out = mutated(client, p, "", "Pod")
    assert "annotations" not in out["metadata"] and "resources" not in out["spec"]["containers"][0]
    assert out["spec"]["containers"][1]["resources"]["limits"] == {
        "nvidia.com/gpu": 1,
        "nvidia.com/gpucores": 30,
        "nvidia.com/gpumem": 10240,
    }


def test_memory_alone_gets_the_whole_devices_compute(client: TestClient) -> None:
    p = pod({"gpupool.io/queue": "research"})
    p["spec"]["containers"][0]["resources"] = {"limits": {"volcano.sh/vgpu-memory": 4096}}
    limits = mutated(client, p, "", "Pod")["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"nvidia.com/gpu": 1, "nvidia.com/gpucores": 100, "nvidia.com/gpumem": 4096}


def test_volcano_keys_are_replaced_by_gpupool_form(client: TestClient) -> None:
    p = pod({"gpupool.io/queue": "research"})
    res = {
        "limits": {"volcano.sh/vgpu-number": 1, "volcano.sh/vgpu-memory": 4096, "volcano.sh/vgpu-cores": 25}
    }
    p["spec"]["containers"][0]["resources"] = res
    out = mutated(client, p, "", "Pod")
    limits = out["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"nvidia.com/gpu": 1, "nvidia.com/gpucores": 25, "nvidia.com/gpumem": 4096}


@pytest.mark.parametrize(
    ("annotations", "limits", "field"),
    [
        ({"gpu-fraction": "1.5"}, {}, "metadata.annotations.gpu-fraction"),
        ({"gpu-fraction": "half"}, {}, "metadata.annotations.gpu-fraction"),
        ({"gpu-memory": "lots"}, {}, "metadata.annotations.gpu-memory"),
        ({}, {"nvidia.com/gpu": 2, "nvidia.com/gpucores": 50}, "metadata.annotations"),
    ],
)
def test_unreadable_shares_are_refused_naming_the_field(
    client: TestClient, annotations: dict[str, str], limits: dict[str, Any], field: str
) -> None:
    p = pod({"gpupool.io/queue": "research"})
    p["metadata"]["annotations"] = annotations
    p["spec"]["containers"][0]["resources"] = {"limits": limits}
    r = client.post("/webhooks/mutate", json=review(p, "", "Pod"))
    assert r.status_code == 200
    resp = r.json()["response"]
    assert resp["allowed"] is False and resp["status"]["code"] == 422
    assert resp["status"]["message"].startswith(f"gpupool: {field}"), resp


def queue_cr(**spec: Any) -> dict[str, Any]:
    """A Queue as the API server hands it to a webhook: with its server-side metadata."""
    return {
        "apiVersion": "gpupool.io/v1alpha1",
        "kind": "Queue",
        "metadata": {
            "name": "llm",
            "uid": "7c0a0f7e",
            "generation": 1,
            "creationTimestamp": "2026-12-01T10:00:00Z",
            "managedFields": [{"manager": "kubectl", "operation": "Apply"}],
        },
        "spec": spec,
    }


def test_validate_accepts_a_good_queue_with_server_metadata(client: TestClient) -> None:
    r = client.post("/webhooks/validate", json=review(queue_cr(weight=2), "gpupool.io", "Queue"))
    assert r.status_code == 200 and r.json()["response"]["allowed"] is True, r.text


def test_validate_refuses_with_the_located_errors_of_gpupool_validate(client: TestClient) -> None:
    body = review(
        queue_cr(weight=0, quotas=[{"pool": "p", "guarantee": {}, "colour": 1}]),
        "gpupool.io",
        "Queue",
        "UPDATE",
    )
    resp = client.post("/webhooks/validate", json=body).json()["response"]
    assert resp["allowed"] is False and resp["status"]["code"] == 422
    lines = resp["status"]["message"].splitlines()
    assert any(x.startswith("admission (Queue/llm): spec.weight:") for x in lines), lines
    assert any(x.startswith("admission (Queue/llm): spec.quotas[0].colour:") for x in lines), lines


def test_delete_is_always_allowed(client: TestClient) -> None:
    r = client.post("/webhooks/validate", json=review(None, "gpupool.io", "Queue", "DELETE"))
    assert r.json()["response"]["allowed"] is True


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b"{not json", "body"),
        (b"[1, 2]", "body"),
        (json.dumps({"apiVersion": "v1", "kind": "Pod"}).encode(), "apiVersion/kind"),
        (json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}).encode(), "request"),
        (
            json.dumps(
                {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": 5}}
            ).encode(),
            "request.uid",
        ),
    ],
)
@pytest.mark.parametrize("path", ["/webhooks/mutate", "/webhooks/validate"])
def test_bad_reviews_are_a_clear_400(client: TestClient, path: str, body: bytes, field: str) -> None:
    r = client.post(path, content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["errors"][0]["field"] == field


def test_garbage_inside_a_review_is_never_a_500(client: TestClient) -> None:
    for obj in (
        {"spec": "x"},
        {"metadata": "x", "spec": {}},
        {"spec": {"template": 3}},
        {"metadata": {"labels": {"gpupool.io/queue": "q"}}, "spec": {"template": {"spec": []}}},
    ):
        for kind in (("", "Pod"), ("batch", "Job"), ("kubeflow.org", "PyTorchJob")):
            for path in ("/webhooks/mutate/namespace", "/webhooks/validate"):
                r = client.post(path, json=review(obj, *kind))
                assert r.status_code in (200, 400), (path, obj, kind, r.text)


def test_the_api_serves_the_webhooks_without_a_token(tmp_path: Path) -> None:
    cfg = ServiceConfig(state_dir=tmp_path, config_dir=None, write_token_file=False)
    with TestClient(create_app(cfg, start_controller=False)) as c:
        out = mutated(c, pod({"gpupool.io/queue": "research"}), "", "Pod")
        assert out["spec"]["schedulerName"] == "gpupool"
        assert c.get("/v1/workloads").status_code == 401  # the rest of the API still wants a token
        assert "/webhooks/mutate" not in c.get("/openapi.json").json()["paths"]


def test_a_bound_namespace_lends_its_queue_to_objects_naming_none() -> None:
    queues = {"team-a": "research"}
    with TestClient(webhook_app(queues.get)) as c:
        out = mutated(c, job({}), "batch", "Job", "/namespace")
        assert (
            out["metadata"]["labels"] == {"gpupool.io/queue": "research"} and out["spec"]["suspend"] is True
        )
        own = mutated(c, job({"kueue.x-k8s.io/queue-name": "training"}), "batch", "Job", "/namespace")
        assert own["metadata"]["labels"] == {"kueue.x-k8s.io/queue-name": "training"}  # its own queue wins
    with TestClient(webhook_app()) as c:  # no lookup (the API's copy of the router): no label added
        assert mutated(c, job({}), "batch", "Job", "/namespace")["metadata"]["labels"] == {}


def test_namespace_queues_are_cached_and_a_failed_lookup_is_none() -> None:
    from gpupool.deploy.namespaces import NamespaceQueues
    from gpupool.kube.client import ApiError

    calls: list[str] = []

    class Api:
        def get(self, res: Any, ns: Any, name: str) -> dict[str, Any]:
            calls.append(name)
            if name == "gone":
                raise ApiError(404, "NotFound", name)
            return {
                "metadata": {
                    "name": name,
                    "labels": {"gpupool.io/queue": "research"} if name == "team-a" else {},
                }
            }

    now = [0.0]
    lookup = NamespaceQueues(Api(), ttl_s=30, clock=lambda: now[0])  # type: ignore[arg-type]
    assert [lookup("team-a"), lookup("team-a"), lookup("plain"), lookup("gone")] == [
        "research",
        "research",
        None,
        None,
    ]
    assert calls == ["team-a", "plain", "gone"]
    now[0] = 31.0
    lookup("team-a")
    assert calls[-1] == "team-a"  # expired: asked again


def test_namespace_queues_read_the_label_from_a_cluster(tmp_path: Path) -> None:
    fake = pytest.importorskip("gpupool.kube.fake", reason="the fake API server is not there yet")
    from gpupool.deploy.namespaces import NamespaceQueues
    from gpupool.kube.client import KubeApi, load_config

    srv = fake.FakeApiServer(time_scale=0.01)
    srv.start()
    try:
        srv.create(
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": "team-b", "labels": {"gpupool.io/queue": "serving"}},
            }
        )
        api = KubeApi(load_config(str(srv.write_kubeconfig(tmp_path / "kubeconfig"))))
        lookup = NamespaceQueues(api)
        assert lookup("team-b") == "serving" and lookup("missing") is None
        api.close()
    finally:
        srv.stop()


def test_a_share_on_a_container_with_broken_resources_is_refused_not_a_500(client: TestClient) -> None:
    for resources in (["x"], {"limits": ["x"]}):
        p = pod({"gpupool.io/queue": "research"})
        p["metadata"]["annotations"] = {"gpu-fraction": "0.5"}
        p["spec"]["containers"][0]["resources"] = resources
        r = client.post("/webhooks/mutate", json=review(p, "", "Pod"))
        assert r.status_code == 200 and r.json()["response"]["allowed"] is False, r.text


def test_templates_without_metadata_get_none_added(client: TestClient) -> None:
    obj = job({"gpupool.io/queue": "training"})
    del obj["spec"]["template"]["metadata"]
    r = client.post("/webhooks/mutate", json=review(obj, "batch", "Job"))
    ops = json.loads(base64.b64decode(r.json()["response"]["patch"]))
    assert sorted(op["path"] for op in ops) == [
        "/spec/suspend",
        "/spec/template/spec/schedulerName",
        "/spec/template/spec/tolerations",
    ]
