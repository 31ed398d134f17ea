"""``pods/binding`` (each refusal, the uid precondition, annotations in the same write, the
legacy ``bindings`` collection) and ``pods/eviction`` (grace, PodDisruptionBudgets).

The eviction of a running pod with its grace runs on the fake and on the real API server
(``kube_api``, a node with a kubelet on each). The other tests here check the fake's own
records (its write history, its stats) besides the answers; the same requests against both
servers are tests/kube/test_parity_binding.py and tests/kube/test_parity_eviction.py."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from gpupool.kube.fake import FakeApiServer
from tests.kube.conftest import KubeTarget

PODS = "/api/v1/namespaces/default/pods"


def pod(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": "w"}},
        "spec": {"schedulerName": "gpupool", "containers": [{"name": "c", "image": "x"}], **spec},
    }


def binding(name: str, node: str = "gpu-node-0000", **md: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name, **md},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }


@pytest.fixture
def api(fake_server: FakeApiServer) -> Iterator[httpx.Client]:
    fake_server.add_gpu_nodes(2, hami=False)
    with httpx.Client(base_url=fake_server.url) as c:
        yield c


def test_bind_sets_node_annotations_and_condition_in_one_write(
    api: httpx.Client, fake_server: FakeApiServer
) -> None:
    before = fake_server.create(pod("p"))
    rv = fake_server.store.rv
    r = api.post(f"{PODS}/p/binding", json=binding("p", annotations={"gpupool.io/node": "gpu-node-0000"}))
    assert r.status_code == 201 and r.json()["kind"] == "Status" and r.json()["status"] == "Success"
    write = next(e for e in fake_server.store._hist if e.rv == rv + 1)  # the bind's own write
    assert write.type == "MODIFIED" and write.obj["spec"]["nodeName"] == "gpu-node-0000"
    assert write.obj["metadata"]["annotations"] == {"gpupool.io/node": "gpu-node-0000"}
    assert [c["type"] for c in write.obj["status"]["conditions"]] == ["PodScheduled"]
    got = api.get(f"{PODS}/p").json()
    assert got["spec"]["nodeName"] == "gpu-node-0000"
    assert got["metadata"]["annotations"]["gpupool.io/node"] == "gpu-node-0000"
    sched = [c for c in got["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert sched and sched[0]["status"] == "True"
    assert got["metadata"]["uid"] == before["metadata"]["uid"] and fake_server.stats.binds == 1


def test_bind_refuses_an_already_bound_pod(api: httpx.Client) -> None:
    api.post(PODS, json=pod("p"))
    api.post(f"{PODS}/p/binding", json=binding("p"))
    r = api.post(f"{PODS}/p/binding", json=binding("p", "gpu-node-0001"))
    assert (
        r.status_code == 409
        and r.json()["reason"] == "Conflict"
        and "already assigned" in r.json()["message"]
    )
    assert api.get(f"{PODS}/p").json()["spec"]["nodeName"] == "gpu-node-0000"


def test_bind_refuses_a_gated_pod(api: httpx.Client) -> None:
    api.post(PODS, json=pod("g", schedulingGates=[{"name": "gpupool.io/admission"}]))
    r = api.post(f"{PODS}/g/binding", json=binding("g"))
    assert r.status_code == 409 and "schedulingGates" in r.json()["message"]


def test_bind_refuses_a_pod_being_deleted(api: httpx.Client) -> None:
    api.post(PODS, json=pod("d") | {"metadata": {"name": "d", "finalizers": ["x/hold"]}})
    api.delete(f"{PODS}/d")
    r = api.post(f"{PODS}/d/binding", json=binding("d"))
    assert r.status_code == 409 and "being deleted" in r.json()["message"]


def test_bind_honours_the_uid_precondition(api: httpx.Client) -> None:
    uid = api.post(PODS, json=pod("u")).json()["metadata"]["uid"]
    r = api.post(f"{PODS}/u/binding", json=binding("u", uid="someone-else"))
    assert r.status_code == 409 and "Precondition failed" in r.json()["message"]
    assert api.post(f"{PODS}/u/binding", json=binding("u", uid=uid)).status_code == 201


def test_bind_missing_pod_and_missing_target(api: httpx.Client) -> None:
    assert api.post(f"{PODS}/nope/binding", json=binding("nope")).status_code == 404
    api.post(PODS, json=pod("t"))
    r = api.post(f"{PODS}/t/binding", json={"metadata": {"name": "t"}, "target": {}})
    assert r.status_code == 500 and r.json()["message"] == "target.name: Required value"  # as the real server


def test_legacy_bindings_collection(api: httpx.Client) -> None:
    api.post(PODS, json=pod("l"))
    assert api.post("/api/v1/namespaces/default/bindings", json=binding("l")).status_code == 201
    assert api.get(f"{PODS}/l").json()["spec"]["nodeName"] == "gpu-node-0000"


def test_eviction_deletes_a_running_pod_with_its_grace(kube_api: KubeTarget) -> None:
    """Evicted, a running pod is marked deleted with its own grace period and stays until its
    kubelet has stopped it (the fake's kubelet, or the node agent on the real server)."""
    node = kube_api.add_kubelet_nodes(1, hami=False)[0]
    body = pod("e", terminationGracePeriodSeconds=5)
    del body["metadata"]["namespace"]  # the test's own namespace, from the path
    created = kube_api.http.post(kube_api.path("pods"), json=body)
    assert created.status_code == 201, created.text
    r = kube_api.http.post(kube_api.path("pods", "e/binding"), json=binding("e", node))
    assert r.status_code == 201, r.text
    until(
        "the pod Running",
        lambda: kube_api.http.get(kube_api.path("pods", "e")).json()["status"]["phase"] == "Running",
    )
    ev = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "e"}}
    r = kube_api.http.post(kube_api.path("pods", "e/eviction"), json=ev)
    assert r.status_code == 201, r.text
    if kube_api.fake is not None:
        assert kube_api.fake.stats.evictions == 1
    got = kube_api.http.get(kube_api.path("pods", "e"))
    assert got.status_code == 404 or got.json()["metadata"]["deletionGracePeriodSeconds"] == 5
    until(
        "the pod gone after its grace",
        lambda: kube_api.http.get(kube_api.path("pods", "e")).status_code == 404,
    )


def until(what: str, probe: Callable[[], bool], timeout: float = 60.0) -> None:
    """Poll ``probe`` until it is true (a loaded 2-core machine: a generous deadline)."""
    deadline = time.monotonic() + timeout
    while not probe():
        assert time.monotonic() < deadline, f"no {what} within {timeout:.0f} s"
        time.sleep(0.1)


def test_eviction_refused_by_a_disruption_budget(api: httpx.Client, fake_server: FakeApiServer) -> None:
    for n in ("a", "b"):
        api.post(PODS, json=pod(n))
        api.post(f"{PODS}/{n}/binding", json=binding(n))
    fake_server.wait_for(
        lambda: all(p["status"]["phase"] == "Running" for p in fake_server.list("pods")), what="pods running"
    )
    pdb = {
        "metadata": {"name": "keep2"},
        "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "w"}}},
    }
    api.post("/apis/policy/v1/namespaces/default/poddisruptionbudgets", json=pdb)
    r = api.post(f"{PODS}/a/eviction", json={"metadata": {"name": "a"}})
    assert r.status_code == 429 and r.json()["details"]["causes"][0]["reason"] == "DisruptionBudget"
    assert api.get(f"{PODS}/a").json()["metadata"].get("deletionTimestamp") is None


def test_unbound_pod_is_deleted_at_once_bound_one_after_grace(
    api: httpx.Client, fake_server: FakeApiServer
) -> None:
    api.post(PODS, json=pod("free"))
    assert api.delete(f"{PODS}/free").status_code == 200
    assert api.get(f"{PODS}/free").status_code == 404
    api.post(PODS, json=pod("bound", terminationGracePeriodSeconds=3))
    api.post(f"{PODS}/bound/binding", json=binding("bound"))
    out = api.delete(f"{PODS}/bound").json()
    assert out["metadata"]["deletionTimestamp"] and out["metadata"]["deletionGracePeriodSeconds"] == 3
    fake_server.wait_for(lambda: api.get(f"{PODS}/bound").status_code == 404, what="graceful deletion")
    api.post(PODS, json=pod("now"))
    api.post(f"{PODS}/now/binding", json=binding("now"))
    api.delete(f"{PODS}/now", params={"gracePeriodSeconds": 0})
    assert api.get(f"{PODS}/now").status_code == 404
