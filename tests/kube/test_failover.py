"""A failover never touches running work (issue 23): the standby that takes over rebuilds what
runs from the cluster, even from an empty store of its own (the chart's former default: each
replica its own SQLite file on an emptyDir), and with a shared store (the chart's default now).
On both the fake and the real API server (issue 24)."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import pytest

from tests.kube.cluster import Cluster, job
from tests.kube.test_kubectl_e2e import TRAINING, serving

pytestmark = pytest.mark.both_servers

QUEUE = {"kueue.x-k8s.io/queue-name": "llm-research"}


def _wait(fn: Any, timeout: float, what: str) -> Any:
    end = time.monotonic() + timeout
    while not (v := fn()):
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.1)
    return v


def _running(srv: Cluster, name: str, n: int) -> dict[str, str] | None:
    pods = srv.list("pods", srv.ns, label_selector=f"job-name={name}")
    up = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods if p["status"].get("phase") == "Running"}
    return up if len(up) == n else None


@pytest.mark.cluster_nodes(labels=TRAINING)
@pytest.mark.parametrize("shared", [False, True], ids=["own-empty-store", "shared-store"])
def test_the_new_leader_leaves_running_pods_alone(cluster: Cluster, tmp_path: Path, shared: bool) -> None:
    srv = cluster
    db = {"database_url": f"sqlite:///{tmp_path / 'shared.db'}"} if shared else {}
    with contextlib.ExitStack() as outer:
        first = contextlib.ExitStack()
        outer.callback(first.close)
        a = first.enter_context(serving(srv, tmp_path / "a", **db))
        b = outer.enter_context(serving(srv, tmp_path / "b", **db))
        obj = job("steady", pods=2, run_s=100_000, gpus=4)
        obj["metadata"]["labels"] = dict(QUEUE)
        srv.create(obj)
        before = _wait(lambda: _running(srv, "steady", 2), 60, "both pods running on the leader")
        assert a.state.svc.leader.is_leader
        first.close()  # the leader goes away (a drain, a rolling upgrade)
        svc_b = b.state.svc
        _wait(lambda: svc_b.leader.is_leader, 30, "the standby to take over")
        name = srv.workload("job", "steady")
        _wait(
            lambda: name in {w.name for w in svc_b.store.list_workloads(phases=["Running"])},
            60,
            "the new leader to hold the Job as Running",
        )
        time.sleep(1.0)  # a few more cycles of the new leader
        acts = [r.action for r in svc_b.store.audit_records() if r.name == name]
        # one admission in all: the old leader's (shared store) or the cluster's, adopted
        assert acts.count("workload.admit") + acts.count("workload.adopt") == 1, acts
        assert ("workload.adopt" in acts) is not shared
        assert _running(srv, "steady", 2) == before, "a running pod was stopped or restarted"
        assert srv.get("jobs.batch", srv.ns, "steady")["spec"]["suspend"] is False
        stopped = [e for e in srv.list("events", srv.ns) if e["reason"] == "Stopped"]
        assert stopped == []
        assert srv.violations() == []
