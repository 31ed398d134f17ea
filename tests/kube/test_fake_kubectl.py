"""The real ``kubectl`` on the fake and on the real API server (``kube_api``): describe (conditions
and Events), a running pod in the server-side tables, ``get -w`` streaming rows; a CRD applied
then used (fake only: see the test). Apply (created / unchanged / configured), delete with
cascading, server-side apply, dry run and ``auth can-i`` on both servers are in
tests/kube/test_parity_kubectl.py."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gpupool.kube.fake import FakeApiServer
from tests.kube.conftest import KubeTarget
from tests.kube.test_parity_kubectl import Kubectl, until

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not on PATH")
CRDS = Path(__file__).resolve().parents[2] / "src/gpupool/kube/fake/crds"

JOB = """apiVersion: batch/v1
kind: Job
metadata:
  name: train
spec:
  parallelism: 1
  completions: 1
  template:
    spec:
      schedulerName: gpupool
      restartPolicy: Never
      containers:
      - name: main
        image: busybox
        resources:
          limits: {nvidia.com/gpu: "1"}
"""
PYTORCHJOB = """apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata:
  name: bert
spec:
  pytorchReplicaSpecs:
    Master:
      replicas: 1
      template:
        spec:
          schedulerName: gpupool
          containers: [{name: pytorch, image: pt, resources: {limits: {nvidia.com/gpu: 8}}}]
    Worker:
      replicas: 1
      template:
        spec:
          schedulerName: gpupool
          containers: [{name: pytorch, image: pt, resources: {limits: {nvidia.com/gpu: 8}}}]
"""


@pytest.fixture
def kubectl(kube_api: KubeTarget, tmp_path: Path) -> Kubectl:
    return Kubectl(kube_api.kubeconfig, tmp_path / "kubectl-cache", kube_api.namespace)


def _job_pod(kubectl: Kubectl) -> dict[str, Any]:
    items = until("the Job's pod", lambda: kubectl.json("get", "pods", "-l", "job-name=train")["items"])
    assert isinstance(items, list)
    return dict(items[0])


def test_describe_pod_shows_condition_and_events(kubectl: Kubectl, kube_api: KubeTarget) -> None:
    kubectl("apply", "-f", "-", stdin=JOB)
    pod = _job_pod(kubectl)
    name, ns = pod["metadata"]["name"], kube_api.namespace
    cond = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "gpupool: waiting for 8 GPUs in pool training",
    }
    r = kube_api.http.patch(
        kube_api.path("pods", f"{name}/status"),
        json={"status": {"conditions": [cond]}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert r.status_code == 200, r.text
    event = {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": f"{name}.1", "namespace": ns},
        "regarding": {"kind": "Pod", "namespace": ns, "name": name, "uid": pod["metadata"]["uid"]},
        "reason": "FailedScheduling",
        "note": "gpupool: waiting for 8 GPUs in pool training",
        "type": "Warning",
        "action": "Scheduling",
        "reportingController": "gpupool",
        "reportingInstance": "gpupool-0",
        "eventTime": "2026-12-01T00:00:00.000000Z",
    }
    r = kube_api.http.post(kube_api.path("events", group="events.k8s.io"), json=event)
    assert r.status_code == 201, r.text
    out = kubectl("describe", "pod", name)
    assert "PodScheduled   False" in out
    assert "FailedScheduling" in out and "gpupool: waiting for 8 GPUs in pool training" in out
    assert "Controlled By:    Job/train" in out and "Service Account:  default" in out


def test_get_prints_a_running_pod_in_the_server_side_tables(kubectl: Kubectl, kube_api: KubeTarget) -> None:
    """A Job's pod bound to a node with a kubelet (the fake's, or the node agent on the real
    server) shows Running, ready, on its node in ``get -o wide``; the Job's row says Running."""
    node = kube_api.add_kubelet_nodes(1, hami=False)[0]
    kubectl("apply", "-f", "-", stdin=JOB)
    name = _job_pod(kubectl)["metadata"]["name"]
    binding = {"metadata": {"name": name}, "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
    r = kube_api.http.post(kube_api.path("pods", f"{name}/binding"), json=binding)
    assert r.status_code == 201, r.text

    def running_row() -> list[str] | None:
        rows = [line.split() for line in kubectl("get", "pods", "-o", "wide").splitlines()]
        return rows if len(rows) > 1 and rows[1][2] == "Running" else None

    rows = until("the pod Running", running_row)
    assert rows[0][:3] == ["NAME", "READY", "STATUS"] and "NODE" in rows[0]
    assert rows[1][0] == name and rows[1][1] == "1/1" and node in rows[1]
    until("the Job Running", lambda: "Running" in kubectl("get", "job", "train"))


def test_get_watch_streams_table_rows(kubectl: Kubectl, kube_api: KubeTarget) -> None:
    """``get -w`` lists, then watches from the list's version: a pod created after the first
    row is printed (the list is done) arrives as a row of its own."""

    def create(name: str) -> None:
        pod = {"metadata": {"name": name}, "spec": {"containers": [{"name": "c", "image": "x"}]}}
        assert kube_api.http.post(kube_api.path("pods"), json=pod).status_code == 201

    create("before")
    proc = subprocess.Popen([*kubectl.base, "get", "pods", "-w"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        header, first = proc.stdout.readline().split(), proc.stdout.readline().split()
        assert header[:3] == ["NAME", "READY", "STATUS"] and first[:3] == ["before", "0/1", "Pending"]
        create("watched")
        assert proc.stdout.readline().split()[:3] == ["watched", "0/1", "Pending"]
    finally:
        proc.kill()
        proc.wait(10)


def test_crd_then_pytorchjob(tmp_path: Path) -> None:
    """Fake only: it needs a server without the training CRDs, and its training operator makes
    the PyTorchJob's pods (the real server runs no such operator)."""
    with FakeApiServer(time_scale=0.01) as srv:
        kubectl = Kubectl(srv.write_kubeconfig(tmp_path / "kc"), tmp_path / "cache", "default")
        assert "doesn't have a resource type" in kubectl("get", "pytorchjobs", ok=False)
        out = kubectl("apply", "-f", str(CRDS / "pytorchjobs.yaml"))
        assert "customresourcedefinition.apiextensions.k8s.io/pytorchjobs.kubeflow.org created" in out
        assert "pytorchjob.kubeflow.org/bert created" in kubectl("apply", "-f", "-", stdin=PYTORCHJOB)
        assert "pytorchjob.kubeflow.org/bert unchanged" in kubectl("apply", "-f", "-", stdin=PYTORCHJOB)
        assert "bert" in kubectl("get", "pytorchjobs")
        srv.wait_for(
            lambda: len(srv.list("pods", "default", "training.kubeflow.org/job-name=bert")) == 2,
            what="master and worker pods",
        )
        names = kubectl("get", "pods", "-o", "name")
        assert "pod/bert-master-0" in names and "pod/bert-worker-0" in names
        kubectl("delete", "pytorchjob", "bert")
        srv.wait_for(lambda: not srv.list("pods"), what="pods deleted with their PyTorchJob")
