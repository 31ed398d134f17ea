"""A new leader on a store that lacks the running work (issue 23): the cluster's admission
records are adopted, so no running pod is stopped, re-placed or restarted. On both the fake and
the real API server (issue 24)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from gpupool.kube import workloads
from gpupool.manifests.convert import workload_model
from gpupool.service.adoption import ADOPTED
from gpupool.service.config import EXAMPLES, seed_config
from gpupool.service.controller import Controller
from gpupool.store import Store
from tests.kube.cluster import Cluster, job, pods_of
from tests.kube.test_backend_controller import ONE_TRAINING_NODE, Setup, setup

__all__ = ["setup"]  # the old leader (one 8-GPU HAMi node), imported for pytest

pytestmark = [pytest.mark.both_servers, ONE_TRAINING_NODE]


def _uids(srv: Cluster, name: str) -> dict[str, str]:
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods_of(srv, f"job-name={name}")}


class NewLeader:
    """A second replica taking over with its own empty store (the chart's old default)."""

    def __init__(self, old: Setup, tmp_path: Path, settled: list[bool]) -> None:
        self.srv = old.srv
        self.store = Store.open(f"sqlite:///{tmp_path}/other.db")
        seed_config(self.store, EXAMPLES / "cluster")
        self.be = old.cluster.fresh()
        self.be.claims_settled = lambda: settled[0]
        self.ctl = Controller(self.store, self.be, tick_s=0.05, min_interval_s=0.0)
        self.be.on_nodes_changed = self.ctl.nodes_changed
        self.ctl.recover()

    def resubmit(self, name: str) -> None:
        """What the Kubernetes source does for every object it watches."""
        got = self.srv.get("jobs.batch", self.srv.ns, name)
        kw = workloads.workload_from_object(got)
        assert kw is not None
        rec, _ = self.store.submit_workload(kw.manifest, owner="system:kubernetes")
        self.ctl.submitted(rec, workload_model(kw.manifest, self.ctl.bundle.priority_classes, 0.0))

    def cycles(self, n: int) -> None:
        for _ in range(n):
            self.ctl.cycle()
            time.sleep(0.03)


def _stopped_events(srv: Cluster) -> list[Any]:
    return [e for e in srv.list("events", srv.ns) if e["reason"] == "Stopped"]


def test_a_new_leader_with_an_empty_store_adopts_running_work(setup: Setup, tmp_path: Path) -> None:
    old, srv = setup, setup.srv
    name = old.submit(job("keep", pods=2, run_s=10_000, gpus=2))
    old.cycle_until(lambda: old.phase(name) == "Running", what="running on the old leader")
    old.cycle_until(
        lambda: sum(p["status"].get("phase") == "Running" for p in pods_of(srv, "job-name=keep")) == 2,
        what="both pods running",
    )
    placement = old.store.get_workload(name).placement
    before = _uids(srv, "keep")
    old.ctl.stop()
    old.be.close()  # the old leader is gone

    settled = [False]
    new = NewLeader(old, tmp_path, settled)
    new.cycles(5)  # the source has not submitted the Job yet: nothing is stopped
    assert _uids(srv, "keep") == before
    assert srv.get("jobs.batch", srv.ns, "keep")["spec"]["suspend"] is False
    new.resubmit("keep")
    new.cycles(3)
    rec = new.store.get_workload(name)
    assert rec.phase == "Running" and rec.placement == placement
    settled[0] = True
    new.cycles(5)
    assert _uids(srv, "keep") == before, "a running pod was restarted"
    assert not [p for p in pods_of(srv, "job-name=keep") if p["metadata"].get("deletionTimestamp")]
    assert _stopped_events(srv) == []
    acts = [(a.action, a.name) for a in new.store.audit_records()]
    assert ("workload.adopt", name) in acts
    assert any(ADOPTED in e.message for e in new.store.list_events(name))
    assert srv.violations() == []
    new.ctl.stop()
    new.store.close()


def test_a_held_run_no_workload_claims_is_stopped_once_the_source_has_read_everything(
    setup: Setup, tmp_path: Path
) -> None:
    old, srv = setup, setup.srv
    name = old.submit(job("orphan", pods=1, run_s=10_000, gpus=1))
    old.cycle_until(lambda: old.phase(name) == "Running", what="running")
    old.ctl.stop()
    old.be.close()
    settled = [False]
    new = NewLeader(old, tmp_path, settled)
    new.cycles(3)
    assert srv.get("jobs.batch", srv.ns, "orphan")["spec"]["suspend"] is False
    settled[0] = True  # read everything; no workload stands for it (say the policy refused it)
    new.cycles(3)
    assert srv.get("jobs.batch", srv.ns, "orphan")["spec"]["suspend"] is True
    new.ctl.stop()
    new.store.close()
