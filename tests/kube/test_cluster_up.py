"""``gpupool kube cluster up``: the real control plane (``make kube-bin``) with simulated nodes,
run as a user runs it (a subprocess), checked over plain HTTP (no kubectl): the nodes are Ready
with GPU capacity, a pod bound through the binding subresource runs and ends as its annotations
say, grace periods are honoured, the nodes' Leases are renewed, and SIGTERM stops everything.

Skipped, with the reason, when the binaries are not built (a failure under
``GPUPOOL_REQUIRE_KUBE=1``, as in CI). Deadlines are generous: a start costs about 12 s on an
idle machine and several times that on a loaded 2-core one.
"""

from __future__ import annotations

import base64
import os
import signal
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import yaml
from typer.testing import CliRunner

from gpupool.cli.main import app
from gpupool.kube import kubelet_status as ks
from gpupool.kube.fake.nodes import gpu_uuid
from gpupool.kube.realcluster import MissingBinaries, find_binaries

realkube = pytest.mark.realkube

T = TypeVar("T")
NS = "cluster-up"


def wait(fn: Callable[[], T | None], what: str, timeout: float = 90.0) -> T:
    deadline = time.monotonic() + timeout
    while True:
        got = fn()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout:.0f} s")
        time.sleep(0.2)


def _descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (from /proc: the components run in their own sessions, so
    their process group says nothing)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    out: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.add(child)
            todo.append(child)
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


class Cluster:
    """The running command, its output lines, and an HTTP client from its kubeconfig."""

    def __init__(self, proc: subprocess.Popen[str], kubeconfig: Path) -> None:
        self.proc, self.kubeconfig = proc, kubeconfig
        self.lines: list[str] = []
        self.http: httpx.Client | None = None
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def up_line(self) -> str | None:
        if self.proc.poll() is not None:
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise AssertionError(f"cluster up exited with {self.proc.returncode}: {self.lines} {err}")
        return next((ln for ln in self.lines if ln.startswith("up: ")), None)

    def connect(self) -> httpx.Client:
        cfg = yaml.safe_load(self.kubeconfig.read_text())
        cluster, user = cfg["clusters"][0]["cluster"], cfg["users"][0]["user"]
        ca = base64.b64decode(cluster["certificate-authority-data"]).decode()
        self.http = httpx.Client(
            base_url=cluster["server"],
            verify=ssl.create_default_context(cadata=ca),
            headers={"Authorization": f"Bearer {user['token']}"},
            timeout=30,
        )
        return self.http


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    try:
        find_binaries()
    except MissingBinaries as exc:
        if os.environ.get("GPUPOOL_REQUIRE_KUBE") == "1":
            pytest.fail(f"GPUPOOL_REQUIRE_KUBE=1 but: {exc}")
        pytest.skip(str(exc))
    kubeconfig = tmp_path_factory.mktemp("cluster-up") / "kubeconfig"
    args = [
        "kube",
        "cluster",
        "up",
        "--nodes",
        "2",
        "--kubeconfig",
        str(kubeconfig),
        "--heartbeat-seconds",
        "1",
    ]
    proc = subprocess.Popen(
        [sys.executable, "-c", "from gpupool.cli import main; main()", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    c = Cluster(proc, kubeconfig)
    try:
        wait(c.up_line, "'up:' line", timeout=300)
        http = c.connect()
        r = http.post("/api/v1/namespaces", json={"metadata": {"name": NS}})
        assert r.status_code == 201, r.text
        wait(
            lambda: http.get(f"/api/v1/namespaces/{NS}/serviceaccounts/default").status_code == 200,
            "default SA",
        )
        yield c
    finally:
        if c.http is not None:
            c.http.close()
        if proc.poll() is None:
            for pid in _descendants(proc.pid):
                os.kill(pid, signal.SIGKILL)
            proc.kill()
        proc.wait(30)


def test_bad_input_and_missing_binaries_are_said_plainly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No binaries needed: both are refused before anything starts."""
    bad = tmp_path / "cluster.yaml"
    bad.write_text("kind: Cluster\nspec:\n  nodeGroups:\n  - gpus: 8\n")
    r = CliRunner().invoke(app, ["kube", "cluster", "up", "--cluster", str(bad)])
    assert r.exit_code == 2 and "nodeGroups[0].name" in r.output, r.output
    monkeypatch.setenv("GPUPOOL_KUBE_BIN_DIR", str(tmp_path / "none"))
    r = CliRunner().invoke(
        app, ["kube", "cluster", "up", "--nodes", "1", "--kubeconfig", str(tmp_path / "kc")]
    )
    assert r.exit_code == 2 and "make kube-bin" in r.output, r.output
    assert not (tmp_path / "kc").exists()


def _pod(name: str, annotations: dict[str, str], gpus: int = 0) -> dict[str, Any]:
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "busybox", "resources": resources}],
        },
    }


def _create_and_bind(http: httpx.Client, pod: dict[str, Any], node: str) -> None:
    name = pod["metadata"]["name"]
    r = http.post(f"/api/v1/namespaces/{NS}/pods", json=pod)
    assert r.status_code == 201, r.text
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name},
        "target": {"kind": "Node", "name": node},
    }
    r = http.post(f"/api/v1/namespaces/{NS}/pods/{name}/binding", json=binding)
    assert r.status_code == 201, r.text


def _in_phase(http: httpx.Client, name: str, phase: str) -> dict[str, Any] | None:
    pod = http.get(f"/api/v1/namespaces/{NS}/pods/{name}").json()
    return pod if (pod.get("status") or {}).get("phase") == phase else None


@realkube
def test_the_nodes_are_ready_with_gpu_capacity_labels_and_hami_register(cluster: Cluster) -> None:
    assert cluster.http is not None
    up = cluster.up_line() or ""
    assert "with 2 nodes Ready" in up and "v1.36" in up, up
    nodes = cluster.http.get("/api/v1/nodes").json()["items"]
    assert sorted(n["metadata"]["name"] for n in nodes) == ["gpu-node-0000", "gpu-node-0001"]
    for n in nodes:
        assert n["status"]["capacity"]["nvidia.com/gpu"] == "8"
        assert n["status"]["allocatable"]["nvidia.com/gpu"] == "8"
        assert {c["type"]: c["status"] for c in n["status"]["conditions"]}["Ready"] == "True"
        assert n["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
        assert "hami.io/node-nvidia-register" in n["metadata"]["annotations"]


@realkube
def test_a_bound_pod_runs_then_succeeds_and_a_failing_one_fails(cluster: Cluster) -> None:
    http = cluster.http
    assert http is not None
    dev = gpu_uuid("gpu-node-0000", 0)
    gpu_ann = {ks.RUN_SECONDS: "2", "hami.io/vgpu-devices-to-allocate": f"{dev},NVIDIA,81559,100;"}
    _create_and_bind(http, _pod("ok", gpu_ann, gpus=1), "gpu-node-0000")
    _create_and_bind(http, _pod("bad", {ks.RUN_SECONDS: "2", ks.EXIT_CODE: "3"}), "gpu-node-0001")
    running = wait(lambda: _in_phase(http, "ok", "Running"), "ok Running")
    status = running["status"]
    assert status["startTime"]
    assert "running" in status["containerStatuses"][0]["state"]
    assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == "True"
    assert running["metadata"]["annotations"]["hami.io/bind-phase"] == "success"
    done = wait(lambda: _in_phase(http, "ok", "Succeeded"), "ok Succeeded")
    term = done["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (term["exitCode"], term["reason"]) == (0, "Completed")
    failed = wait(lambda: _in_phase(http, "bad", "Failed"), "bad Failed")
    assert failed["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 3


@realkube
def test_a_pod_deleted_with_grace_is_removed_after_it(cluster: Cluster) -> None:
    http = cluster.http
    assert http is not None
    _create_and_bind(http, _pod("long", {}), "gpu-node-0001")
    wait(lambda: _in_phase(http, "long", "Running"), "long Running")
    r = http.request("DELETE", f"/api/v1/namespaces/{NS}/pods/long", json={"gracePeriodSeconds": 5})
    assert r.status_code == 200, r.text
    # the server keeps a bound, running pod until its kubelet (the agent) confirms it stopped
    assert r.json()["metadata"]["deletionTimestamp"], r.json()["metadata"]
    assert r.json()["metadata"]["deletionGracePeriodSeconds"] == 5
    wait(lambda: http.get(f"/api/v1/namespaces/{NS}/pods/long").status_code == 404, "removal after the grace")


@realkube
def test_the_node_leases_are_renewed(cluster: Cluster) -> None:
    http = cluster.http
    assert http is not None
    path = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/gpu-node-0000"
    first = http.get(path).json()["spec"]
    assert first["holderIdentity"] == "gpu-node-0000"
    wait(lambda: http.get(path).json()["spec"]["renewTime"] != first["renewTime"], "lease renewal")


@realkube
def test_sigterm_stops_everything_and_leaves_no_process(cluster: Cluster) -> None:
    """Last in the module: it ends the cluster the other tests share."""
    below = _descendants(cluster.proc.pid)
    assert len(below) >= 3, below  # etcd, kube-apiserver, kube-controller-manager
    cluster.proc.send_signal(signal.SIGTERM)
    assert cluster.proc.wait(120) == 0
    wait(lambda: "stopping" in cluster.lines, "'stopping' line", timeout=10)
    assert [pid for pid in below if _alive(pid)] == []
