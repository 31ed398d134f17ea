"""Elastic shrink on Kubernetes (issue 27 item 5), on the fake and the real API server: a running Job whose
gang may run with fewer pods (``kueue.x-k8s.io/job-min-parallelism``) loses only its extra pods:
``spec.parallelism`` (and the completions that follow) lowered as partial admission sets them,
the removed pod deleted and never replaced, the admission record on the Job following; a later
suspension gives the Job back its counts. Volcano and KAI preempt elastic jobs the same way
(only the pods above ``minAvailable`` / the minimum go)."""

from __future__ import annotations

import json
import time

import pytest

from gpupool.kube.runtime.evictor import ADMISSION
from gpupool.kube.translate import partial as tp
from gpupool.service.backends import RunSpec
from tests.kube.cluster import Cluster, bound, known, placement, pods_of, wait_for
from tests.kube.test_partial_jobs import partial_job, two, wl

pytestmark = pytest.mark.both_servers


def test_a_shrunk_job_runs_with_parallelism_lowered_and_its_extra_pod_gone(cluster: Cluster) -> None:
    srv, (node0, node1), NAME = cluster, cluster.nodes, wl(cluster)
    THREE = placement(("main", 0, node0, [0]), ("main", 1, node1, [0]), ("main", 2, node0, [1]))
    TWO = two(cluster)
    be = cluster.fresh()
    srv.create(partial_job(ns=srv.ns))  # 3 pods, at least 2
    wait_for(lambda: known(be, NAME), what="the Job in the cache")
    be.start([RunSpec(NAME, dict(THREE, admittedAt=time.time()))])
    wait_for(lambda: len(bound(pods_of(srv, "job-name=train"))) == 3, what="all three bound")
    assert srv.get("jobs.batch", srv.ns, "train")["spec"]["parallelism"] == 3

    be.shrink(NAME, TWO, "preempted by urgent: pods above gang.minMember removed")
    got = srv.get("jobs.batch", srv.ns, "train")
    assert (got["spec"]["parallelism"], got["spec"]["completions"]) == (2, 2)
    ann = got["metadata"]["annotations"]
    assert (ann[tp.ORIGINAL_PARALLELISM], ann[tp.ORIGINAL_COMPLETIONS]) == ("3", "3")
    assert len(json.loads(ann[ADMISSION])["placement"]["pods"]) == 2
    wait_for(lambda: len(pods_of(srv, "job-name=train")) == 2, what="the extra pod deleted")
    time.sleep(0.3)  # a few controller and bind passes: the Job makes no replacement
    pods = pods_of(srv, "job-name=train")
    assert sorted(bound(pods).values()) == [node0, node1] and len(pods) == 2
    assert len(be.runs()[NAME].placement["pods"]) == 2
    events = {e["reason"]: e["message"] for e in srv.list("events", srv.ns)}
    assert "1 pod(s) removed, 2 keep running" in events["Shrunk"]

    be.stop([NAME])  # evicted later: suspended with its counts back, as partial admission does
    got = srv.get("jobs.batch", srv.ns, "train")
    assert (got["spec"]["suspend"], got["spec"]["parallelism"], got["spec"]["completions"]) == (True, 3, 3)


def test_shrinking_an_unknown_run_does_nothing(cluster: Cluster) -> None:
    be = cluster.fresh()
    be.shrink(cluster.workload("job", "nothing"), two(cluster))
    assert cluster.workload("job", "nothing") not in be.runs()
