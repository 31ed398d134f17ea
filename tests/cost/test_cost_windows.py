"""Capacity and idle counted from when the GPUs existed, and idle shared by default.

A young store (its nodes joined 15 minutes ago) reported over the default 7-day window was
priced for 7 days of capacity: 99.95% idle. These tests build that store and check capacity
against the node history, idle against capacity minus allocation, and the reconciliation.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.audit import AuditEntry
from gpupool.cost.chargeback import PoolCost, chargeback, pool_capacity, reconciles
from gpupool.cost.history import History, NodeSpan, Resources, Run, WorkloadInfo, node_spans
from gpupool.cost.metering import US_PER_S, Window, meter, us_between
from gpupool.cost.policy import CostPolicySpec, PolicyError, parse_policy
from gpupool.cost.render import render
from gpupool.cost.reports import chargeback_report, load_store
from gpupool.cost.sacct import SacctError, parse_sacct
from gpupool.cost.weekly import team_figure, weekly_report
from gpupool.model import Node
from gpupool.store import PhaseChange, Store
from gpupool.store.revisions import RevisionRecord

ROOT = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 12, 1, 10, 17, tzinfo=UTC)
JOINED = NOW - timedelta(minutes=15)
WEEK = Window(NOW - timedelta(days=7), NOW)
API = "gpupool.io/v1alpha1"


def manifests() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for f in sorted((ROOT / "examples" / "cluster").glob("*.yaml")):
        out += [d for d in yaml.safe_load_all(f.read_text()) if d]
    return out


def job(name: str, queue: str, gpus: int) -> dict[str, Any]:
    group = {"name": "w", "replicas": 1, "resources": {"nvidia.com/gpu": gpus, "cpu": 8, "memory": "64Gi"}}
    return {
        "apiVersion": API,
        "kind": "Workload",
        "metadata": {"name": name},
        "spec": {"queue": queue, "type": "training", "podGroups": [group]},
    }


def run_job(store: Store, name: str, queue: str, gpus: int, start: datetime, end: datetime | None) -> None:
    """Submitted at ``start``, admitted at once on h100-0, finished at ``end`` (None: still running)."""
    store.submit_workload(job(name, queue, gpus), owner="u", at=start)
    pod = {"group": "w", "index": 0, "node": "h100-0", "devices": list(range(gpus)), "gpuMilli": 1000}
    detail = {"pool": "h100-training", "nodes": ["h100-0"], "gpuMilli": gpus * 1000}
    store.apply_transitions(
        [PhaseChange(name, "Admitted", "fits", {"pool": "h100-training", "pods": [pod]})],
        audit=[AuditEntry("scheduler", "workload.admit", "Workload", name, detail)],
        at=start,
    )
    if end is not None:
        store.apply_transitions([PhaseChange(name, "Succeeded", "done")], at=end)


@pytest.fixture
def young() -> Iterator[Store]:
    """Installed 15 minutes before NOW; an 8-GPU job ran 5 minutes, a 2-GPU one runs for 12."""
    store = Store.open("sqlite://", clock=lambda: NOW)
    for m in manifests():
        store.apply_object(m, at=JOINED)
    run_job(store, "pretrain", "llm-pretrain", 8, NOW - timedelta(minutes=10), NOW - timedelta(minutes=5))
    run_job(store, "research", "llm-research", 2, NOW - timedelta(minutes=12), None)
    yield store
    store.close()


def rows(rep: dict[str, Any], name: str) -> list[dict[str, Any]]:
    t = next(t for t in rep["tables"] if t["name"] == name)
    return [dict(zip(t["columns"], r, strict=True)) for r in t["rows"]]


def test_young_store_capacity_is_clipped_to_the_node_history(young: Store) -> None:
    rep = chargeback_report(load_store(young, WEEK, CostPolicySpec()))
    pools = {r["pool"]: r for r in rows(rep, "pools")}
    h100 = pools["h100-training"]
    # 64 H100s for 15 minutes, not 7 days: 16 GPU-hours at 2.90 = 46.40
    assert h100["capacityGpuHours"] == 16.0 and h100["capacityCost"] == "46.40"
    assert h100["allocatedGpuHours"] == pytest.approx(8 * 5 / 60 + 2 * 12 / 60, abs=1e-4)
    assert h100["idleGpuHours"] == pytest.approx(16 - 8 * 5 / 60 - 2 * 12 / 60, abs=1e-4)
    assert pools["a100-inference"]["capacityGpuHours"] == 32 * 0.25
    for r in pools.values():  # charged + idle = capacity, per pool, to the cent
        assert r["reconciles"] is True
        assert Decimal(r["charged"]) + Decimal(r["idleCost"]) == Decimal(r["capacityCost"])
    assert rep["summary"]["covers"] == "covers 2026-12-01 10:02 → 10:17 UTC, since the first node joined"
    total = sum(Decimal(r["capacityCost"]) for r in pools.values())
    assert Decimal(rep["summary"]["capacityCost"]) == total


def test_idle_is_shared_by_guarantee_by_default(young: Store) -> None:
    rep = chargeback_report(load_store(young, WEEK, CostPolicySpec()))
    assert rep["summary"]["idleRule"] == "idle shared by guarantee share; costPolicy.idle can change it"
    teams = {r["queue"]: r for r in rows(rep, "teams")}
    for leaf in ("llm-pretrain", "llm-research", "vision-team", "serving"):  # every guarantee holder
        assert Decimal(teams[leaf]["idleShare"]) > 0, leaf
    idle = sum(Decimal(r["idleCost"]) for r in rows(rep, "pools"))
    assert Decimal(teams["ai-org"]["idleShare"]) == idle  # every pool's idle reached a team, to the cent


def test_the_policy_changes_or_turns_off_the_idle_rule(young: Store) -> None:
    off = chargeback_report(
        load_store(young, WEEK, parse_policy({"kind": "CostPolicy", "spec": {"idle": "none"}}))
    )
    assert all(Decimal(r["idleShare"]) == 0 for r in rows(off, "teams"))
    assert off["summary"]["idleRule"].startswith("idle not shared")
    used = parse_policy({"kind": "CostPolicy", "spec": {"idle": "allocated"}})
    by_use = {r["queue"]: r for r in rows(chargeback_report(load_store(young, WEEK, used)), "teams")}
    assert "vision-team" not in by_use  # it used nothing: no idle of its own
    assert Decimal(by_use["llm-pretrain"]["idleShare"]) > Decimal(by_use["llm-research"]["idleShare"]) > 0
    with pytest.raises(PolicyError, match=r"spec\.idle: Input should be 'guarantee', 'allocated' or 'none'"):
        parse_policy({"kind": "CostPolicy", "spec": {"idle": "evenly"}})
    with pytest.raises(PolicyError, match=r"spec\.spreadIdleByGuarantee: contradicts spec\.idle 'none'"):
        parse_policy({"kind": "CostPolicy", "spec": {"idle": "none", "spreadIdleByGuarantee": True}})


def test_nodes_that_leave_stop_counting(young: Store) -> None:
    """Half the H100 nodes removed 5 minutes before NOW: 64 GPUs for 10 min, 32 for 5."""
    cluster = next(m for m in manifests() if m["kind"] == "Cluster")
    cluster["spec"]["nodeGroups"][0]["count"] = 4
    young.apply_object(cluster, at=NOW - timedelta(minutes=5))
    data = load_store(young, WEEK, CostPolicySpec())
    h100 = next(
        pc
        for pc in chargeback(data.history, data.metered, data.pools, WEEK, data.policy).pools
        if pc.pool == "h100-training"
    )
    assert h100.capacity == (64 * 10 + 32 * 5) * 60 * US_PER_S * 1000
    assert reconciles(h100)


def test_a_backfilled_revision_counts_from_before_history() -> None:
    """Objects older than the configuration history (migration 0003's revision 1) were there all along."""
    cluster = next(m for m in manifests() if m["kind"] == "Cluster")
    rev = RevisionRecord("Cluster", "demo", 1, "apply", "migration", "", JOINED, cluster["spec"], {}, {}, 1)
    spans = node_spans([rev])
    assert len(spans) == 16 and all(s.start is None and s.end is None for s in spans)
    gone = RevisionRecord("Cluster", "demo", 2, "delete", "u", "", NOW, cluster["spec"], {}, {}, 2)
    assert {s.end for s in node_spans([rev, gone])} == {NOW}


def node(name: str, gpus: int) -> Node:
    return Node(name, "m", gpus, 0, 0, 0)


span_st = st.tuples(
    st.integers(1, 8),
    st.one_of(st.none(), st.integers(-3600, 7200)),
    st.one_of(st.none(), st.integers(0, 3600 * 3)),
)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(span_st, min_size=1, max_size=6),
    st.lists(
        st.tuples(st.sampled_from(["q1", "q2", "q3"]), st.integers(1, 4000), st.integers(0, 3599)), max_size=8
    ),
    st.decimals("0.01", "20", places=2),
)
def test_clipped_capacity_reconciles_and_shares_all_idle(
    raw: list[tuple[int, int | None, int | None]], runs: list[tuple[str, int, int]], price: Decimal
) -> None:
    """Whatever the node history, capacity is the spans' GPU time inside the window, list
    charges plus idle equal it to the cent, and the guarantee holders get all of the idle."""
    t0 = NOW - timedelta(hours=1)
    win = Window(t0, NOW)
    spans = []
    for i, (gpus, a, length) in enumerate(raw):
        start = None if a is None else t0 + timedelta(seconds=a)
        end = None if length is None else (start or t0) + timedelta(seconds=length + 1)
        spans.append(NodeSpan(node(f"n{i}", gpus), start, end))
    history_runs = [
        Run(
            f"w{i}", 1, t0 + timedelta(seconds=s), None, "Running", Resources("p", "m", milli, 1, milli, 0, 0)
        )
        for i, (_, milli, s) in enumerate(runs)
    ]
    infos = {
        f"w{i}": WorkloadInfo(f"w{i}", q, "", "training", milli, 0, 0, "", "Running", "")
        for i, (q, milli, _) in enumerate(runs)
    }
    h = History(infos, history_runs, [], [], spans)
    pool = PoolCost(
        "p", price, 0, {"q1": 3000, "q2": 1000}, tuple((s.start, s.end, s.node.gpu_count) for s in spans)
    )
    expected = 0
    for s in spans:
        lo, hi = max(s.start or t0, t0), min(s.end or NOW, NOW)
        expected += s.node.gpu_count * 1000 * max(0, us_between(lo, hi))
    assert pool_capacity(pool, win) == expected
    (pc,) = chargeback(h, meter(h, win), {"p": pool}, win, CostPolicySpec()).pools
    assert reconciles(pc) and pc.capacity == max(expected, pc.allocated)
    assert sum(pc.charges.values()) + pc.idle_cents == pc.total_cents
    assert sum(pc.idle_shares.values()) == pc.idle_cents


# ---------------------------------------------------------------------- sacct: unfinished jobs kept
SACCT_HEAD = "JobID|User|Account|Partition|Submit|Start|End|AllocTRES|ReqTRES|State"


def test_sacct_keeps_failed_cancelled_and_timeout_jobs_with_their_state() -> None:
    """A FAILED job whose AllocTRES Slurm left empty was skipped as "no GPU": now it is sized
    from ReqTRES and replayed, its state kept; a skip still names an unfinished job's state."""
    lines = [
        SACCT_HEAD,
        "1|u|a|gpu|2026-03-02T08:00:00|2026-03-02T08:01:00|2026-03-02T08:05:00||cpu=8,gres/gpu=4,node=1|FAILED",
        "2|u|a|gpu|2026-03-02T08:00:00|2026-03-02T08:01:00|2026-03-02T09:01:00|gres/gpu=2|gres/gpu=2|TIMEOUT",
        "3|u|a|gpu|2026-03-02T08:00:00|2026-03-02T08:02:00|2026-03-02T08:03:00||gres/gpu=1|CANCELLED by 7",
        "4|u|a|gpu|2026-03-02T08:00:00|None|2026-03-02T08:03:00||gres/gpu=1|CANCELLED by 7",
        "5|u|a|gpu|2026-03-02T08:00:00|2026-03-02T08:01:00|2026-03-02T08:05:00|||FAILED",
    ]
    tr = parse_sacct(lines, "s")
    assert [(j.name, j.gpus, j.duration) for j in tr.jobs] == [
        ("slurm-1", 4, 240.0),
        ("slurm-2", 2, 3600.0),
        ("slurm-3", 1, 60.0),
    ]
    assert [o[4] for o in tr.observed] == ["FAILED", "TIMEOUT", "CANCELLED"]
    assert tr.skipped == {"never started, CANCELLED": 1, "no GPU, FAILED": 1}
    with pytest.raises(SacctError, match="s:2: field ReqTRES: gres/gpu='x' is not a whole number"):
        parse_sacct([SACCT_HEAD, lines[1].replace("gres/gpu=4", "gres/gpu=x")], "s")


# ---------------------------------------------------------------------- charts that add up
def test_cost_per_team_chart_adds_up_to_the_spend(young: Store) -> None:
    """The bars stack each queue's own cost under its top team: they add up to what the teams
    were charged (list + surcharge + idle shared), never a parent's total beside its children's."""
    rep = chargeback_report(load_store(young, WEEK, CostPolicySpec()))
    fig = team_figure(rep)
    tops = {r["queue"]: Decimal(r["total"]) for r in rows(rep, "teams") if r["parent"] is None}
    assert {x for bar in fig.data for x in bar.x} == set(tops) == {"ai-org"}
    drawn = sum(Decimal(str(y)) for bar in fig.data for y in bar.y)
    assert drawn == sum(tops.values())
    assert drawn == Decimal(rep["summary"]["listCost"]) + Decimal(rep["summary"]["idleCost"])
    page = render(rep, "html")
    assert 'id="teams-chart"' in page and "llm-pretrain" in page


# ---------------------------------------------------------------------- every wait has its reason
def admitted_after_wait(store: Store, name: str, detail_extra: dict[str, Any], pending_msg: str = "") -> None:
    store.submit_workload(job(name, "llm-research", 1), owner="u", at=NOW - timedelta(minutes=10))
    if pending_msg:
        store.apply_transitions([PhaseChange(name, "Pending", pending_msg)], at=NOW - timedelta(minutes=9))
    pod = {"group": "w", "index": 0, "node": "h100-0", "devices": [0], "gpuMilli": 1000}
    detail = {"pool": "h100-training", "nodes": ["h100-0"], "gpuMilli": 1000, **detail_extra}
    store.apply_transitions(
        [PhaseChange(name, "Admitted", "fits", {"pool": "h100-training", "pods": [pod]})],
        audit=[AuditEntry("scheduler", "workload.admit", "Workload", name, detail)],
        at=NOW - timedelta(minutes=2),
    )


def test_every_wait_carries_what_it_waited_for(young: Store) -> None:
    """A finished wait's reason comes from the admission record's waitedFor (the row's reason
    is replaced on admission), else from the wait's own events; none reads "(none given)"."""
    admitted_after_wait(young, "quota", {"waitedFor": "QuotaExceeded: llm-research is at its limit"})
    admitted_after_wait(young, "first", {"waitedFor": ""})
    admitted_after_wait(young, "requeued", {}, "requeued: node h100-3 went away")
    admitted_after_wait(young, "old", {})
    data = load_store(young, WEEK, CostPolicySpec())
    why = {w.workload: w.reason for w in data.history.waits}
    assert why["quota"] == "QuotaExceeded: llm-research is at its limit"
    assert why["first"] == "admitted when first considered"
    assert why["requeued"] == "requeued: node h100-3 went away"
    assert why["old"] == "(not recorded)"  # an admission written before waitedFor existed
    reasons = dict(next(t for t in weekly_report(data)["tables"] if t["name"] == "waitReasons")["rows"])
    assert "(none given)" not in reasons and reasons["QuotaExceeded"] == 1


def test_the_admission_record_names_the_last_pending_reason() -> None:
    """The controller puts the workload's latest pending reason into its admission record."""
    from gpupool.engine.decisions import Admit, Decisions, Pending, PendingCode
    from gpupool.service.controller.commit import Commit

    reasons = {"a": Pending("a", "q", PendingCode.QUOTA, "q is at its limit")}
    stored = {"b": "InsufficientCapacity: no node has 8 free GPUs"}
    d = Decisions()
    d.admitted = [Admit(n, "q", "p", (), False, "fits") for n in ("a", "b", "c")]
    waited = Commit.waited_for(d, reasons, stored)
    assert waited == {
        "a": "QuotaExceeded: q is at its limit",
        "b": "InsufficientCapacity: no node has 8 free GPUs",
    }
    audits: list[AuditEntry] = []
    Commit.admission_records(d, 0.0, [], audits, waited)
    assert [a.detail["waitedFor"] for a in audits] == [waited["a"], waited["b"], ""]


# ---------------------------------------------------------------------- billed to the real end
def test_a_local_run_that_ended_while_the_server_was_down_is_billed_to_its_end(tmp_path: Path) -> None:
    """The pod exits while no server runs; the restarted server records Succeeded at its own
    time, but the run is metered to the pod's exit (its exit.json), not to the restart."""
    from gpupool.service.config import ServiceConfig
    from tests.service.test_local_backend import PY, app_with, backend, phase
    from tests.service.test_local_backend import workload as local_workload
    from tests.test_service_support import wait_for

    go = tmp_path / "go"
    code = f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.02)\n"
    with app_with(backend(tmp_path), tmp_path) as (c, h):
        assert c.post("/v1/workloads", json=local_workload("down", code), headers=h).status_code == 201
        phase(c, h, "down", "Running", timeout=30)
    state = json.loads(backend(tmp_path).path.read_text())
    exit_json = Path(state["runs"]["down"]["pods"][0]["dir"]) / "exit.json"
    go.touch()
    wait_for(exit_json.exists, 30, "the pod to exit while the server is down")
    ended = datetime.fromtimestamp(json.loads(exit_json.read_text())["finishedAt"], UTC)
    wait_for(lambda: datetime.now(UTC) > ended + timedelta(seconds=1), 10, "a restart later than the exit")
    with app_with(backend(tmp_path), tmp_path) as (c, _):
        h = {"Authorization": f"Bearer {(tmp_path / 'admin-token').read_text().strip()}"}
        phase(c, h, "down", "Succeeded", timeout=30)
    with Store.open(ServiceConfig(state_dir=tmp_path).url) as store:
        finished_at = store.get_workload("down").finished_at
        data = load_store(store, Window(ended - timedelta(hours=1), datetime.now(UTC)), CostPolicySpec())
    (run,) = [r for r in data.history.runs if r.workload == "down"]
    assert finished_at is not None and finished_at > ended + timedelta(seconds=1)  # noticed at the restart
    assert run.end == ended and run.outcome == "Succeeded"
    assert PY  # the local backend's interpreter ran the pod


def test_a_failed_attempt_noticed_late_is_billed_to_its_end(young: Store) -> None:
    """A requeue after a failure whose record says when the run really ended (endedAt)."""
    run_job(young, "flaky", "llm-research", 4, NOW - timedelta(minutes=10), None)
    real_end = NOW - timedelta(minutes=8)
    detail = {"code": "Error", "reason": "exit 1", "endedAt": real_end.isoformat()}
    young.apply_transitions(
        [PhaseChange("flaky", "Pending", "retry 1 of 3")],
        audit=[AuditEntry("scheduler", "workload.failure", "Workload", "flaky", detail)],
        at=NOW - timedelta(minutes=3),
    )
    data = load_store(young, WEEK, CostPolicySpec())
    (run,) = [r for r in data.history.runs if r.workload == "flaky"]
    assert (run.end, run.outcome) == (real_end, "Pending")


def test_a_pool_without_a_price_is_named_not_shown_as_a_free_figure() -> None:
    """Why every cost of a simulated trial read 0: its pools had no price; the summary says so."""
    store = Store.open("sqlite://", clock=lambda: NOW)
    for m in manifests():
        if m["kind"] == "ResourcePool" and m["metadata"]["name"] == "l40s-experiment":
            m["spec"].pop("pricePerGPUHour", None)
        store.apply_object(m, at=JOINED)
    rep = chargeback_report(load_store(store, WEEK, CostPolicySpec()))
    store.close()
    assert rep["summary"]["unpriced"] == "no pricePerGPUHour (or CostPolicy pricePerGpuHour): l40s-experiment"
    priced = parse_policy({"kind": "CostPolicy", "spec": {"pricePerGpuHour": {"l40s-experiment": 0.9}}})
    store = Store.open("sqlite://", clock=lambda: NOW)
    for m in manifests():
        store.apply_object(m, at=JOINED)
    assert "unpriced" not in chargeback_report(load_store(store, WEEK, priced))["summary"]
    store.close()
