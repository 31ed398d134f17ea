"""Consolidation moves on Kubernetes (issue 27, kube/adapters/moves.py), on the fake and the real
API server (issue 24): "an
eviction plus a reserved re-bind". A moved Job's pods are marked ``DisruptionTarget`` and
deleted, its admission record names the reserved placement, and the Job controller's
replacements are bound there (never to the old devices); the beneficiary admitted on the freed
devices binds only once the moved pods are gone, so no device is held by two running pods at
any time; a deposed leader moves nothing; a kind without a controller to recreate its pods is
refused."""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict
from typing import Any

import pytest

from gpupool.kube import annotations as kube_ann
from gpupool.kube.adapters.backend import KubernetesBackend
from gpupool.kube.runtime.evictor import ADMISSION
from gpupool.kube.workloads import workload_from_object, workload_from_pods
from gpupool.service.backends import Capability, RunSpec
from gpupool.service.leader import GuardedBackend
from gpupool.store import NotLeader
from tests.kube.cluster import Cluster, bare_pod, bound, job, known, placement, pods_of, wait_for

pytestmark = pytest.mark.both_servers  # the tests with a cluster


def names(c: Cluster) -> tuple[str, str, str]:
    """The moved Job's and the beneficiary's workload names, and the move's reason."""
    moved, big = c.workload("job", "small"), c.workload("job", "big")
    return moved, big, f"Consolidated: freed node {c.nodes[0]} for {big}"


def slow_to_leave(obj: dict[str, Any]) -> dict[str, Any]:
    """A Job whose pods take a while to go once deleted (grace 300 x the fake's 0.01 s), and that
    ignores a disrupted pod: a movable Job, as in KAI (without the rule the real Job controller
    counts the moved pod against ``backoffLimit``, 0 here, and fails the Job). The real
    controller makes the replacement once the moved pod is terminal, after its pod backoff
    (about 10 s): the waits for it allow 60 s."""
    obj["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 300
    obj["spec"]["podFailurePolicy"] = {
        "rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]
    }
    return obj


def running_small(srv: Cluster) -> dict[str, Any]:
    """The Job ``small``'s one running pod that is not being deleted ({} while there is none)."""
    pods = [
        p
        for p in pods_of(srv, "job-name=small")
        if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    ]
    return pods[0] if len(pods) == 1 else {}


def devices_of(pod: dict[str, Any]) -> tuple[str, list[int]]:
    ann = pod["metadata"].get("annotations") or {}
    return pod["spec"].get("nodeName", ""), [
        int(i) for i in ann.get(kube_ann.GPU_INDICES, "").split(",") if i
    ]


class Watch:
    """Samples the pods while a move runs: every (node, device) held by running pods, and the
    largest number of running pods that held one device at once."""

    def __init__(self, srv: Cluster) -> None:
        self.srv, self.most, self.done = srv, 0, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done.is_set():
            held: dict[tuple[str, int], int] = defaultdict(int)
            for p in self.srv.list("pods", self.srv.ns):
                if p["status"].get("phase") == "Running":
                    node, devs = devices_of(p)
                    for d in devs:
                        held[(node, d)] += 1
            self.most = max([self.most, *held.values()])
            time.sleep(0.005)

    def stop(self) -> int:
        self.done.set()
        self.thread.join(5)
        return self.most


def started(cluster: Cluster) -> tuple[KubernetesBackend, dict[str, Any]]:
    """A backend running the Job ``small`` on the first node's devices 0-3, and the Job ``big``
    created (not admitted) that wants all 8 devices there."""
    srv, (MOVED, BIG, _), NODE0 = cluster, names(cluster), cluster.nodes[0]
    be = cluster.fresh()
    srv.create(slow_to_leave(job("small", pods=1, run_s=100_000, gpus=4)))
    srv.create(job("big", pods=1, run_s=100_000, gpus=8))
    wait_for(lambda: known(be, MOVED) and known(be, BIG), what="both Jobs in the cache")
    be.start([RunSpec(MOVED, placement(("main", 0, NODE0, [0, 1, 2, 3])))])
    first = wait_for(lambda: running_small(srv), what="small running on its first placement")
    assert devices_of(first) == (NODE0, [0, 1, 2, 3])
    return be, first


def test_the_kubernetes_backend_declares_move() -> None:
    assert Capability.MOVE in KubernetesBackend.capabilities
    assert Capability.MOVABLE in KubernetesBackend.capabilities


def _manifest_of(obj: dict[str, object]) -> dict[str, object]:
    kw = workload_from_object(obj)
    assert kw is not None
    return kw.manifest


def test_only_a_batch_v1_jobs_workload_is_movable() -> None:
    """The engine is told before it plans: a bare pod's or a Deployment's run is not moved
    (the backend would refuse and the controller stop it whole)."""
    assert KubernetesBackend.movable(_manifest_of(job("j", 1, ns="default")))
    pod = workload_from_pods([bare_pod("solo", ns="default", run_s=10)])
    assert pod is not None and not KubernetesBackend.movable(pod.manifest)
    assert not KubernetesBackend.movable({"metadata": {"name": "api-made"}})


def test_a_moved_job_is_rebound_where_reserved_and_the_beneficiary_gets_the_freed_node(
    cluster: Cluster,
) -> None:
    srv, (MOVED, BIG, WHY), (NODE0, NODE1) = cluster, names(cluster), cluster.nodes
    be, first = started(cluster)
    watch = Watch(srv)
    to = placement(("main", 0, NODE1, [4, 5, 6, 7]))
    assert be.move(RunSpec(MOVED, to), WHY) is True
    be.start([RunSpec(BIG, placement(("main", 0, NODE0, list(range(8)))))])  # the same cycle

    old = srv.list("pods", srv.ns, field_selector=f"metadata.name={first['metadata']['name']}")
    assert old, "the moved pod is inside its grace period (3 s)"
    conds = {c["type"]: c for c in old[0]["status"].get("conditions") or []}
    assert conds["DisruptionTarget"]["reason"] == "PreemptionByScheduler"
    assert WHY in conds["DisruptionTarget"]["message"]
    assert old[0]["metadata"].get("deletionTimestamp")
    time.sleep(0.3)  # a few bind passes
    assert not bound(pods_of(srv, "job-name=big"))  # the freed devices wait for it to go
    moved = wait_for(lambda: running_small(srv), timeout=60, what="small running again")
    assert moved["metadata"]["uid"] != first["metadata"]["uid"]  # the Job controller's replacement
    assert devices_of(moved) == (NODE1, [4, 5, 6, 7])
    big = wait_for(lambda: [p for p in pods_of(srv, "job-name=big") if p["status"].get("phase") == "Running"])
    assert devices_of(big[0]) == (NODE0, list(range(8)))
    assert watch.stop() == 1  # never two running pods on one device
    assert srv.violations() == [] and be.overbooked() == []

    rec = json.loads(srv.get("jobs.batch", srv.ns, "small")["metadata"]["annotations"][ADMISSION])
    assert rec["placement"]["pods"] == to["pods"] and rec["decision"] == repr(to["admittedAt"])
    state = be.runs()[MOVED]
    assert state.placement["pods"] == to["pods"] and not state.finished
    events = [e for e in srv.list("events", srv.ns) if e["reason"] == "Consolidated"]
    assert [e["involvedObject"]["name"] for e in events] == ["small"]
    assert events[0]["message"].startswith(f"{WHY}: moved to {NODE1} [4,5,6,7]")


def test_a_moved_job_is_resumed_on_its_reserved_placement_after_a_restart(cluster: Cluster) -> None:
    srv, (MOVED, _BIG, WHY), (_NODE0, NODE1) = cluster, names(cluster), cluster.nodes
    be, _ = started(cluster)
    to = placement(("main", 0, NODE1, [2, 3, 4, 5]))
    assert be.move(RunSpec(MOVED, to), WHY) is True
    assert be.move(RunSpec(MOVED, to), WHY) is True  # the same move again: nothing more
    again = cluster.fresh()  # the record on the Job is the truth after a restart
    assert again.runs()[MOVED].placement["pods"] == to["pods"]
    moved = wait_for(lambda: running_small(srv), timeout=60, what="small running again")
    assert devices_of(moved) == (NODE1, [2, 3, 4, 5])
    assert len([e for e in srv.list("events", srv.ns) if e["reason"] == "Consolidated"]) == 1


def test_a_move_on_a_deposed_leader_does_nothing(cluster: Cluster) -> None:
    srv, (MOVED, _BIG, WHY), (_NODE0, NODE1) = cluster, names(cluster), cluster.nodes
    be, first = started(cluster)
    before = srv.get("jobs.batch", srv.ns, "small")["metadata"]["annotations"][ADMISSION]
    to = RunSpec(MOVED, placement(("main", 0, NODE1, [0, 1, 2, 3])))
    with pytest.raises(NotLeader):
        GuardedBackend(be, lambda: False).move(to, WHY)
    be.leader_gate = lambda: False  # the lease lost: the backend itself refuses too
    with pytest.raises(NotLeader):
        be.move(to, WHY)
    time.sleep(0.3)  # a few controller and bind passes
    assert srv.get("jobs.batch", srv.ns, "small")["metadata"]["annotations"][ADMISSION] == before
    assert running_small(srv)["metadata"]["uid"] == first["metadata"]["uid"]
    assert not [e for e in srv.list("events", srv.ns) if e["reason"] == "Consolidated"]


def test_a_bare_pod_is_not_moved(cluster: Cluster) -> None:
    """Nothing recreates a deleted bare pod: the move is refused (the controller then stops the
    run whole and requeues it) and the pod is left running where it is."""
    srv, (_MOVED, _BIG, WHY), (NODE0, NODE1) = cluster, names(cluster), cluster.nodes
    be = cluster.fresh()
    srv.create(bare_pod("solo", run_s=100_000))
    wait_for(lambda: known(be, cluster.workload("pod", "solo")))
    be.start([RunSpec(cluster.workload("pod", "solo"), placement(("main", 0, NODE0, [0])))])
    wait_for(lambda: srv.get("pods", srv.ns, "solo")["status"].get("phase") == "Running")
    assert be.move(RunSpec(cluster.workload("pod", "solo"), placement(("main", 0, NODE1, [0]))), WHY) is False
    assert devices_of(srv.get("pods", srv.ns, "solo")) == (NODE0, [0])
    assert be.runs()[cluster.workload("pod", "solo")].placement["pods"][0]["node"] == NODE0


def test_a_move_cut_short_by_a_restart_is_finished_by_the_next_backend(cluster: Cluster) -> None:
    """The record written, the process gone before the pods were disrupted: the next backend
    adopts the reserved placement from the record and disrupts the pod bound for the old one
    (``moves.stale``), so the Job's replacement is bound where reserved."""
    srv, (_MOVED, _BIG, _WHY), (_NODE0, NODE1) = cluster, names(cluster), cluster.nodes
    be, first = started(cluster)
    be.leader_gate = lambda: False  # the process that wrote the record is gone
    to = placement(("main", 0, NODE1, [1, 2, 3, 4]))
    rec = json.loads(srv.get("jobs.batch", srv.ns, "small")["metadata"]["annotations"][ADMISSION])
    rec.update(placement=to, decision=repr(to["admittedAt"]))
    srv.patch("jobs.batch", srv.ns, "small", {"metadata": {"annotations": {ADMISSION: json.dumps(rec)}}})
    cluster.fresh()

    def replaced() -> dict[str, Any]:
        p = running_small(srv)
        return p if p and p["metadata"]["uid"] != first["metadata"]["uid"] else {}

    moved = wait_for(replaced, timeout=60, what="small's replacement running")
    assert devices_of(moved) == (NODE1, [1, 2, 3, 4])
    assert srv.violations() == []
