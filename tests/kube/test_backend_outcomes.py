"""How a run's end is read from its pods and owner (pure functions, no server), and the same over what
each API server's Job controller and kubelet write (``kube_api``: fake and real, issue 24)."""

from __future__ import annotations

from typing import Any

from gpupool.kube.outcomes import owner_outcome, pod_failure, pods_outcome


def pod(phase: str, reason: str = "", code: int | None = None, term: str = "", **ann: str) -> dict[str, Any]:
    st: dict[str, Any] = {"phase": phase}
    if reason:
        st["reason"] = reason
    if code is not None:
        st["containerStatuses"] = [{"name": "c", "state": {"terminated": {"exitCode": code, "reason": term}}}]
    return {"metadata": {"name": "p", "annotations": ann}, "status": st}


def test_pod_failures_are_named_as_the_pod_shows_them() -> None:
    assert pod_failure(pod("Running")) is None
    assert pod_failure(pod("Succeeded", code=0)) is None
    oom = pod_failure(pod("Failed", code=137, term="OOMKilled"))
    assert oom is not None and (oom.exit_code, oom.reason) == (137, "OOMKilled")
    err = pod_failure(pod("Failed", code=3, term="Error"))
    assert err is not None and (err.exit_code, err.reason) == (3, "Error")
    adm = pod_failure(pod("Failed", reason="UnexpectedAdmissionError"))
    assert adm is not None and adm.reason == "UnexpectedAdmissionError"
    hami = pod_failure(pod("Pending", **{"hami.io/bind-phase": "failed"}))
    assert hami is not None and hami.reason == "BindPhaseFailed"
    lost = pod_failure(pod("Failed", reason="NodeLost"))
    assert lost is not None and lost.reason == "NodeFailure"


def test_a_replica_deleted_under_its_controller_is_not_a_failure() -> None:
    """The real kubelet (and the node agent) put a pod being deleted in a terminal phase before
    it goes: Failed, 143 (SIGTERM). A ReplicaSet's or StatefulSet's replica so stopped is
    replaced by its controller, and its workload did not fail; a Job's pod so stopped, or one
    deleted after its node was lost, still counts (issue 24)."""

    def deleted(kind: str, reason: str = "") -> dict[str, Any]:
        p = pod("Failed", reason=reason, code=143, term="Error")
        p["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        p["metadata"]["ownerReferences"] = [{"kind": kind, "name": "o", "uid": "u", "controller": True}]
        return p

    assert pod_failure(deleted("ReplicaSet")) is None
    assert pod_failure(deleted("StatefulSet")) is None
    assert pods_outcome([deleted("ReplicaSet"), pod("Running")], 2) is None
    job = pod_failure(deleted("Job"))
    assert job is not None and (job.exit_code, job.reason) == (143, "Error")
    lost = pod_failure(deleted("ReplicaSet", reason="NodeLost"))
    assert lost is not None and lost.reason == "NodeFailure"
    alive = deleted("ReplicaSet")
    del alive["metadata"]["deletionTimestamp"]  # failed on its own (evicted, say): still a failure
    assert pod_failure(alive) is not None


def test_owner_conditions_and_bare_pods() -> None:
    job = {"kind": "Job", "metadata": {"name": "j"}, "status": {"conditions": []}}
    assert owner_outcome(job) is None
    job["status"]["conditions"] = [{"type": "Complete", "status": "True"}]
    done = owner_outcome(job)
    assert done is not None and done.outcome == "Succeeded"
    job["status"]["conditions"] = [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]
    failed = owner_outcome(job)
    assert failed is not None and (failed.outcome, failed.reason) == ("Failed", "BackoffLimitExceeded")
    assert pods_outcome([pod("Succeeded"), pod("Running")], 2) is None
    ok = pods_outcome([pod("Succeeded"), pod("Succeeded")], 2)
    assert ok is not None and ok.outcome == "Succeeded"
    bad = pods_outcome([pod("Succeeded"), pod("Failed", code=1, term="Error")], 2)
    assert bad is not None and bad.exit_code == 1


def test_outcomes_read_from_what_each_server_writes(kube_api: Any) -> None:
    """On both servers (issue 24): the same functions over what the Job controller and a kubelet
    (the node agent on the real server) write: a Job's Complete condition and its Succeeded pods,
    a failing Job's Failed condition (BackoffLimitExceeded) and its pod's exit code."""
    from tests.kube.test_fake_controllers import JOBS, RUN, create, drive, job, listed

    k = kube_api
    node = k.add_kubelet_nodes(1, gpus=0, hami=False)[0]
    create(k, "jobs", job("done", parallelism=2, completions=2, annotations={RUN: "1"}), **JOBS)
    failing = {RUN: "0", "fake.gpupool.io/exit-code": "3"}
    create(k, "jobs", job("bad", parallelism=1, completions=1, backoff=0, annotations=failing), **JOBS)

    done = drive(k, "done", "Complete", node)
    got = owner_outcome(done)
    assert got is not None and got.outcome == "Succeeded"
    pods = listed(k, "pods", "batch.kubernetes.io/job-name=done")
    assert [pod_failure(p) for p in pods] == [None, None]
    ok = pods_outcome(pods, 2)
    assert ok is not None and ok.outcome == "Succeeded"

    bad = drive(k, "bad", "Failed", node)
    failed = owner_outcome(bad)
    assert failed is not None and (failed.outcome, failed.reason) == ("Failed", "BackoffLimitExceeded")
    (p,) = listed(k, "pods", "batch.kubernetes.io/job-name=bad")
    why = pod_failure(p)
    assert why is not None and why.exit_code == 3
    lost = pods_outcome([p], 1)
    assert lost is not None and (lost.outcome, lost.exit_code) == ("Failed", 3)
