"""Device exclusivity (issue 23): a device is never held by more pods than it can take, checked
before every bind and by a checker that reads every pod's device annotations. The backend's part
runs on both the fake and the real API server (issue 24)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from gpupool.kube import annotations as kube_ann
from gpupool.kube.exclusive import PassTally, overbooked
from gpupool.service.backends import RunSpec
from tests.kube.cluster import Cluster, job, known, placement, pods_of, wait_for

pytestmark = pytest.mark.both_servers  # the tests with a cluster


def _slow_to_stop(obj: dict[str, Any], grace: int = 300) -> dict[str, Any]:
    obj["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = grace
    return obj


def test_a_readmitted_workload_waits_for_its_own_terminating_pods(cluster: Cluster) -> None:
    """A Job stopped and admitted again onto the same devices (a node flap's requeue) must not
    bind its new pod while its old pod still terminates on them: they are the same devices."""
    srv, ns, node0 = cluster, cluster.ns, cluster.nodes[0]
    be = cluster.fresh()
    srv.create(_slow_to_stop(job("train", pods=1, run_s=10_000)))
    name = cluster.workload("job", "train")
    wait_for(lambda: known(be, name), what="the Job in the cache")
    be.start([RunSpec(name, placement(("main", 0, node0, [3])))])
    wait_for(lambda: [p for p in pods_of(srv, "job-name=train") if p["status"].get("phase") == "Running"])
    old = pods_of(srv, "job-name=train")[0]["metadata"]["name"]
    be.stop([name])
    wait_for(lambda: srv.get("pods", ns, old)["metadata"].get("deletionTimestamp"), what="terminating")
    time.sleep(0.05)
    be.start([RunSpec(name, placement(("main", 0, node0, [3])))])  # a new admission, same devices
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline and srv.list("pods", ns, field_selector=f"metadata.name={old}"):
        shared = overbooked(srv.list("pods", ns))
        assert not shared, [o.message() for o in shared]
        time.sleep(0.02)
    assert srv.violations() == []
    wait_for(
        lambda: [p for p in pods_of(srv, "job-name=train") if p["spec"].get("nodeName") == node0],
        timeout=60,
        what="the new pod bound once the old one is gone",
    )
    assert srv.violations() == []


def _bound(
    name: str,
    node: str,
    devices: str,
    milli: int,
    *,
    uuids: str = "",
    phase: str = "Running",
    deleting: bool = False,
) -> dict[str, Any]:
    ann = {
        kube_ann.WORKLOAD: "w",
        kube_ann.PODSET: "main",
        kube_ann.POD_INDEX: "0",
        kube_ann.NODE: node,
        kube_ann.GPU_INDICES: devices,
        kube_ann.GPU_MILLI: str(milli),
        kube_ann.GPU_MEMORY_MIB: "40000",
    }
    if uuids:
        ann[kube_ann.GPU_UUIDS] = uuids
    md: dict[str, Any] = {"name": name, "namespace": "ml", "annotations": ann}
    if deleting:
        md["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    return {"metadata": md, "spec": {"nodeName": node}, "status": {"phase": phase}}


def test_the_checker_counts_terminating_pods_and_ignores_ended_ones() -> None:
    a = _bound("a", "n0", "3", 1000, uuids="GPU-3")
    b = _bound("b", "n0", "3", 1000, uuids="GPU-3", deleting=True)
    done = _bound("c", "n0", "3", 1000, uuids="GPU-3", phase="Succeeded")
    other_node = _bound("d", "n1", "3", 1000)
    got = overbooked([a, b, done, other_node])
    assert [(o.node, o.device, o.pods, o.milli) for o in got] == [("n0", "GPU-3", ("ml/a", "ml/b"), 2000)]
    assert "ml/a, ml/b" in got[0].message()
    assert overbooked([a, done, other_node]) == []


def test_the_checker_lets_shares_fit_and_reports_compute_or_memory_beyond_the_device() -> None:
    halves = [_bound("a", "n0", "0", 500), _bound("b", "n0", "0", 500)]
    assert overbooked(halves) == []
    assert overbooked([*halves, _bound("c", "n0", "0", 100)])[0].milli == 1100
    mem = {("n0", "#0"): 81559}
    assert overbooked(halves, mem) == []
    three = [_bound(n, "n0", "0", 300) for n in "xyz"]  # 900 milli, 120,000 MiB
    got = overbooked(three, mem)
    assert len(got) == 1 and "120000 of 81559 MiB" in got[0].message()


def test_one_pass_never_gives_out_a_device_twice() -> None:
    """The bind-time proof: what a pass already gave out counts for the next gang; a gang that
    would overfill any device takes nothing; the pods being bound are left out of the count."""
    held = {"n0": {0: 500, 1: 1000}}
    seen: list[object] = []

    def use(node: str, exclude: object) -> dict[int, int]:
        seen.append(exclude)
        return held.get(node, {})

    t = PassTally(use)
    assert t.claim([("n0", [0], 500)], {"a"})
    assert not t.claim([("n0", [0], 100)], {"b"})  # 500 held + 500 given out this pass
    assert not t.claim([("n0", [2], 1000), ("n0", [1], 1000)], {"c"})  # all or nothing
    assert t.taking == {("n0", 0): 500}
    assert t.claim([("n0", [2], 500), ("n0", [2], 500)], {"d"})  # two halves of one free device
    assert not t.claim([("n0", [2], 1)], set())
    assert seen[0] == {"a"}
