"""Node faults in the live service: removal, NoExecute, drain, node failure, unhealthy devices.

In-process (Store + VirtualBackend + Controller on one fake clock) on a two-node cluster, on
SQLite and PostgreSQL; the verbs also through the API. After every fault the engine charges
exactly what the backend runs, and nothing is placed on a failed node or an unhealthy device.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpupool.audit import AuditEntry
from gpupool.manifests.convert import workload_model
from gpupool.service.backends.virtual import VirtualBackend
from gpupool.service.controller import Controller
from gpupool.service.failures.policy import UNHEALTHY_ANNOTATION
from gpupool.store import Store
from tests.service.test_failures import Clock
from tests.test_service_support import db_url, device_overcommit, running_app, wl

__all__ = ["db_url"]

API = "gpupool.io/v1alpha1"


def node(name: str, gpus: int = 4, taints: list[dict[str, str]] | None = None) -> dict[str, Any]:
    return {
        "name": name,
        "gpu": {"model": "H100-80GB", "count": gpus, "memory": "80Gi"},
        "cpu": 64,
        "memory": "512Gi",
        "labels": {"env": "t"},
        "taints": taints or [],
    }


def cluster(*nodes: dict[str, Any], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    md: dict[str, Any] = {"name": "c"}
    if annotations:
        md["annotations"] = annotations
    return {"apiVersion": API, "kind": "Cluster", "metadata": md, "spec": {"nodes": list(nodes)}}


CONFIG = [
    {
        "apiVersion": API,
        "kind": "ResourcePool",
        "metadata": {"name": "p"},
        "spec": {"nodeSelector": {"env": "t"}},
    },
    {
        "apiVersion": API,
        "kind": "Queue",
        "metadata": {"name": "q"},
        "spec": {"quotas": [{"pool": "p", "guarantee": {"nvidia.com/gpu": 8}}]},
    },
]


def make(url: str, state: Path, clk: Clock, **be: Any) -> tuple[Store, Controller, VirtualBackend]:
    store = Store.open(url)
    if not store.list_objects():
        for m in [*CONFIG, cluster(node("n1"), node("n2"))]:
            store.apply_object(m, audit=AuditEntry("t", "config.seed", m["kind"], m["metadata"]["name"]))
    backend = VirtualBackend(state / "vc.json", time_scale=1.0, clock=clk, **be)
    ctl = Controller(store, backend, tick_s=0.05, min_interval_s=0.0, clock=clk)
    ctl.recover()
    return store, ctl, backend


def submit(store: Store, ctl: Controller, name: str, gpus: int = 1, **spec: Any) -> None:
    m = wl(name, queue="q", gpus=gpus, duration="1h", **spec)
    rec, _ = store.submit_workload(m, owner="t")
    ctl.submitted(rec, workload_model(m, ctl.bundle.priority_classes, 0.0))


def reconfigure(store: Store, ctl: Controller, m: dict[str, Any]) -> None:
    store.apply_object(m, audit=AuditEntry("t", "config.apply", "Cluster", "c"))
    ctl.reload_config()


def nodes_of(store: Store, name: str) -> set[str]:
    w = store.get_workload(name)
    return {p["node"] for p in (w.placement or {}).get("pods", ())}


def check_consistent(store: Store, ctl: Controller, be: VirtualBackend) -> None:
    """The engine charges exactly what the backend runs; nothing is over-committed anywhere."""
    active = store.list_workloads(phases=["Admitted", "Running"])
    live = {n for n, r in be.runs().items() if not r.finished}
    assert {w.name for w in active} == set(ctl.engine.running) == live
    assert not device_overcommit([dict(w.placement or {}) for w in active])
    assert not be.violations
    held = sum(len(d) for n, d in ctl.faults.unhealthy.items() if n in ctl.engine.cluster.index)
    charged = sum(p.gpu_milli * len(p.devices) for r in ctl.engine.running.values() for p in r.admission.pods)
    assert ctl.engine.cluster.used_gpu_milli() == charged + 1000 * held


def evict_audits(store: Store, name: str) -> list[dict[str, Any]]:
    return [dict(r.detail) for r in store.audit_records() if r.action == "workload.evict" and r.name == name]


def test_removed_node_requeues_its_work_and_capacity_matches(tmp_path: Path, db_url: str) -> None:
    clk = Clock()
    store, ctl, be = make(db_url, tmp_path, clk)
    try:
        submit(store, ctl, "a", gpus=4)
        submit(store, ctl, "b", gpus=4)
        ctl.cycle()
        gone = nodes_of(store, "a").pop()
        kept = "n2" if gone == "n1" else "n1"
        reconfigure(store, ctl, cluster(node(kept)))
        a = store.get_workload("a")
        assert a.phase == "Pending" and a.reason == f"requeued: node {gone} was removed from the cluster"
        assert [e["code"] for e in evict_audits(store, "a")] == ["NodeRemoved"]
        assert "Preempted" in [e.reason for e in store.list_events("a")]
        assert store.get_workload("b").phase == "Running"
        check_consistent(store, ctl, be)
        assert ctl.engine.cluster.used_gpu_milli() == 4000  # b only
        ctl.cycle()  # one node, full: a waits, nothing is placed on the removed node
        assert store.get_workload("a").phase == "Pending"
        check_consistent(store, ctl, be)
    finally:
        store.close()


def test_no_execute_taint_evicts_only_what_does_not_tolerate_it(tmp_path: Path, db_url: str) -> None:
    clk = Clock()
    store, ctl, be = make(db_url, tmp_path, clk)
    try:
        tol = [{"key": "maint", "operator": "Exists", "effect": "NoExecute"}]
        submit(store, ctl, "tolerant", gpus=2, tolerations=tol)
        submit(store, ctl, "plain", gpus=2)
        ctl.cycle()
        assert nodes_of(store, "tolerant") == nodes_of(store, "plain")  # bin-packed on one node
        where = nodes_of(store, "plain").pop()
        other = "n2" if where == "n1" else "n1"
        taint = [{"key": "maint", "value": "now", "effect": "NoExecute"}]
        reconfigure(store, ctl, cluster(node(where, taints=taint), node(other)))
        assert store.get_workload("tolerant").phase == "Running"
        p = store.get_workload("plain")
        assert p.phase == "Pending" and "maint=now:NoExecute" in p.reason
        assert [e["code"] for e in evict_audits(store, "plain")] == ["NoExecuteTaint"]
        check_consistent(store, ctl, be)
        ctl.cycle()  # requeued at once (an eviction, not a failure): placed on the other node
        assert store.get_workload("plain").phase == "Running" and nodes_of(store, "plain") == {other}
        check_consistent(store, ctl, be)
    finally:
        store.close()


def test_drain_cordons_and_requeues(tmp_path: Path, db_url: str) -> None:
    clk = Clock()
    store, ctl, be = make(db_url, tmp_path, clk)
    try:
        for n in ("x", "y"):
            submit(store, ctl, n, gpus=2)
        ctl.cycle()
        where = nodes_of(store, "x").pop()
        m = store.get_object("Cluster", "c").to_manifest()
        m["metadata"] = {"name": "c", "annotations": {"gpupool.io/cordoned": where}}
        reconfigure(store, ctl, m)
        assert store.get_workload("x").phase == "Running"  # cordon alone never drains
        assert sorted(ctl.drain(where, "kernel upgrade", "alice")) == ["x", "y"]
        for n in ("x", "y"):
            w = store.get_workload(n)
            assert (
                w.phase == "Pending"
                and w.reason == f"requeued: node {where} drained by alice: kernel upgrade"
            )
        check_consistent(store, ctl, be)
        ctl.cycle()
        assert all(nodes_of(store, n) == {"n2" if where == "n1" else "n1"} for n in ("x", "y"))
        check_consistent(store, ctl, be)
    finally:
        store.close()


def test_node_failure_requeues_within_one_cycle_and_repair_restores(tmp_path: Path, db_url: str) -> None:
    clk = Clock()
    store, ctl, be = make(db_url, tmp_path, clk)
    try:
        submit(store, ctl, "a", gpus=4, type="inference")
        ctl.cycle()
        where = nodes_of(store, "a").pop()
        be.fail_node(where, repair_s=300, reason="PSU lost")
        ctl.cycle()
        a = store.get_workload("a")
        # a platform fault: requeued at once (no backoff, not counted against maxRetries) and,
        # in the same cycle, started again on the node that is up
        assert a.phase == "Running" and nodes_of(store, "a") != {where}, a.reason
        ev = [e for e in store.list_events("a") if e.reason == "RunFailed"]
        assert len(ev) == 1 and ev[0].message.startswith("NodeFailure: ") and "not counted" in ev[0].message
        assert ctl.engine.cluster.nodes[ctl.engine.cluster.index[where]].schedulable is False
        check_consistent(store, ctl, be)
        clk.t += 300
        ctl.cycle()
        assert ctl.engine.cluster.nodes[ctl.engine.cluster.index[where]].schedulable is True
        check_consistent(store, ctl, be)
    finally:
        store.close()


def test_unhealthy_device_takes_no_work_and_its_workload_is_requeued(tmp_path: Path, db_url: str) -> None:
    clk = Clock()
    store, ctl, be = make(db_url, tmp_path, clk)
    try:
        submit(store, ctl, "d0", gpus=1, type="training")
        ctl.cycle()
        w = store.get_workload("d0")
        pod = (w.placement or {})["pods"][0]
        bad = {f"{pod['node']}/{pod['devices'][0]}": "XID 79"}
        reconfigure(
            store, ctl, cluster(node("n1"), node("n2"), annotations={UNHEALTHY_ANNOTATION: json.dumps(bad)})
        )
        w = store.get_workload("d0")
        assert w.phase in ("Pending", "Running") and (w.placement or {}).get("pods", [{}])[0] != pod, w.reason
        assert any(e.message.startswith("DeviceUnhealthy: ") for e in store.list_events("d0"))
        assert ctl.faults.unhealthy == {pod["node"]: {pod["devices"][0]: "XID 79"}}
        check_consistent(store, ctl, be)
        for i in range(8):
            submit(store, ctl, f"fill-{i}", gpus=1)
        clk.t += 61
        ctl.cycle()
        running = store.list_workloads(phases=["Running"])
        assert len(running) == 7  # 8 devices, one unhealthy
        used = {(p["node"], d) for w in running for p in (w.placement or {})["pods"] for d in p["devices"]}
        assert (pod["node"], pod["devices"][0]) not in used
        check_consistent(store, ctl, be)
    finally:
        store.close()
    # it survives a restart (it is stored on the Cluster object)
    store2, ctl2, be2 = make(db_url, tmp_path, clk)
    try:
        assert ctl2.faults.unhealthy == {pod["node"]: {pod["devices"][0]: "XID 79"}}
        check_consistent(store2, ctl2, be2)
    finally:
        store2.close()


def test_drain_and_device_health_verbs(tmp_path: Path) -> None:
    with running_app(tmp_path, time_scale=1.0) as api:
        fa = wl("fa", duration="1h")
        fa["metadata"]["annotations"] = {"gpupool.io/fail-after": "1h"}
        assert api.req("POST", "/v1/workloads", json=wl("dr", duration="1h")).status_code == 201
        w = api.wait_phase("dr", "Running")
        pod = w["placement"]["pods"][0]
        where, dev = pod["node"], pod["devices"][0]
        r = api.req(
            "POST", f"/v1/nodes/{where}/devices/{dev}/health", json={"healthy": False, "reason": "XID 79"}
        )
        assert r.status_code == 200, r.text
        assert r.json()["requeued"] == ["dr"]
        view = api.get(f"/v1/nodes/{where}")
        assert view["health"]["unhealthyDevices"] == [dev]
        assert view["devices"][dev]["healthy"] is False and view["devices"][dev]["healthReason"] == "XID 79"
        got = api.get("/v1/workloads/dr")
        # requeued at once (a platform fault): it may already run again, never on the bad device
        assert got["phase"] in ("Pending", "Admitted", "Running") and got["attempts"] >= 1
        assert got["failures"][0]["reason"].startswith("DeviceUnhealthy: ")
        if got["placement"]:
            assert {(p["node"], d) for p in got["placement"]["pods"] for d in p["devices"]}.isdisjoint(
                {(where, dev)}
            )
        bad = api.req("POST", f"/v1/nodes/{where}/devices/99/health", json={"healthy": False})
        assert bad.status_code == 422 and bad.json()["error"]["errors"][0]["field"] == "index"
        assert api.req("POST", "/v1/nodes/nope/devices/0/health", json={"healthy": False}).status_code == 404
        member = api.token_for("bob", "member", "llm-research")
        assert api.req("POST", f"/v1/nodes/{where}/drain", token=member).status_code == 403
        ok = api.req("POST", f"/v1/nodes/{where}/devices/{dev}/health", json={"healthy": True})
        assert ok.status_code == 200 and api.get(f"/v1/nodes/{where}")["health"]["healthy"] is True
        # drain: cordon, then evict with the reason
        assert api.req("POST", "/v1/workloads", json=wl("dr2", duration="1h")).status_code == 201
        w2 = api.wait_phase("dr2", "Running")
        n2 = w2["placement"]["pods"][0]["node"]
        r = api.req("POST", f"/v1/nodes/{n2}/drain", json={"reason": "maintenance"})
        assert r.status_code == 200, r.text
        assert "dr2" in r.json()["evicted"] and r.json()["schedulable"] is False
        assert api.get(f"/v1/nodes/{n2}")["schedulable"] is False
        w2 = api.wait_phase("dr2", "Running", "Pending")
        assert n2 not in {p["node"] for p in (w2.get("placement") or {}).get("pods", [])}
        acts = [a["action"] for a in api.get("/v1/audit", params={"limit": 1000})["items"]]
        assert {"device.health", "node.drain", "node.cordon", "workload.evict"} <= set(acts)


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("submit"), st.sampled_from([1, 2, 4]), st.sampled_from([None, "5s", "30s"])),
        st.tuples(st.just("fail-node"), st.sampled_from(["n1", "n2"]), st.sampled_from([10.0, 60.0])),
        st.tuples(st.just("tick"), st.sampled_from([1.0, 7.0, 40.0]), st.none()),
    ),
    min_size=3,
    max_size=25,
)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS, rate=st.sampled_from([0.0, 200.0]))
def test_no_device_over_committed_while_failures_are_injected(
    ops: list[tuple[Any, Any, Any]], rate: float
) -> None:
    with tempfile.TemporaryDirectory() as d:
        clk = Clock()
        store, ctl, be = make(f"sqlite:///{d}/g.db", Path(d), clk, failure_rates={"*": rate})
        try:
            for i, (op, a, b) in enumerate(ops):
                if op == "submit":
                    m = wl(f"w{i}", queue="q", gpus=a, duration="1m", maxRetries=2)
                    if b:
                        m["metadata"]["annotations"] = {"gpupool.io/fail-after": b}
                    rec, _ = store.submit_workload(m, owner="t")
                    ctl.submitted(rec, workload_model(m, ctl.bundle.priority_classes, 0.0))
                elif op == "fail-node":
                    be.fail_node(a, repair_s=b)
                else:
                    clk.t += a
                ctl.cycle()
                check_consistent(store, ctl, be)
                down = set(ctl.faults.down)
                for w in store.list_workloads(phases=["Admitted", "Running"]):
                    assert not {p["node"] for p in (w.placement or {})["pods"]} & down
        finally:
            store.close()


def test_a_platform_fault_does_not_spend_the_workloads_retries(tmp_path: Path, db_url: str) -> None:
    """maxRetries 0: an error of its own ends it, a node failing under it does not."""
    clk = Clock()
    store, ctl, be = make(db_url, tmp_path, clk)
    try:
        submit(store, ctl, "once", gpus=4, maxRetries=0)
        ctl.cycle()
        be.fail_node(nodes_of(store, "once").pop(), repair_s=300, reason="PSU lost")
        ctl.cycle()
        w = store.get_workload("once")
        assert w.phase in ("Pending", "Running"), w.reason
        assert not [e for e in store.list_events("once") if "final" in e.message]
        check_consistent(store, ctl, be)
    finally:
        store.close()
