"""Partial admission of batch/v1 Jobs (issue 11, item 4, on Kubernetes): Kueue's
``kueue.x-k8s.io/job-min-parallelism`` (or ``gpupool.io/min-member``) becomes the workload's
``gang.minMember``; a bad value is held back with a Warning Event; a Job admitted with fewer pods
runs with ``spec.parallelism`` (and ``completions``) set to that count and only those pods bound;
suspending it again gives it back its counts. The whole path through the engine runs in
``test_scenario_parity.py`` (``partial_admission``)."""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Mapping
from typing import Any

import pytest

from gpupool.kube.adapters.backend import KubernetesBackend
from gpupool.kube.adapters.source import INVALID
from gpupool.kube.runtime.evictor import ADMISSION
from gpupool.kube.translate import partial as tp
from gpupool.kube.workloads import KubeWorkloadError, workload_from_object
from gpupool.service.backends import RunSpec
from tests.kube.cluster import QUEUE, Cluster, bound, known, placement, pods_of, wait_for
from tests.kube.cluster import template as pod_template
from tests.kube.test_source import make

KUEUE_MIN = f"metadata.annotations.{tp.MIN_PARALLELISM}"
NAME = "default.job.train"  # on the fake; ``wl(cluster)`` on either server


def partial_job(
    name: str = "train",
    pods: int = 3,
    minimum: object = "2",
    key: str = tp.MIN_PARALLELISM,
    *,
    ns: str = "default",
    **spec: Any,
) -> dict[str, Any]:
    """A Kueue-style Job (queue label, suspended, Indexed, completions == parallelism) in ``ns``
    that may run with ``minimum`` pods; ``spec`` overrides its spec fields (None removes one)."""
    body: dict[str, Any] = {
        "suspend": True,
        "parallelism": pods,
        "completions": pods,
        "completionMode": "Indexed",
        "backoffLimit": 0,
        "template": pod_template(run_s=10_000),
    }
    body.update(spec)
    body = {k: v for k, v in body.items() if v is not None}
    ann = {key: minimum} if minimum is not None else {}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": ns, "labels": dict(QUEUE), "annotations": ann},
        "spec": body,
    }


def merged(obj: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """``obj`` with a JSON merge patch applied (None deletes), as the API server applies it."""
    out = copy.deepcopy(dict(obj))
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, Mapping):
            out[k] = merged(out.get(k) or {}, v)
        else:
            out[k] = v
    return out


def gang(obj: Mapping[str, Any]) -> tuple[int, Any]:
    kw = workload_from_object(obj)
    assert kw is not None
    spec = kw.manifest["spec"]
    return spec["podGroups"][0]["replicas"], spec.get("gang")


# ------------------------------------------------------------------------- translation
def test_the_kueue_annotation_is_the_gang_minimum() -> None:
    assert gang(partial_job(minimum="2")) == (3, {"minMember": 2})
    assert gang(partial_job(minimum="1", pods=8)) == (8, {"minMember": 1})
    assert gang(partial_job(minimum=None)) == (3, None)  # without it: all pods together


def test_gpupools_own_annotation_says_the_same_and_both_must_agree() -> None:
    assert gang(partial_job(key=tp.MIN_MEMBER)) == (3, {"minMember": 2})
    both = partial_job()
    both["metadata"]["annotations"][tp.MIN_MEMBER] = "2"
    assert gang(both) == (3, {"minMember": 2})
    both["metadata"]["annotations"][tp.MIN_MEMBER] = "1"
    with pytest.raises(KubeWorkloadError) as err:
        workload_from_object(both)
    assert err.value.field == f"metadata.annotations.{tp.MIN_MEMBER}"
    assert tp.MIN_PARALLELISM in err.value.problem


def test_a_minimum_of_every_pod_is_no_partial_admission() -> None:
    assert gang(partial_job(minimum="3")) == (3, None)


@pytest.mark.parametrize("value", ["0", "4", "two", "-1", "2.5", "", " ", 2, "1e1", "²"])
def test_a_bad_minimum_names_the_annotation(value: object) -> None:
    with pytest.raises(KubeWorkloadError) as err:
        workload_from_object(partial_job(minimum=value))
    assert err.value.field == KUEUE_MIN


def test_a_job_whose_completions_cannot_follow_is_held_back() -> None:
    """A NonIndexed Job's completions is immutable, and an Indexed Job's may only equal its
    parallelism: run with fewer pods, either would wait for completions no pod is bound for."""
    for spec in ({"completionMode": "NonIndexed"}, {"completions": 6}, {"completions": 2, "parallelism": 4}):
        with pytest.raises(KubeWorkloadError) as err:
            workload_from_object(partial_job(minimum="1", **spec))
        assert err.value.field == KUEUE_MIN and "completions" in err.value.problem
    # a work-queue Job (no completions) can; without the annotation nothing is asked of it
    assert gang(partial_job(completions=None, completionMode=None)) == (3, {"minMember": 2})
    assert gang(partial_job(minimum=None, completionMode="NonIndexed")) == (3, None)


def test_the_unsuspend_patch_scales_parallelism_and_completions() -> None:
    job = partial_job()
    patch = tp.admit_patch(job, 2)
    assert patch == {
        "metadata": {"annotations": {tp.ORIGINAL_PARALLELISM: "3", tp.ORIGINAL_COMPLETIONS: "3"}},
        "spec": {"parallelism": 2, "completions": 2},
    }
    queue_job = partial_job(completions=None, completionMode=None)
    assert tp.admit_patch(queue_job, 2) == {
        "metadata": {"annotations": {tp.ORIGINAL_PARALLELISM: "3"}},
        "spec": {"parallelism": 2},
    }
    assert tp.admit_patch(job, 3) == {}  # all its pods: nothing to change
    assert tp.admit_patch(partial_job(minimum=None), 2) == {}  # not a partial Job: never resized


def test_a_job_running_reduced_is_still_the_workload_submitted() -> None:
    """While it runs with 2 pods the Job says parallelism 2; read again (a restart), it is still
    3 pods with minimum 2, and the restore patch gives its owner's spec back exactly."""
    job = partial_job()
    running = merged(job, tp.admit_patch(job, 2))
    assert running["spec"]["parallelism"] == running["spec"]["completions"] == 2
    want, got = workload_from_object(job), workload_from_object(running)
    assert want is not None and got is not None and got.manifest == want.manifest
    assert tp.admit_patch(running, 2) == tp.admit_patch(job, 2)  # admitted again: the same patch
    assert merged(running, tp.restore_patch(running)) == job
    assert merged(running, tp.admit_patch(running, 3)) == job  # all pods: the originals back
    assert tp.restore_patch(job) == {}


def test_an_unreadable_original_count_names_its_annotation() -> None:
    job = partial_job()
    job["metadata"]["annotations"][tp.ORIGINAL_PARALLELISM] = "three"
    with pytest.raises(KubeWorkloadError) as err:
        workload_from_object(job)
    assert err.value.field == f"metadata.annotations.{tp.ORIGINAL_PARALLELISM}"


# ------------------------------------------------------------------------- the source
def test_a_bad_minimum_is_a_warning_event_and_the_job_is_held_back() -> None:
    src, infs, sub, ev = make()
    bad = partial_job("bad", minimum="5")
    bad["metadata"]["namespace"] = "ml"
    good = partial_job("good")
    good["metadata"]["namespace"] = "ml"
    infs["jobs"].put(bad)
    infs["jobs"].put(good)
    src.process()
    assert [m["metadata"]["name"] for m in sub.manifests] == ["ml.job.good"]
    assert sub.manifests[0]["spec"]["gang"] == {"minMember": 2}
    assert [(e[0], e[1], e[2]) for e in ev.got] == [("bad", "Warning", INVALID)]
    assert KUEUE_MIN in ev.got[0][3] and "between 1 and the 3 pods" in ev.got[0][3]


# ------------------------------------------------------------------------- the backend
both = pytest.mark.both_servers


def wl(cluster: Cluster) -> str:
    """The workload name of the Job ``train`` in the cluster's namespace."""
    return cluster.workload("job", "train")


def two(cluster: Cluster) -> dict[str, Any]:
    """Two pods, one on each node."""
    return placement(("main", 0, cluster.nodes[0], [0]), ("main", 1, cluster.nodes[1], [0]))


def admitted_reduced(cluster: Cluster, **job: Any) -> KubernetesBackend:
    """A backend that has admitted the 3-pod Job ``train`` (minimum 2) with 2 pods."""
    be = cluster.fresh()
    cluster.create(partial_job(ns=cluster.ns, **job))
    wait_for(lambda: known(be, wl(cluster)), what="the Job in the cache")
    be.start([RunSpec(wl(cluster), dict(two(cluster), admittedAt=time.time()))])
    return be


@both
def test_a_partially_admitted_job_runs_only_the_admitted_pods(cluster: Cluster) -> None:
    srv = cluster
    admitted_reduced(cluster)
    got = srv.get("jobs.batch", srv.ns, "train")
    assert got["spec"]["suspend"] is False
    assert (got["spec"]["parallelism"], got["spec"]["completions"]) == (2, 2)
    ann = got["metadata"]["annotations"]
    assert (ann[tp.ORIGINAL_PARALLELISM], ann[tp.ORIGINAL_COMPLETIONS]) == ("3", "3")
    record = json.loads(ann[ADMISSION])
    assert (record["admittedPods"], record["requestedPods"]) == (2, 3)  # the reduced count, recorded
    wait_for(lambda: len(bound(pods_of(srv, "job-name=train"))) == 2, what="the 2 admitted pods bound")
    time.sleep(0.3)  # a few controller and bind passes: no third pod is made
    pods = pods_of(srv, "job-name=train")
    assert sorted(bound(pods).values()) == [srv.nodes[0], srv.nodes[1]] and len(pods) == 2
    events = {e["reason"]: e["message"] for e in srv.list("events", srv.ns)}
    assert "admitted with 2 of 3 pods" in events["PartiallyAdmitted"]


@both
def test_eviction_gives_the_job_back_its_parallelism(cluster: Cluster) -> None:
    srv = cluster
    be = admitted_reduced(cluster)
    wait_for(lambda: len(bound(pods_of(srv, "job-name=train"))) == 2, what="both bound")
    be.stop([wl(cluster)])
    got = srv.get("jobs.batch", srv.ns, "train")
    assert got["spec"]["suspend"] is True
    assert (got["spec"]["parallelism"], got["spec"]["completions"]) == (3, 3)
    assert not set(got["metadata"]["annotations"]) & {tp.ORIGINAL_PARALLELISM, tp.ORIGINAL_COMPLETIONS}
    wait_for(lambda: not pods_of(srv, "job-name=train"), what="the Job controller to remove its pods")
    # admitted again with every pod: nothing is reduced, all three bound
    three = placement(
        ("main", 0, srv.nodes[0], [1]), ("main", 1, srv.nodes[1], [1]), ("main", 2, srv.nodes[0], [2])
    )
    be.start([RunSpec(wl(cluster), three)])
    assert srv.get("jobs.batch", srv.ns, "train")["spec"]["parallelism"] == 3
    wait_for(lambda: len(bound(pods_of(srv, "job-name=train"))) == 3, what="all three bound")


@both
def test_a_restarted_backend_restores_from_the_annotations(cluster: Cluster) -> None:
    srv = cluster
    be = admitted_reduced(cluster)
    wait_for(lambda: len(bound(pods_of(srv, "job-name=train"))) == 2, what="both bound")
    be.close()
    again = cluster.fresh()  # it knows of the reduction only from the Job
    assert wl(cluster) in again.runs()
    again.stop([wl(cluster)])
    got = srv.get("jobs.batch", srv.ns, "train")
    assert (got["spec"]["suspend"], got["spec"]["parallelism"], got["spec"]["completions"]) == (True, 3, 3)


@both
def test_a_run_that_failed_to_bind_is_resuspended_with_its_counts_back(cluster: Cluster) -> None:
    srv = cluster
    be = cluster.fresh(bind_deadline_s=0.5)
    srv.create(partial_job(ns=srv.ns))
    wait_for(lambda: known(be, wl(cluster)), what="the Job in the cache")
    be.start(
        [RunSpec(wl(cluster), placement(("main", 0, srv.nodes[0], [0]), ("main", 1, "gpu-node-9999", [0])))]
    )
    done = wait_for(lambda: be.poll(time.time()), what="the bind deadline")
    assert [(r.outcome, r.reason) for r in done] == [("Failed", "BindFailed")]
    be.forget([wl(cluster)])
    got = srv.get("jobs.batch", srv.ns, "train")
    assert (got["spec"]["suspend"], got["spec"]["parallelism"], got["spec"]["completions"]) == (True, 3, 3)


@both
def test_a_job_without_the_annotation_is_never_resized(cluster: Cluster) -> None:
    """A Job that did not ask for partial admission keeps its spec whatever the placement."""
    srv = cluster
    be = cluster.fresh()
    srv.create(partial_job(minimum=None, pods=2, ns=srv.ns))
    wait_for(lambda: known(be, wl(cluster)), what="the Job in the cache")
    be.start([RunSpec(wl(cluster), two(cluster))])
    got = srv.get("jobs.batch", srv.ns, "train")
    assert got["spec"]["parallelism"] == 2 and tp.ORIGINAL_PARALLELISM not in got["metadata"]["annotations"]
