"""Kueue v0.17 and kube-scheduler beside the real local control plane (issue 24): a
ResourceFlavor, ClusterQueue and LocalQueue from Kueue's own API, and a suspended Job labelled
for the queue, is admitted (unsuspended) by Kueue's manager, its pod bound by kube-scheduler and
run to completion by the node agent. The Job is created unsuspended and Kueue's mutating webhook,
served by the manager on 127.0.0.1, suspends it (``gpupool.kube.kueue_local``).

Skipped, with the reason, when the binaries are not built (a failure under
``GPUPOOL_REQUIRE_KUBE=1``). Deadlines are generous for a loaded 2-core machine.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import httpx
import pytest

from gpupool.kube import kubelet_status as ks
from gpupool.kube.realcluster import MissingBinaries, find_binaries
from tests.kube.test_cluster_up import Cluster

pytestmark = pytest.mark.realkube
T = TypeVar("T")
KUEUE = "/apis/kueue.x-k8s.io/v1beta2"


def wait(fn: Callable[[], T | None], what: str, timeout: float = 120.0) -> T:
    deadline = time.monotonic() + timeout
    while True:
        got = fn()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout:.0f} s")
        time.sleep(0.3)


@pytest.fixture(scope="module")
def kueue_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    """``gpupool kube cluster up --nodes 2 --with-kueue`` run as a user runs it (a subprocess),
    stopped with SIGTERM at the end (it must exit 0)."""
    try:
        binaries = find_binaries()
        for name in ("kube-scheduler", "kueue"):
            if not binaries.path(name).exists():
                raise MissingBinaries(f"no {name} in {binaries.directory} (run `make kube-bin`)")
    except MissingBinaries as exc:
        if os.environ.get("GPUPOOL_REQUIRE_KUBE") == "1":
            pytest.fail(f"GPUPOOL_REQUIRE_KUBE=1 but Kueue cannot start: {exc}")
        pytest.skip(f"Kueue beside the real API server: {exc}")
    kubeconfig = tmp_path_factory.mktemp("kueue") / "kubeconfig"
    args = ["kube", "cluster", "up", "--nodes", "2", "--with-kueue", "--time-scale", "0.01"]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from gpupool.cli import main; main()",
            *args,
            "--kubeconfig",
            str(kubeconfig),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    c = Cluster(proc, kubeconfig)
    try:
        line = wait(c.up_line, "'up:' line", timeout=300)
        assert "kube-scheduler, Kueue v0.17.0" in line
        yield c.connect()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        if c.http is not None:
            c.http.close()
        assert rc == 0, c.lines


def _post(http: httpx.Client, path: str, obj: dict[str, Any], kind: str = "") -> dict[str, Any]:
    if kind:
        obj = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": kind, **obj}
    r = http.post(path, json=obj)
    assert r.status_code == 201, r.text
    return dict(r.json())


def test_kueue_admits_a_job_that_kube_scheduler_binds_and_the_node_agent_runs(
    kueue_cluster: httpx.Client,
) -> None:
    http = kueue_cluster
    ns = "team-a"
    _post(http, "/api/v1/namespaces", {"metadata": {"name": ns}})
    wait(
        lambda: http.get(f"/api/v1/namespaces/{ns}/serviceaccounts/default").status_code == 200, "default SA"
    )
    _post(http, f"{KUEUE}/resourceflavors", {"metadata": {"name": "h100"}}, "ResourceFlavor")
    _post(
        http,
        f"{KUEUE}/clusterqueues",
        {
            "metadata": {"name": "cq-a"},
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": [
                    {
                        "coveredResources": ["nvidia.com/gpu"],
                        "flavors": [
                            {"name": "h100", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 8}]}
                        ],
                    }
                ],
            },
        },
        "ClusterQueue",
    )
    _post(
        http,
        f"{KUEUE}/namespaces/{ns}/localqueues",
        {"metadata": {"name": "lq-a"}, "spec": {"clusterQueue": "cq-a"}},
        "LocalQueue",
    )
    job = _post(
        http,
        f"/apis/batch/v1/namespaces/{ns}/jobs",
        {
            "metadata": {"name": "train", "labels": {"kueue.x-k8s.io/queue-name": "lq-a"}},
            "spec": {
                # Not suspended by us: Kueue's mutating webhook suspends a queued Job on create.
                "suspend": False,
                "template": {
                    "metadata": {"annotations": {ks.RUN_SECONDS: "100"}},
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [
                            {
                                "name": "c",
                                "image": "busybox",
                                "resources": {"limits": {"nvidia.com/gpu": "2"}},
                            }
                        ],
                    },
                },
            },
        },
    )
    # Kueue's mutating webhook (served on 127.0.0.1, URL client config) ran on create.
    assert job["spec"]["suspend"] is True

    def admitted() -> bool:
        return http.get(f"/apis/batch/v1/namespaces/{ns}/jobs/train").json()["spec"].get("suspend") is False

    wait(admitted, "admission (suspend: false) by Kueue")
    workloads = http.get(f"{KUEUE}/namespaces/{ns}/workloads").json()["items"]
    assert len(workloads) == 1
    conds = {c["type"]: c["status"] for c in workloads[0]["status"]["conditions"]}
    assert conds.get("Admitted") == "True"

    def pod() -> dict[str, Any] | None:
        items = http.get(f"/api/v1/namespaces/{ns}/pods", params={"labelSelector": "job-name=train"}).json()[
            "items"
        ]
        return items[0] if items and items[0]["spec"].get("nodeName") else None

    bound = wait(pod, "pod bound by kube-scheduler")
    assert bound["spec"]["nodeName"]
    assert bound["spec"].get("schedulerName", "default-scheduler") == "default-scheduler"

    def succeeded() -> bool:
        return (http.get(f"/apis/batch/v1/namespaces/{ns}/jobs/train").json().get("status") or {}).get(
            "succeeded"
        ) == 1

    wait(succeeded, "the Job to succeed (pod run by the node agent)")
