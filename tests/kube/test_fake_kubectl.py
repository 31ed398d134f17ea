"""The real ``kubectl`` against the fake server: apply (created / unchanged / configured), get,
describe (conditions and Events), delete with cascading, and a CRD applied then used."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.kube.fake import FakeApiServer

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not on PATH")
CRDS = Path(__file__).resolve().parents[2] / "src/gpupool/kube/fake/crds"

JOB = """apiVersion: batch/v1
kind: Job
metadata:
  name: train
spec:
  parallelism: {parallelism}
  completions: 2
  template:
    spec:
      schedulerName: gpupool
      restartPolicy: Never
      containers:
      - name: main
        image: busybox
        resources:
          limits: {{nvidia.com/gpu: "1"}}  # quoted: a number is stored as "1", so re-apply would read configured
"""
DEPLOYMENT = """apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: 2
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: nginx
        image: nginx
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


class Kubectl:
    def __init__(self, kubeconfig: Path, cache: Path) -> None:
        self.base = ["kubectl", "--kubeconfig", str(kubeconfig), "--cache-dir", str(cache)]

    def __call__(self, *args: str, stdin: str | None = None, ok: bool = True) -> str:
        r = subprocess.run([*self.base, *args], input=stdin, capture_output=True, text=True, timeout=60)
        if ok:
            assert r.returncode == 0, f"kubectl {' '.join(args)}: {r.stderr}"
        return r.stdout + r.stderr


@pytest.fixture
def kubectl(fake_server: FakeApiServer, tmp_path: Path) -> Iterator[Kubectl]:
    assert fake_server.kubeconfig is not None
    yield Kubectl(fake_server.kubeconfig, tmp_path / "kubectl-cache")


def test_apply_job_created_unchanged_configured(kubectl: Kubectl, fake_server: FakeApiServer) -> None:
    assert "job.batch/train created" in kubectl("apply", "-f", "-", stdin=JOB.format(parallelism=2))
    assert "job.batch/train unchanged" in kubectl("apply", "-f", "-", stdin=JOB.format(parallelism=2))
    assert "job.batch/train configured" in kubectl("apply", "-f", "-", stdin=JOB.format(parallelism=1))
    job = fake_server.get("jobs.batch", "default", "train")
    assert job["spec"]["parallelism"] == 1 and job["metadata"]["generation"] == 2
    assert "kubectl.kubernetes.io/last-applied-configuration" in job["metadata"]["annotations"]
    pods = json.loads(kubectl("get", "pods", "-o", "json", "-l", "batch.kubernetes.io/job-name=train"))
    assert pods["kind"] == "List" and len(pods["items"]) == 2
    assert all(p["spec"]["schedulerName"] == "gpupool" for p in pods["items"])


def test_apply_deployment_twice_and_delete_cascades(kubectl: Kubectl, fake_server: FakeApiServer) -> None:
    assert "deployment.apps/web created" in kubectl("apply", "-f", "-", stdin=DEPLOYMENT)
    assert "deployment.apps/web unchanged" in kubectl("apply", "-f", "-", stdin=DEPLOYMENT)
    fake_server.wait_for(lambda: len(fake_server.list("pods", "default", "app=web")) == 2, what="2 pods")
    assert "web-" in kubectl("get", "pods", "-l", "app=web")
    assert 'deployment.apps "web" deleted' in kubectl("delete", "deployment", "web")
    fake_server.wait_for(lambda: not fake_server.list("pods", "default", "app=web"), what="pods deleted")
    assert "No resources found" in kubectl("get", "replicasets")


def test_describe_pod_shows_condition_and_events(kubectl: Kubectl, fake_server: FakeApiServer) -> None:
    kubectl("apply", "-f", "-", stdin=JOB.format(parallelism=1))
    pod = fake_server.wait_for(lambda: fake_server.list("pods", "default"), what="a pod")[0]
    name = pod["metadata"]["name"]
    cond = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "gpupool: waiting for 8 GPUs in pool training",
    }
    fake_server.patch("pods", "default", name, {"status": {"conditions": [cond]}}, subresource="status")
    fake_server.create(
        {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"name": f"{name}.1", "namespace": "default"},
            "regarding": {"kind": "Pod", "namespace": "default", "name": name, "uid": pod["metadata"]["uid"]},
            "reason": "FailedScheduling",
            "note": "gpupool: waiting for 8 GPUs in pool training",
            "type": "Warning",
            "action": "Scheduling",
            "reportingController": "gpupool",
            "reportingInstance": "gpupool-0",
            "eventTime": "2026-12-01T00:00:00.000000Z",
        }
    )
    out = kubectl("describe", "pod", name)
    assert "PodScheduled   False" in out
    assert "FailedScheduling" in out and "gpupool: waiting for 8 GPUs in pool training" in out
    assert "Controlled By:  Job/train" in out


def test_crd_then_pytorchjob(tmp_path: Path) -> None:
    with FakeApiServer(time_scale=0.01) as srv:
        kubectl = Kubectl(srv.write_kubeconfig(tmp_path / "kc"), tmp_path / "cache")
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


def test_get_prints_server_side_tables(kubectl: Kubectl, fake_server: FakeApiServer) -> None:
    node = fake_server.add_gpu_nodes(1, hami=False)[0]
    kubectl("apply", "-f", "-", stdin=JOB.format(parallelism=1))
    name = fake_server.wait_for(lambda: fake_server.list("pods", "default"), what="a pod")[0]["metadata"][
        "name"
    ]
    fake_server.bind("default", name, node)
    fake_server.wait_for(
        lambda: fake_server.get("pods", "default", name)["status"]["phase"] == "Running", what="running"
    )
    rows = [line.split() for line in kubectl("get", "pods", "-o", "wide").splitlines()]
    assert rows[0][:3] == ["NAME", "READY", "STATUS"] and "NODE" in rows[0]
    assert rows[1][0] == name and rows[1][1] == "1/1" and rows[1][2] == "Running" and node in rows[1]
    assert kubectl("get", "nodes").split()[:3] == ["NAME", "STATUS", "ROLES"]
    assert "Running" in kubectl("get", "job", "train")


def test_get_watch_streams_table_rows(kubectl: Kubectl, fake_server: FakeApiServer) -> None:
    proc = subprocess.Popen(
        [*kubectl.base, "get", "pods", "-w"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        fake_server.wait_for(lambda: fake_server.store.watch_count() > 0, what="kubectl's watch")
        fake_server.create(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "watched", "namespace": "default"},
                "spec": {"containers": [{"name": "c", "image": "x"}]},
            }
        )
        header, row = proc.stdout.readline().split(), proc.stdout.readline().split()
        assert header[:3] == ["NAME", "READY", "STATUS"] and row[:3] == ["watched", "0/1", "Pending"]
    finally:
        proc.kill()
        proc.wait(10)


def test_server_side_apply_and_server_dry_run(kubectl: Kubectl, fake_server: FakeApiServer) -> None:
    assert "deployment.apps/web serverside-applied" in kubectl(
        "apply", "--server-side", "-f", "-", stdin=DEPLOYMENT
    )
    assert fake_server.get("deployments.apps", "default", "web")["spec"]["replicas"] == 2
    out = kubectl("apply", "--dry-run=server", "-f", "-", stdin=JOB.format(parallelism=1))
    assert "job.batch/train created (server dry run)" in out
    assert fake_server.list("jobs.batch") == []


def test_auth_can_i_says_yes(kubectl: Kubectl) -> None:
    assert kubectl("auth", "can-i", "create", "pods/binding").strip() == "yes"
