"""The fake API server over HTTP: CRUD, conflicts, selectors, paging, patches, finalizers, binding."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from gpupool.kube.fake import FakeApiServer

PODS = "/api/v1/namespaces/default/pods"


def pod(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "a"}},
        "spec": {"schedulerName": "gpupool", "containers": [{"name": "c", "image": "busybox"}], **spec},
    }


@pytest.fixture
def api(fake_server: FakeApiServer) -> httpx.Client:
    with httpx.Client(base_url=fake_server.url, headers={"Authorization": "Bearer fake"}) as c:
        yield c


def test_create_get_and_already_exists(api: httpx.Client) -> None:
    r = api.post(PODS, json=pod("p1"))
    assert r.status_code == 201
    md = r.json()["metadata"]
    assert md["uid"] and md["creationTimestamp"] and int(md["resourceVersion"]) > 1
    assert api.get(f"{PODS}/p1").json()["status"]["phase"] == "Pending"
    r = api.post(PODS, json=pod("p1"))
    assert r.status_code == 409
    assert r.json()["reason"] == "AlreadyExists" and r.json()["kind"] == "Status"


def test_binding_sets_node_annotations_and_condition(api: httpx.Client) -> None:
    api.post(PODS, json=pod("p1"))
    body = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "p1", "annotations": {"x/y": "z"}},
        "target": {"kind": "Node", "name": "n1"},
    }
    assert api.post(f"{PODS}/p1/binding", json=body).status_code == 201
    p = api.get(f"{PODS}/p1").json()
    assert p["spec"]["nodeName"] == "n1" and p["metadata"]["annotations"]["x/y"] == "z"
    assert {"type": "PodScheduled", "status": "True"}.items() <= p["status"]["conditions"][0].items()
    again = api.post(f"{PODS}/p1/binding", json=body)
    assert again.status_code == 409 and "already assigned" in again.json()["message"]
