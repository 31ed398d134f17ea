"""``pods/binding`` and pod status on the fake and on the real API server (issue 24): the
same requests, the same answers. The refusals are what gpupool's binder reads to tell a lost
race (409) from a mistake."""

from __future__ import annotations

from typing import Any

from tests.kube.conftest import KubeTarget


def pod(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "w"}},
        "spec": {"schedulerName": "gpupool", "containers": [{"name": "c", "image": "x"}], **spec},
    }


def binding(name: str, node: str, **md: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name, **md},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }


def create(k: KubeTarget, obj: dict[str, Any]) -> dict[str, Any]:
    r = k.http.post(k.path("pods"), json=obj)
    assert r.status_code == 201, r.text
    return dict(r.json())


def test_bind_sets_node_annotations_and_scheduled_condition(kube_api: KubeTarget) -> None:
    node = kube_api.add_gpu_nodes(1)[0]
    create(kube_api, pod("p"))
    r = kube_api.http.post(
        kube_api.path("pods", "p/binding"), json=binding("p", node, annotations={"gpupool.io/node": node})
    )
    assert r.status_code == 201 and r.json()["kind"] == "Status" and r.json()["status"] == "Success"
    got = kube_api.http.get(kube_api.path("pods", "p")).json()
    assert got["spec"]["nodeName"] == node
    assert got["metadata"]["annotations"]["gpupool.io/node"] == node
    sched = [c for c in got["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert sched and sched[0]["status"] == "True"


def test_bind_refusals(kube_api: KubeTarget) -> None:
    a, b = kube_api.add_gpu_nodes(2)
    create(kube_api, pod("p"))
    kube_api.http.post(kube_api.path("pods", "p/binding"), json=binding("p", a))
    again = kube_api.http.post(kube_api.path("pods", "p/binding"), json=binding("p", b))
    assert again.status_code == 409 and again.json()["reason"] == "Conflict"
    assert "already assigned" in again.json()["message"]
    create(kube_api, pod("g", schedulingGates=[{"name": "gpupool.io/admission"}]))
    gated = kube_api.http.post(kube_api.path("pods", "g/binding"), json=binding("g", a))
    assert gated.status_code == 409 and "schedulingGates" in gated.json()["message"]
    held = pod("d")
    held["metadata"]["finalizers"] = ["example.com/hold"]
    create(kube_api, held)
    kube_api.http.delete(kube_api.path("pods", "d"))
    deleting = kube_api.http.post(kube_api.path("pods", "d/binding"), json=binding("d", a))
    assert deleting.status_code == 409 and "being deleted" in deleting.json()["message"]
    kube_api.http.patch(
        kube_api.path("pods", "d"),
        json={"metadata": {"finalizers": None}},
        headers={"Content-Type": "application/merge-patch+json"},
    )


def test_bind_uid_precondition_missing_pod_and_missing_target(kube_api: KubeTarget) -> None:
    node = kube_api.add_gpu_nodes(1)[0]
    uid = create(kube_api, pod("u"))["metadata"]["uid"]
    wrong = kube_api.http.post(kube_api.path("pods", "u/binding"), json=binding("u", node, uid="other"))
    assert wrong.status_code == 409 and "Precondition failed" in wrong.json()["message"]
    right = kube_api.http.post(kube_api.path("pods", "u/binding"), json=binding("u", node, uid=uid))
    assert right.status_code == 201
    assert (
        kube_api.http.post(kube_api.path("pods", "nope/binding"), json=binding("nope", node)).status_code
        == 404
    )
    create(kube_api, pod("t"))
    # The real server answers an invalid Binding with an internal error (its binding storage
    # returns the field errors unwrapped), not 422: the fake does the same.
    empty = kube_api.http.post(
        kube_api.path("pods", "t/binding"), json={"metadata": {"name": "t"}, "target": {}}
    )
    assert empty.status_code == 500 and empty.json()["message"] == "target.name: Required value"
    # No check that the node exists: binding to a name no Node has is accepted.
    create(kube_api, pod("x"))
    assert (
        kube_api.http.post(kube_api.path("pods", "x/binding"), json=binding("x", "no-such-node")).status_code
        == 201
    )


def test_legacy_bindings_collection(kube_api: KubeTarget) -> None:
    node = kube_api.add_gpu_nodes(1)[0]
    create(kube_api, pod("l"))
    assert kube_api.http.post(kube_api.path("bindings"), json=binding("l", node)).status_code == 201
    assert kube_api.http.get(kube_api.path("pods", "l")).json()["spec"]["nodeName"] == node


def test_create_drops_pod_status_and_the_status_subresource_writes_it(kube_api: KubeTarget) -> None:
    """What a kubelet simulator relies on: status given at create is dropped (phase Pending);
    the status subresource writes it."""
    made = create(kube_api, {**pod("s"), "status": {"phase": "Running"}})
    assert made["status"]["phase"] == "Pending"
    assert kube_api.set_pod_phase("s", "Running")["status"]["phase"] == "Running"


def test_deleting_an_unbound_pod_is_immediate_a_bound_one_graceful(kube_api: KubeTarget) -> None:
    node = kube_api.add_gpu_nodes(1)[0]
    create(kube_api, pod("free"))
    assert kube_api.http.delete(kube_api.path("pods", "free")).status_code == 200
    assert kube_api.http.get(kube_api.path("pods", "free")).status_code == 404
    create(kube_api, pod("now"))
    kube_api.http.post(kube_api.path("pods", "now/binding"), json=binding("now", node))
    kube_api.http.delete(kube_api.path("pods", "now"), params={"gracePeriodSeconds": 0})
    assert kube_api.http.get(kube_api.path("pods", "now")).status_code == 404
    create(kube_api, pod("bound", terminationGracePeriodSeconds=30))
    kube_api.http.post(kube_api.path("pods", "bound/binding"), json=binding("bound", node))
    out = kube_api.http.delete(kube_api.path("pods", "bound")).json()
    assert out["metadata"]["deletionTimestamp"] and out["metadata"]["deletionGracePeriodSeconds"] == 30


def test_a_pods_requests_default_to_its_limits(kube_api: KubeTarget) -> None:
    made = create(
        kube_api,
        pod(
            "r",
            containers=[
                {
                    "name": "c",
                    "image": "x",
                    "resources": {"limits": {"nvidia.com/gpu": 2, "cpu": "4"}, "requests": {"cpu": "1"}},
                }
            ],
        ),
    )
    resources = made["spec"]["containers"][0]["resources"]
    assert resources["requests"] == {"cpu": "1", "nvidia.com/gpu": "2"}
    assert resources["limits"] == {"cpu": "4", "nvidia.com/gpu": "2"}
