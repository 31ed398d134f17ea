"""The controller carries a consolidation move out (issue 27, KAI's consolidation), in-process on
the virtual cluster, on SQLite and PostgreSQL: the moved workload keeps running, restarted on
the placement the engine reserved for it (stored, in the backend and in the engine alike), with
an event and an audit entry saying why; the blocked workload starts in the same cycle on what it
freed, and nothing is over-committed. A backend that cannot move gets no Move planned, and the
controller says why."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpupool.audit import AuditEntry
from gpupool.manifests.convert import workload_model
from gpupool.service.backends import Capability, RunSpec
from gpupool.service.backends.virtual import VirtualBackend
from gpupool.service.controller import Controller, Hooks
from gpupool.service.metrics import Metrics
from gpupool.store import Store
from tests.service.test_failures import Clock
from tests.service.test_node_faults import API, check_consistent, cluster, node, nodes_of
from tests.test_service_support import db_url, wl

__all__ = ["db_url"]

CONFIG = [
    {
        "apiVersion": API,
        "kind": "ResourcePool",
        "metadata": {"name": "p"},
        "spec": {"nodeSelector": {"env": "t"}, "consolidation": {"enabled": True, "maxMovesPerCycle": 1}},
    },
    {
        "apiVersion": API,
        "kind": "Queue",
        "metadata": {"name": "q"},
        "spec": {"quotas": [{"pool": "p", "guarantee": {"nvidia.com/gpu": 8}}]},
    },
]


def _make(
    url: str,
    tmp: Path,
    clk: Clock,
    backend: type[VirtualBackend] = VirtualBackend,
    hooks: Hooks | None = None,
) -> Any:
    store = Store.open(url)
    for m in [*CONFIG, cluster(node("n1"), node("n2"))]:
        store.apply_object(m, audit=AuditEntry("t", "config.seed", m["kind"], m["metadata"]["name"]))
    be = backend(tmp / "vc.json", time_scale=1.0, clock=clk)
    ctl = Controller(store, be, tick_s=0.05, min_interval_s=0.0, clock=clk, hooks=hooks)
    ctl.recover()
    return store, ctl, be


def _submit(store: Store, ctl: Controller, name: str, gpus: int, duration: str = "1h") -> None:
    m = wl(name, queue="q", gpus=gpus, duration=duration)
    rec, _ = store.submit_workload(m, owner="t")
    ctl.submitted(rec, workload_model(m, ctl.bundle.priority_classes, 0.0))


def _scattered(store: Store, ctl: Controller, clk: Clock) -> str:
    """Two 4-GPU nodes with 2 GPUs free on each (a ends on the node it shared with b), then a
    4-GPU workload that fits on neither; returns the node b ran on."""
    for name in ("a", "b", "c"):
        _submit(store, ctl, name, 2, "10m" if name == "a" else "1h")
        ctl.cycle()
    assert nodes_of(store, "a") == nodes_of(store, "b") != nodes_of(store, "c")
    clk.t += 11 * 60  # a ends; b and c have run past their cooldown (a tenth of an hour)
    ctl.cycle()
    assert store.get_workload("a").phase == "Succeeded"
    _submit(store, ctl, "big", 4)
    return nodes_of(store, "b").pop()


def test_a_move_restarts_the_work_where_reserved_and_the_blocked_one_starts(
    tmp_path: Path, db_url: str
) -> None:
    clk = Clock()
    store, ctl, be = _make(db_url, tmp_path, clk)
    try:
        was = _scattered(store, ctl, clk)
        started = be.runs()["b"].started_at
        ctl.cycle()
        big, b = store.get_workload("big"), store.get_workload("b")
        assert big.phase == "Running" and nodes_of(store, "big") == {was}
        assert b.phase == "Running" and nodes_of(store, "b") == nodes_of(store, "c") != {was}
        assert b.placement["admittedAt"] == clk.t  # restarted now: its earlier work is lost
        run = be.runs()["b"]
        assert run.placement == b.placement and run.started_at == clk.t > started
        assert be.starts["b"] == 2 and be.starts["big"] == 1
        assert {p.node for p in ctl.engine.running["b"].admission.pods} == nodes_of(store, "b")
        [ev] = [e for e in store.list_events("b") if e.reason == "Consolidated"]
        assert f"Consolidated: freed node {was} for big" in ev.message and "GPU-seconds" in ev.message
        [audit] = [r for r in store.audit_records() if r.action == "workload.move"]
        assert audit.name == "b" and audit.detail["for"] == "big"
        assert audit.detail["fromNodes"] == [was] and audit.detail["gpuSecondsLost"] == 2 * 11 * 60
        check_consistent(store, ctl, be)
    finally:
        ctl.stop()


class _Unmovable(VirtualBackend):
    """A backend that cannot move a running workload (it does not declare the capability)."""

    capabilities = VirtualBackend.capabilities - {Capability.MOVE}


def test_a_backend_that_cannot_move_gets_no_move_and_says_why(tmp_path: Path, db_url: str) -> None:
    clk = Clock()
    store, ctl, be = _make(db_url, tmp_path, clk, _Unmovable)
    try:
        was = _scattered(store, ctl, clk)
        ctl.cycle()
        assert store.get_workload("big").phase == "Pending"
        assert nodes_of(store, "b") == {was} and be.starts["b"] == 1
        assert not [r for r in store.audit_records() if r.action == "workload.move"]
        assert "cannot move" in ctl.config.consolidation_off["p"]
        check_consistent(store, ctl, be)
    finally:
        ctl.stop()


class _Refusing(VirtualBackend):
    """A backend that declares MOVE but cannot move this run (``move`` returns False)."""

    def move(self, spec: RunSpec, message: str = "") -> bool:
        return False


def _counted(m: Metrics, name: str) -> float | None:
    return m.registry.get_sample_value(name, {"queue": "q", "pool": "p"})


def test_a_move_carried_out_is_counted_and_a_refused_one_is_a_preemption(tmp_path: Path) -> None:
    """``gpupool_consolidation_moves_total{queue,pool}`` and the GPU-seconds the moves lost
    count moves the backend carried out; one it refused is stopped and counted as a preemption."""
    for backend, moves, preempted in ((VirtualBackend, 1.0, None), (_Refusing, None, 1.0)):
        clk, m, tmp = Clock(), Metrics(refresh_s=3600.0), tmp_path / backend.__name__
        tmp.mkdir()
        store, ctl, _be = _make(f"sqlite:///{tmp}/gpupool.db", tmp, clk, backend, m.hooks())
        try:
            _scattered(store, ctl, clk)
            ctl.cycle()
            assert _counted(m, "gpupool_consolidation_moves_total") == moves, backend.__name__
            lost = _counted(m, "gpupool_consolidation_gpu_seconds_lost_total")
            assert lost == (2 * 11 * 60 if moves else None), backend.__name__
            assert m.registry.get_sample_value("gpupool_preemptions_total", {"queue": "q"}) == preempted
        finally:
            ctl.stop()
            store.close()
