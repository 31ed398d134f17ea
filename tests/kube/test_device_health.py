"""HAMi's per-device health on Kubernetes (issue 23): a device its register reports unhealthy is
not given out, the work on it is requeued, and it is given back once healthy again. On both the
fake and the real API server (issue 24)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpupool.kube import annotations as kube_ann
from gpupool.kube.inventory import HAMI_REGISTER
from tests.kube.cluster import Cluster, bound, job, pods_of
from tests.kube.test_backend_controller import ONE_TRAINING_NODE, Setup, setup

__all__ = ["setup"]  # the fixture (one 8-GPU HAMi node), imported for pytest

pytestmark = [pytest.mark.both_servers, ONE_TRAINING_NODE]


def _set_health(srv: Cluster, indices: set[int], healthy: bool) -> None:
    (name,) = srv.nodes
    node = srv.get("nodes", "", name)
    devs = json.loads(node["metadata"]["annotations"][HAMI_REGISTER])
    for d in devs:
        if d["index"] in indices:
            d["health"] = healthy
    srv.patch("nodes", "", name, {"metadata": {"annotations": {HAMI_REGISTER: json.dumps(devs)}}})


def _devices_of(srv: Cluster, selector: str) -> set[int]:
    out: set[int] = set()
    for p in pods_of(srv, selector):
        if p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp"):
            out |= {int(i) for i in p["metadata"]["annotations"][kube_ann.GPU_INDICES].split(",")}
    return out


def test_an_unhealthy_device_is_not_given_out_and_its_work_is_requeued(setup: Setup) -> None:
    srv, (node,) = setup.srv, setup.cluster.nodes
    name = setup.submit(job("sick", pods=1, run_s=100_000, gpus=1))
    setup.cycle_until(lambda: len(bound(pods_of(srv, "job-name=sick"))) == 1, what="bound")
    (dev,) = _devices_of(srv, "job-name=sick")
    _set_health(srv, {dev}, False)

    def evicted() -> list[Any]:
        return [a for a in setup.store.audit_records() if a.action == "workload.evict" and a.name == name]

    setup.cycle_until(evicted, what="evicted off the unhealthy device")
    assert evicted()[0].detail["code"] == "DeviceUnhealthy"
    assert dev in setup.ctl.faults.unhealthy.get(node, {})
    setup.cycle_until(
        lambda: setup.phase(name) == "Running" and _devices_of(srv, "job-name=sick"),
        timeout=60,
        what="placed again",
    )
    assert dev not in _devices_of(srv, "job-name=sick")
    _set_health(srv, {dev}, True)
    setup.cycle_until(lambda: dev not in setup.ctl.faults.unhealthy.get(node, {}), what="given back")
    assert srv.violations() == []
