"""Kueue's ``waitForPodsReady`` on the Kubernetes backend: the setting (checked, errors naming the
field), a gang held Pending past the timeout evicted with ``PodsReadyTimeout`` (pods gone, Job
re-suspended, an Event, a requeue with backoff through the controller), and a gang that starts
in time left alone. The kubelet (the fake's, or the node agent on the real server: the backend
tests run on both, issue 24) holds pods Pending with ``fake.gpupool.io/start-seconds``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpupool.kube import workloads
from gpupool.kube.fake.kubelet import START_SECONDS
from gpupool.kube.outcomes import PODS_READY_TIMEOUT, PodsReadyPolicy, pods_ready_policy
from gpupool.kube.wiring import PODS_READY_ENV, kube_options
from gpupool.manifests.convert import workload_model
from gpupool.service.backends import RunSpec
from gpupool.service.config import EXAMPLES, seed_config
from gpupool.service.controller import Controller
from gpupool.service.failures.policy import PLATFORM_FAULTS
from gpupool.store import Store
from tests.kube.cluster import Cluster, bound, job, known, placement, pods_of, wait_for

TRAINING = {"gpupool.io/environment": "training"}


def held_job(name: str, hold_s: float, pods: int = 2, **kw: Any) -> dict[str, Any]:
    """A Kueue-style Job whose pods stay Pending (ContainerCreating) ``hold_s`` after their bind
    (seconds before the fake server's time scale)."""
    obj = job(name, pods=pods, **kw)
    obj["spec"]["template"]["metadata"]["annotations"][START_SECONDS] = str(hold_s)
    return obj


# -- the setting ----------------------------------------------------------------------------
def test_the_setting_is_off_by_default_and_reads_kueues_fields() -> None:
    assert pods_ready_policy(None) == PodsReadyPolicy(None)
    assert pods_ready_policy({"enable": False, "timeout": "1m"}).timeout_s is None
    assert pods_ready_policy({"enable": True}).timeout_s == 300.0  # Kueue's default: 5 minutes
    assert pods_ready_policy({"timeout": "2m30s"}).timeout_s == 150.0
    assert pods_ready_policy("90s").timeout_s == 90.0
    assert pods_ready_policy(12).timeout_s == 12.0


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"enable": "yes"}, "waitForPodsReady.enable: expected true or false"),
        ({"timeout": "soon"}, "waitForPodsReady.timeout:"),
        ({"timeout": 0}, "waitForPodsReady.timeout: must be more than 0"),
        ({"timeout": "5m", "requeuingStrategy": {}}, "waitForPodsReady.requeuingStrategy: unknown field"),
        ([1, 2], "waitForPodsReady: expected a mapping"),
        (True, "waitForPodsReady: expected a mapping"),
    ],
)
def test_a_bad_setting_names_its_field(doc: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        pods_ready_policy(doc)


def test_serve_reads_the_setting_from_its_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PODS_READY_ENV, "{enable: true, timeout: 45s}")
    assert kube_options(None, None, [], False, "default").pods_ready.timeout_s == 45.0
    monkeypatch.setenv(PODS_READY_ENV, "{timeout: never}")
    with pytest.raises(ValueError, match=f"{PODS_READY_ENV}: waitForPodsReady.timeout:"):
        kube_options(None, None, [], False, "default")
    monkeypatch.delenv(PODS_READY_ENV)
    assert kube_options(None, None, [], False, "default").pods_ready.timeout_s is None


def test_a_timeout_is_not_a_platform_fault() -> None:
    """So the requeue counts under the workload's retry policy (backoff, then final failure),
    as Kueue's requeuingStrategy backs off and finally deactivates a workload."""
    assert PODS_READY_TIMEOUT not in PLATFORM_FAULTS


# -- the backend, on both servers ---------------------------------------------------------
@pytest.mark.both_servers
def test_a_gang_held_pending_past_the_timeout_is_evicted(cluster: Cluster) -> None:
    srv = cluster
    be = cluster.fresh(pods_ready=PodsReadyPolicy(1.0))
    srv.create(held_job("slow", hold_s=100_000, run_s=100_000))  # 1,000 s after time scaling
    name = srv.workload("job", "slow")
    wait_for(lambda: known(be, name), what="the Job in the cache")
    be.start([RunSpec(name, placement(("main", 0, srv.nodes[0], [0]), ("main", 1, srv.nodes[0], [1])))])
    wait_for(lambda: len(bound(pods_of(srv, "job-name=slow"))) == 2, what="both bound")
    pods = pods_of(srv, "job-name=slow")
    assert {p["status"]["phase"] for p in pods} == {"Pending"}  # held by the kubelet
    assert be.poll(time.time()) == []  # not yet: the timeout has not passed
    done = wait_for(lambda: be.poll(time.time()), timeout=20, what="the podsReady timeout")
    assert [(r.name, r.outcome, r.reason) for r in done] == [(name, "Failed", PODS_READY_TIMEOUT)]
    assert "2 of 2 pods not ready 1s after admission" in done[0].message
    assert "Pending (ContainerCreating)" in done[0].message
    wait_for(lambda: not bound(pods_of(srv, "job-name=slow")), what="the held pods removed")
    be.forget([name])
    assert srv.get("jobs.batch", srv.ns, "slow")["spec"]["suspend"] is True
    reasons = {e.get("reason") for e in srv.list("events", srv.ns)}
    assert PODS_READY_TIMEOUT in reasons
    assert srv.violations() == []


@pytest.mark.both_servers
def test_a_gang_ready_in_time_is_never_evicted(cluster: Cluster) -> None:
    srv = cluster
    be = cluster.fresh(pods_ready=PodsReadyPolicy(1.0))
    srv.create(held_job("quick", hold_s=10, run_s=100_000))  # Pending for 0.1 s, then Running
    name = srv.workload("job", "quick")
    wait_for(lambda: known(be, name), what="the Job in the cache")
    be.start([RunSpec(name, placement(("main", 0, srv.nodes[0], [0]), ("main", 1, srv.nodes[0], [1])))])
    wait_for(
        lambda: [p["status"]["phase"] for p in pods_of(srv, "job-name=quick")] == ["Running"] * 2,
        what="both running",
    )
    wait_for(lambda: be.runs()[name] and be._runs[name].ready, what="the gang seen ready")
    assert be.ready_pass(time.time() + 3600) == 0  # long past the timeout: still left alone
    assert be.poll(time.time()) == []
    assert len(bound(pods_of(srv, "job-name=quick"))) == 2


@pytest.mark.both_servers
def test_without_the_setting_a_held_gang_waits(cluster: Cluster) -> None:
    srv = cluster
    be = cluster.fresh()
    srv.create(held_job("wait", hold_s=100_000, run_s=100_000))
    name = srv.workload("job", "wait")
    wait_for(lambda: known(be, name), what="the Job in the cache")
    be.start([RunSpec(name, placement(("main", 0, srv.nodes[0], [0]), ("main", 1, srv.nodes[0], [1])))])
    wait_for(lambda: len(bound(pods_of(srv, "job-name=wait"))) == 2, what="both bound")
    assert be.ready_pass(time.time() + 3600) == 0
    assert be.poll(time.time()) == []


# -- through the controller: evicted, requeued with the reason and a backoff ----------------
class Setup:
    def __init__(self, cluster: Cluster, tmp_path: Path) -> None:
        self.srv = self.cluster = cluster
        self.store = Store.open(f"sqlite:///{tmp_path}/gpupool.db")
        seed_config(self.store, EXAMPLES / "cluster")
        self.be = self.cluster.fresh(pods_ready=PodsReadyPolicy(1.0))
        self.ctl = Controller(self.store, self.be, tick_s=0.05, min_interval_s=0.0)
        self.be.on_nodes_changed = self.ctl.nodes_changed
        self.ctl.recover()

    def submit(self, obj: dict[str, Any]) -> str:
        self.srv.create(obj)
        kw = workloads.workload_from_object(self.srv.get("jobs.batch", self.srv.ns, obj["metadata"]["name"]))
        assert kw is not None
        rec, _ = self.store.submit_workload(kw.manifest, owner="system:kubernetes")
        self.ctl.submitted(rec, workload_model(kw.manifest, self.ctl.bundle.priority_classes, 0.0))
        name = str(kw.manifest["metadata"]["name"])
        wait_for(lambda: self.be.tracker.top_by_name(name), what="the Job in the backend's cache")
        return name

    def cycle_until(self, cond: Any, timeout: float = 30.0, what: str = "condition") -> None:
        end = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > end:
                raise AssertionError(f"timed out waiting for {what}")
            self.ctl.cycle()
            time.sleep(0.03)


@pytest.fixture
def setup(cluster: Cluster, tmp_path: Path) -> Iterator[Setup]:
    """The controller over ``cluster`` (its test marks one 8-GPU training node)."""
    s = Setup(cluster, tmp_path)
    yield s
    s.store.close()  # (the cluster fixture closes the backend)


@pytest.mark.both_servers
@pytest.mark.cluster_nodes(count=1, gpus=8, labels=TRAINING)
def test_the_controller_requeues_a_timed_out_gang_with_its_reason_and_a_backoff(setup: Setup) -> None:
    srv = setup.srv
    name = setup.submit(held_job("stuck", hold_s=100_000, pods=2, run_s=100_000, gpus=4))
    setup.cycle_until(lambda: len(bound(pods_of(srv, "job-name=stuck"))) == 2, what="bound")
    setup.cycle_until(lambda: setup.store.get_workload(name).phase == "Pending", what="evicted and requeued")
    rec = setup.store.get_workload(name)
    assert rec.reason.startswith("Backoff: retry 1 of"), rec.reason
    failures = [e for e in setup.store.list_events(name) if e.reason == "RunFailed"]
    assert failures and PODS_READY_TIMEOUT in failures[-1].message
    setup.cycle_until(
        lambda: srv.get("jobs.batch", srv.ns, "stuck")["spec"]["suspend"] is True, what="re-suspended"
    )
    setup.cycle_until(lambda: not bound(pods_of(srv, "job-name=stuck")), what="its pods gone")
    for _ in range(5):  # in backoff: not admitted again at once
        setup.ctl.cycle()
    assert setup.store.get_workload(name).phase == "Pending"
    assert srv.violations() == []
