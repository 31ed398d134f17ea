"""KAI's memory-only GPU share (issue 27, item 7): a pod with only the ``gpu-memory``
annotation (KAI's documented way to ask for a share by memory, in MiB) is placed on a device
with that much memory free and counted as the fraction of the device it takes
(``engine/memory_share.py``), on the Kubernetes path and the Workload manifest path alike;
a bad value is refused naming the annotation the user wrote."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupool.engine import decide
from gpupool.engine.memory_share import share_milli
from gpupool.kube.exclusive import overbooked
from gpupool.kube.workloads import KubeWorkloadError, workload_from_object
from gpupool.manifests import ManifestError, build, parse_documents
from gpupool.model import (
    Node,
    PodGroup,
    PodRequest,
    PoolQuota,
    Queue,
    ResourcePool,
    Snapshot,
    Workload,
)
from tests.kube.cluster import Cluster, bound, job, pods_of, wait_for
from tests.kube.test_backend_controller import TRAINING, Setup

#: the fake nodes' H100 device memory (``kube.fake.nodes.gpu_nodes``)
H100_MIB = 81559


def kai_job(name: str, memory: str, ns: str | None = "default") -> dict[str, Any]:
    """A one-pod Job whose container names no GPU resource: the share is KAI's annotation
    (in ``ns``; None: the cluster's namespace, once created there)."""
    obj = job(name, pods=1, ns=ns, run_s=100_000)
    obj["spec"]["template"]["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1"}}
    obj["spec"]["template"]["metadata"]["annotations"]["gpu-memory"] = memory
    return obj


#: a training pool with a node of two 16 GiB devices and a node of two 80 GiB devices
MIXED = pytest.mark.cluster_nodes(
    groups=[
        {"count": 1, "gpus": 2, "labels": TRAINING, "product": "Tesla-T4", "memory_mib": 16384},
        {"count": 1, "gpus": 2, "labels": TRAINING},
    ]
)


@pytest.fixture
def mixed(cluster: Cluster, tmp_path: Path) -> Iterator[Setup]:
    """The example config's controller over ``MIXED``'s nodes (``cluster.nodes``: small, big)."""
    s = Setup(cluster, tmp_path)
    yield s
    s.store.close()  # (the cluster fixture closes the backends)


@pytest.mark.both_servers
@MIXED
def test_two_memory_only_pods_share_one_80gib_device(mixed: Setup) -> None:
    """On both servers (issue 24): the pods bound by the backend and run by a kubelet (the node
    agent on the real server) that checks HAMi's device allocation."""
    srv = mixed.srv
    small, big = mixed.cluster.nodes
    assert sorted(n.name for n in mixed.ctl.nodes()) == sorted([small, big])
    first = mixed.submit(kai_job("kai-a", "20000", ns=None))
    second = mixed.submit(kai_job("kai-b", "20000", ns=None))
    mixed.cycle_until(
        lambda: (
            len(bound(pods_of(srv, "job-name=kai-a"))) == 1
            and len(bound(pods_of(srv, "job-name=kai-b"))) == 1
        ),
        timeout=60,
        what="both KAI pods bound",
    )
    pods = [pods_of(srv, f"job-name={n}")[0] for n in ("kai-a", "kai-b")]
    anns = [p["metadata"]["annotations"] for p in pods]
    # the 16 GiB devices cannot hold 20000 MiB: both on one device of the 80 GiB node
    assert {(a["gpupool.io/node"], a["gpupool.io/gpu-indices"]) for a in anns} == {(big, "0")}
    assert {p["spec"]["nodeName"] for p in pods} == {big}
    milli = math.ceil(20000 * 1000 / H100_MIB)
    assert [(a["gpupool.io/gpu-milli"], a["gpupool.io/gpu-memory-mib"]) for a in anns] == [
        (str(milli), "20000")
    ] * 2

    def running() -> bool:
        pods = [p for n in ("kai-a", "kai-b") for p in pods_of(srv, f"job-name={n}")]
        return len(pods) == 2 and all(p["status"].get("phase") == "Running" for p in pods)

    # the kubelet started both: the shared device's allocation accepted, neither failed
    wait_for(running, 60, "both KAI pods Running on the node")
    mixed.cycle_until(
        lambda: {mixed.phase(first), mixed.phase(second)} == {"Running"}, timeout=60, what="both Running"
    )
    assert not overbooked(srv.list("pods", srv.ns)) and mixed.cluster.violations() == []


def test_a_bad_gpu_memory_value_names_the_annotation() -> None:
    with pytest.raises(KubeWorkloadError) as ei:
        workload_from_object(kai_job("bad", "lots"))
    assert ei.value.field == "spec.template.metadata.annotations.gpu-memory"
    assert "nvidia.com/gpumem" not in str(ei.value)
    with pytest.raises(KubeWorkloadError) as ei:
        workload_from_object(kai_job("zero", "0"))
    assert ei.value.field == "spec.template.metadata.annotations.gpu-memory"
    both = kai_job("both", "20000")
    both["spec"]["template"]["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": 1}}
    with pytest.raises(KubeWorkloadError) as ei:
        workload_from_object(both)
    assert ei.value.field == "spec.template.metadata.annotations.gpu-memory"  # not gpu-fraction


def _workload_doc(annotations: str, resources: str) -> str:
    return f"""
apiVersion: gpupool.io/v1alpha1
kind: Workload
metadata: {{name: a, annotations: {annotations}}}
spec: {{queue: q, podGroups: [{{replicas: 2, resources: {resources}}}]}}
"""


def test_the_workload_manifest_takes_a_memory_only_share() -> None:
    (w,) = build(parse_documents(_workload_doc('{gpu-memory: "20000"}', "{cpu: 1}"), "w.yaml")).workloads
    r = w.pod_groups[0].request
    assert (r.gpus, r.gpu_milli, r.gpu_memory_mib) == (0, 0, 20000)
    (h,) = build(
        parse_documents(_workload_doc("{}", "{cpu: 1, nvidia.com/gpumem: 20000}"), "w.yaml")
    ).workloads
    assert h.pod_groups[0].request == r


def test_a_bad_gpu_memory_on_a_workload_names_the_annotation() -> None:
    with pytest.raises(ManifestError) as ei:
        build(parse_documents(_workload_doc('{gpu-memory: "lots"}', "{cpu: 1}"), "w.yaml"))
    assert len(ei.value.errors) == 1
    assert "(Workload/a): metadata.annotations.gpu-memory: invalid quantity" in ei.value.errors[0]
    assert "nvidia.com/gpumem" not in ei.value.errors[0]


def _snapshot(guarantee_milli: int, *pending: Workload) -> Snapshot:
    nodes = [
        Node("small", "T4", 2, 16384, 64_000, 512_000),
        Node("big", "H100", 2, H100_MIB, 64_000, 512_000),
    ]
    quota = (PoolQuota("p", guarantee=(guarantee_milli, 10**9, 10**9, 10**9, 10**9)),)
    return Snapshot(
        nodes=tuple(nodes), pools=(ResourcePool("p"),), queues=(Queue("q", quotas=quota),), pending=pending
    )


def _kai(name: str, memory: int, replicas: int = 1) -> Workload:
    return Workload(name, "q", (PodGroup("main", replicas, PodRequest(gpu_memory_mib=memory)),))


def test_the_engine_charges_the_fraction_of_the_smallest_device_that_holds_it() -> None:
    d = decide(_snapshot(1000, _kai("w", 20000, replicas=3)))
    (a,) = d.admitted
    milli = math.ceil(20000 * 1000 / H100_MIB)
    assert {(p.node, p.devices, p.gpu_milli, p.gpu_memory_mib) for p in a.pods} == {
        ("big", (0,), milli, 20000)
    }
    # four pods (4 x 246 milli) fit a one-GPU guarantee; five do not, though memory alone would
    assert decide(_snapshot(1000, _kai("w", 20000, replicas=4))).admitted
    assert not decide(_snapshot(1000, _kai("w", 20000, replicas=5))).admitted


def test_a_share_no_device_holds_stays_pending_saying_so() -> None:
    d = decide(_snapshot(10_000, _kai("huge", 100_000)))
    assert not d.admitted and "100000Mi memory" in d.pending[0].reason


@given(
    memory=st.integers(1, 200_000),
    devices=st.lists(st.integers(1024, 200_000), min_size=1, max_size=6),
)
def test_the_share_never_counts_less_than_it_takes(memory: int, devices: list[int]) -> None:
    """On any device that can hold it, the charged milli covers the memory's fraction; when
    none can, it asks for a whole device."""
    m = share_milli(memory, devices)
    fit = [d for d in devices if d >= memory]
    assert 1 <= m <= 1000
    if not fit:
        assert m == 1000
    else:  # the fraction of the smallest device that holds it, rounded up to milli
        assert m * min(fit) >= memory * 1000 > (m - 1) * min(fit)


def test_submit_f_of_a_kai_job_carries_the_share_or_the_located_problem() -> None:
    """``gpupool submit -f job.yaml`` converts with the backend's own translation."""
    from gpupool.cli.kubeobjects import to_workload

    manifest, problem = to_workload(kai_job("kai", "20000"))
    assert problem is None and manifest is not None
    assert manifest["spec"]["podGroups"][0]["resources"] == {"cpu": "1000m", "nvidia.com/gpumem": 20000}
    manifest, problem = to_workload(kai_job("kai", "lots"))
    assert manifest is None and problem is not None
    assert problem.startswith("spec.template.metadata.annotations.gpu-memory: invalid quantity 'lots'")


def test_a_memory_only_share_pulled_into_a_cycles_window_is_resolved_too() -> None:
    """The controller passes pending work in windows and the engine pulls more of a queue
    through ``more``; a memory-only workload pulled that way is charged its fraction and given
    a device like one passed from the start (before: placed with no device and 0 milli, a pod
    with HAMi's memory annotation and no GPU at all; seen on the Kubernetes backend, issue 24)."""
    from gpupool.engine import Engine

    a, b = _kai("a", 20000), _kai("b", 20000)
    d = Engine(_snapshot(2000)).cycle([a], more=lambda w: b if w.name == "a" else None)
    milli = math.ceil(20000 * 1000 / H100_MIB)
    assert {
        (x.workload, p.node, p.devices, p.gpu_milli, p.gpu_memory_mib) for x in d.admitted for p in x.pods
    } == {
        ("a", "big", (0,), milli, 20000),
        ("b", "big", (0,), milli, 20000),
    }
