"""How a run's end is read from its pods and owner (pure functions, no server)."""

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
