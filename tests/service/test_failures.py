"""Failed runs in the live service: retried by policy with growing backoff, then given up.

In-process (Store + VirtualBackend + Controller on one fake clock), on SQLite and PostgreSQL:
the devices of a failed run are released in the cycle that sees the failure, the backoff is
derived from stored events after a restart, and the final record names every attempt.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpupool.manifests.convert import workload_model
from gpupool.service.backends.virtual import VirtualBackend
from gpupool.service.config import EXAMPLES, seed_config
from gpupool.service.controller import Controller, Hooks
from gpupool.service.failures.policy import DEFAULT_POLICIES, FaultState, RetryPolicy, policy_for
from gpupool.service.metrics import Metrics
from gpupool.store import Store
from gpupool.store.failure_events import history_view
from tests.test_service_support import db_url, wl

__all__ = ["db_url"]

T0 = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t


def make(
    url: str, state: Path, clk: Clock, hooks: Hooks | None = None, **be: Any
) -> tuple[Store, Controller, VirtualBackend]:
    store = Store.open(url)
    seed_config(store, EXAMPLES / "cluster")
    backend = VirtualBackend(state / "vc.json", time_scale=1.0, clock=clk, **be)
    ctl = Controller(store, backend, tick_s=0.05, min_interval_s=0.0, clock=clk, hooks=hooks)
    ctl.recover()
    return store, ctl, backend


def submit(store: Store, ctl: Controller, m: dict[str, Any]) -> None:
    rec, _ = store.submit_workload(m, owner="t")
    ctl.submitted(rec, workload_model(m, ctl.bundle.priority_classes, 0.0))


def failing(name: str, after: str = "10s", code: int = 137, **spec: Any) -> dict[str, Any]:
    m = wl(name, queue="llm-research", duration="1h", **spec)
    m["metadata"]["annotations"] = {"gpupool.io/fail-after": after, "gpupool.io/exit-code": str(code)}
    return m


def step(ctl: Controller, clk: Clock, dt: float) -> None:
    clk.t += dt
    ctl.cycle()


def test_policy_defaults_by_type_and_overrides() -> None:
    st = FaultState()
    assert policy_for({"spec": {"type": "inference"}}, st) == DEFAULT_POLICIES["inference"]
    assert policy_for({"spec": {}}, st) == DEFAULT_POLICIES["batch"]
    inf, train = DEFAULT_POLICIES["inference"], DEFAULT_POLICIES["training"]
    assert inf.max_retries > train.max_retries and inf.backoff_s < train.backoff_s
    p = policy_for(
        {
            "metadata": {
                "annotations": {"gpupool.io/retry-backoff": "5s", "gpupool.io/retry-max-backoff": "12s"}
            },
            "spec": {"type": "training", "maxRetries": 7},
        },
        st,
    )
    assert (p.max_retries, p.backoff_s, p.max_backoff_s) == (7, 5.0, 12.0)
    assert [p.delay(k) for k in (1, 2, 3, 4)] == [5.0, 10.0, 12.0, 12.0]  # exponential, capped
    assert policy_for({"spec": {"maxRetries": 0}}, st).max_retries == 0
    st.backoff_s, st.max_backoff_s = 1.0, 2.0  # ServiceConfig: one base and cap for every type
    assert policy_for({"spec": {"type": "training"}}, st) == RetryPolicy(train.max_retries, 1.0, 2.0)


def test_failed_run_is_retried_with_growing_backoff_then_fails(tmp_path: Path, db_url: str) -> None:
    clk = Clock()
    metrics = Metrics()
    store, ctl, be = make(db_url, tmp_path, clk, metrics.hooks())
    try:
        submit(store, ctl, failing("oom", maxRetries=2, type="training"))
        ctl.cycle()
        assert store.get_workload("oom").phase == "Running"
        used = ctl.engine.cluster.used_gpu_milli()
        assert used == 1000
        waits = []
        for retry in (1, 2):
            step(ctl, clk, 10.0)  # the run fails after 10 virtual seconds
            w = store.get_workload("oom")
            assert w.phase == "Pending", w.reason
            assert w.reason.startswith(f"Backoff: retry {retry} of 2 after exit code 137 at "), w.reason
            # released at once: the engine no longer charges it, the backend no longer runs it
            assert "oom" not in ctl.engine.running and ctl.engine.cluster.used_gpu_milli() == 0
            assert "oom" not in be.runs()
            ex = ctl.explain(w)
            assert ex["code"] == "Backoff" and f"retry {retry} of 2" in ex["reason"]
            started = clk.t
            while store.get_workload("oom").phase == "Pending":
                step(ctl, clk, 5.0)
                assert clk.t - started < 1000
            waits.append(clk.t - started)
        assert waits[0] >= 60 and waits[1] >= 120 and waits[1] > waits[0]  # training: 60s, then 120s
        step(ctl, clk, 10.0)
        w = store.get_workload("oom")
        assert w.phase == "Failed"
        assert w.reason.startswith("RetriesExhausted: OOMKilled (exit code 137)"), w.reason
        assert "3 failed attempts (maxRetries 2)" in w.reason
        assert be.starts["oom"] == 3
        final = [r for r in store.audit_records() if r.action == "workload.fail" and r.name == "oom"]
        assert len(final) == 1 and final[0].detail["final"] is True
        assert [a["exitCode"] for a in final[0].detail["attempts"]] == [137, 137, 137]
        retries = [r for r in store.audit_records() if r.action == "workload.failure"]
        assert [r.detail["attempt"] for r in retries] == [1, 2]
        hist = history_view(store.list_events("oom"))
        assert hist["attempts"] == 3
        assert [f["exitCode"] for f in hist["failures"]] == [137, 137, 137]
        assert hist["failures"][0]["reason"].startswith("OOMKilled: ")
        assert hist["failures"][0]["retryAt"] is not None and hist["failures"][-1]["retryAt"] is None
        got = metrics.registry.get_sample_value(
            "gpupool_workload_failures_total", {"queue": "llm-research", "reason": "OOMKilled"}
        )
        assert got == 3.0
        assert store.verify_audit().ok
    finally:
        store.close()


def test_backoff_survives_a_controller_restart(tmp_path: Path, db_url: str) -> None:
    clk = Clock()
    store, ctl, _ = make(db_url, tmp_path, clk)
    submit(store, ctl, failing("flaky", after="5s", code=1, maxRetries=1, type="inference"))
    ctl.cycle()
    step(ctl, clk, 5.0)
    assert store.get_workload("flaky").phase == "Pending"
    store.close()
    # restart: a new controller and store; the backoff (inference: 5 s) is read back from events
    store2, ctl2, be2 = make(db_url, tmp_path, clk)
    try:
        step(ctl2, clk, 2.0)
        w = store2.get_workload("flaky")
        assert w.phase == "Pending" and ctl2.explain(w)["code"] == "Backoff"
        step(ctl2, clk, 3.5)
        assert store2.get_workload("flaky").phase == "Running"
        assert be2.starts["flaky"] == 2
        step(ctl2, clk, 5.0)  # maxRetries 1: the second failure is final
        assert store2.get_workload("flaky").phase == "Failed"
    finally:
        store2.close()


def test_a_successful_run_records_no_failure(tmp_path: Path, db_url: str) -> None:
    clk = Clock()
    store, ctl, _ = make(db_url, tmp_path, clk)
    try:
        submit(store, ctl, wl("fine", duration="10s"))
        ctl.cycle()
        step(ctl, clk, 11.0)
        assert store.get_workload("fine").phase == "Succeeded"
        assert history_view(store.list_events("fine")) == {"attempts": 1, "failures": []}
    finally:
        store.close()


def test_fail_after_and_drain_end_to_end_through_the_cli(tmp_path: Path) -> None:
    """A real server with a short backoff: the annotation fails each run, describe shows the history."""
    import json as _json

    import yaml
    from typer.testing import CliRunner

    from gpupool.cli.main import app
    from tests.test_service_support import Server, wait_for

    srv = Server(tmp_path / "state", time_scale=60.0, args=["--retry-backoff", "1s", "--failure-rate", "0"])
    srv.start()
    env = {
        "GPUPOOL_SERVER": srv.base,
        "GPUPOOL_TOKEN": srv.token,
        "GPUPOOL_CONFIG": "/nonexistent",
        "COLUMNS": "200",
    }

    def cli(*args: str) -> str:
        r = CliRunner().invoke(app, list(args), env=env)
        assert r.exit_code == 0 and "Traceback" not in r.output, r.output
        return r.output

    try:
        m = failing("e2e", after="60s", code=137, maxRetries=1)  # 60 virtual s = 1 s here
        f = tmp_path / "w.yaml"
        f.write_text(yaml.safe_dump_all([m, wl("keeper", duration="10h")]))
        cli("submit", "-f", str(f))
        wait_for(lambda: '"phase": "Failed"' in cli("get", "workload", "e2e", "-o", "json"), 20, "e2e Failed")
        out = cli("describe", "workload", "e2e")
        assert "attempts: 2, failures: 2" in out and out.count("exit code 137") >= 2, out
        assert "RetriesExhausted" in out
        keeper = _json.loads(cli("get", "workload", "keeper", "-o", "json"))
        where = keeper["placement"]["pods"][0]["node"]
        out = cli("drain", where, "--reason", "maintenance")
        assert "evicted and requeued: keeper" in out
        got = _json.loads(cli("get", "workload", "keeper", "-o", "json"))
        assert where not in {p["node"] for p in (got.get("placement") or {}).get("pods", [])}
    finally:
        srv.stop()


def _record(name: str) -> Any:
    from datetime import UTC, datetime

    from gpupool.store.records import WorkloadRecord

    return WorkloadRecord(
        1, name, "q", None, "alice", {"spec": {}}, "Running", None, "", datetime.now(UTC), None, None, 1
    )


def test_a_gang_the_kubernetes_backend_could_not_bind_is_requeued_without_spending_a_retry() -> None:
    """BindFailed (and a kubelet's UnexpectedAdmissionError) happen before any of the job's code
    runs: with maxRetries 0 the workload is requeued at once, not failed."""
    from gpupool.service.failures.policy import Fault
    from gpupool.service.failures.record import _outcome

    pol = RetryPolicy(max_retries=0, backoff_s=10.0, max_backoff_s=60.0)
    for code in ("BindFailed", "UnexpectedAdmissionError"):
        out = _outcome(_record("w"), Fault(code, "binds refused"), pol, [], 100.0)
        assert out.change.phase == "Pending", code
        assert "not counted against maxRetries" in out.change.reason
    job_fault = _outcome(_record("w"), Fault("Error", "exit 1", 1), pol, [], 100.0)
    assert job_fault.change.phase == "Failed"
