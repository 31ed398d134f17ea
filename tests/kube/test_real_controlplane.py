"""The real control plane (etcd, kube-apiserver, kube-controller-manager built by
``make kube-bin``) starts, serves a client through the kubeconfig it writes, runs the Job
controller, and stops without leaving a process (issue 24, first step).

Skips with the reason when the binaries are not built."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar, cast

import pytest
import yaml
from lightkube import Client
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Namespace, Pod, ServiceAccount

from gpupool.kube.client import KubeApi, make_client
from gpupool.kube.realcluster import KUBERNETES_VERSION, MissingBinaries, RealControlPlane, find_binaries

T = TypeVar("T")

GO_MOD = Path(__file__).resolve().parents[2] / "tools" / "kube" / "go.mod"


def test_the_launcher_looks_for_the_version_tools_kube_pins() -> None:
    pinned = re.search(r"^\s*k8s\.io/kubernetes (v\S+)", GO_MOD.read_text(), re.MULTILINE)
    assert pinned is not None
    assert pinned.group(1) == KUBERNETES_VERSION


def _until(what: str, probe: Callable[[], T], timeout: float) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout:.0f} s")
        time.sleep(0.2)


JOB_YAML = """\
apiVersion: v1
kind: Namespace
metadata: {name: team-a}
---
apiVersion: batch/v1
kind: Job
metadata: {name: hello, namespace: team-a}
spec:
  template:
    spec:
      restartPolicy: Never
      containers: [{name: main, image: busybox, command: ["true"]}]
"""


def _create_namespace_and_job(client: Client, kubeconfig: Path) -> None:
    """With kubectl when the machine has one (what a user would type), else lightkube.

    Pods are admitted only once the namespace's default service account exists (the
    ServiceAccount admission plugin), so the Job is created after the service-account
    controller has made it: otherwise the Job controller's retries back off for seconds."""
    docs = list(yaml.safe_load_all(JOB_YAML))
    kubectl = shutil.which("kubectl")
    if kubectl:
        run = [kubectl, f"--kubeconfig={kubeconfig}", "apply", "-f", "-"]
        subprocess.run(run, input=yaml.safe_dump(docs[0]), text=True, check=True, timeout=60)
    else:
        client.create(cast(Namespace, Namespace.from_dict(docs[0])))
    _until(
        "default service account",
        lambda: any(True for _ in client.list(ServiceAccount, namespace="team-a")),
        30,
    )
    if kubectl:
        subprocess.run(run, input=yaml.safe_dump(docs[1]), text=True, check=True, timeout=60)
    else:
        client.create(cast(Job, Job.from_dict(docs[1])))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_the_job_controller_creates_the_pod_of_a_job_on_the_real_control_plane() -> None:
    try:
        binaries = find_binaries()
    except MissingBinaries as exc:
        if os.environ.get("GPUPOOL_REQUIRE_KUBE") == "1":  # CI: a missing real tier fails
            pytest.fail(f"GPUPOOL_REQUIRE_KUBE=1 but: {exc}")
        pytest.skip(str(exc))
    cp = RealControlPlane(binaries)
    with cp:
        pids = cp.processes
        assert set(pids) == {"etcd", "kube-apiserver", "kube-controller-manager"}
        client: Client = make_client(kubeconfig=str(cp.kubeconfig))
        assert client.get(Namespace, "default").metadata is not None
        _create_namespace_and_job(client, cp.kubeconfig)
        pods = _until(
            "pod for the Job",
            lambda: list(
                client.list(Pod, namespace="team-a", labels={"batch.kubernetes.io/job-name": "hello"})
            ),
            30,
        )
        pod = pods[0]
        assert pod.metadata is not None and pod.metadata.ownerReferences
        assert pod.metadata.ownerReferences[0].kind == "Job"
        # Real defaulting: the server filled what the client left out.
        assert pod.spec is not None and pod.spec.serviceAccountName == "default"
        assert pod.spec.schedulerName == "default-scheduler"
        # Not a fake: the server reports the version the binaries were built at (asked through
        # gpupool's own request path).
        api = KubeApi(client)
        try:
            assert api.request("GET", "/version")["gitVersion"] == KUBERNETES_VERSION
        finally:
            api.close()
    left = [f"{name} (pid {pid})" for name, pid in pids.items() if _alive(pid)]
    assert not left, f"still running after stop: {left}"
    assert cp.workdir is None
