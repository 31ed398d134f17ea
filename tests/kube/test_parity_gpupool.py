"""gpupool's own readers on objects the fake and the real API server return (issue 24): a GPU
node reads as inventory with its devices, and a suspended GPU Job (with the server's defaults
and quantities as strings) reads as the same workload on both; the informers sync and follow."""

from __future__ import annotations

import time
from typing import Any

from gpupool.kube import inventory, workloads
from gpupool.kube.client import RESOURCES, KubeApi, make_client
from gpupool.kube.runtime.informer import Informers
from tests.kube.conftest import KubeTarget


def job(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train", "namespace": namespace, "labels": {"gpupool.io/queue": "research"}},
        "spec": {
            "suspend": True,
            "parallelism": 2,
            "completions": 2,
            "template": {
                "spec": {
                    "schedulerName": "gpupool",
                    "restartPolicy": "Never",
                    "containers": [
                        {"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 4}}}
                    ],
                }
            },
        },
    }


def test_a_gpu_node_reads_as_inventory_with_its_devices(kube_api: KubeTarget) -> None:
    name = kube_api.add_gpu_nodes(1, gpus=8)[0]
    api = KubeApi(make_client(str(kube_api.kubeconfig)))
    try:
        node = api.get(RESOURCES["nodes"], None, name)
    finally:
        api.close()
    inv = inventory.node_inventory(node)
    assert inv.node.name == name and inv.ready and inv.unschedulable_reason == ""
    assert len(inv.devices) == 8


def test_a_suspended_gpu_job_reads_as_the_same_workload(kube_api: KubeTarget) -> None:
    api = KubeApi(make_client(str(kube_api.kubeconfig)))
    try:
        created = api.create(RESOURCES["jobs"], kube_api.namespace, job(kube_api.namespace))
    finally:
        api.close()
    limits = created["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"nvidia.com/gpu": "4"}  # the server's quantity, a string
    kw = workloads.workload_from_object(created)
    assert kw is not None and kw.ref.name == "train" and kw.suspendable and kw.pod_count == 2
    assert kw.manifest["spec"]["queue"] == "research"


def test_the_informers_sync_and_follow_a_new_pod(kube_api: KubeTarget) -> None:
    """gpupool's informers (list, then watch from the list's resourceVersion) on both servers:
    synced, and a pod created afterwards reaches the cache."""
    node = kube_api.add_gpu_nodes(1)[0]
    infs = Informers(KubeApi(make_client(str(kube_api.kubeconfig))), kinds=("nodes", "pods", "jobs"))
    infs.start()
    try:
        assert infs.wait_synced(120), infs.stats()
        assert infs.nodes.get("", node) is not None
        pod = {"metadata": {"name": "seen"}, "spec": {"containers": [{"name": "c", "image": "x"}]}}
        assert kube_api.http.post(kube_api.path("pods"), json=pod).status_code == 201
        deadline = time.monotonic() + 60
        while infs.pods.get(kube_api.namespace, "seen") is None:
            assert time.monotonic() < deadline, f"the pod never reached the informer: {infs.stats()}"
            time.sleep(0.1)
    finally:
        infs.stop()
        infs.api.close()
