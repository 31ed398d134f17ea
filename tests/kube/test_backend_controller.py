"""End to end through the real controller: the engine decides, the Kubernetes backend binds pods
on the fake API server (workloads submitted as the kubectl source would submit them)."""

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
from tests.kube.test_backend import Cluster, bound, job, pods_of

TRAINING = {"gpupool.io/environment": "training"}


class Setup:
    def __init__(self, srv: FakeApiServer, tmp_path: Path) -> None:
        self.srv = srv
        self.cluster = Cluster(srv)
        self.store = Store.open(f"sqlite:///{tmp_path}/gpupool.db")
        seed_config(self.store, EXAMPLES / "cluster")
        self.be: KubernetesBackend = self.cluster.fresh()
        self.ctl = Controller(self.store, self.be, tick_s=0.05, min_interval_s=0.0)
        self.be.on_nodes_changed = self.ctl.nodes_changed
        self.ctl.recover()

    def submit(self, obj: dict[str, Any]) -> str:
        """Create the object and submit its workload, as gpupool.kube.adapters.source does."""
        self.srv.create(obj)
        got = self.srv.get("jobs.batch", "default", obj["metadata"]["name"])
        kw = workloads.workload_from_object(got)
        assert kw is not None
        rec, _ = self.store.submit_workload(kw.manifest, owner="system:kubernetes")
        self.ctl.submitted(rec, workload_model(kw.manifest, self.ctl.bundle.priority_classes, 0.0))
        name = str(kw.manifest["metadata"]["name"])
        end = time.monotonic() + 10
        while self.be.tracker.top_by_name(name) is None:  # the backend's cache saw the Job
            assert time.monotonic() < end
            time.sleep(0.02)
        return name

    def cycle_until(self, cond: Any, timeout: float = 20.0, what: str = "condition") -> None:
        end = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > end:
                raise AssertionError(f"timed out waiting for {what}")
            self.ctl.cycle()
            time.sleep(0.03)

    def phase(self, name: str) -> str:
        return self.store.get_workload(name).phase


@pytest.fixture
def setup(fake_server: FakeApiServer, tmp_path: Path) -> Iterator[Setup]:
    fake_server.add_gpu_nodes(1, gpus=8, hami=True, labels=TRAINING)
    s = Setup(fake_server, tmp_path)
    yield s
    s.cluster.close()
    s.store.close()


def prio(obj: dict[str, Any], cls: str) -> dict[str, Any]:
    obj["metadata"]["labels"]["gpupool.io/priority-class"] = cls
    return obj


def test_a_kueue_job_runs_to_success_through_the_controller(setup: Setup) -> None:
    assert [n.name for n in setup.ctl.nodes()] == ["gpu-node-0000"]  # the cluster's, not configured
    name = setup.submit(job("e2e", pods=2, run_s=30, gpus=4))
    setup.cycle_until(lambda: setup.phase(name) in ("Running", "Succeeded"), what="admitted")
    setup.cycle_until(lambda: len(bound(pods_of(setup.srv, "job-name=e2e"))) == 2, what="bound")
    devs = sorted(
        p["metadata"]["annotations"]["gpupool.io/gpu-indices"] for p in pods_of(setup.srv, "job-name=e2e")
    )
    assert devs == ["0,1,2,3", "4,5,6,7"]
    setup.cycle_until(lambda: setup.phase(name) == "Succeeded", what="succeeded")
    assert setup.srv.stats.violations == []


def test_preemption_through_the_controller_waits_for_the_victim(setup: Setup) -> None:
    srv = setup.srv
    low = setup.submit(prio(job("low", pods=1, run_s=100_000, gpus=8), "evaluation"))
    setup.cycle_until(lambda: len(bound(pods_of(srv, "job-name=low"))) == 1, what="low bound")
    high = setup.submit(prio(job("high", pods=1, run_s=100_000, gpus=8), "training"))
    setup.cycle_until(lambda: setup.phase(low) in ("Pending", "Preempted"), what="the victim preempted")
    assert srv.get("jobs.batch", "default", "low")["spec"]["suspend"] is True
    setup.cycle_until(lambda: len(bound(pods_of(srv, "job-name=high"))) == 1, what="the preemptor bound")
    assert setup.phase(high) == "Running"
    setup.cycle_until(
        lambda: all(p["status"].get("phase") == "Running" for p in pods_of(srv, "job-name=high")),
        what="the preemptor running",
    )
    assert srv.stats.violations == []  # never two pods on one device
    assert not bound(pods_of(srv, "job-name=low"))


def test_a_node_going_not_ready_requeues_its_work(setup: Setup) -> None:
    srv = setup.srv
    name = setup.submit(job("lost", pods=1, run_s=100_000, gpus=2))
    setup.cycle_until(lambda: len(bound(pods_of(srv, "job-name=lost"))) == 1, what="bound")
    srv.set_node_ready("gpu-node-0000", False)
    setup.cycle_until(lambda: setup.phase(name) == "Pending", what="requeued")
    rec = setup.store.get_workload(name)
    assert "NodeFailure" in rec.reason or "gpu-node-0000" in rec.reason
    assert srv.get("jobs.batch", "default", "lost")["spec"]["suspend"] is True
    setup.ctl.cycle()
    assert setup.phase(name) == "Pending"  # nothing new on a NotReady node
