"""The controller carries an elastic shrink out (issue 27 item 5), in-process on the virtual
cluster, on SQLite and PostgreSQL: the gang keeps running in its phase with the pods above its
minimum removed from its stored placement and from the backend's run, each removed pod recorded
as an event with the reason and the whole audited; a backend that cannot remove single pods gets
the gang stopped and requeued whole instead."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpupool.manifests.convert import workload_model
from gpupool.service.backends import Capability
from gpupool.service.backends.virtual import VirtualBackend
from gpupool.service.controller import Controller
from gpupool.store import Store
from tests.service.test_failures import Clock
from tests.service.test_node_faults import check_consistent, make
from tests.test_service_support import db_url, wl

__all__ = ["db_url"]


def _submit(store: Store, ctl: Controller, name: str, pods: int, pc: str, **spec: Any) -> None:
    groups = [{"replicas": pods, "resources": {"nvidia.com/gpu": 2, "cpu": 2, "memory": "8Gi"}}]
    m = wl(name, queue="q", duration="1h", priorityClass=pc, podGroups=groups, **spec)
    rec, _ = store.submit_workload(m, owner="t")
    ctl.submitted(rec, workload_model(m, ctl.bundle.priority_classes, 0.0))


def test_a_shrunk_gang_keeps_running_with_fewer_pods_recorded_per_pod(tmp_path: Path, db_url: str) -> None:
    clk = Clock()
    store, ctl, be = make(db_url, tmp_path, clk)
    try:
        _submit(store, ctl, "elastic", 4, "experiment", gang={"minMember": 2})
        ctl.cycle()
        assert len(store.get_workload("elastic").placement["pods"]) == 4
        _submit(store, ctl, "urgent", 1, "training")
        clk.t += 1
        ctl.cycle()
        el = store.get_workload("elastic")
        assert el.phase == "Running" and len(el.placement["pods"]) == 3
        assert store.get_workload("urgent").phase == "Running"
        assert len(be.runs()["elastic"].placement["pods"]) == 3
        assert len(ctl.engine.running["elastic"].admission.pods) == 3
        shrunk = [e for e in store.list_events("elastic") if e.reason == "Shrunk"]
        assert len(shrunk) == 1 and "removed for urgent" in shrunk[0].message
        [audit] = [r for r in store.audit_records() if r.action == "workload.shrink"]
        assert audit.name == "elastic" and audit.detail["replicas"] == 3 and len(audit.detail["pods"]) == 1
        check_consistent(store, ctl, be)
    finally:
        ctl.stop()


class _WholeOnly(VirtualBackend):
    """A backend that cannot remove single pods (it does not declare the capability)."""

    capabilities = VirtualBackend.capabilities - {Capability.SHRINK}


def test_a_backend_without_shrink_stops_and_requeues_the_gang_whole(tmp_path: Path, db_url: str) -> None:
    clk = Clock()
    store, ctl, _ = make(db_url, tmp_path, clk)
    be = _WholeOnly(tmp_path / "vc2.json", time_scale=1.0, clock=clk)
    ctl.backend = be
    try:
        _submit(store, ctl, "elastic", 4, "experiment", gang={"minMember": 2})
        ctl.cycle()
        _submit(store, ctl, "urgent", 1, "training")
        clk.t += 1
        ctl.cycle()
        assert store.get_workload("elastic").phase == "Pending"
        assert "elastic" not in ctl.engine.running and "elastic" not in be.runs()
        assert store.get_workload("urgent").phase == "Running"
    finally:
        ctl.stop()
