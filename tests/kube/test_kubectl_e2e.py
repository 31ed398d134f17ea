"""End to end with the real kubectl and ``gpupool serve --backend kubernetes`` in-process
(gpupool.kube.wiring), on the fake and on the real API server (``kube_api``, issue 24: labelled
nodes with a kubelet, the fake's or the node agent's; the objects, the queue mapping and the
leader Lease in the test's own namespace): a Kueue-style Job ends bound with the device
annotations; a waiting pod shows gpupool's reason in ``kubectl describe pod``; two replicas
against one server and one store: only the Lease holder binds; a Deployment's replicas bound; a
refused Job's located error in ``kubectl describe job``. The PyTorchJob case is the fake's only:
the real server runs no training operator, so nothing makes a PyTorchJob's pods there."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gpupool.service.config import EXAMPLES, ServiceConfig
from tests.kube.conftest import KubeTarget

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")

CRDS = Path(__file__).resolve().parents[2] / "src" / "gpupool" / "kube" / "fake" / "crds"
TRAINING = {"gpupool.io/environment": "training"}  # what the example h100-training pool selects


def kubectl(srv: Any, *args: str, stdin: str | None = None) -> str:
    r = subprocess.run(
        ["kubectl", "--kubeconfig", str(srv.kubeconfig), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, f"kubectl {' '.join(args)}: {r.stderr}"
    return r.stdout


def wait(fn: Callable[[], Any], timeout: float, what: str) -> Any:
    end = time.monotonic() + timeout
    while True:
        v = fn()
        if v:
            return v
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.2)


@contextlib.contextmanager
def serving(srv: Any, state: Path, ns: str | None = None, **lease: Any) -> Iterator[Any]:
    """``gpupool serve --backend kubernetes`` in-process (its lifespan runs in the TestClient),
    on ``srv``'s kubeconfig; its namespace (``ns``, else a ``Cluster``'s ``ns``, else ``default``)
    is the one mapped to the queue and holding the leader Lease."""
    from gpupool.kube.wiring import kube_app, kube_options

    cfg = ServiceConfig(
        state_dir=state,
        config_dir=EXAMPLES / "cluster",
        backend="kubernetes",
        tick_s=0.05,
        min_interval_s=0.0,
        **lease,
    )
    ns = ns or getattr(srv, "ns", "default")
    opts = kube_options(Path(srv.kubeconfig), None, [f"{ns}=llm-research"], False, ns)
    app = kube_app(cfg, opts)
    with TestClient(app, raise_server_exceptions=False):
        yield app


def pods(srv: Any, selector: str = "", ns: str = "default") -> list[dict[str, Any]]:
    where = ["-l", selector] if selector else []
    out = json.loads(kubectl(srv, "get", "pods", "-n", ns, *where, "-o", "json"))
    return list(out["items"])


def bound(
    srv: Any, selector: str, n: int, prefix: str = "", ns: str = "default"
) -> list[dict[str, Any]] | None:
    """The bound pods in ``ns`` (by label selector and name prefix), once there are ``n``."""
    got = [
        p
        for p in pods(srv, selector, ns)
        if p["spec"].get("nodeName") and p["metadata"]["name"].startswith(prefix)
    ]
    return got if len(got) >= n else None


def kueue_job(name: str, pods: int, gpus: int, run_s: int = 3600, ns: str = "default") -> str:
    return f"""
apiVersion: batch/v1
kind: Job
metadata:
  name: {name}
  namespace: {ns}
  labels: {{kueue.x-k8s.io/queue-name: llm-research}}
spec:
  suspend: true
  parallelism: {pods}
  completions: {pods}
  template:
    metadata:
      annotations: {{fake.gpupool.io/run-seconds: "{run_s}"}}
    spec:
      schedulerName: gpupool
      restartPolicy: Never
      containers:
        - name: main
          image: busybox
          resources: {{limits: {{nvidia.com/gpu: {gpus}}}}}
"""


PYTORCHJOB = """
apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata:
  name: ddp
  namespace: %s
  labels: {kueue.x-k8s.io/queue-name: llm-research}
spec:
  runPolicy: {suspend: true}
  pytorchReplicaSpecs:
    Master:
      replicas: 1
      template:
        metadata: {annotations: {fake.gpupool.io/run-seconds: "3600"}}
        spec:
          schedulerName: gpupool
          containers:
            - {name: pytorch, image: pytorch, resources: {limits: {nvidia.com/gpu: 1}}}
    Worker:
      replicas: 1
      template:
        metadata: {annotations: {fake.gpupool.io/run-seconds: "3600"}}
        spec:
          schedulerName: gpupool
          containers:
            - {name: pytorch, image: pytorch, resources: {limits: {nvidia.com/gpu: 1}}}
"""


def device_annotations(p: dict[str, Any]) -> dict[str, str]:
    ann = p["metadata"].get("annotations") or {}
    return {k: v for k, v in ann.items() if k.startswith(("gpupool.io/", "hami.io/"))}


def _no_device_twice(got: list[dict[str, Any]]) -> None:
    seen: dict[tuple[str, str], str] = {}
    for p in got:
        ann = device_annotations(p)
        assert ann.get("gpupool.io/workload"), ann
        assert ann.get("gpupool.io/gpu-indices"), ann
        assert ann.get("hami.io/vgpu-devices-to-allocate"), ann
        assert ann.get("hami.io/vgpu-node") == p["spec"]["nodeName"], ann
        for i in ann["gpupool.io/gpu-indices"].split(","):
            key = (p["spec"]["nodeName"], i)
            assert key not in seen, f"device {key} given to {seen.get(key)} and {p['metadata']['name']}"
            seen[key] = p["metadata"]["name"]


def violations(k: KubeTarget) -> list[str]:
    """HAMi double-bookings the kubelets saw: the fake's ledger, or the node agents'."""
    if k.fake is not None:
        return list(k.fake.stats.violations)
    return [v for a in k._agents for v in a.violations]


def test_kueue_job_bound_with_device_annotations(kube_api: KubeTarget, tmp_path: Path) -> None:
    k, ns = kube_api, kube_api.namespace
    k.add_kubelet_nodes(2, labels=TRAINING)
    with serving(k, tmp_path / "a", ns):
        kubectl(k, "apply", "-f", "-", stdin=kueue_job("train", pods=2, gpus=2, ns=ns))
        got = wait(lambda: bound(k, "job-name=train", 2, ns=ns), 120, "the Job's 2 pods bound")
        _no_device_twice(got)
        job = json.loads(kubectl(k, "get", "job", "train", "-n", ns, "-o", "json"))
        assert job["spec"]["suspend"] is False  # unsuspended on admission, as Kueue does
        # the kubelet (fake or node agent) admitted them with HAMi's allocation and runs them
        wait(
            lambda: all(p["status"].get("phase") == "Running" for p in pods(k, "job-name=train", ns)),
            120,
            "the Job's pods Running",
        )
        assert violations(k) == []


@pytest.mark.fake_only("no training operator on the real server: nothing makes a PyTorchJob's pods")
def test_pytorchjob_bound_with_device_annotations(kube_api: KubeTarget, tmp_path: Path) -> None:
    k, ns = kube_api, kube_api.namespace
    k.add_kubelet_nodes(2, labels=TRAINING)
    with serving(k, tmp_path / "a", ns):
        kubectl(k, "apply", "-f", "-", stdin=kueue_job("train", pods=2, gpus=2, ns=ns))
        kubectl(k, "apply", "-f", str(CRDS / "pytorchjobs.yaml"))
        kubectl(k, "apply", "-f", "-", stdin=PYTORCHJOB % ns)
        got = wait(lambda: bound(k, "job-name=train", 2, ns=ns), 120, "the Job's 2 pods bound")
        ddp = wait(lambda: bound(k, "", 2, prefix="ddp-", ns=ns), 120, "the PyTorchJob's 2 pods bound")
        _no_device_twice([*got, *ddp])


def test_waiting_pod_describe_shows_gpupools_reason(kube_api: KubeTarget, tmp_path: Path) -> None:
    k, ns = kube_api, kube_api.namespace
    k.add_kubelet_nodes(1, labels=TRAINING)
    with serving(k, tmp_path / "a", ns):
        kubectl(k, "apply", "-f", "-", stdin=kueue_job("first", pods=1, gpus=8, ns=ns))
        wait(lambda: bound(k, "job-name=first", 1, ns=ns), 120, "the first Job bound")
        # a bare pod (no Job, so it exists while it waits): the node is full
        kubectl(
            k,
            "apply",
            "-f",
            "-",
            stdin=f"""
apiVersion: v1
kind: Pod
metadata: {{name: waiter, namespace: {ns}, labels: {{kueue.x-k8s.io/queue-name: llm-research}}}}
spec:
  schedulerName: gpupool
  containers:
    - {{name: main, image: busybox, resources: {{limits: {{nvidia.com/gpu: 8}}}}}}
""",
        )

        def described() -> str | None:
            out = kubectl(k, "describe", "pod", "waiter", "-n", ns)
            return out if "gpupool:" in out else None

        out = wait(described, 120, "gpupool's reason in kubectl describe pod")
        assert "FailedScheduling" in out and "position 1 of" in out, out
        pod = json.loads(kubectl(k, "get", "pod", "waiter", "-n", ns, "-o", "json"))
        cond = next(c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled")
        assert (cond["status"], cond["reason"]) == ("False", "Unschedulable")
        assert cond["message"].startswith("gpupool: ")

        # a suspended Job has no pods while it waits: its reason is on the Job
        kubectl(k, "apply", "-f", "-", stdin=kueue_job("later", pods=1, gpus=8, ns=ns))

        def job_described() -> str | None:
            out = kubectl(k, "describe", "job", "later", "-n", ns)
            return out if "gpupool:" in out else None

        out = wait(job_described, 120, "gpupool's reason in kubectl describe job")
        assert "Pending" in out and "in queue llm-research" in out, out


def test_two_replicas_only_the_lease_holder_binds(kube_api: KubeTarget, tmp_path: Path) -> None:
    """Two replicas, one server, one store: the first holds the Kubernetes Lease and the store
    lease and binds; the standby sends no write. When the leader shuts down (releasing both),
    the standby takes over and binds the next Job, and only it: the pair's pods are not bound
    again (the binders' own counts, on both servers; the fake's count of binds besides)."""
    k, ns = kube_api, kube_api.namespace
    k.add_kubelet_nodes(2, labels=TRAINING)
    db = f"sqlite:///{tmp_path / 'shared.db'}"
    with contextlib.ExitStack() as outer:
        first = contextlib.ExitStack()
        outer.callback(first.close)
        a = first.enter_context(serving(k, tmp_path / "a", ns, database_url=db))
        b = outer.enter_context(serving(k, tmp_path / "b", ns, database_url=db))
        ra, rb = a.state.kube, b.state.kube
        assert ra.lease.held() and not rb.lease.held()
        assert a.state.svc.leader.is_leader and not b.state.svc.leader.is_leader
        kubectl(k, "apply", "-f", "-", stdin=kueue_job("pair", pods=2, gpus=4, ns=ns))
        pair = wait(lambda: bound(k, "job-name=pair", 2, ns=ns), 120, "the Job's pods bound")
        lease = json.loads(kubectl(k, "get", "lease", "gpupool-scheduler", "-n", ns, "-o", "json"))
        assert lease["spec"]["holderIdentity"] == ra.lease.identity
        writes_b = {v: n for v, n in rb.api.requests.items() if v in ("POST", "PATCH", "PUT", "DELETE")}
        assert writes_b == {}, f"the standby wrote: {writes_b}"
        assert ra.backend.binder.stats["bound"] == 2

        binds_before = k.fake.stats.binds if k.fake is not None else 0
        first.close()  # the leader shuts down: both leases released
        wait(lambda: rb.lease.held() and b.state.svc.leader.is_leader, 60, "the standby to take over")
        kubectl(k, "apply", "-f", "-", stdin=kueue_job("after", pods=1, gpus=4, ns=ns))
        wait(lambda: bound(k, "job-name=after", 1, ns=ns), 120, "the new leader to bind")
        assert rb.backend.binder.stats["bound"] == 1  # the pair's pods were not bound again
        uids = {p["metadata"]["uid"]: p["spec"]["nodeName"] for p in pair}
        now = {p["metadata"]["uid"]: p["spec"]["nodeName"] for p in pods(k, "job-name=pair", ns)}
        assert now == uids  # the same pods, on the same nodes
        if k.fake is not None:
            assert k.fake.stats.binds == binds_before + 1


def test_deployment_for_inference_gets_its_replicas_bound(kube_api: KubeTarget, tmp_path: Path) -> None:
    """A Deployment (no suspend: its pods wait for gpupool) becomes one inference workload whose
    replicas are bound with device annotations."""
    k, ns = kube_api, kube_api.namespace
    k.add_kubelet_nodes(1, labels=TRAINING)
    with serving(k, tmp_path / "a", ns):
        kubectl(
            k,
            "apply",
            "-f",
            "-",
            stdin=f"""
apiVersion: apps/v1
kind: Deployment
metadata: {{name: chat, namespace: {ns}, labels: {{kueue.x-k8s.io/queue-name: llm-research}}}}
spec:
  replicas: 2
  selector: {{matchLabels: {{app: chat}}}}
  template:
    metadata: {{labels: {{app: chat}}}}
    spec:
      schedulerName: gpupool
      containers:
        - {{name: server, image: vllm, resources: {{limits: {{nvidia.com/gpu: 1}}}}}}
""",
        )
        got = wait(lambda: bound(k, "app=chat", 2, ns=ns), 120, "the Deployment's 2 replicas bound")
        _no_device_twice(got)
        assert violations(k) == []


def test_refused_job_shows_the_located_error_in_describe(kube_api: KubeTarget, tmp_path: Path) -> None:
    """A Job naming a queue that does not exist stays suspended; `kubectl describe job` shows a
    Warning Event with the field at fault, once."""
    k, ns = kube_api, kube_api.namespace
    k.add_kubelet_nodes(1, labels=TRAINING)
    with serving(k, tmp_path / "a", ns) as app:
        bad = kueue_job("lost", pods=1, gpus=1, ns=ns).replace(
            "queue-name: llm-research", "queue-name: no-such-queue"
        )
        kubectl(k, "apply", "-f", "-", stdin=bad)

        def described() -> str | None:
            out = kubectl(k, "describe", "job", "lost", "-n", ns)
            return out if "GpupoolRefused" in out else None

        out = " ".join(wait(described, 120, "the refusal in kubectl describe job").split())
        assert "Warning" in out and "no-such-queue" in out and "spec.queue" in out, out
        job = json.loads(kubectl(k, "get", "job", "lost", "-n", ns, "-o", "json"))
        assert job["spec"]["suspend"] is True
        assert app.state.kube.source.stats["refused"] == 1
