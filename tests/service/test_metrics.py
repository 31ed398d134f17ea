"""The Prometheus metrics after a few cycles on the virtual backend (in-process, one fake clock).

What is checked: the per-queue families exist with their labels (usage, guarantee, pending by
type and reason code), an admission's wait is observed under its queue and task type, cost and
GPU-seconds grow by GPUs x elapsed time x the pool's price, fragmentation reflects a shared
device, state is refreshed at most once per ``refresh_s``, and no label value anywhere is a
workload's name.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpupool.engine.decisions import PendingCode
from gpupool.manifests.convert import workload_model
from gpupool.service.backends.virtual import VirtualBackend
from gpupool.service.config import EXAMPLES, seed_config
from gpupool.service.controller import Controller
from gpupool.service.metrics import NEW_REASON, Metrics
from gpupool.service.readmodel import ControllerReadModel
from gpupool.store import Store
from tests.test_service_support import wl

T0 = 1_800_000_000.0
NAMES = ("train-a", "tiny-b", "huge-c")
ALLOWED_LABELS = {"queue", "pool", "type", "reason", "phase", "outcome", "le"}


class Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[tuple[Store, Controller, Metrics, Clock]]:
    clk = Clock()
    store = Store.open(f"sqlite:///{tmp_path}/gpupool.db")
    seed_config(store, EXAMPLES / "cluster")
    metrics = Metrics(refresh_s=0.0, frag_refresh_s=0.0)
    be = VirtualBackend(tmp_path / "vc.json", time_scale=1.0, clock=clk)
    ctl = Controller(store, be, tick_s=0.05, min_interval_s=0.0, clock=clk, hooks=metrics.hooks())
    metrics.bind(ControllerReadModel(ctl), ctl)
    ctl.recover()
    try:
        yield store, ctl, metrics, clk
    finally:
        store.close()


def submit(store: Store, ctl: Controller, name: str, **kw: Any) -> None:
    m = wl(name, **kw)
    rec, _ = store.submit_workload(m, owner="t")
    ctl.submitted(rec, workload_model(m, ctl.bundle.priority_classes, 0.0))


def step(ctl: Controller, clk: Clock, dt: float) -> None:
    clk.t += dt
    ctl.cycle()


def sample(m: Metrics, name: str, **labels: str) -> float | None:
    return m.registry.get_sample_value(name, labels)


def test_per_queue_families_and_labels(rig: tuple[Store, Controller, Metrics, Clock]) -> None:
    store, ctl, m, clk = rig
    submit(store, ctl, "train-a", gpus=2, pool="h100-training", type="training", duration="10h")
    submit(store, ctl, "tiny-b", gpus="500m", pool="l40s-experiment", type="inference", duration="10h")
    big = wl("huge-c", gpus=8, pool="h100-training", type="evaluation", duration="1h")
    big["spec"]["podGroups"][0]["replicas"] = 64  # 512 GPUs: more than the cluster holds
    rec, _ = store.submit_workload(big, owner="t")
    ctl.submitted(rec, workload_model(big, ctl.bundle.priority_classes, 0.0))
    step(ctl, clk, 1.0)
    assert store.get_workload("train-a").phase in {"Admitted", "Running"}
    assert sample(m, "gpupool_queue_gpu_guarantee", queue="llm-research", pool="h100-training") == 8.0
    assert sample(m, "gpupool_queue_gpu_used", queue="llm-research", pool="h100-training") == 2.0
    assert sample(m, "gpupool_queue_gpu_used", queue="llm-team", pool="h100-training") == 2.0  # subtree
    pend = [
        s
        for f in text_string_to_metric_families(m.render(lambda _: None).decode())
        if f.name == "gpupool_queue_pending_workloads"
        for s in f.samples
    ]
    assert len(pend) == 1 and pend[0].value == 1.0
    assert pend[0].labels["queue"] == "llm-research" and pend[0].labels["type"] == "evaluation"
    assert pend[0].labels["reason"] in {c.value for c in PendingCode} | {NEW_REASON}
    got = sample(m, "gpupool_queue_pending_gpus", **pend[0].labels)
    assert got == 512.0
    assert (sample(m, "gpupool_last_cycle_timestamp_seconds") or 0) > 0
    assert (sample(m, "gpupool_queue_oldest_pending_seconds", queue="llm-research") or 0) > 0
    assert sample(m, "gpupool_queue_oldest_pending_seconds", queue="serving") is None  # nothing waits


def test_wait_is_observed_by_queue_and_type(rig: tuple[Store, Controller, Metrics, Clock]) -> None:
    store, ctl, m, clk = rig
    submit(store, ctl, "train-a", gpus=2, pool="h100-training", type="training", duration="10h")
    submit(store, ctl, "tiny-b", gpus="500m", pool="l40s-experiment", type="inference", duration="10h")
    step(ctl, clk, 1.0)
    labels = {"queue": "llm-research", "type": "training"}
    assert sample(m, "gpupool_admission_wait_time_seconds_count", **labels) == 1.0
    assert (sample(m, "gpupool_admission_wait_time_seconds_sum", **labels) or 0) > 0
    inf = {"queue": "llm-research", "type": "inference"}
    assert sample(m, "gpupool_admission_wait_time_seconds_count", **inf) == 1.0
    assert (
        sample(m, "gpupool_admission_wait_time_seconds_count", queue="llm-research", type="unknown") is None
    )
    step(ctl, clk, 1.0)  # nothing new admitted: no new observation
    assert sample(m, "gpupool_admission_wait_time_seconds_count", **labels) == 1.0


def test_cost_and_gpu_seconds_grow_with_time_and_price(rig: tuple[Store, Controller, Metrics, Clock]) -> None:
    store, ctl, m, clk = rig
    submit(store, ctl, "train-a", gpus=2, pool="h100-training", type="training", duration="10h")
    step(ctl, clk, 1.0)  # admitted; the cost clock starts
    step(ctl, clk, 3600.0)
    secs = sample(m, "gpupool_allocated_gpu_seconds_total", queue="llm-research", pool="h100-training")
    cost = sample(m, "gpupool_allocated_cost_total", queue="llm-research", pool="h100-training")
    assert secs == pytest.approx(2 * 3600.0)
    assert cost == pytest.approx(2 * 2.9)  # 2 GPUs x 1 h x pricePerGPUHour 2.9


def test_fragmentation_of_a_shared_device(rig: tuple[Store, Controller, Metrics, Clock]) -> None:
    store, ctl, m, clk = rig
    step(ctl, clk, 1.0)
    assert sample(m, "gpupool_pool_fragmentation_ratio", pool="l40s-experiment") == 0.0
    submit(store, ctl, "tiny-b", gpus="500m", pool="l40s-experiment", type="inference", duration="10h")
    step(ctl, clk, 1.0)
    assert sample(m, "gpupool_pool_gpu_free_partial", pool="l40s-experiment") == 0.5
    ratio = sample(m, "gpupool_pool_fragmentation_ratio", pool="l40s-experiment") or 0.0
    assert 0.0 < ratio < 1.0  # the node holding the half GPU is no longer whole
    assert sample(m, "gpupool_pool_gpu_free_partial", pool="h100-training") == 0.0


def test_state_refreshes_at_most_once_per_interval(rig: tuple[Store, Controller, Metrics, Clock]) -> None:
    store, ctl, m, clk = rig
    m.refresh_s = 3600.0
    step(ctl, clk, 1.0)  # first refresh: nothing used
    submit(store, ctl, "train-a", gpus=2, pool="h100-training", type="training", duration="10h")
    step(ctl, clk, 1.0)  # admitted, but the state families wait for the interval
    assert sample(m, "gpupool_queue_gpu_used", queue="llm-research", pool="h100-training") == 0.0
    assert (
        sample(m, "gpupool_admission_wait_time_seconds_count", queue="llm-research", type="training") == 1.0
    )
    m.refresh_s = 0.0
    step(ctl, clk, 1.0)
    assert sample(m, "gpupool_queue_gpu_used", queue="llm-research", pool="h100-training") == 2.0


def test_no_label_is_a_workload_name(rig: tuple[Store, Controller, Metrics, Clock]) -> None:
    store, ctl, m, clk = rig
    submit(store, ctl, "train-a", gpus=2, pool="h100-training", type="training", duration="10m")
    submit(store, ctl, "tiny-b", gpus="500m", pool="l40s-experiment", type="inference", duration="10h")
    step(ctl, clk, 1.0)
    step(ctl, clk, 3600.0)  # train-a finished
    text = m.render(lambda _: None).decode()
    families = list(text_string_to_metric_families(text))
    assert {f.name for f in families} >= {"gpupool_queue_gpu_used", "gpupool_finished_workloads"}
    for f in families:
        for s in f.samples:
            assert set(s.labels) <= ALLOWED_LABELS, (s.name, s.labels)
            assert not set(s.labels.values()) & set(NAMES), (s.name, s.labels)
