"""lightkube (the backend's client) decodes what the server sends into its typed models: its
msgspec models refuse objects that lack a field the real API always sends. On the fake and on
the real API server (``kube_api``; there the node agent is the kubelet), so the fake's objects
are held to the real ones."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

from tests.kube.conftest import KubeTarget

lightkube = pytest.importorskip("lightkube")
T = TypeVar("T")


def wait(fn: Callable[[], T | None], what: str, timeout: float = 60.0) -> T:
    deadline = time.monotonic() + timeout
    while True:
        got = fn()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout:.0f} s")
        time.sleep(0.1)


def test_typed_models_decode_nodes_running_pods_jobs_and_events(kube_api: KubeTarget) -> None:
    from lightkube.resources.batch_v1 import Job
    from lightkube.resources.core_v1 import Event, Node, Pod

    k, ns = kube_api, kube_api.namespace
    client = lightkube.Client(lightkube.KubeConfig.from_file(str(k.kubeconfig)))
    hami_node = k.add_kubelet_nodes(1)[0]
    plain = k.add_kubelet_nodes(1, hami=False)[0]
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "j"},
        "spec": {
            "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}}
        },
    }
    assert k.http.post(k.path("jobs", group="batch"), json=job).status_code == 201

    def job_pods() -> list[dict[str, Any]]:
        return list(k.http.get(k.path("pods"), params={"labelSelector": "job-name=j"}).json()["items"])

    pod = wait(job_pods, "the Job's pod")[0]
    name = pod["metadata"]["name"]
    binding = {"metadata": {"name": name}, "target": {"kind": "Node", "name": plain}}
    assert k.http.post(k.path("pods", f"{name}/binding"), json=binding).status_code == 201
    limits = {"limits": {"nvidia.com/gpu": "1"}}
    gpu_pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "g"}}
    gpu_pod["spec"] = {"containers": [{"name": "c", "image": "x", "resources": limits}]}
    assert k.http.post(k.path("pods"), json=gpu_pod).status_code == 201
    binding = {"metadata": {"name": "g"}, "target": {"kind": "Node", "name": hami_node}}
    assert (
        k.http.post(k.path("pods", "g/binding"), json=binding).status_code == 201
    )  # no HAMi annotation: refused
    refused = "UnexpectedAdmissionError"
    wait(lambda: k.http.get(k.path("pods", "g")).json()["status"].get("reason") == refused, "g refused")
    wait(lambda: refused in {e["reason"] for e in k.http.get(k.path("events")).json()["items"]}, "its Event")
    wait(
        lambda: k.http.get(k.path("pods", name)).json()["status"].get("phase") == "Running",
        "the Job's pod running",
    )
    nodes = [n for n in client.list(Node) if n.metadata.name in (hami_node, plain)]
    assert nodes[0].status.nodeInfo.kubeletVersion and nodes[0].status.allocatable["nvidia.com/gpu"] == "8"
    running = client.get(Pod, name, namespace=ns)
    assert running.status.phase == "Running" and running.status.containerStatuses[0].ready
    assert client.get(Pod, "g", namespace=ns).status.reason == refused
    job_obj = wait(
        lambda: (j := client.get(Job, "j", namespace=ns)).status.active == 1 and j, "the Job active"
    )
    assert job_obj.spec.parallelism == 1
    assert refused in {e.reason for e in client.list(Event, namespace=ns)}
