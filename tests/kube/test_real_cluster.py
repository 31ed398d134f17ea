"""Opt-in checks against a real cluster: set ``GPUPOOL_TEST_KUBECONFIG`` to a kubeconfig.

What runs there, and why it is safe on a shared cluster: read-only checks (discovery, nodes as
inventory, the informer caches sync), then in a namespace the suite creates and deletes: the
leader Lease round trip and one tiny Job (default scheduler, no GPU, ``true``) watched to
completion and translated the way the source would. It never runs gpupool's scheduler there, so
it binds, suspends and writes events on nothing but its own objects.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Iterator
from typing import Any

import pytest

KUBECONFIG = os.environ.get("GPUPOOL_TEST_KUBECONFIG", "")
pytestmark = pytest.mark.skipif(
    not KUBECONFIG, reason="GPUPOOL_TEST_KUBECONFIG is not set: no real cluster to test against"
)


@pytest.fixture(scope="module")
def api() -> Iterator[Any]:
    from gpupool.kube.client import KubeApi, make_client

    a = KubeApi(make_client(KUBECONFIG, os.environ.get("GPUPOOL_TEST_CONTEXT") or None))
    yield a
    a.close()


@pytest.fixture(scope="module")
def namespace(api: Any) -> Iterator[str]:
    from gpupool.kube.client import Resource

    ns = f"gpupool-test-{secrets.token_hex(3)}"
    namespaces = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
    api.create(namespaces, None, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    yield ns
    api.delete(namespaces, None, ns)


def test_core_kinds_are_served(api: Any) -> None:
    from gpupool.kube.client import RESOURCES

    for kind in ("nodes", "pods", "events", "jobs", "leases", "deployments", "statefulsets"):
        assert api.served(RESOURCES[kind]), kind


def test_every_node_reads_as_inventory(api: Any) -> None:
    """A node gpupool cannot read becomes not-ready with a reason, never an exception."""
    from gpupool.kube import inventory
    from gpupool.kube.client import RESOURCES

    nodes, rv = api.list(RESOURCES["nodes"])
    assert rv and nodes
    for n in nodes:
        inv = inventory.node_inventory(n)
        assert inv.node.name == n["metadata"]["name"]
        assert inv.ready or inv.unschedulable_reason, n["metadata"]["name"]  # a reason when it takes no work


def test_informer_caches_sync(api: Any) -> None:
    from gpupool.kube.runtime.informer import Informers

    infs = Informers(api, kinds=("nodes", "pods", "jobs"))
    infs.start()
    try:
        assert infs.wait_synced(120), infs.stats()
        assert len(infs.nodes) > 0
    finally:
        infs.stop()


def test_lease_round_trip(api: Any, namespace: str) -> None:
    from gpupool.kube.runtime.lease import KubeApiLeases, KubeLease, KubeLeaseSettings

    s = KubeLeaseSettings(namespace=namespace, name="gpupool-test")
    a = KubeLease(KubeApiLeases(api), s, identity="test-a")
    b = KubeLease(KubeApiLeases(api), s, identity="test-b")
    assert a.step() is True and b.step() is False
    a.stop()  # releases
    assert b.step() is True
    b.stop()


def test_a_tiny_job_runs_and_reads_as_a_workload(api: Any, namespace: str) -> None:
    from gpupool.kube import workloads
    from gpupool.kube.client import RESOURCES

    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "tiny", "namespace": namespace},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "main", "image": "busybox", "command": ["true"]}],
                }
            },
        },
    }
    created = api.create(RESOURCES["jobs"], namespace, job)
    kw = workloads.workload_from_object(created, workloads.WorkloadDefaults({namespace: "llm-research"}))
    assert kw is not None and kw.ref.name == "tiny" and kw.suspendable
    end = time.monotonic() + 180
    while time.monotonic() < end:
        got = api.get(RESOURCES["jobs"], namespace, "tiny")
        if (got.get("status") or {}).get("succeeded"):
            break
        time.sleep(2)
    else:
        pytest.fail("the tiny Job did not complete within 180 s (image pull, or no schedulable node)")
