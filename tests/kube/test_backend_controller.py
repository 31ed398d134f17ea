"""End to end through the real controller: the engine decides, the Kubernetes backend binds pods
on the fake API server and on a real kube-apiserver (issue 24; workloads submitted as the kubectl
source would submit them)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpupool.kube import workloads
from gpupool.kube.adapters.backend import KubernetesBackend
from gpupool.kube.fake import FakeApiServer
from gpupool.manifests.convert import workload_model
from gpupool.service.config import EXAMPLES, seed_config
from gpupool.service.controller import Controller
from gpupool.store import Store
from tests.kube.cluster import Cluster, bound, job, pods_of

TRAINING = {"gpupool.io/environment": "training"}

#: the ``setup`` fixture's cluster: one 8-GPU HAMi node of the example config's training pool
ONE_TRAINING_NODE = pytest.mark.cluster_nodes(count=1, gpus=8, labels=TRAINING)
pytestmark = [pytest.mark.both_servers, ONE_TRAINING_NODE]


class Setup:
    """The example config's controller over a ``Cluster`` (``srv``: its object API)."""

    def __init__(self, cluster: Cluster | FakeApiServer, tmp_path: Path) -> None:
        self.cluster = cluster if isinstance(cluster, Cluster) else Cluster(cluster)
        self.srv = self.cluster
        self.store = Store.open(f"sqlite:///{tmp_path}/gpupool.db")
        seed_config(self.store, EXAMPLES / "cluster")
        self.be: KubernetesBackend = self.cluster.fresh()
        self.ctl = Controller(self.store, self.be, tick_s=0.05, min_interval_s=0.0)
        self.be.on_nodes_changed = self.ctl.nodes_changed
        self.ctl.recover()

    def submit(self, obj: dict[str, Any]) -> str:
        """Create the object and submit its workload, as gpupool.kube.adapters.source does."""
        self.srv.create(obj)
        got = self.srv.get("jobs.batch", self.cluster.ns, obj["metadata"]["name"])
        kw = workloads.workload_from_object(got)
        assert kw is not None
        rec, _ = self.store.submit_workload(kw.manifest, owner="system:kubernetes")
        self.ctl.submitted(rec, workload_model(kw.manifest, self.ctl.bundle.priority_classes, 0.0))
        name = str(kw.manifest["metadata"]["name"])
        end = time.monotonic() + 30
        while self.be.tracker.top_by_name(name) is None:  # the backend's cache saw the Job
            assert time.monotonic() < end
            time.sleep(0.02)
        return name

    def cycle_until(self, cond: Any, timeout: float = 30.0, what: str = "condition") -> None:
        end = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > end:
                raise AssertionError(f"timed out waiting for {what}")
            self.ctl.cycle()
            time.sleep(0.03)

    def phase(self, name: str) -> str:
        return self.store.get_workload(name).phase


@pytest.fixture
def setup(cluster: Cluster, tmp_path: Path) -> Iterator[Setup]:
    """The controller over ``cluster`` (a module using it marks itself ``ONE_TRAINING_NODE``)."""
    s = Setup(cluster, tmp_path)
    yield s
    s.store.close()  # (the cluster fixture closes the backends)


def prio(obj: dict[str, Any], cls: str) -> dict[str, Any]:
    obj["metadata"]["labels"]["gpupool.io/priority-class"] = cls
    return obj


def test_a_kueue_job_runs_to_success_through_the_controller(setup: Setup) -> None:
    assert [n.name for n in setup.ctl.nodes()] == setup.cluster.nodes  # the cluster's, not configured
    name = setup.submit(job("e2e", pods=2, run_s=30, gpus=4))
    setup.cycle_until(lambda: setup.phase(name) in ("Running", "Succeeded"), what="admitted")
    setup.cycle_until(lambda: len(bound(pods_of(setup.srv, "job-name=e2e"))) == 2, what="bound")
    devs = sorted(
        p["metadata"]["annotations"]["gpupool.io/gpu-indices"] for p in pods_of(setup.srv, "job-name=e2e")
    )
    assert devs == ["0,1,2,3", "4,5,6,7"]
    setup.cycle_until(lambda: setup.phase(name) == "Succeeded", what="succeeded")
    assert setup.cluster.violations() == []


def test_preemption_through_the_controller_waits_for_the_victim(setup: Setup) -> None:
    srv = setup.srv
    low = setup.submit(prio(job("low", pods=1, run_s=100_000, gpus=8), "evaluation"))
    setup.cycle_until(lambda: len(bound(pods_of(srv, "job-name=low"))) == 1, what="low bound")
    high = setup.submit(prio(job("high", pods=1, run_s=100_000, gpus=8), "training"))
    setup.cycle_until(lambda: setup.phase(low) in ("Pending", "Preempted"), what="the victim preempted")
    assert srv.get("jobs.batch", srv.ns, "low")["spec"]["suspend"] is True
    setup.cycle_until(lambda: len(bound(pods_of(srv, "job-name=high"))) == 1, what="the preemptor bound")
    assert setup.phase(high) == "Running"
    setup.cycle_until(
        lambda: all(p["status"].get("phase") == "Running" for p in pods_of(srv, "job-name=high")),
        what="the preemptor running",
    )
    assert srv.violations() == []  # never two pods on one device
    assert not bound(pods_of(srv, "job-name=low"))


def test_a_node_going_not_ready_requeues_its_work(setup: Setup) -> None:
    srv = setup.srv
    name = setup.submit(job("lost", pods=1, run_s=100_000, gpus=2))
    setup.cycle_until(lambda: len(bound(pods_of(srv, "job-name=lost"))) == 1, what="bound")
    node = srv.nodes[0]
    srv.set_node_ready(node, False)
    setup.cycle_until(lambda: setup.phase(name) == "Pending", what="requeued")
    rec = setup.store.get_workload(name)
    assert "NodeFailure" in rec.reason or node in rec.reason
    assert srv.get("jobs.batch", srv.ns, "lost")["spec"]["suspend"] is True
    setup.ctl.cycle()
    assert setup.phase(name) == "Pending"  # nothing new on a NotReady node


def test_a_node_flapped_not_ready_and_back_never_gives_a_device_twice(setup: Setup) -> None:
    """The node of a running Job flaps NotReady and comes back: the Job is requeued and bound
    again on the same devices, but only once its old pod (parked while the node was NotReady,
    then ended by the kubelet) is gone; no device is ever held by two pods (the pods'
    annotations read every cycle, and the kubelet's HAMi ledger)."""
    from gpupool.kube.exclusive import overbooked

    srv, seen = setup.srv, []

    def sampled(cond: Any) -> Any:
        def check() -> Any:
            seen.extend(o.message() for o in overbooked(srv.list("pods", srv.ns)))
            return cond()

        return check

    name = setup.submit(job("flap", pods=1, run_s=100_000, gpus=8))
    setup.cycle_until(sampled(lambda: len(bound(pods_of(srv, "job-name=flap"))) == 1), what="bound")
    (first,) = [p["metadata"]["uid"] for p in pods_of(srv, "job-name=flap")]
    node = srv.nodes[0]
    srv.set_node_ready(node, False)
    setup.cycle_until(sampled(lambda: setup.phase(name) == "Pending"), what="requeued")
    srv.set_node_ready(node, True)

    def running_again() -> bool:
        pods = pods_of(srv, "job-name=flap")
        return any(p["metadata"]["uid"] != first and p["status"].get("phase") == "Running" for p in pods)

    setup.cycle_until(sampled(running_again), 60, "the Job running again on its node")
    assert seen == []
    assert srv.violations() == []
