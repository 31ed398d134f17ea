"""The node agent (``gpupool.kube.nodeagent``), the kubelet of ``gpupool kube cluster up``,
against the fake API server with the fake's own kubelet off: it plays the kubelet over HTTP
only, so what passes here is what it does against any server (``test_cluster_up`` runs it
against the real one)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from gpupool.kube import kubelet_status as ks
from gpupool.kube.client import RESOURCES, KubeApi, load_config
from gpupool.kube.fake import FakeApiServer
from gpupool.kube.fake import nodes as builders
from gpupool.kube.nodeagent import LEASE_NAMESPACE, NodeAgent

T = TypeVar("T")
PODS, LEASES = RESOURCES["pods"], RESOURCES["leases"]


def wait(fn: Callable[[], T | None], what: str, timeout: float = 30.0) -> T:
    deadline = time.monotonic() + timeout
    while True:
        got = fn()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout:.0f} s")
        time.sleep(0.05)


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[tuple[FakeApiServer, KubeApi, NodeAgent]]:
    srv = FakeApiServer(kubelet=False)
    srv.start()
    api = KubeApi(load_config(str(srv.write_kubeconfig(tmp_path / "kubeconfig"))))
    node_objs = builders.gpu_nodes(2, "agent", gpus=4)
    na = NodeAgent(api, node_objs, heartbeat_s=0.2)
    try:
        na.start()
        na.wait_ready(30)
        yield srv, api, na
    finally:
        na.stop()
        api.close()
        srv.stop()


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


def _bind(api: KubeApi, name: str, node: str) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name},
        "target": {"kind": "Node", "name": node},
    }
    api.post_sub(PODS, "default", name, "binding", body)


def _phase(api: KubeApi, name: str, phase: str) -> dict[str, Any] | None:
    pod = api.get(PODS, "default", name)
    return pod if (pod.get("status") or {}).get("phase") == phase else None


def test_nodes_register_with_gpus_and_their_leases_are_renewed(
    agent: tuple[FakeApiServer, KubeApi, NodeAgent],
) -> None:
    srv, api, _na = agent
    node = srv.get("nodes", "", "agent-0000")
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "4"
    assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert builders.HAMI_REGISTER in node["metadata"]["annotations"]
    lease = api.get(LEASES, LEASE_NAMESPACE, "agent-0000")
    assert lease["spec"]["holderIdentity"] == "agent-0000"
    assert lease["metadata"]["ownerReferences"][0]["uid"] == node["metadata"]["uid"]
    first = lease["spec"]["renewTime"]
    wait(
        lambda: api.get(LEASES, LEASE_NAMESPACE, "agent-0000")["spec"]["renewTime"] != first, "lease renewal"
    )


def test_a_bound_pod_runs_then_succeeds_or_fails_with_its_exit_code(
    agent: tuple[FakeApiServer, KubeApi, NodeAgent],
) -> None:
    _srv, api, _na = agent
    api.create(PODS, "default", _pod("ok", {ks.RUN_SECONDS: "0.5"}))
    api.create(PODS, "default", _pod("bad", {ks.RUN_SECONDS: "0.5", ks.EXIT_CODE: "3"}))
    _bind(api, "ok", "agent-0000")
    _bind(api, "bad", "agent-0001")
    running = wait(lambda: _phase(api, "ok", "Running"), "ok Running")
    assert running["status"]["containerStatuses"][0]["state"]["running"]["startedAt"]
    assert {c["type"]: c["status"] for c in running["status"]["conditions"]}["Ready"] == "True"
    assert running["status"]["startTime"]
    done = wait(lambda: _phase(api, "ok", "Succeeded"), "ok Succeeded")
    term = done["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (term["exitCode"], term["reason"]) == (0, "Completed")
    assert done["status"]["startTime"] == running["status"]["startTime"]
    failed = wait(lambda: _phase(api, "bad", "Failed"), "bad Failed")
    assert failed["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 3


def test_hami_allocation_is_checked_and_a_bad_one_fails_the_pod(
    agent: tuple[FakeApiServer, KubeApi, NodeAgent],
) -> None:
    _srv, api, na = agent
    dev = builders.gpu_uuid("agent-0000", 0)
    api.create(
        PODS, "default", _pod("gpu", {"hami.io/vgpu-devices-to-allocate": f"{dev},NVIDIA,81559,100;"}, 1)
    )
    api.create(PODS, "default", _pod("nodev", {}, 1))
    _bind(api, "gpu", "agent-0000")
    _bind(api, "nodev", "agent-0000")
    pod = wait(lambda: _phase(api, "gpu", "Running"), "gpu Running")
    assert pod["metadata"]["annotations"]["hami.io/bind-phase"] == "success"
    refused = wait(lambda: _phase(api, "nodev", "Failed"), "nodev Failed")
    assert refused["status"]["reason"] == "UnexpectedAdmissionError"
    assert refused["metadata"]["annotations"]["hami.io/bind-phase"] == "failed"
    assert na.violations == []


def test_a_pod_deleted_with_grace_stays_until_the_grace_is_over(
    agent: tuple[FakeApiServer, KubeApi, NodeAgent],
) -> None:
    _srv, api, _na = agent
    api.create(PODS, "default", _pod("long", {}))
    _bind(api, "long", "agent-0001")
    wait(lambda: _phase(api, "long", "Running"), "long Running")
    api.delete(PODS, "default", "long", {"gracePeriodSeconds": 2})
    assert api.get(PODS, "default", "long")["metadata"]["deletionTimestamp"]
    names = lambda: {p["metadata"]["name"] for p in api.list(PODS, "default")[0]}  # noqa: E731
    wait(lambda: "long" not in names(), "removal after the grace period")
