"""Measured GPU utilisation (gpupool.service.utilisation*): readings from NVML (a stand-in),
Prometheus (a local HTTP stub) and the synthetic levels; hourly rollups; the per-workload
gauges; and the held-but-idle alert on the local and the virtual backends."""

from __future__ import annotations

import http.server
import json
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest

from gpupool.discovery import synthetic
from gpupool.discovery.nvml import NvmlDiscovery, Reading
from gpupool.model import Admission, PodGroup, PodPlacement, PodRequest, Running, Workload
from gpupool.service import alerts
from gpupool.service.core import Service
from gpupool.service.readmodel import ControllerReadModel
from gpupool.service.utilisation import About, UtilisationSettings, UtilisationTracker, hour_split
from gpupool.service.utilisation_loop import RULE, UtilisationLoop
from gpupool.service.utilisation_sources import NvmlReadings, PrometheusReadings, SyntheticReadings
from gpupool.store import Store
from gpupool.store.utilisation import Rollup
from tests.discovery.test_nvml import FakeNvml, NVMLError, h100s
from tests.test_service_support import API, in_process_controller, wl

T0 = 1_800_000_000.0  # an instant on an hour boundary (1_800_000_000 / 3600 = 500000)


class UtilNvml(FakeNvml):
    """The stand-in NVML with utilisation rates and memory in use per device."""

    def __init__(self, n: int = 2) -> None:
        super().__init__(h100s(n))
        self.sm = [0] * n
        self.used = [0] * n
        self.broken: set[int] = set()

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        if h in self.broken:
            raise NVMLError(15)  # GPU_IS_LOST
        return SimpleNamespace(gpu=self.sm[h], memory=0)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        g = self.gpus[h]
        return SimpleNamespace(
            total=g.mem_mib << 20, used=self.used[h], free=(g.mem_mib << 20) - self.used[h]
        )


def running(
    name: str, devices: tuple[int, ...], node: str = "n1", queue: str = "q", pool: str = "p"
) -> Running:
    pod = PodPlacement("main", 0, node, devices, 1000, 0, 0, 0)
    w = Workload(name, queue, (PodGroup("main", 1, PodRequest(gpus=len(devices))),))
    return Running(w, Admission(pool, (pod,), admitted_at=T0))


def readings(sm: float, keys: list[tuple[str, int]], mem: int = 1 << 30) -> dict[tuple[str, int], Reading]:
    return {k: Reading(sm, mem) for k in keys}


def about(idle_for_s: float | None = 1800.0) -> Any:
    return lambda name: About("alice", idle_for_s)


# ---------------------------------------------------------------------- the tracker
def test_a_workload_below_the_threshold_for_its_idle_for_is_held_idle() -> None:
    tr = UtilisationTracker(UtilisationSettings(threshold_percent=5.0))
    run = {"nb": running("nb", (0, 1))}
    keys = [("n1", 0), ("n1", 1)]
    for minute in range(0, 30, 5):  # 0 .. 25 min below 5 %: not yet its 30 min
        tr.observe(T0 + minute * 60, run, readings(2.0, keys), about())
        assert tr.held_idle() == []
    tr.observe(T0 + 30 * 60, run, readings(2.0, keys), about())
    (h,) = tr.held_idle()
    assert (h.workload, h.owner, h.gpus, h.idle_s, h.idle_since) == ("nb", "alice", 2.0, 1800.0, T0)
    tr.observe(T0 + 35 * 60, run, readings(40.0, keys), about())  # it computes again
    assert tr.held_idle() == []
    (r,) = tr.drain()
    assert r.idle_s == 1800.0 and r.idle_gpu_s == 3600.0  # the whole stretch, once it qualified
    assert r.sampled_s == 35 * 60 and r.gpu_s == 2 * 35 * 60
    assert r.used_gpu_s == pytest.approx(2 * 30 * 60 * 0.02 + 2 * 300 * 0.40)


def test_one_busy_gpu_a_missing_reading_or_idle_for_off_is_never_held_idle() -> None:
    tr = UtilisationTracker(UtilisationSettings())
    run = {"w": running("w", (0, 1))}
    for minute in range(0, 121, 10):
        tr.observe(T0 + minute * 60, run, {("n1", 0): Reading(0.0, 0), ("n1", 1): Reading(90.0, 0)}, about())
    assert tr.held_idle() == []
    gaps = UtilisationTracker(UtilisationSettings())
    for minute in range(0, 121, 10):  # every other pass cannot read device 1: unknown is not idle
        got = readings(0.0, [("n1", 0)] if minute % 20 else [("n1", 0), ("n1", 1)])
        gaps.observe(T0 + minute * 60, run, got, about())
    assert gaps.held_idle() == []
    off = UtilisationTracker(UtilisationSettings())
    for minute in range(0, 121, 10):
        off.observe(T0 + minute * 60, run, readings(0.0, [("n1", 0), ("n1", 1)]), about(None))
    assert off.held_idle() == [] and all(r.idle_s == 0 for r in off.drain())


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.floats(1, 600), st.floats(0, 100)), min_size=1, max_size=30),
    st.floats(60, 7200),
    st.sampled_from([1e-3, 1.0, 1000.0]),
)
def test_the_decision_does_not_depend_on_the_unit_of_time(
    steps: list[tuple[float, float]], idle_for: float, scale: float
) -> None:
    """Every time (the readings' instants and idleFor) times the same factor: same verdicts."""

    def verdicts(k: float) -> list[bool]:
        tr = UtilisationTracker(UtilisationSettings())
        run, keys, t, out = {"w": running("w", (0,))}, [("n1", 0)], 0.0, []
        for dt, sm in steps:
            t += dt
            tr.observe(t * k, run, readings(sm, keys), about(idle_for * k))
            out.append(bool(tr.held_idle()))
        return out

    assert verdicts(1.0) == verdicts(scale)


@given(st.floats(0, 1e6), st.floats(0, 1e5))
def test_hour_split_covers_the_interval_exactly_in_clock_hours(t0: float, length: float) -> None:
    parts = hour_split(t0, t0 + length)
    assert sum(s for _, s in parts) == pytest.approx(length, abs=1e-6)
    assert all(h % 3600 == 0 and 0 < s <= 3600 for h, s in parts)


def test_gauges_by_pool_queue_and_workload_go_when_the_workload_ends() -> None:
    reg = CollectorRegistry()
    tr = UtilisationTracker(UtilisationSettings(), reg)
    tr.observe(T0, {"w": running("w", (0,))}, readings(50.0, [("n1", 0)], mem=3 << 30), about())
    text = generate_latest(reg).decode()
    assert 'gpupool_gpu_utilization{pool="p",queue="q",workload="w"} 0.5' in text
    assert 'gpupool_gpu_memory_used_bytes{pool="p",queue="q",workload="w"} 3.221225472e+09' in text
    tr.observe(T0 + 60, {}, {}, about())
    assert 'workload="w"' not in generate_latest(reg).decode()


# ---------------------------------------------------------------------- sources
def test_nvml_reads_sm_utilisation_and_memory_used_and_skips_a_lost_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nv = UtilNvml(3)
    nv.sm, nv.used, nv.broken = [0, 87, 50], [1 << 30, 60 << 30, 0], {2}
    src = NvmlReadings(NvmlDiscovery(nv), "box")
    assert src.read() == {("box", 0): Reading(0.0, 1 << 30), ("box", 1): Reading(87.0, 60 << 30)}


@pytest.fixture
def prometheus() -> Iterator[tuple[str, dict[str, Any]]]:
    """A local HTTP stub of Prometheus' instant-query API; ``answers[metric]`` is its result list."""
    answers: dict[str, Any] = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            from urllib.parse import parse_qs, urlparse

            u = urlparse(self.path)
            metric = parse_qs(u.query).get("query", [""])[0]
            ok = u.path == "/api/v1/query" and metric in answers
            body = {"status": "success", "data": {"resultType": "vector", "result": answers.get(metric, [])}}
            data = json.dumps(body if ok else {"status": "error", "error": "unknown"}).encode()
            self.send_response(200 if ok else 400)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", answers
    finally:
        srv.shutdown()
        srv.server_close()


def test_dcgm_exporter_metrics_read_through_prometheus(prometheus: tuple[str, dict[str, Any]]) -> None:
    url, answers = prometheus
    answers["DCGM_FI_DEV_GPU_UTIL"] = [
        {"metric": {"Hostname": "node-a", "gpu": "0"}, "value": [T0, "97"]},
        {"metric": {"Hostname": "node-a", "gpu": "1"}, "value": [T0, "0"]},
        {"metric": {"gpu": "2"}, "value": [T0, "50"]},  # no node: not one device
    ]
    answers["DCGM_FI_DEV_FB_USED"] = [{"metric": {"Hostname": "node-a", "gpu": "0"}, "value": [T0, "1024"]}]
    got = PrometheusReadings(url).read()
    assert got == {("node-a", 0): Reading(97.0, 1 << 30), ("node-a", 1): Reading(0.0, 0)}


def test_hami_metrics_read_through_prometheus_and_an_error_names_the_metric(
    prometheus: tuple[str, dict[str, Any]],
) -> None:
    url, answers = prometheus
    answers["HostCoreUtilization"] = [{"metric": {"nodeid": "n", "deviceidx": "3"}, "value": [T0, "12.5"]}]
    answers["HostGPUMemoryUsage"] = [{"metric": {"nodeid": "n", "deviceidx": "3"}, "value": [T0, "2048"]}]
    assert PrometheusReadings(url, "hami").read() == {("n", 3): Reading(12.5, 2048)}
    answers.clear()
    with pytest.raises(Exception, match="400"):
        PrometheusReadings(url).read()
    with pytest.raises(ValueError, match="exporter"):
        PrometheusReadings(url, "nvidia-smi")


def test_synthetic_levels_follow_the_task_type_and_the_annotation() -> None:
    assert synthetic.level("training", "a").sm_percent > synthetic.level("inference", "a").sm_percent
    assert synthetic.level("training", "a") == synthetic.level("training", "a")  # deterministic
    assert synthetic.level("batch", "x", {synthetic.ANNOTATION: "0"}).sm_percent == 0.0
    with pytest.raises(ValueError, match=r"gpupool\.io/synthetic-utilization"):
        synthetic.level("batch", "x", {synthetic.ANNOTATION: "lots"})


def test_settings_from_the_environment_name_the_variable() -> None:
    s = UtilisationSettings.from_env(
        {"GPUPOOL_UTILISATION_IDLE_FOR": "10m", "GPUPOOL_UTILISATION_THRESHOLD": "2"}
    )
    assert (s.idle_for_s, s.threshold_percent) == (600.0, 2.0)
    for var, bad in [("IDLE_FOR", "soon"), ("THRESHOLD", "200"), ("RETENTION", "0"), ("PROMETHEUS_URL", "x")]:
        with pytest.raises(ValueError, match=f"GPUPOOL_UTILISATION_{var}"):
            UtilisationSettings.from_env({f"GPUPOOL_UTILISATION_{var}": bad})


# ---------------------------------------------------------------------- the store
def test_rollups_add_up_per_hour_and_old_hours_are_pruned(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path}/u.db")
    try:
        h0 = datetime.fromtimestamp(T0, UTC)
        rep = store.utilisation
        rep.add([Rollup(h0, "w", "q", "p", 60, 120, 60, 1e9, 5, 0, 0)])
        rep.add([Rollup(h0, "w", "q", "p", 60, 120, 30, 1e9, 9, 60, 120)])
        rep.add([Rollup(h0 + timedelta(hours=1), "w", "q", "p", 10, 20, 0, 0, 1, 10, 20)])
        (a, b) = rep.between(h0, h0 + timedelta(hours=2))
        assert (a.sampled_s, a.gpu_s, a.used_gpu_s, a.memory_max_bytes, a.idle_gpu_s) == (
            120,
            240,
            90,
            9,
            120,
        )
        assert b.hour == h0 + timedelta(hours=1)
        assert rep.prune(h0 + timedelta(hours=1)) == 1
        assert [r.hour for r in rep.between(h0, h0 + timedelta(hours=2))] == [h0 + timedelta(hours=1)]
    finally:
        store.close()


# ---------------------------------------------------------------------- held idle, end to end
def service(store: Any, ctl: Any, be: Any) -> Service:
    return cast(
        Service,
        SimpleNamespace(
            controller=ctl,
            store=store,
            backend=be,
            read=ControllerReadModel(ctl),
            metrics=SimpleNamespace(registry=CollectorRegistry()),
            leader=None,
        ),
    )


def submit(store: Any, ctl: Any, name: str, annotations: dict[str, str], **kw: Any) -> None:
    from gpupool.manifests.convert import workload_model

    m = wl(name, **kw)
    m["metadata"]["annotations"] = annotations
    rec, _ = store.submit_workload(m, owner="alice")
    ctl.submitted(rec, workload_model(m, ctl.bundle.priority_classes, 0.0))


def open_incidents(store: Any) -> dict[str, str]:
    return {i["subject"]: i["message"] for i in store.list_incidents(open_only=True) if i["rule"] == RULE}


def test_a_synthetic_idle_workload_on_the_virtual_backend_raises_gpu_held_idle(tmp_path: Path) -> None:
    store, ctl, be = in_process_controller(f"sqlite:///{tmp_path}/v.db", tmp_path)
    try:
        ctl.recover()
        idle = {synthetic.ANNOTATION: "0", "gpupool.io/idle-for": "10m"}
        submit(store, ctl, "notebook", idle, gpus=2, duration="1000h", type="batch")
        submit(
            store, ctl, "trainer", {"gpupool.io/idle-for": "10m"}, gpus=2, duration="1000h", type="training"
        )
        ctl.cycle()
        svc = service(store, ctl, be)
        loop = UtilisationLoop(svc, UtilisationSettings())
        assert isinstance(loop.source, SyntheticReadings)
        rules = {**alerts.RULES, RULE: loop.rule}
        t = ctl.clock()
        loop.sample_now(t)
        loop.sample_now(t + 9 * 60)
        alerts.refresh(svc, rules=rules)
        assert open_incidents(store) == {}  # 9 of its 10 minutes
        loop.sample_now(t + 10 * 60)
        alerts.refresh(svc, rules=rules)
        (subject,) = open_incidents(store)
        msg = open_incidents(store)[subject]
        assert subject == "workload/notebook"
        assert "owner alice" in msg and "holds 2 GPU(s)" in msg and "queue llm-research" in msg
        assert "cost so far" in msg
        ctl.cancel("notebook", "alice")  # it ends: resolved
        loop.sample_now(t + 11 * 60)
        alerts.refresh(svc, rules=rules)
        assert open_incidents(store) == {}
        week = store.utilisation.between(
            datetime.fromtimestamp(t - 3600, UTC), datetime.fromtimestamp(t + 7200, UTC)
        )

        def total(name: str, f: str) -> float:  # the ten minutes may span two clock hours
            return sum(getattr(r, f) for r in week if r.workload == name)

        assert (
            total("notebook", "idle_gpu_s") == pytest.approx(2 * 600) and total("trainer", "idle_gpu_s") == 0
        )
        assert total("trainer", "used_gpu_s") > 0.8 * total("trainer", "gpu_s")
    finally:
        store.close()


def test_the_local_backend_with_nvml_reporting_zero_raises_gpu_held_idle(tmp_path: Path) -> None:
    from gpupool.service.backends.local import LocalBackend
    from gpupool.service.backends.local_host import seed_manifests, write_config_dir
    from gpupool.service.config import seed_config
    from gpupool.service.controller import Controller

    nv = UtilNvml(2)
    be = LocalBackend(tmp_path / "be", NvmlDiscovery(nv), node="box", grace_s=0.2)
    store = Store.open(f"sqlite:///{tmp_path}/l.db")
    try:
        seed_config(store, write_config_dir(tmp_path / "cfg", seed_manifests(be.cluster_manifest())))
        ctl = Controller(store, be, tick_s=0.05, min_interval_s=0.0)
        ctl.recover()
        group = {
            "resources": {"nvidia.com/gpu": 1, "cpu": "100m", "memory": "256Mi"},
            "command": [sys.executable, "-c", "import time; time.sleep(60)"],
        }
        m = {"apiVersion": API, "kind": "Workload", "metadata": {"name": "held"}}
        m["spec"] = {"queue": "default", "podGroups": [group]}
        rec, _ = store.submit_workload(m, owner="bob")
        from gpupool.manifests.convert import workload_model

        ctl.submitted(rec, workload_model(m, ctl.bundle.priority_classes, 0.0))
        ctl.cycle()
        assert "held" in ctl.running_view()
        svc = service(store, ctl, be)
        loop = UtilisationLoop(svc, UtilisationSettings(idle_for_s=1800))
        assert isinstance(loop.source, NvmlReadings)
        rules = {**alerts.RULES, RULE: loop.rule}
        t = ctl.clock()
        for minute in (0, 15, 30):  # NVML reports 0 % on every device
            loop.sample_now(t + minute * 60)
        alerts.refresh(svc, rules=rules)
        msg = open_incidents(store)["workload/held"]
        assert "owner bob" in msg and "holds 1 GPU(s)" in msg and "for 30 min" in msg
        dev = ctl.running_view()["held"].admission.pods[0].devices[0]
        nv.sm[dev] = 75  # it computes again: resolved
        loop.sample_now(t + 31 * 60)
        alerts.refresh(svc, rules=rules)
        assert open_incidents(store) == {}
        ctl.cancel("held", "bob")
    finally:
        be.close()
        store.close()


# ---------------------------------------------------------------------- the weekly report
def test_the_weekly_report_shows_allocated_vs_used_per_team_and_the_idle_allocations(tmp_path: Path) -> None:
    """Six hours replayed on the store's and the controller's clock: a training job computes,
    a notebook holds two GPUs at 0 % (idleFor 1h); the report's two tables say so, to the cent."""
    from gpupool.cost.metering import Window
    from gpupool.cost.policy import CostPolicySpec
    from gpupool.cost.reports import load_store
    from gpupool.cost.weekly import render_weekly_html, weekly_report

    store, ctl, be = in_process_controller(f"sqlite:///{tmp_path}/w.db", tmp_path)
    t0 = 3600.0 * 500_000  # on an hour boundary
    clock = SimpleNamespace(t=t0)
    ctl.clock = lambda: clock.t
    store.clock = lambda: datetime.fromtimestamp(clock.t, UTC)
    try:
        ctl.recover()
        idle = {synthetic.ANNOTATION: "0", "gpupool.io/idle-for": "1h"}
        submit(store, ctl, "notebook", idle, gpus=2, duration="1000h", type="batch")
        submit(store, ctl, "trainer", {}, queue="vision-team", gpus=8, duration="1000h", type="training")
        ctl.cycle()
        pools = {n: r.admission.pool for n, r in ctl.running_view().items()}
        loop = UtilisationLoop(service(store, ctl, be), UtilisationSettings())
        for minute in range(0, 6 * 60 + 1, 15):
            clock.t = t0 + minute * 60
            loop.sample_now()
        start = datetime.fromtimestamp(t0, UTC)
        rep = weekly_report(
            load_store(store, Window(start, start + timedelta(days=7)), CostPolicySpec()), store
        )
    finally:
        store.close()
    tables = {t["name"]: t for t in rep["tables"]}
    teams = {r[0]: r[1:] for r in tables["utilisation_teams"]["rows"]}
    assert (
        teams["llm-research"][:2] == [12.0, 0.0] and teams["llm-research"][3] == 12.0
    )  # 2 GPUs x 6 h, all idle
    assert teams["vision-team"][0] == 48.0 and teams["vision-team"][2] > 80  # 8 GPUs x 6 h, busy
    price = {"h100-training": "2.9", "l40s-experiment": "0.9", "a100-inference": "1.8"}[pools["notebook"]]
    cost = f"{Decimal(price) * 12:.2f}"
    assert tables["idle_allocations"]["rows"] == [["notebook", "llm-research", 2.0, 6.0, cost]]
    assert "Idle allocations" in render_weekly_html(rep)


def test_a_bad_idle_for_or_synthetic_level_is_refused_at_submit_naming_the_annotation(tmp_path: Path) -> None:
    from tests.test_service_support import running_app

    with running_app(tmp_path) as api:
        for key, bad in [("gpupool.io/idle-for", "soon"), (synthetic.ANNOTATION, "150")]:
            m = wl(f"bad-{len(bad)}", duration="1h")
            m["metadata"]["annotations"] = {key: bad}
            r = api.req("POST", "/v1/workloads", json=m)
            assert r.status_code == 422, r.text
            assert f"metadata.annotations.{key}" in r.text
        ok = wl("fine", duration="1h")
        ok["metadata"]["annotations"] = {"gpupool.io/idle-for": "off"}
        assert api.req("POST", "/v1/workloads", json=ok).status_code in (200, 201)
        assert api.get("/v1/workloads/fine")["name"] == "fine"  # accepted and kept


def test_the_simulator_reports_the_synthetic_sm_utilisation_of_the_time_jobs_ran() -> None:
    """Two completed jobs of 2 GPUs x 100 s, one training and one inference: the held GPU time
    computed at each type's synthetic level, weighted by the time each held."""
    from gpupool.model import WorkloadType
    from gpupool.sim.metrics import synthetic_sm
    from gpupool.sim.results import JobRecord
    from gpupool.sim.sources import JobSpec

    train = JobSpec("t", "q", 0.0, 100.0, gpus=2, type=WorkloadType.TRAINING)
    serve = JobSpec("s", "q", 0.0, 100.0, gpus=2, type=WorkloadType.INFERENCE)
    jobs = [JobRecord(train, 0, status="completed"), JobRecord(serve, 1, status="completed")]
    want = (synthetic.level("training", "t").sm_percent + synthetic.level("inference", "s").sm_percent) / 200
    assert synthetic_sm(jobs) == pytest.approx(want)
    waiting = JobRecord(JobSpec("w", "q", 0.0, 100.0, type=WorkloadType.TRAINING), 2)
    assert synthetic_sm([waiting]) == 0.0  # never ran: no GPU time


def test_the_api_shows_what_running_workloads_compute_for_the_dashboard(tmp_path: Path) -> None:
    from tests.test_service_support import running_app

    with running_app(tmp_path) as api:
        m = wl("nb", duration="100h")
        m["metadata"]["annotations"] = {synthetic.ANNOTATION: "0", "gpupool.io/idle-for": "1h"}
        assert api.req("POST", "/v1/workloads", json=m).status_code in (200, 201)
        api.wait_phase("nb", "Running")
        loop = cast(Any, api.c.app).state.utilisation
        t = loop.svc.controller.clock()
        loop.sample_now(t)
        loop.sample_now(t + 3600)
        body = api.get("/v1/utilisation")
        assert body["source"] == "synthetic" and body["thresholdPercent"] == 5.0
        (row,) = body["items"]
        assert (row["workload"], row["smPercent"], row["heldIdle"], row["idleForSeconds"]) == (
            "nb",
            0.0,
            True,
            3600.0,
        )
        assert row["memoryUsedBytes"] > 0
        assert api.req("GET", "/v1/utilisation", token="").status_code == 401


class FlakySource:
    """A source whose reads can be made to fail (Prometheus away)."""

    def __init__(self, keys: list[tuple[str, int]]) -> None:
        self.keys, self.down = keys, False

    def read(self) -> dict[tuple[str, int], Reading]:
        if self.down:
            raise OSError("connection refused")
        return readings(0.0, self.keys)


def test_a_failed_read_breaks_the_idle_stretch_and_a_failed_write_keeps_the_hours(tmp_path: Path) -> None:
    store, ctl, be = in_process_controller(f"sqlite:///{tmp_path}/f.db", tmp_path)
    try:
        ctl.recover()
        submit(store, ctl, "nb", {"gpupool.io/idle-for": "30m"}, gpus=1, duration="1000h")
        ctl.cycle()
        keys = [(p.node, d) for p in ctl.running_view()["nb"].admission.pods for d in p.devices]
        src = FlakySource(keys)
        loop = UtilisationLoop(service(store, ctl, be), UtilisationSettings(retention_s=7200), source=src)
        t = T0
        loop.sample_now(t)
        src.down = True
        with pytest.raises(OSError):
            loop.sample_now(t + 20 * 60)
        src.down = False
        loop.sample_now(t + 25 * 60)
        loop.sample_now(t + 40 * 60)  # 40 min since the first reading, but only 15 since the gap
        assert loop.tracker.held_idle() == []
        real = loop.svc.controller.store

        class Away:
            @property
            def utilisation(self) -> Any:
                raise OSError("database is locked")

        ctl.store = cast(Any, Away())
        with pytest.raises(OSError):
            loop.sample_now(t + 50 * 60)
        ctl.store = real
        loop.sample_now(t + 55 * 60)
        (row,) = store.utilisation.between(
            datetime.fromtimestamp(t, UTC), datetime.fromtimestamp(t + 3600, UTC)
        )
        assert row.sampled_s == 30 * 60  # 25-40 and 40-55 min: the pass the store refused is kept
        loop.sample_now(t + 4 * 3600)  # the retention is 2 h
        hours = store.utilisation.between(
            datetime.fromtimestamp(t - 1, UTC), datetime.fromtimestamp(t + 5 * 3600, UTC)
        )
        # this pass added 55 min .. 4 h; the hours starting before 4 h - 2 h went
        assert [h.hour for h in hours] == [datetime.fromtimestamp(t + k * 3600, UTC) for k in (2, 3)]
    finally:
        store.close()


def test_the_dashboard_overview_shows_a_workload_held_idle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, browser: Any
) -> None:
    """In a browser: the overview's utilisation panel names the source and marks the idle one."""
    import httpx

    from tests.test_service_support import Server

    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    monkeypatch.setenv("GPUPOOL_UTILISATION_INTERVAL", "1")
    srv = Server(tmp_path / "state", time_scale=1.0)
    srv.start(timeout=120.0)
    try:
        m = wl("nb", duration="10h")
        m["metadata"]["annotations"] = {synthetic.ANNOTATION: "0", "gpupool.io/idle-for": "2s"}
        h = {"Authorization": f"Bearer {srv.token}"}
        assert httpx.post(srv.base + "/v1/workloads", json=m, headers=h, timeout=30).status_code == 201
        page = browser.new_page()
        page.goto(srv.base + "/ui/")
        page.fill("#token", srv.token)
        page.click("#login button")
        sync_api.expect(page.locator("#utilisation-source")).to_contain_text("synthetic", timeout=30000)
        row = page.locator("#utilisation tbody tr").first
        sync_api.expect(row).to_contain_text("held idle", timeout=60000)  # refreshed every 5 s
        sync_api.expect(row).to_contain_text("0%")
        # the error line is the newest refresh's: one refresh that failed on the loaded CI
        # machine (once, cause not kept) shows until the next one, 5 s later, succeeds
        err = page.locator("#error")
        try:
            sync_api.expect(err).to_be_hidden(timeout=20000)
        except AssertionError as e:
            raise AssertionError(f"the overview shows an error: {err.text_content()!r}") from e
    finally:
        srv.stop()
