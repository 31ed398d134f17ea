"""The Kubernetes backend over HTTP against the fake API server: admission (unsuspend + bind with
the device annotations), gangs, preemption, failures, node readiness, conflicts, restart."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from gpupool.kube import annotations as kube_ann
from gpupool.kube.adapters.backend import KubernetesBackend
from gpupool.kube.client import KubeApi, make_client
from gpupool.kube.fake import FakeApiServer
from gpupool.kube.fake.faults import FaultConfig
from gpupool.kube.runtime.evictor import ADMISSION
from gpupool.kube.runtime.informer import Informers
from gpupool.service.backends import BackendError, RunSpec
from tests.test_service_support import wait_for as support_wait_for

NODE0, NODE1 = "gpu-node-0000", "gpu-node-0001"
QUEUE = {"kueue.x-k8s.io/queue-name": "llm-research"}


def wait_for(fn: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    return support_wait_for(fn, timeout, what)


def template(run_s: float = 100, exit_code: int = 0, gpus: int = 1) -> dict[str, Any]:
    ann = {"fake.gpupool.io/run-seconds": str(run_s)}
    if exit_code:
        ann["fake.gpupool.io/exit-code"] = str(exit_code)
    return {
        "metadata": {"annotations": ann},
        "spec": {
            "schedulerName": "gpupool",
            "restartPolicy": "Never",
            "containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": gpus}}}],
        },
    }


def job(name: str, pods: int = 2, **tpl: Any) -> dict[str, Any]:
    """A Job as written for Kueue: queue label, suspended, indexed."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": "default", "labels": dict(QUEUE)},
        "spec": {
            "suspend": True,
            "parallelism": pods,
            "completions": pods,
            "completionMode": "Indexed",
            "backoffLimit": 0,
            "template": template(**tpl),
        },
    }


def bare_pod(name: str, group: str | None = None, **tpl: Any) -> dict[str, Any]:
    t = template(**tpl)
    labels = dict(QUEUE)
    if group:
        labels["scheduling.x-k8s.io/pod-group"] = group
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": labels, **t["metadata"]},
        "spec": t["spec"],
    }


def placement(*pods: tuple[str, int, str, list[int]], milli: int = 1000) -> dict[str, Any]:
    return {
        "pool": "p",
        "admittedAt": time.time(),
        "pods": [
            {"group": g, "index": i, "node": n, "devices": d, "gpuMilli": milli, "gpuMemoryMiB": 81559}
            for g, i, n, d in pods
        ],
    }


class Cluster:
    """A backend (and its caches) on the fake server; ``fresh()`` makes another one (a restart)."""

    def __init__(self, srv: FakeApiServer) -> None:
        self.srv = srv
        self.made: list[tuple[KubernetesBackend, Informers, KubeApi]] = []

    def fresh(self, **kw: Any) -> KubernetesBackend:
        api = KubeApi(make_client(str(self.srv.kubeconfig)))
        infs = Informers(api)
        kw.setdefault("bind_deadline_s", 5.0)
        kw.setdefault("backoff_s", (0.02, 0.2))
        be = KubernetesBackend(api, infs, **kw)
        be.run(10)
        self.made.append((be, infs, api))
        return be

    def close(self) -> None:
        for be, infs, api in self.made:
            be.close()
            infs.stop()
            api.close()


def pods_of(srv: FakeApiServer, selector: str) -> list[dict[str, Any]]:
    return srv.list("pods", "default", label_selector=selector)


def known(be: KubernetesBackend, name: str) -> bool:
    return be.tracker.top_by_name(name) is not None


def bound(pods: list[dict[str, Any]]) -> dict[str, str]:
    return {p["metadata"]["name"]: p["spec"].get("nodeName", "") for p in pods if p["spec"].get("nodeName")}


def test_kueue_job_is_unsuspended_and_bound_with_device_annotations(cluster: Cluster) -> None:
    srv = cluster.srv
    be = cluster.fresh()
    srv.create(job("train", pods=2, run_s=50))
    name = "default.job.train"
    wait_for(lambda: known(be, name), what="the Job in the cache")
    be.start([RunSpec(name, placement(("main", 0, NODE0, [2]), ("main", 1, NODE1, [5])), 30.0)])
    got = srv.get("jobs.batch", "default", "train")
    assert got["spec"]["suspend"] is False
    assert '"workload":"default.job.train"' in got["metadata"]["annotations"][ADMISSION]
    pods = wait_for(lambda: len(bound(p := pods_of(srv, "job-name=train"))) == 2 and p, what="both bound")
    by_index = {p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]: p for p in pods}
    p0, p1 = by_index["0"], by_index["1"]
    assert (p0["spec"]["nodeName"], p1["spec"]["nodeName"]) == (NODE0, NODE1)
    a0 = p0["metadata"]["annotations"]
    assert a0[kube_ann.WORKLOAD] == name and a0[kube_ann.GPU_INDICES] == "2"
    assert a0[kube_ann.GPU_MILLI] == "1000" and a0[kube_ann.GPU_MEMORY_MIB] == "81559"
    uuid = a0[kube_ann.GPU_UUIDS]
    assert a0[kube_ann.HAMI_TO_ALLOCATE] == f"{uuid},NVIDIA,81559,100:;"
    assert a0[kube_ann.HAMI_NODE] == NODE0
    # admitted by the kubelet: Running, or already Succeeded (they run 0.5 s: on a loaded machine
    # a wait for "all Running" could look only after they finished, which is what once flaked)
    started = ("Running", "Succeeded")
    wait_for(
        lambda: all(p["status"].get("phase") in started for p in pods_of(srv, "job-name=train")),
        timeout=60,
        what="both pods admitted by the kubelet",
    )
    assert all(
        a["metadata"]["annotations"][kube_ann.HAMI_BIND_PHASE] == "success"
        for a in pods_of(srv, "job-name=train")
    )
    done = wait_for(lambda: be.poll(time.time()), timeout=60, what="the Job to complete")
    assert [(r.name, r.outcome) for r in done] == [(name, "Succeeded")]
    assert srv.stats.violations == []
    be.forget([name])
    assert ADMISSION not in (srv.get("jobs.batch", "default", "train")["metadata"].get("annotations") or {})


def test_a_gang_binds_all_at_once_or_not_at_all(cluster: Cluster) -> None:
    srv = cluster.srv
    be = cluster.fresh()
    srv.create(bare_pod("g-a", group="g"))
    wait_for(lambda: be.informers.pods.get("default", "g-a"), what="the first pod")
    name = be.tracker.name_of(be.tracker.top_owner(be.informers.pods.get("default", "g-a") or {}))
    name = name or "default.podgroup.g"
    wait_for(lambda: known(be, name), what="the pod group in the cache")
    be.start([RunSpec(name, placement(("main", 0, NODE0, [0]), ("main", 1, NODE0, [1])))])
    time.sleep(0.5)  # several reconcile passes with one of two pods
    assert bound(pods_of(srv, "scheduling.x-k8s.io/pod-group=g")) == {}
    srv.create(bare_pod("g-b", group="g"))
    wait_for(lambda: len(bound(pods_of(srv, "scheduling.x-k8s.io/pod-group=g"))) == 2, what="both bound")
    assert srv.stats.violations == []


def test_unknown_workload_is_refused(cluster: Cluster) -> None:
    be = cluster.fresh()
    with pytest.raises(BackendError, match="no Kubernetes object"):
        be.start([RunSpec("default.job.nothing", placement(("main", 0, NODE0, [0])))])
    assert be.runs() == {}


def test_preemption_resuspends_a_job_and_deletes_a_bare_pod(cluster: Cluster) -> None:
    srv = cluster.srv
    be = cluster.fresh()
    srv.create(job("victim", pods=1, run_s=10_000))
    srv.create(bare_pod("solo", run_s=10_000))
    wait_for(lambda: known(be, "default.job.victim") and known(be, "default.pod.solo"))
    be.start(
        [
            RunSpec("default.job.victim", placement(("main", 0, NODE0, [0]))),
            RunSpec("default.pod.solo", placement(("main", 0, NODE1, [0]))),
        ]
    )
    wait_for(lambda: len(bound(pods_of(srv, "job-name=victim"))) == 1, what="the job's pod bound")
    wait_for(lambda: bound([srv.get("pods", "default", "solo")]), what="the bare pod bound")
    be.stop(["default.job.victim", "default.pod.solo"])
    j = srv.get("jobs.batch", "default", "victim")
    assert j["spec"]["suspend"] is True and ADMISSION not in (j["metadata"].get("annotations") or {})
    solo = srv.list("pods", "default", field_selector="metadata.name=solo")
    if solo:  # still inside its grace period: marked and deleting
        conds = {c["type"]: c for c in solo[0]["status"].get("conditions") or []}
        assert conds["DisruptionTarget"]["reason"] == "PreemptionByScheduler"
        assert solo[0]["metadata"].get("deletionTimestamp")
    wait_for(lambda: not srv.list("pods", "default", field_selector="metadata.name=solo"), what="deleted")
    wait_for(lambda: not pods_of(srv, "job-name=victim"), what="the Job controller to remove its pods")
    reasons = {
        e["involvedObject"]["name"]: e["reason"]
        for e in srv.list("events", "default")
        if e.get("source", {}).get("component") == "gpupool"
    }
    assert reasons.get("victim") == "Stopped"
    assert be.runs() == {}


def test_freed_devices_wait_for_the_victims(cluster: Cluster) -> None:
    srv = cluster.srv
    be = cluster.fresh()
    srv.create(bare_pod("old", run_s=10_000))
    wait_for(lambda: known(be, "default.pod.old"))
    be.start([RunSpec("default.pod.old", placement(("main", 0, NODE0, [3])))])
    wait_for(lambda: srv.get("pods", "default", "old")["status"].get("phase") == "Running")
    srv.patch("pods", "default", "old", {"spec": {"terminationGracePeriodSeconds": 100}})
    srv.create(bare_pod("new", run_s=10_000))
    wait_for(lambda: known(be, "default.pod.new"))
    be.stop(["default.pod.old"])
    be.start([RunSpec("default.pod.new", placement(("main", 0, NODE0, [3])))])
    time.sleep(0.3)  # the victim is still terminating (grace 100 x 0.01 s)
    if srv.list("pods", "default", field_selector="metadata.name=old"):
        assert not srv.get("pods", "default", "new")["spec"].get("nodeName")
    wait_for(lambda: srv.get("pods", "default", "new")["spec"].get("nodeName") == NODE0, what="bound after")
    wait_for(lambda: srv.get("pods", "default", "new")["status"].get("phase") == "Running")
    assert srv.stats.violations == []


def test_a_failed_pod_is_a_failed_run_with_its_exit_code(cluster: Cluster) -> None:
    srv = cluster.srv
    be = cluster.fresh()
    srv.create(job("oom", pods=1, run_s=5, exit_code=137))
    wait_for(lambda: known(be, "default.job.oom"))
    be.start([RunSpec("default.job.oom", placement(("main", 0, NODE0, [0])))])
    done = wait_for(lambda: be.poll(time.time()), what="the failure")
    assert [(r.outcome, r.exit_code, r.reason) for r in done] == [("Failed", 137, "OOMKilled")]


def test_not_ready_node_is_down_and_cordoned_is_unschedulable(cluster: Cluster) -> None:
    srv = cluster.srv
    be = cluster.fresh()
    assert {n.name for n in be.observed_nodes()} == {NODE0, NODE1}
    assert all(n.gpu_count == 8 for n in be.observed_nodes())
    assert be.down_nodes(time.time()) == {}
    changed: list[int] = []
    be.on_nodes_changed = lambda: changed.append(1)
    srv.set_node_ready(NODE1, False)
    wait_for(lambda: NODE1 in be.down_nodes(time.time()), what="NotReady reported")
    wait_for(lambda: changed, what="the controller told")
    srv.patch("nodes", "", NODE0, {"spec": {"unschedulable": True}})
    wait_for(lambda: not next(n for n in be.observed_nodes() if n.name == NODE0).schedulable)
    assert NODE0 not in be.down_nodes(time.time())


def test_bind_conflicts_are_retried(cluster: Cluster) -> None:
    srv = cluster.srv
    be = cluster.fresh(bind_deadline_s=30.0)
    srv.create(job("busy", pods=4, run_s=10_000))
    wait_for(lambda: known(be, "default.job.busy"))
    srv.faults = FaultConfig(conflict_rate=0.4, seed=7)
    be.start(
        [
            RunSpec(
                "default.job.busy",
                placement(
                    ("main", 0, NODE0, [0]),
                    ("main", 1, NODE0, [1]),
                    ("main", 2, NODE1, [0]),
                    ("main", 3, NODE1, [1]),
                ),
            )
        ]
    )
    wait_for(lambda: len(bound(pods_of(srv, "job-name=busy"))) == 4, timeout=30, what="all bound")
    srv.faults = FaultConfig()
    assert be.binder.stats["retried"] > 0
    assert srv.stats.violations == []
    assert len(bound(pods_of(srv, "job-name=busy"))) == 4


def test_a_restarted_backend_finds_the_same_runs(cluster: Cluster) -> None:
    srv = cluster.srv
    be = cluster.fresh()
    srv.create(job("keep", pods=2, run_s=10_000))
    srv.create(bare_pod("lone", run_s=10_000))
    wait_for(lambda: known(be, "default.job.keep") and known(be, "default.pod.lone"))
    be.start(
        [
            RunSpec("default.job.keep", placement(("main", 0, NODE0, [0]), ("main", 1, NODE0, [1])), 60.0),
            RunSpec("default.pod.lone", placement(("main", 0, NODE1, [7])), None),
        ]
    )
    wait_for(lambda: len(bound(srv.list("pods", "default"))) == 3, what="all bound")
    before = be.runs()
    binds = srv.stats.binds
    be.close()
    again = cluster.fresh()
    assert again.runs() == before
    # fully bound gangs are adopted without translating their owners (restart time)
    time.sleep(0.2)  # a few bind passes
    assert all(r.kw is None and r.untranslated for r in again._runs.values())
    again.start([RunSpec(n, r.placement, r.duration_s) for n, r in before.items()])  # idempotent
    time.sleep(0.3)
    assert srv.stats.binds == binds  # nothing bound twice
    assert srv.stats.violations == []


def test_a_gang_that_cannot_bind_is_unbound_and_failed(cluster: Cluster) -> None:
    srv = cluster.srv
    be = cluster.fresh(bind_deadline_s=0.5)
    srv.create(job("stuck", pods=2, run_s=10_000))
    wait_for(lambda: known(be, "default.job.stuck"))
    # pod 1's node does not exist: its bind fails on every try, pod 0's succeeds
    be.start(
        [RunSpec("default.job.stuck", placement(("main", 0, NODE0, [0]), ("main", 1, "gpu-node-9999", [0])))]
    )
    done = wait_for(lambda: be.poll(time.time()), what="the bind deadline")
    assert [(r.outcome, r.reason) for r in done] == [("Failed", "BindFailed")]
    wait_for(lambda: not bound(pods_of(srv, "job-name=stuck")), what="the bound pod removed")
    be.forget(["default.job.stuck"])
    assert srv.get("jobs.batch", "default", "stuck")["spec"]["suspend"] is True


def test_preempting_a_deployment_evicts_its_pods(cluster: Cluster) -> None:
    srv = cluster.srv
    be = cluster.fresh()
    t = template(run_s=10_000)
    t["metadata"]["labels"] = {"app": "serve"}
    srv.create(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "serve", "namespace": "default", "labels": dict(QUEUE)},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "serve"}}, "template": t},
        }
    )
    name = "default.deployment.serve"
    wait_for(lambda: known(be, name) and len(pods_of(srv, "app=serve")) == 2, what="the ReplicaSet's pods")
    be.start([RunSpec(name, placement(("main", 0, NODE0, [0]), ("main", 1, NODE1, [0])))])
    wait_for(lambda: len(bound(pods_of(srv, "app=serve"))) == 2, what="both replicas bound")
    first = {p["metadata"]["name"] for p in pods_of(srv, "app=serve")}
    evictions = srv.stats.evictions
    be.stop([name])
    assert srv.stats.evictions == evictions + 2
    # the ReplicaSet replaces the evicted pods; nobody binds the replacements until admitted again
    wait_for(
        lambda: (
            {p["metadata"]["name"] for p in pods_of(srv, "app=serve")}.isdisjoint(first)
            and len(pods_of(srv, "app=serve")) == 2
        ),
        what="replacements",
    )
    time.sleep(0.3)
    assert bound(pods_of(srv, "app=serve")) == {}


def test_make_backend_kubernetes_connects_and_syncs(cluster: Cluster) -> None:
    from gpupool.composition import make_backend
    from gpupool.service.backends import Backend

    be = make_backend("kubernetes", kubeconfig=str(cluster.srv.kubeconfig), bind_deadline_s=5.0)
    try:
        assert isinstance(be, KubernetesBackend) and isinstance(be, Backend)
        assert {n.name for n in be.observed_nodes()} == {NODE0, NODE1}
        h = be.health()
        assert h.ok and h.detail["nodes"] == 2
    finally:
        assert isinstance(be, KubernetesBackend)
        be.close()
        be.informers.stop()
        be.api.close()


def test_a_pytorchjob_gang_binds_each_replica_to_its_slot(cluster: Cluster) -> None:
    srv = cluster.srv
    be = cluster.fresh()
    tpl = template(run_s=10_000)
    srv.create(
        {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "metadata": {"name": "pt", "namespace": "default", "labels": dict(QUEUE)},
            "spec": {
                "runPolicy": {"suspend": True},
                "pytorchReplicaSpecs": {
                    "Master": {"replicas": 1, "template": tpl},
                    "Worker": {"replicas": 2, "template": tpl},
                },
            },
        }
    )
    name = "default.pytorchjob.pt"
    wait_for(lambda: known(be, name), what="the PyTorchJob in the cache")
    be.start(
        [
            RunSpec(
                name,
                placement(("master", 0, NODE0, [0]), ("worker", 0, NODE1, [0]), ("worker", 1, NODE1, [1])),
            )
        ]
    )
    assert srv.get("pytorchjobs.kubeflow.org", "default", "pt")["spec"]["runPolicy"]["suspend"] is False
    sel = "training.kubeflow.org/job-name=pt"
    pods = wait_for(lambda: len(bound(p := pods_of(srv, sel))) == 3 and p, what="the gang bound")
    where = {
        (
            p["metadata"]["labels"]["training.kubeflow.org/replica-type"].lower(),
            p["metadata"]["labels"]["training.kubeflow.org/replica-index"],
        ): (p["spec"]["nodeName"], p["metadata"]["annotations"]["gpupool.io/gpu-indices"])
        for p in pods
    }
    assert where == {
        ("master", "0"): (NODE0, "0"),
        ("worker", "0"): (NODE1, "0"),
        ("worker", "1"): (NODE1, "1"),
    }
    be.stop([name])
    assert srv.get("pytorchjobs.kubeflow.org", "default", "pt")["spec"]["runPolicy"]["suspend"] is True
