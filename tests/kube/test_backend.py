"""The Kubernetes backend over HTTP: admission (unsuspend + bind with the device annotations),
gangs, preemption, failures, node readiness, conflicts, restart. On both the fake API server and a
real kube-apiserver (issue 24; the ``cluster`` fixture, tests/kube/cluster.py)."""

from __future__ import annotations

import time

import pytest

from gpupool.kube import annotations as kube_ann
from gpupool.kube.adapters.backend import KubernetesBackend
from gpupool.kube.fake.faults import FaultConfig
from gpupool.kube.runtime.evictor import ADMISSION
from gpupool.service.backends import BackendError, RunSpec
from tests.kube.cluster import (
    QUEUE,
    Cluster,
    bare_pod,
    bound,
    job,
    known,
    placement,
    pods_of,
    template,
    wait_for,
)

pytestmark = pytest.mark.both_servers

#: the fake cluster's node names (the ``cluster`` fixture on the fake; ``cluster.nodes`` on either)
NODE0, NODE1 = "gpu-node-0000", "gpu-node-0001"

__all__ = ["NODE0", "NODE1", "QUEUE", "Cluster", "bare_pod", "bound", "job", "known", "placement", "pods_of"]
__all__ += ["template", "wait_for"]


def test_kueue_job_is_unsuspended_and_bound_with_device_annotations(cluster: Cluster) -> None:
    ns, (node0, node1) = cluster.ns, cluster.nodes
    be = cluster.fresh()
    cluster.create(job("train", pods=2, run_s=50))
    name = cluster.workload("job", "train")
    wait_for(lambda: known(be, name), what="the Job in the cache")
    be.start([RunSpec(name, placement(("main", 0, node0, [2]), ("main", 1, node1, [5])), 30.0)])
    got = cluster.get("jobs.batch", ns, "train")
    assert got["spec"]["suspend"] is False
    assert f'"workload":"{name}"' in got["metadata"]["annotations"][ADMISSION]
    pods = wait_for(lambda: len(bound(p := pods_of(cluster, "job-name=train"))) == 2 and p, what="both bound")
    by_index = {p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]: p for p in pods}
    p0, p1 = by_index["0"], by_index["1"]
    assert (p0["spec"]["nodeName"], p1["spec"]["nodeName"]) == (node0, node1)
    a0 = p0["metadata"]["annotations"]
    assert a0[kube_ann.WORKLOAD] == name and a0[kube_ann.GPU_INDICES] == "2"
    assert a0[kube_ann.GPU_MILLI] == "1000" and a0[kube_ann.GPU_MEMORY_MIB] == "81559"
    uuid = a0[kube_ann.GPU_UUIDS]
    assert a0[kube_ann.HAMI_TO_ALLOCATE] == f"{uuid},NVIDIA,81559,100:;"
    assert a0[kube_ann.HAMI_NODE] == node0
    # admitted by the kubelet: Running, or already Succeeded (they run 0.5 s: on a loaded machine
    # a wait for "all Running" could look only after they finished, which is what once flaked)
    started = ("Running", "Succeeded")
    wait_for(
        lambda: all(p["status"].get("phase") in started for p in pods_of(cluster, "job-name=train")),
        timeout=60,
        what="both pods admitted by the kubelet",
    )
    assert all(
        a["metadata"]["annotations"][kube_ann.HAMI_BIND_PHASE] == "success"
        for a in pods_of(cluster, "job-name=train")
    )
    done = wait_for(lambda: be.poll(time.time()), timeout=60, what="the Job to complete")
    assert [(r.name, r.outcome) for r in done] == [(name, "Succeeded")]
    assert cluster.violations() == []
    be.forget([name])
    assert ADMISSION not in (cluster.get("jobs.batch", ns, "train")["metadata"].get("annotations") or {})


def test_a_gang_binds_all_at_once_or_not_at_all(cluster: Cluster) -> None:
    ns, node0 = cluster.ns, cluster.nodes[0]
    be = cluster.fresh()
    cluster.create(bare_pod("g-a", group="g"))
    wait_for(lambda: be.informers.pods.get(ns, "g-a"), what="the first pod")
    name = be.tracker.name_of(be.tracker.top_owner(be.informers.pods.get(ns, "g-a") or {}))
    name = name or cluster.workload("podgroup", "g")
    wait_for(lambda: known(be, name), what="the pod group in the cache")
    be.start([RunSpec(name, placement(("main", 0, node0, [0]), ("main", 1, node0, [1])))])
    time.sleep(0.5)  # several reconcile passes with one of two pods
    assert bound(pods_of(cluster, "scheduling.x-k8s.io/pod-group=g")) == {}
    cluster.create(bare_pod("g-b", group="g"))
    wait_for(lambda: len(bound(pods_of(cluster, "scheduling.x-k8s.io/pod-group=g"))) == 2, what="both bound")
    assert cluster.violations() == []


def test_unknown_workload_is_refused(cluster: Cluster) -> None:
    be = cluster.fresh()
    with pytest.raises(BackendError, match="no Kubernetes object"):
        be.start([RunSpec(cluster.workload("job", "nothing"), placement(("main", 0, cluster.nodes[0], [0])))])
    assert be.runs() == {}


def test_preemption_resuspends_a_job_and_deletes_a_bare_pod(cluster: Cluster) -> None:
    ns, (node0, node1) = cluster.ns, cluster.nodes
    victim, solo_name = cluster.workload("job", "victim"), cluster.workload("pod", "solo")
    be = cluster.fresh()
    cluster.create(job("victim", pods=1, run_s=10_000))
    cluster.create(bare_pod("solo", run_s=10_000))
    wait_for(lambda: known(be, victim) and known(be, solo_name))
    be.start(
        [
            RunSpec(victim, placement(("main", 0, node0, [0]))),
            RunSpec(solo_name, placement(("main", 0, node1, [0]))),
        ]
    )
    wait_for(lambda: len(bound(pods_of(cluster, "job-name=victim"))) == 1, what="the job's pod bound")
    wait_for(lambda: bound([cluster.get("pods", ns, "solo")]), what="the bare pod bound")
    be.stop([victim, solo_name])
    j = cluster.get("jobs.batch", ns, "victim")
    assert j["spec"]["suspend"] is True and ADMISSION not in (j["metadata"].get("annotations") or {})
    solo = cluster.list("pods", ns, field_selector="metadata.name=solo")
    if solo:  # still inside its grace period: marked and deleting
        conds = {c["type"]: c for c in solo[0]["status"].get("conditions") or []}
        assert conds["DisruptionTarget"]["reason"] == "PreemptionByScheduler"
        assert solo[0]["metadata"].get("deletionTimestamp")
    wait_for(lambda: not cluster.list("pods", ns, field_selector="metadata.name=solo"), what="deleted")
    wait_for(lambda: not pods_of(cluster, "job-name=victim"), what="the Job controller to remove its pods")
    reasons = {
        e["involvedObject"]["name"]: e["reason"]
        for e in cluster.list("events", ns)
        if e.get("source", {}).get("component") == "gpupool"
    }
    assert reasons.get("victim") == "Stopped"
    assert be.runs() == {}


def test_freed_devices_wait_for_the_victims(cluster: Cluster) -> None:
    ns, node0 = cluster.ns, cluster.nodes[0]
    old_name, new_name = cluster.workload("pod", "old"), cluster.workload("pod", "new")
    be = cluster.fresh()
    # a long grace period, set at creation: the real server refuses to change it on a running pod
    old = bare_pod("old", run_s=10_000)
    old["spec"]["terminationGracePeriodSeconds"] = 100
    cluster.create(old)
    wait_for(lambda: known(be, old_name))
    be.start([RunSpec(old_name, placement(("main", 0, node0, [3])))])
    wait_for(lambda: cluster.get("pods", ns, "old")["status"].get("phase") == "Running")
    cluster.create(bare_pod("new", run_s=10_000))
    wait_for(lambda: known(be, new_name))
    be.stop([old_name])
    be.start([RunSpec(new_name, placement(("main", 0, node0, [3])))])
    time.sleep(0.3)  # the victim is still terminating (grace 100 x 0.01 s)
    if cluster.list("pods", ns, field_selector="metadata.name=old"):
        assert not cluster.get("pods", ns, "new")["spec"].get("nodeName")
    wait_for(lambda: cluster.get("pods", ns, "new")["spec"].get("nodeName") == node0, what="bound after")
    wait_for(lambda: cluster.get("pods", ns, "new")["status"].get("phase") == "Running")
    assert cluster.violations() == []


def test_a_failed_pod_is_a_failed_run_with_its_exit_code(cluster: Cluster) -> None:
    oom = cluster.workload("job", "oom")
    be = cluster.fresh()
    cluster.create(job("oom", pods=1, run_s=5, exit_code=137))
    wait_for(lambda: known(be, oom))
    be.start([RunSpec(oom, placement(("main", 0, cluster.nodes[0], [0])))])
    done = wait_for(lambda: be.poll(time.time()), what="the failure")
    assert [(r.outcome, r.exit_code, r.reason) for r in done] == [("Failed", 137, "OOMKilled")]


def test_not_ready_node_is_down_and_cordoned_is_unschedulable(cluster: Cluster) -> None:
    node0, node1 = cluster.nodes
    be = cluster.fresh()
    assert {n.name for n in be.observed_nodes()} == {node0, node1}
    assert all(n.gpu_count == 8 for n in be.observed_nodes())
    assert be.down_nodes(time.time()) == {}
    changed: list[int] = []
    be.on_nodes_changed = lambda: changed.append(1)
    cluster.set_node_ready(node1, False)
    wait_for(lambda: node1 in be.down_nodes(time.time()), what="NotReady reported")
    wait_for(lambda: changed, what="the controller told")
    cluster.patch("nodes", "", node0, {"spec": {"unschedulable": True}})
    wait_for(lambda: not next(n for n in be.observed_nodes() if n.name == node0).schedulable)
    assert node0 not in be.down_nodes(time.time())


@pytest.mark.fake_only("conflicts injected by the fake's fault config (srv.faults)")
def test_bind_conflicts_are_retried(cluster: Cluster) -> None:
    srv, (node0, node1) = cluster.srv, cluster.nodes
    be = cluster.fresh(bind_deadline_s=30.0)
    cluster.create(job("busy", pods=4, run_s=10_000))
    wait_for(lambda: known(be, cluster.workload("job", "busy")))
    srv.faults = FaultConfig(conflict_rate=0.4, seed=7)
    be.start(
        [
            RunSpec(
                cluster.workload("job", "busy"),
                placement(
                    ("main", 0, node0, [0]),
                    ("main", 1, node0, [1]),
                    ("main", 2, node1, [0]),
                    ("main", 3, node1, [1]),
                ),
            )
        ]
    )
    wait_for(lambda: len(bound(pods_of(cluster, "job-name=busy"))) == 4, timeout=30, what="all bound")
    srv.faults = FaultConfig()
    assert be.binder.stats["retried"] > 0
    assert cluster.violations() == []
    assert len(bound(pods_of(cluster, "job-name=busy"))) == 4


def test_a_restarted_backend_finds_the_same_runs(cluster: Cluster) -> None:
    ns, (node0, node1) = cluster.ns, cluster.nodes
    keep, lone = cluster.workload("job", "keep"), cluster.workload("pod", "lone")
    be = cluster.fresh()
    cluster.create(job("keep", pods=2, run_s=10_000))
    cluster.create(bare_pod("lone", run_s=10_000))
    wait_for(lambda: known(be, keep) and known(be, lone))
    be.start(
        [
            RunSpec(keep, placement(("main", 0, node0, [0]), ("main", 1, node0, [1])), 60.0),
            RunSpec(lone, placement(("main", 0, node1, [7])), None),
        ]
    )
    wait_for(lambda: len(bound(cluster.list("pods", ns))) == 3, what="all bound")
    before = be.runs()
    pods_before = {p["metadata"]["uid"]: p["spec"]["nodeName"] for p in cluster.list("pods", ns)}
    binds = cluster.fake.stats.binds if cluster.fake else 0
    be.close()
    again = cluster.fresh()
    assert again.runs() == before
    # fully bound gangs are adopted without translating their owners (restart time)
    time.sleep(0.2)  # a few bind passes
    assert all(r.kw is None and r.untranslated for r in again._runs.values())
    again.start([RunSpec(n, r.placement, r.duration_s) for n, r in before.items()])  # idempotent
    time.sleep(0.3)
    # nothing bound twice: the same pods on the same nodes, and no bind request (the fake counts)
    assert {p["metadata"]["uid"]: p["spec"]["nodeName"] for p in cluster.list("pods", ns)} == pods_before
    assert again.binder.stats["bound"] == 0
    if cluster.fake is not None:
        assert cluster.fake.stats.binds == binds
    assert cluster.violations() == []


def test_a_gang_that_cannot_bind_is_unbound_and_failed(cluster: Cluster) -> None:
    ns, node0 = cluster.ns, cluster.nodes[0]
    stuck = cluster.workload("job", "stuck")
    be = cluster.fresh(bind_deadline_s=0.5)
    cluster.create(job("stuck", pods=2, run_s=10_000))
    wait_for(lambda: known(be, stuck))
    # pod 1's node does not exist: its bind fails on every try, pod 0's succeeds
    be.start([RunSpec(stuck, placement(("main", 0, node0, [0]), ("main", 1, "gpu-node-9999", [0])))])
    done = wait_for(lambda: be.poll(time.time()), what="the bind deadline")
    assert [(r.outcome, r.reason) for r in done] == [("Failed", "BindFailed")]
    wait_for(lambda: not bound(pods_of(cluster, "job-name=stuck")), what="the bound pod removed")
    be.forget([stuck])
    assert cluster.get("jobs.batch", ns, "stuck")["spec"]["suspend"] is True


def test_preempting_a_deployment_evicts_its_pods(cluster: Cluster) -> None:
    ns, (node0, node1) = cluster.ns, cluster.nodes
    be = cluster.fresh()
    t = template(run_s=10_000)
    t["metadata"]["labels"] = {"app": "serve"}
    t["spec"]["restartPolicy"] = "Always"  # a Deployment's only policy (the real server refuses Never)
    cluster.create(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "serve", "namespace": ns, "labels": dict(QUEUE)},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "serve"}}, "template": t},
        }
    )
    name = cluster.workload("deployment", "serve")
    wait_for(
        lambda: known(be, name) and len(pods_of(cluster, "app=serve")) == 2, what="the ReplicaSet's pods"
    )
    be.start([RunSpec(name, placement(("main", 0, node0, [0]), ("main", 1, node1, [0])))])
    wait_for(lambda: len(bound(pods_of(cluster, "app=serve"))) == 2, what="both replicas bound")
    first = {p["metadata"]["name"] for p in pods_of(cluster, "app=serve")}
    evictions = cluster.fake.stats.evictions if cluster.fake else 0
    be.stop([name])
    if cluster.fake is not None:  # the eviction requests: the fake counts them
        assert cluster.fake.stats.evictions == evictions + 2
    assert all(
        p["metadata"].get("deletionTimestamp")
        for p in pods_of(cluster, "app=serve")
        if p["metadata"]["name"] in first
    )
    # the ReplicaSet replaces the evicted pods; nobody binds the replacements until admitted again
    wait_for(
        lambda: (
            {p["metadata"]["name"] for p in pods_of(cluster, "app=serve")}.isdisjoint(first)
            and len(pods_of(cluster, "app=serve")) == 2
        ),
        what="replacements",
    )
    time.sleep(0.3)
    assert bound(pods_of(cluster, "app=serve")) == {}


def test_make_backend_kubernetes_connects_and_syncs(cluster: Cluster) -> None:
    from gpupool.composition import make_backend
    from gpupool.service.backends import Backend

    node0, node1 = cluster.nodes
    be = make_backend("kubernetes", kubeconfig=str(cluster.kubeconfig), bind_deadline_s=5.0)
    try:
        assert isinstance(be, KubernetesBackend) and isinstance(be, Backend)
        assert {n.name for n in be.observed_nodes()} == {node0, node1}
        h = be.health()
        assert h.ok and h.detail["nodes"] == 2
    finally:
        assert isinstance(be, KubernetesBackend)
        be.close()
        be.informers.stop()
        be.api.close()


@pytest.mark.fake_only("no training operator (PyTorchJob CRD and controller) on the real server")
def test_a_pytorchjob_gang_binds_each_replica_to_its_slot(cluster: Cluster) -> None:
    ns, (node0, node1) = cluster.ns, cluster.nodes
    be = cluster.fresh()
    tpl = template(run_s=10_000)
    cluster.create(
        {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "metadata": {"name": "pt", "namespace": ns, "labels": dict(QUEUE)},
            "spec": {
                "runPolicy": {"suspend": True},
                "pytorchReplicaSpecs": {
                    "Master": {"replicas": 1, "template": tpl},
                    "Worker": {"replicas": 2, "template": tpl},
                },
            },
        }
    )
    name = cluster.workload("pytorchjob", "pt")
    wait_for(lambda: known(be, name), what="the PyTorchJob in the cache")
    be.start(
        [
            RunSpec(
                name,
                placement(("master", 0, node0, [0]), ("worker", 0, node1, [0]), ("worker", 1, node1, [1])),
            )
        ]
    )
    assert cluster.get("pytorchjobs.kubeflow.org", ns, "pt")["spec"]["runPolicy"]["suspend"] is False
    sel = "training.kubeflow.org/job-name=pt"
    pods = wait_for(lambda: len(bound(p := pods_of(cluster, sel))) == 3 and p, what="the gang bound")
    where = {
        (
            p["metadata"]["labels"]["training.kubeflow.org/replica-type"].lower(),
            p["metadata"]["labels"]["training.kubeflow.org/replica-index"],
        ): (p["spec"]["nodeName"], p["metadata"]["annotations"]["gpupool.io/gpu-indices"])
        for p in pods
    }
    assert where == {
        ("master", "0"): (node0, "0"),
        ("worker", "0"): (node1, "0"),
        ("worker", "1"): (node1, "1"),
    }
    be.stop([name])
    assert cluster.get("pytorchjobs.kubeflow.org", ns, "pt")["spec"]["runPolicy"]["suspend"] is True
