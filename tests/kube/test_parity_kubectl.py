"""The real ``kubectl`` against the fake and the real API server (issue 24): the same commands
print the same outcomes. Only what needs no running container: there is no kubelet on the
real server, so pods stay Pending."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from tests.kube.conftest import KubeTarget

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not on PATH")
T = TypeVar("T")

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
          limits: {{nvidia.com/gpu: {gpus}}}
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
      schedulerName: gpupool
      containers:
      - name: nginx
        image: nginx
"""


def until(what: str, probe: Callable[[], T], timeout: float = 60.0) -> T:
    """Poll ``probe`` until it is truthy (a loaded 2-core machine: a generous deadline)."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout:.0f} s")
        time.sleep(0.2)


class Kubectl:
    def __init__(self, kubeconfig: Path, cache: Path, namespace: str) -> None:
        self.base = ["kubectl", "--kubeconfig", str(kubeconfig), "--cache-dir", str(cache), "-n", namespace]

    def __call__(self, *args: str, stdin: str | None = None, ok: bool = True) -> str:
        r = subprocess.run([*self.base, *args], input=stdin, capture_output=True, text=True, timeout=90)
        if ok:
            assert r.returncode == 0, f"kubectl {' '.join(args)}: {r.stderr}"
        return r.stdout + r.stderr

    def json(self, *args: str) -> dict[str, object]:
        return dict(json.loads(self(*args, "-o", "json")))


@pytest.fixture
def kubectl(kube_api: KubeTarget, tmp_path: Path) -> Kubectl:
    return Kubectl(kube_api.kubeconfig, tmp_path / "kubectl-cache", kube_api.namespace)


def _pods(kubectl: Kubectl, selector: str) -> list[dict[str, object]]:
    items = kubectl.json("get", "pods", "-l", selector)["items"]
    assert isinstance(items, list)
    return items


def test_apply_job_created_unchanged_configured(kubectl: Kubectl) -> None:
    assert "job.batch/train created" in kubectl(
        "apply", "-f", "-", stdin=JOB.format(parallelism=2, gpus='"1"')
    )
    pods = until("the Job's 2 pods", lambda: len(_pods(kubectl, "batch.kubernetes.io/job-name=train")) == 2)
    assert pods
    assert "job.batch/train unchanged" in kubectl(
        "apply", "-f", "-", stdin=JOB.format(parallelism=2, gpus='"1"')
    )
    assert "job.batch/train configured" in kubectl(
        "apply", "-f", "-", stdin=JOB.format(parallelism=1, gpus='"1"')
    )
    job = kubectl.json("get", "job", "train")
    spec, md = job["spec"], job["metadata"]
    assert isinstance(spec, dict) and isinstance(md, dict)
    assert spec["parallelism"] == 1 and md["generation"] == 2
    assert "kubectl.kubernetes.io/last-applied-configuration" in md["annotations"]
    assert all(p["spec"]["schedulerName"] == "gpupool" for p in _pods(kubectl, "job-name=train"))  # type: ignore[index]


def test_a_number_as_quantity_is_stored_as_a_string_so_apply_again_reads_configured(
    kubectl: Kubectl,
) -> None:
    """The real server stores ``nvidia.com/gpu: 1`` as ``"1"``; kubectl's next apply sends the
    number again and reports ``configured`` (quote quantities in manifests to avoid it)."""
    job = JOB.format(parallelism=1, gpus=1)
    assert "job.batch/train created" in kubectl("apply", "-f", "-", stdin=job)
    assert "job.batch/train configured" in kubectl("apply", "-f", "-", stdin=job)
    got = kubectl.json("get", "job", "train")
    container = got["spec"]["template"]["spec"]["containers"][0]  # type: ignore[index]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert got["metadata"]["generation"] == 1  # type: ignore[index]


def test_apply_deployment_twice_and_delete_cascades(kubectl: Kubectl) -> None:
    assert "deployment.apps/web created" in kubectl("apply", "-f", "-", stdin=DEPLOYMENT)
    assert "deployment.apps/web unchanged" in kubectl("apply", "-f", "-", stdin=DEPLOYMENT)
    until("2 pods", lambda: len(_pods(kubectl, "app=web")) == 2)
    assert "web-" in kubectl("get", "pods", "-l", "app=web")
    assert 'deployment.apps "web" deleted' in kubectl("delete", "deployment", "web")
    until("pods deleted with their Deployment", lambda: not _pods(kubectl, "app=web"))
    until("replicasets deleted", lambda: "No resources found" in kubectl("get", "replicasets"))


def test_server_side_apply_and_server_dry_run(kubectl: Kubectl, kube_api: KubeTarget) -> None:
    out = kubectl("apply", "--server-side", "-f", "-", stdin=DEPLOYMENT)
    assert "deployment.apps/web serverside-applied" in out
    dep = kubectl.json("get", "deployment", "web")
    assert dep["spec"]["replicas"] == 2  # type: ignore[index]
    shown = kubectl.json("get", "deployment", "web", "--show-managed-fields")
    managers = [f["manager"] for f in shown["metadata"].get("managedFields", [])]  # type: ignore[attr-defined]
    # The fake tracks no field managers (docs/kubernetes-fake.md, differences from a real
    # API server); the real one records kubectl's apply.
    assert ("kubectl" in managers) == (kube_api.kind == "real")
    out = kubectl("apply", "--dry-run=server", "-f", "-", stdin=JOB.format(parallelism=1, gpus='"1"'))
    assert "job.batch/train created (server dry run)" in out
    assert "No resources found" in kubectl("get", "jobs")


def test_get_tables_for_nodes_and_pending_pods(kubectl: Kubectl, kube_api: KubeTarget) -> None:
    node = kube_api.add_gpu_nodes(1)[0]
    rows = [line.split() for line in kubectl("get", "node", node).splitlines()]
    assert rows[0][:3] == ["NAME", "STATUS", "ROLES"] and rows[1][:2] == [node, "Ready"]
    kubectl("apply", "-f", "-", stdin=JOB.format(parallelism=1, gpus='"1"'))
    until("a pod", lambda: _pods(kubectl, "job-name=train"))
    rows = [line.split() for line in kubectl("get", "pods", "-o", "wide").splitlines()]
    assert rows[0][:3] == ["NAME", "READY", "STATUS"] and "NODE" in rows[0]
    assert rows[1][1:3] == ["0/1", "Pending"]


def test_auth_can_i_says_yes(kubectl: Kubectl) -> None:
    assert kubectl("auth", "can-i", "create", "pods/binding").strip() == "yes"
