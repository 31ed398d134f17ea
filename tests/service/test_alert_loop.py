"""Alerts evaluated by gpupool itself in the background (gpupool.service.alerts.AlertLoop):
incidents open and resolve on a replayed scenario with nobody calling the API, one failing rule
never stops the others, a standby never evaluates, and the wait-limit rule reads the pending
workload's model's ``max_wait_s``."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry

from gpupool.service import alerts
from gpupool.service.alerts import AlertLoop, AlertPolicy
from gpupool.service.controller import Controller
from gpupool.service.core import Service
from gpupool.service.readmodel import ControllerReadModel
from gpupool.store import Store
from gpupool.store.incidents import Firing
from tests.test_service_support import in_process_controller, running_app, submit_to, wait_for


def _open(store: Store) -> set[tuple[str, str]]:
    return {(i["rule"], i["subject"]) for i in store.list_incidents(open_only=True)}


class Clock:
    """A clock the test moves: the replayed scenario's time."""

    def __init__(self) -> None:
        self.t = time.time()

    def __call__(self) -> float:
        return self.t


def _svc(ctl: Controller, store: Any, leader: Any = None) -> Service:
    return cast(
        Service,
        SimpleNamespace(
            controller=ctl, store=store, backend=ctl.backend, read=ControllerReadModel(ctl), leader=leader
        ),
    )


@pytest.fixture
def world(tmp_path: Path) -> Iterator[tuple[Store, Controller, Clock]]:
    """The H100 pool full and one more workload waiting; the controller's clock is the test's."""
    store, ctl, _ = in_process_controller(f"sqlite:///{tmp_path}/a.db", tmp_path)
    clock = Clock()
    ctl.clock = clock
    try:
        ctl.recover()
        for i in range(8):
            submit_to(store, ctl, f"run-{i}", queue="vision-team", gpus=8, duration="1000h")
        ctl.cycle()
        submit_to(store, ctl, "waits", queue="vision-team", gpus=8, duration="1000h")
        ctl.cycle()
        yield store, ctl, clock
    finally:
        store.close()


def test_the_loop_opens_and_resolves_incidents_with_no_api_call(
    world: tuple[Store, Controller, Clock],
) -> None:
    store, ctl, clock = world
    loop = AlertLoop(_svc(ctl, store), interval_s=0.02, registry=CollectorRegistry())
    loop.start()
    try:
        time.sleep(0.1)  # several passes at the scenario's start: nothing is due yet
        assert _open(store) == set()
        clock.t += 5 * 3600  # five hours later the waiting work is over its target
        wait_for(
            lambda: ("QueueOldestPendingAboveTarget", "queue/vision-team") in _open(store), 5, "an incident"
        )
        assert ("PoolIdleWhileWorkWaits", "pool/a100-inference") in _open(store)
        ctl.cancel("waits", "alice")  # the waiting work goes: every condition clears by itself
        wait_for(lambda: not _open(store), 5, "the incidents to resolve")
    finally:
        loop.stop()
    done = store.list_incidents()
    assert done and all(i["state"] == "Resolved" and i["resolvedBy"] == "gpupool" for i in done)
    assert len([i for i in done if i["rule"] == "QueueOldestPendingAboveTarget"]) == 1  # opened once
    assert loop.passes._value.get() >= 3


def test_a_failing_rule_is_counted_and_the_others_still_run(world: tuple[Store, Controller, Clock]) -> None:
    store, ctl, clock = world
    # an incident of the rule about to break is open from before
    store.sync_incidents([Firing("Broken", "queue/x", "warning", "was firing")])

    def broken(svc: Service, policy: AlertPolicy, now: float) -> list[Firing]:
        raise RuntimeError("rule bug")

    rules = {"Broken": broken, **alerts.RULES}
    loop = AlertLoop(_svc(ctl, store), interval_s=60, registry=CollectorRegistry(), rules=rules)
    clock.t += 5 * 3600
    opened, resolved = loop.evaluate_now()
    assert opened == 3 and resolved == 0
    assert ("QueueOldestPendingAboveTarget", "queue/vision-team") in _open(store)
    assert ("Broken", "queue/x") in _open(store)  # unknown is not cleared: it stays open
    assert loop.rule_errors.labels("Broken")._value.get() == 1
    ev = alerts.evaluate_rules(_svc(ctl, store), rules=rules, now=clock.t)
    assert "RuntimeError: rule bug" in ev.failed["Broken"] and "Broken" not in ev.evaluated


def test_a_standby_does_not_evaluate(world: tuple[Store, Controller, Clock]) -> None:
    store, ctl, clock = world
    leader = SimpleNamespace(is_leader=False)
    loop = AlertLoop(_svc(ctl, store, leader), interval_s=60, registry=CollectorRegistry())
    clock.t += 5 * 3600
    assert loop.evaluate_now() == (0, 0) and _open(store) == set()
    leader.is_leader = True  # it took the lease over
    assert loop.evaluate_now()[0] == 3


def _limit(ctl: Controller, name: str, limit: float | None) -> None:
    """Give a pending workload's model its task type's wait limit."""
    q = ctl.pending[name]
    q.model = dataclasses.replace(q.model, max_wait_s=limit)


def test_a_workload_waiting_past_its_task_types_limit_fires(world: tuple[Store, Controller, Clock]) -> None:
    store, ctl, clock = world
    _limit(ctl, "waits", 600.0)
    svc = _svc(ctl, store)
    only = {"WorkloadWaitedPastLimit": alerts.RULES["WorkloadWaitedPastLimit"]}
    clock.t += 300
    assert alerts.evaluate_rules(svc, rules=only, now=clock.t).firing == []  # 5 of 10 minutes
    clock.t += 600
    (f,) = alerts.evaluate_rules(svc, rules=only, now=clock.t).firing
    assert (f.rule, f.subject) == ("WorkloadWaitedPastLimit", "queue/vision-team")
    assert "waits (15 of 10 min)" in f.message
    # no limit (a workload of a type without one): nothing fires
    _limit(ctl, "waits", None)
    assert alerts.evaluate_rules(_svc(ctl, store), rules=only, now=clock.t).firing == []


def test_the_wait_limit_is_the_task_types_default(world: tuple[Store, Controller, Clock]) -> None:
    """Issue 11's task types: an evaluation workload may wait 8 h (the packaged default)."""
    store, ctl, clock = world
    submit_to(store, ctl, "eval", queue="vision-team", gpus=8, duration="1h", type="evaluation")
    ctl.cycle()  # it waits: the H100 pool is full
    assert ctl.pending["eval"].model.max_wait_s == 8 * 3600
    svc = _svc(ctl, store)
    fired = lambda: {(f.rule, f.subject) for f in alerts.evaluate(svc, now=clock.t)}  # noqa: E731
    clock.t += 5 * 3600
    assert ("WorkloadWaitedPastLimit", "queue/vision-team") not in fired()
    clock.t += 4 * 3600
    assert ("WorkloadWaitedPastLimit", "queue/vision-team") in fired()


def test_the_interval_is_configured_and_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    assert alerts.interval_from_env({}) == alerts.DEFAULT_INTERVAL_S
    assert alerts.interval_from_env({alerts.INTERVAL_ENV: "2.5"}) == 2.5
    for bad in ("soon", "0", "-1"):
        with pytest.raises(ValueError, match=alerts.INTERVAL_ENV):
            alerts.interval_from_env({alerts.INTERVAL_ENV: bad})


def test_the_server_evaluates_in_the_background(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(alerts.INTERVAL_ENV, "0.05")
    with running_app(tmp_path, time_scale=1.0) as api:
        app = api.c.app
        loop = app.state.alerts  # type: ignore[attr-defined]
        svc = app.state.svc  # type: ignore[attr-defined]
        assert loop.interval_s == 0.05 and loop.may_evaluate()
        for i in range(8):
            r = api.req("POST", "/v1/workloads", json=_wl(f"run-{i}"))
            assert r.status_code == 201, r.text
        api.wait_phase("run-7", "Running")
        assert api.req("POST", "/v1/workloads", json=_wl("waits")).status_code == 201
        wait_for(lambda: "waits" in svc.controller.pending, 5, "the workload to wait")
        clock = Clock()
        clock.t += 5 * 3600
        svc.controller.clock = clock  # the replay jumps five hours; nobody calls /v1/alerts
        wait_for(
            lambda: ("QueueOldestPendingAboveTarget", "queue/vision-team") in _open(svc.store),
            10,
            "an incident",
        )
        metrics = api.req("GET", "/metrics").text
        assert "gpupool_alert_evaluations_total" in metrics


def _wl(name: str) -> dict[str, Any]:
    from tests.test_service_support import wl

    return wl(name, queue="vision-team", gpus=8, duration="1000h")


def test_serve_refuses_a_bad_alerts_interval_before_it_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bad $GPUPOOL_ALERTS_INTERVAL_S is one line naming the variable and exit 2, before the
    store is opened (it used to fail inside uvicorn's start-up, under a traceback)."""
    from typer.testing import CliRunner

    from gpupool.cli.main import app

    monkeypatch.setenv("GPUPOOL_ALERTS_INTERVAL_S", "soon")
    r = CliRunner().invoke(app, ["serve", "--state-dir", str(tmp_path)])
    assert r.exit_code == 2, r.output
    assert "GPUPOOL_ALERTS_INTERVAL_S: must be a number of seconds, got 'soon'" in r.output
    assert not (tmp_path / "gpupool.db").exists()
