"""lightkube (the backend's client) decodes what the fake serves into its typed models: its
msgspec models refuse objects that lack a field the real API always sends."""

from __future__ import annotations

import pytest

from gpupool.kube.fake import FakeApiServer

lightkube = pytest.importorskip("lightkube")


def test_typed_models_decode_nodes_running_pods_jobs_and_events(fake_server: FakeApiServer) -> None:
    from lightkube.resources.batch_v1 import Job
    from lightkube.resources.core_v1 import Event, Node, Pod

    assert fake_server.kubeconfig is not None
    client = lightkube.Client(lightkube.KubeConfig.from_file(str(fake_server.kubeconfig)))
    hami_node = fake_server.add_gpu_nodes(1)[0]
    plain = fake_server.add_gpu_nodes(1, prefix="plain", hami=False)[0]
    fake_server.create(
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "j", "namespace": "default"},
            "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "x"}]}}},
        }
    )
    pod = fake_server.wait_for(lambda: fake_server.list("pods", "default"), what="the Job's pod")[0]
    fake_server.bind("default", pod["metadata"]["name"], plain)
    gpu_pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "g", "namespace": "default"},
        "spec": {
            "containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
        },
    }
    fake_server.create(gpu_pod)
    fake_server.bind("default", "g", hami_node)  # no HAMi annotation: refused, with an Event
    fake_server.wait_for(lambda: fake_server.list("events", "default"), what="the refusal's Event")
    fake_server.wait_for(
        lambda: fake_server.get("pods", "default", pod["metadata"]["name"])["status"]["phase"] == "Running",
        what="the Job's pod running",
    )
    nodes = list(client.list(Node))
    assert nodes[0].status.nodeInfo.kubeletVersion and nodes[0].status.allocatable["nvidia.com/gpu"] == "8"
    running = client.get(Pod, pod["metadata"]["name"], namespace="default")
    assert running.status.phase == "Running" and running.status.containerStatuses[0].ready
    assert client.get(Pod, "g", namespace="default").status.reason == "UnexpectedAdmissionError"
    job = client.get(Job, "j", namespace="default")
    assert job.spec.parallelism == 1 and job.status.active == 1
    assert next(iter(client.list(Event, namespace="default"))).reason == "UnexpectedAdmissionError"
