"""Metering from the store's own history: each run once, open runs to the window's end."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from gpupool.audit import AuditEntry
from gpupool.cost.history import load_history
from gpupool.cost.metering import (
    GPU_HOUR,
    US_PER_S,
    SimulatedUsage,
    Window,
    meter,
    retained,
    rollup,
    rollup_subtrees,
    split_periods,
)
from gpupool.manifests import Bundle, build, load_files
from gpupool.store import PhaseChange, Store

ROOT = Path(__file__).resolve().parents[2]
T0 = datetime(2026, 11, 30, 23, 0, tzinfo=UTC)
API = "gpupool.io/v1alpha1"


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


def example_bundle() -> Bundle:
    return build(load_files([ROOT / "examples" / "cluster"]))


def workload(name: str, queue: str, gpus: int, replicas: int = 1, typ: str = "training") -> dict[str, Any]:
    group = {
        "name": "w",
        "replicas": replicas,
        "resources": {"nvidia.com/gpu": gpus, "cpu": 8, "memory": "64Gi"},
    }
    return {
        "apiVersion": API,
        "kind": "Workload",
        "metadata": {"name": name},
        "spec": {"queue": queue, "type": typ, "podGroups": [group]},
    }


def placement(pool: str, node: str, devices: int, milli: int = 1000) -> dict[str, Any]:
    pod = {"group": "w", "index": 0, "node": node, "devices": list(range(devices)), "gpuMilli": milli}
    pod |= {"cpuMilli": 8000, "memoryMiB": 65536}
    return {"pool": pool, "pods": [pod]}


def admit(
    store: Store, name: str, pool: str, node: str, devices: int, at: datetime, milli: int = 1000
) -> None:
    detail = {"pool": pool, "nodes": [node], "gpuMilli": devices * milli}
    store.apply_transitions(
        [PhaseChange(name, "Admitted", "fits", placement(pool, node, devices, milli))],
        audit=[AuditEntry("scheduler", "workload.admit", "Workload", name, detail)],
        at=at,
    )


def step(store: Store, name: str, phase: str, at: datetime, reason: str = "") -> None:
    store.apply_transitions([PhaseChange(name, phase, reason)], at=at)


@pytest.fixture
def store() -> Iterator[Store]:
    s = Store.open("sqlite://", clock=Clock())
    yield s
    s.close()


def s(n: float) -> datetime:
    return T0 + timedelta(seconds=n)


def node_of(bundle: Bundle, model: str) -> str:
    return next(n.name for n in bundle.nodes if n.gpu_model.startswith(model))


def preempted_history(store: Store, bundle: Bundle) -> None:
    """train-1: 4 GPUs [10, 100) preempted, requeued, again [200, 500) succeeded."""
    h100 = node_of(bundle, "H100")
    store.submit_workload(workload("train-1", "llm-pretrain", 4), owner="u", at=s(0))
    admit(store, "train-1", "h100-training", h100, 4, s(10))
    step(store, "train-1", "Running", s(20))
    step(store, "train-1", "Preempted", s(100), "reclaim")
    step(store, "train-1", "Pending", s(110), "requeued after preemption")
    admit(store, "train-1", "h100-training", h100, 4, s(200))
    step(store, "train-1", "Running", s(210))
    step(store, "train-1", "Succeeded", s(500))


def test_preempted_then_restarted_counts_each_run_once(store: Store) -> None:
    bundle = example_bundle()
    preempted_history(store, bundle)
    h = load_history(store, bundle)
    assert [(r.start, r.end, r.outcome) for r in h.runs] == [
        (s(10), s(100), "Preempted"),
        (s(200), s(500), "Succeeded"),
    ]
    m = meter(h, Window(s(0), s(1000)))
    assert sum(x.gpu for x in m) == 4 * 1000 * (90 + 300) * US_PER_S
    assert {x.gpu_model for x in m} == {"H100-80GB"}
    # the waits: submitted -> first admission, requeued -> second admission
    assert [(w.start, w.end) for w in h.waits] == [(s(0), s(10)), (s(110), s(200))]


def test_running_workload_counts_up_to_the_window_end(store: Store) -> None:
    bundle = example_bundle()
    store.submit_workload(workload("live", "llm-research", 2), owner="u", at=s(0))
    admit(store, "live", "h100-training", node_of(bundle, "H100"), 2, s(30))
    step(store, "live", "Running", s(31))
    h = load_history(store, bundle)
    m = meter(h, Window(s(0), s(130)))
    assert [(x.outcome, x.gpu) for x in m] == [("Running", 2 * 1000 * 100 * US_PER_S)]
    # a window that ends before the admission sees nothing; one inside it sees its share only
    assert meter(h, Window(s(0), s(30))) == []
    assert sum(x.gpu for x in meter(h, Window(s(50), s(60)))) == 2 * 1000 * 10 * US_PER_S


def test_fractional_runs_and_simulated_use(store: Store) -> None:
    bundle = example_bundle()
    l40 = node_of(bundle, "L40S")
    store.submit_workload(workload("nb", "llm-research", 1, typ="inference"), owner="u", at=s(0))
    admit(store, "nb", "l40s-experiment", l40, 1, s(0), milli=500)
    step(store, "nb", "Cancelled", s(3600))
    h = load_history(store, bundle)
    (m,) = meter(h, Window(s(0), s(7200)), SimulatedUsage())
    assert m.gpu == GPU_HOUR // 2 and m.fraction_milli == 500
    assert m.used == int(m.gpu * 0.45)
    t = rollup([m], "fraction")
    assert list(t) == ["0.5"] and t["0.5"].utilization == pytest.approx(0.45)


def test_rollups_by_team_and_day(store: Store) -> None:
    bundle = example_bundle()
    preempted_history(store, bundle)
    h = load_history(store, bundle)
    m = meter(h, Window(s(0), s(1000)))
    parents = {q.name: q.parent for q in bundle.queues}
    sub = rollup_subtrees(m, parents)
    assert sub["llm-pretrain"].gpu == sub["llm-team"].gpu == sub["ai-org"].gpu > 0
    assert "vision-team" not in sub
    # T0 is 23:00 UTC: [10, 500) s stays on Nov 30; a day split never loses or invents time
    days = rollup(m, "day")
    assert sum(t.gpu for t in days.values()) == sum(x.gpu for x in m)
    parts = split_periods(s(3000), s(3600 + 3000), "day")
    assert [p[0] for p in parts] == ["2026-11-30", "2026-12-01"]


def test_window_and_retention_errors_name_the_field() -> None:
    with pytest.raises(ValueError, match=r"^to: must be after from"):
        Window(s(10), s(5))
    with pytest.raises(ValueError, match=r"^from: a time zone is required"):
        Window(datetime(2026, 1, 1), s(5))
    with pytest.raises(ValueError, match=r"^from: a report spans at most 3660 days"):
        Window(s(0), s(3661 * 86400))
    w = retained(Window(s(0), s(10 * 86400)), 2)
    assert w.start == s(8 * 86400)
    with pytest.raises(ValueError, match="retentionDays"):
        retained(w, 0)
    with pytest.raises(ValueError, match=r"^by: unknown grouping"):
        rollup([], "colour")


def test_a_same_phase_update_continues_the_run(store: Store) -> None:
    bundle = example_bundle()
    h100 = node_of(bundle, "H100")
    store.submit_workload(workload("again", "llm-research", 2), owner="u", at=s(0))
    admit(store, "again", "h100-training", h100, 2, s(10))
    step(store, "again", "Admitted", s(20), "placement refreshed")
    step(store, "again", "Running", s(30))
    step(store, "again", "Succeeded", s(100))
    h = load_history(store, bundle)
    assert [(r.start, r.end, r.res.gpu_milli, r.res.cpu_milli) for r in h.runs] == [
        (s(10), s(100), 2000, 8000)
    ]
