"""The node agent (``gpupool.kube.nodeagent``), the kubelet of ``gpupool kube cluster up``, on
both servers: the fake with its own kubelet off (so the agent alone plays the kubelet, over HTTP
only) and the real control plane (issue 24). Each test gets its own node names and, on the real
server, its own namespace, since the session shares one server."""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from gpupool.kube import kubelet_status as ks
from gpupool.kube.client import RESOURCES, ApiError, KubeApi, Resource, load_config
from gpupool.kube.fake import FakeApiServer
from gpupool.kube.fake import nodes as builders
from gpupool.kube.nodeagent import LEASE_NAMESPACE, NodeAgent

T = TypeVar("T")
PODS, LEASES, NODES = RESOURCES["pods"], RESOURCES["leases"], RESOURCES["nodes"]
NAMESPACES = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
SERVICE_ACCOUNTS = Resource("", "v1", "serviceaccounts", "ServiceAccount")


@dataclass
class Agent:
    """The API, the agent, its two nodes (4 GPUs each) and the namespace the test's pods use."""

    api: KubeApi
    na: NodeAgent
    nodes: list[str]
    ns: str


def wait(fn: Callable[[], T | None], what: str, timeout: float = 30.0) -> T:
    deadline = time.monotonic() + timeout
    while True:
        got = fn()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout:.0f} s")
        time.sleep(0.05)


@pytest.fixture(params=["fake", pytest.param("real", marks=pytest.mark.realkube)])
def agent(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Agent]:
    srv: FakeApiServer | None = None
    if request.param == "real":
        kubeconfig = request.getfixturevalue("real_control_plane").kubeconfig
    else:
        srv = FakeApiServer(kubelet=False)
        srv.start()
        kubeconfig = srv.write_kubeconfig(tmp_path / "kubeconfig")
    api = KubeApi(load_config(str(kubeconfig)))
    ns = f"agent-{secrets.token_hex(4)}"
    api.create(NAMESPACES, None, {"metadata": {"name": ns}})
    if srv is None:  # the ServiceAccount admission plugin refuses pods until ``default`` exists
        wait(
            lambda: _exists(api, SERVICE_ACCOUNTS, ns, "default"), f"the default service account in {ns}", 60
        )
    node_objs = builders.gpu_nodes(2, f"agent-{secrets.token_hex(3)}", gpus=4)
    na = NodeAgent(api, node_objs, heartbeat_s=0.2)
    try:
        na.start()
        na.wait_ready(60)
        yield Agent(api, na, list(na.nodes), ns)
    finally:
        na.stop()
        for name in na.nodes:
            _delete_quietly(api, NODES, None, name)
        _delete_quietly(api, NAMESPACES, None, ns)
        api.close()
        if srv is not None:
            srv.stop()


def _exists(api: KubeApi, res: Resource, ns: str | None, name: str) -> bool:
    try:
        api.get(res, ns, name)
    except ApiError:
        return False
    return True


def _delete_quietly(api: KubeApi, res: Resource, ns: str | None, name: str) -> None:
    with contextlib.suppress(ApiError):  # gone already
        api.delete(res, ns, name)


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


def _bind(a: Agent, name: str, node: str) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name},
        "target": {"kind": "Node", "name": node},
    }
    a.api.post_sub(PODS, a.ns, name, "binding", body)


def _phase(a: Agent, name: str, phase: str) -> dict[str, Any] | None:
    pod = a.api.get(PODS, a.ns, name)
    return pod if (pod.get("status") or {}).get("phase") == phase else None


def test_nodes_register_with_gpus_and_their_leases_are_renewed(
    agent: Agent,
) -> None:
    api, name = agent.api, agent.nodes[0]
    node = api.get(NODES, None, name)
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "4"
    assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert builders.HAMI_REGISTER in node["metadata"]["annotations"]
    lease = api.get(LEASES, LEASE_NAMESPACE, name)
    assert lease["spec"]["holderIdentity"] == name
    assert lease["metadata"]["ownerReferences"][0]["uid"] == node["metadata"]["uid"]
    first = lease["spec"]["renewTime"]
    wait(lambda: api.get(LEASES, LEASE_NAMESPACE, name)["spec"]["renewTime"] != first, "lease renewal")


def test_a_bound_pod_runs_then_succeeds_or_fails_with_its_exit_code(
    agent: Agent,
) -> None:
    api, ns, (n0, n1) = agent.api, agent.ns, agent.nodes
    api.create(PODS, ns, _pod("ok", {ks.RUN_SECONDS: "0.5"}))
    api.create(PODS, ns, _pod("bad", {ks.RUN_SECONDS: "0.5", ks.EXIT_CODE: "3"}))
    _bind(agent, "ok", n0)
    _bind(agent, "bad", n1)
    running = wait(lambda: _phase(agent, "ok", "Running"), "ok Running")
    assert running["status"]["containerStatuses"][0]["state"]["running"]["startedAt"]
    assert {c["type"]: c["status"] for c in running["status"]["conditions"]}["Ready"] == "True"
    assert running["status"]["startTime"]
    done = wait(lambda: _phase(agent, "ok", "Succeeded"), "ok Succeeded")
    term = done["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (term["exitCode"], term["reason"]) == (0, "Completed")
    assert done["status"]["startTime"] == running["status"]["startTime"]
    failed = wait(lambda: _phase(agent, "bad", "Failed"), "bad Failed")
    assert failed["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 3


def test_hami_allocation_is_checked_and_a_bad_one_fails_the_pod(
    agent: Agent,
) -> None:
    api, ns, (n0, _n1), na = agent.api, agent.ns, agent.nodes, agent.na
    dev = builders.gpu_uuid(n0, 0)
    api.create(PODS, ns, _pod("gpu", {"hami.io/vgpu-devices-to-allocate": f"{dev},NVIDIA,81559,100;"}, 1))
    api.create(PODS, ns, _pod("nodev", {}, 1))
    _bind(agent, "gpu", n0)
    _bind(agent, "nodev", n0)
    pod = wait(lambda: _phase(agent, "gpu", "Running"), "gpu Running")
    assert pod["metadata"]["annotations"]["hami.io/bind-phase"] == "success"
    refused = wait(lambda: _phase(agent, "nodev", "Failed"), "nodev Failed")
    assert refused["status"]["reason"] == "UnexpectedAdmissionError"
    assert refused["metadata"]["annotations"]["hami.io/bind-phase"] == "failed"
    assert na.violations == []


def test_a_pod_deleted_with_grace_stays_until_the_grace_is_over(
    agent: Agent,
) -> None:
    api, ns, n1 = agent.api, agent.ns, agent.nodes[1]
    api.create(PODS, ns, _pod("long", {}))
    _bind(agent, "long", n1)
    wait(lambda: _phase(agent, "long", "Running"), "long Running")
    api.delete(PODS, ns, "long", {"gracePeriodSeconds": 2})
    assert api.get(PODS, ns, "long")["metadata"]["deletionTimestamp"]
    names = lambda: {p["metadata"]["name"] for p in api.list(PODS, ns)[0]}  # noqa: E731
    wait(lambda: "long" not in names(), "removal after the grace period")


def test_a_started_pod_keeps_the_conditions_others_wrote(agent: Agent) -> None:
    """A DisruptionTarget written before the kubelet starts the pod stays on it: the kubelet
    owns Initialized/Ready/ContainersReady only (the agent once replaced the whole list, so a
    preempted pod lost its mark; issue 24)."""
    api, ns, n0 = agent.api, agent.ns, agent.nodes[0]
    api.create(PODS, ns, _pod("marked", {ks.RUN_SECONDS: "1000"}))
    # (with its transition time: the real disruption controller resets a DisruptionTarget of a
    # pod that is not deleting once it is 2 minutes old, and at once when it has no time)
    mark = {
        "type": "DisruptionTarget",
        "status": "True",
        "reason": "PreemptionByScheduler",
        "lastTransitionTime": ks.now_rfc3339(),
    }
    api.patch(PODS, ns, "marked", {"status": {"conditions": [mark]}}, sub="status")
    _bind(agent, "marked", n0)
    running = wait(lambda: _phase(agent, "marked", "Running"), "marked Running")
    conds = {c["type"]: c for c in running["status"]["conditions"]}
    assert conds["DisruptionTarget"]["reason"] == "PreemptionByScheduler"
    assert {"PodScheduled", "Ready", "Initialized", "ContainersReady"} <= set(conds)


def test_a_node_set_not_ready_parks_its_pods_until_ready_again(agent: Agent) -> None:
    """``set_ready(name, False)``: the node reads NotReady (and stays so through the heartbeats),
    a pod bound to it is not started; Ready again, the pod runs (the fake kubelet's parking)."""
    api, ns, na, n0 = agent.api, agent.ns, agent.na, agent.nodes[0]

    def ready(name: str) -> str:
        conds = api.get(NODES, None, name)["status"]["conditions"]
        return next(c["status"] for c in conds if c["type"] == "Ready")

    na.set_ready(n0, False)
    assert ready(n0) == "False"
    api.create(PODS, ns, _pod("parked", {ks.RUN_SECONDS: "1000"}))
    _bind(agent, "parked", n0)
    renewed = api.get(LEASES, LEASE_NAMESPACE, n0)["spec"]["renewTime"]
    wait(lambda: api.get(LEASES, LEASE_NAMESPACE, n0)["spec"]["renewTime"] != renewed, "a heartbeat")
    wait(lambda: len(na._parked.get(n0, [])) == 1, "the pod's admission parked")
    assert ready(n0) == "False" and _phase(agent, "parked", "Pending")
    na.set_ready(n0, True)
    wait(lambda: _phase(agent, "parked", "Running"), "parked Running after Ready")
    assert ready(n0) == "True"


def test_a_deleted_pod_ends_in_a_terminal_phase_before_it_goes(agent: Agent) -> None:
    """Its grace period over, the pod is Failed (its containers stopped by SIGTERM, 143) before
    the agent deletes it, as the kubelet does: a Job's pod keeps the Job controller's finalizer
    until that controller has judged it, which it does only once the pod is terminal (the agent
    once deleted it Running, and a Job with a podFailurePolicy made no replacement; issue 24)."""
    api, ns, n0 = agent.api, agent.ns, agent.nodes[0]
    held = _pod("held", {})
    held["metadata"]["finalizers"] = ["gpupool.io/test-hold"]
    api.create(PODS, ns, held)
    _bind(agent, "held", n0)
    wait(lambda: _phase(agent, "held", "Running"), "held Running")
    api.delete(PODS, ns, "held", {"gracePeriodSeconds": 1})
    done = wait(lambda: _phase(agent, "held", "Failed"), "held Failed after its grace period")
    term = done["status"]["containerStatuses"][0]["state"]["terminated"]
    assert term["exitCode"] == 143 and done["metadata"]["deletionTimestamp"]
    api.patch(PODS, ns, "held", {"metadata": {"finalizers": None}})
    wait(lambda: not _exists(api, PODS, ns, "held"), "held gone once its finalizer is")


def test_complete_ends_a_running_pod_now_with_its_exit_code(agent: Agent) -> None:
    """``NodeAgent.complete``, as the fake kubelet's: a pod with no run time (it runs until
    deleted) ended on demand, Succeeded or Failed with the code, its devices released; a pod
    not running here (Pending, unknown) is left alone (False)."""
    api, ns, (n0, n1) = agent.api, agent.ns, agent.nodes
    api.create(PODS, ns, _pod("ok", {}))
    api.create(PODS, ns, _pod("bad", {}))
    api.create(PODS, ns, _pod("unbound", {}))
    assert agent.na.complete(ns, "unbound") is False
    assert agent.na.complete(ns, "no-such-pod") is False
    _bind(agent, "ok", n0)
    _bind(agent, "bad", n1)
    wait(lambda: _phase(agent, "ok", "Running"), "ok Running")
    wait(lambda: _phase(agent, "bad", "Running"), "bad Running")
    assert agent.na.complete(ns, "ok") is True
    assert agent.na.complete(ns, "bad", exit_code=3) is True
    done = api.get(PODS, ns, "ok")
    assert done["status"]["phase"] == "Succeeded"
    assert done["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
    failed = api.get(PODS, ns, "bad")
    assert failed["status"]["phase"] == "Failed"
    assert failed["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 3
    assert agent.na.complete(ns, "ok") is False  # ended already
    with pytest.raises(ValueError, match="exit_code"):
        agent.na.complete(ns, "ok", exit_code=256)
