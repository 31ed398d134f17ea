"""Alerts handled in the platform (gpupool.service.alerts, gpupool.store.incidents): on a
replayed scenario the conditions fire, become incidents, are acknowledged and resolve."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from gpupool.service import alerts
from gpupool.service.core import Service
from gpupool.service.readmodel import ControllerReadModel
from gpupool.store import Conflict
from gpupool.store.incidents import Firing
from tests.test_service_support import in_process_controller, running_app, submit_to


def _open(store: Any) -> set[tuple[str, str]]:
    return {(i["rule"], i["subject"]) for i in store.list_incidents(open_only=True)}


def test_conditions_fire_are_acknowledged_and_resolve(tmp_path: Path) -> None:
    store, ctl, be = in_process_controller(f"sqlite:///{tmp_path}/a.db", tmp_path)
    try:
        ctl.recover()
        for i in range(8):  # the H100 pool full
            submit_to(store, ctl, f"run-{i}", queue="vision-team", gpus=8, duration="1000h")
        ctl.cycle()
        submit_to(store, ctl, "waits", queue="vision-team", gpus=8, duration="1000h")
        ctl.cycle()
        svc = cast(
            Service, SimpleNamespace(controller=ctl, store=store, backend=be, read=ControllerReadModel(ctl))
        )
        t0 = time.time()
        assert alerts.refresh(svc, now=t0 + 60) == (0, 0)  # waited a minute: nothing is due
        opened, _ = alerts.refresh(svc, now=t0 + 5 * 3600)  # replayed five hours later
        assert _open(store) == {
            ("QueueOldestPendingAboveTarget", "queue/vision-team"),
            ("PoolIdleWhileWorkWaits", "pool/a100-inference"),
            ("PoolIdleWhileWorkWaits", "pool/l40s-experiment"),
        }
        assert opened == 3
        assert alerts.refresh(svc, now=t0 + 6 * 3600) == (0, 0)  # still firing: no second incident
        wait = next(i for i in store.list_incidents() if i["rule"] == "QueueOldestPendingAboveTarget")
        acked = store.ack_incident(wait["id"], "alice", "bob")
        assert (acked["state"], acked["owner"], acked["acknowledgedBy"]) == ("Acknowledged", "bob", "alice")
        ctl.cancel("waits", "alice")  # the waiting work goes: every condition clears
        assert alerts.refresh(svc, now=t0 + 7 * 3600) == (0, 3)
        done = {i["id"]: i for i in store.list_incidents()}[wait["id"]]
        assert (done["state"], done["resolvedBy"], done["resolution"]) == (
            "Resolved",
            "gpupool",
            "condition cleared",
        )
        with pytest.raises(Conflict):
            store.resolve_incident(wait["id"], "alice", "late")
        actions = [a.action for a in store.audit_records() if a.kind == "Incident"]
        assert actions.count("incident.open") == 3 and actions.count("incident.resolve") == 3
        assert actions.count("incident.ack") == 1
    finally:
        store.close()


def test_alerts_over_the_api(tmp_path: Path) -> None:
    with running_app(tmp_path) as api:
        data = api.get("/v1/alerts")
        assert data["items"] == [] and data["opened"] == 0
        r = api.req("POST", "/v1/alerts/99/ack", json={})
        assert r.status_code == 404
        r = api.req("POST", "/v1/alerts/1/resolve", json={"note": ""})
        assert r.status_code == 422
        viewer = api.token_for("v", "viewer")
        assert api.req("GET", "/v1/alerts", token=viewer).status_code == 403


def test_listing_without_evaluating_shows_what_was_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(alerts.INTERVAL_ENV, "3600")  # the background loop stays out of the way
    with running_app(tmp_path) as api:
        svc = api.c.app.state.svc  # type: ignore[attr-defined]
        svc.store.sync_incidents([Firing("GPUUnhealthy", "node/x/gpu/0", "critical", "gone")])
        listed = api.get("/v1/alerts", params={"evaluate": "false", "open": "true"})
        assert [i["subject"] for i in listed["items"]] == ["node/x/gpu/0"]  # not evaluated: still open
        evaluated = api.get("/v1/alerts", params={"open": "true"})
        assert evaluated["resolved"] == 1 and evaluated["items"] == []  # the condition does not hold
