"""Reports from a live service run on the virtual backend: API (with authorization) and CLI."""

from __future__ import annotations

import hashlib
import json
import zipfile
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpupool.cli.main import app
from gpupool.cost.render import render
from tests.test_service_support import Api, running_app, wl

runner = CliRunner()


def table(rep: dict[str, Any], name: str) -> dict[str, Any]:
    return next(t for t in rep["tables"] if t["name"] == name)


def column(rep: dict[str, Any], name: str, col: str) -> list[Any]:
    t = table(rep, name)
    i = t["columns"].index(col)
    return [r[i] for r in t["rows"]]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Api, dict[str, str], Path]]:
    """A service that ran two teams' work (time runs 3600x: an hour of work takes a second)."""
    state = tmp_path_factory.mktemp("cost")
    with running_app(state) as api:
        tokens = {
            "admin": str(api.token),
            "alice": api.token_for("alice", "member", "llm-research"),
            "bob": api.token_for("bob", "member", "vision-team"),
            "lead": api.token_for("lead", "queue-admin", "llm-team"),
        }
        jobs = [
            ("a1", "llm-research", 2, "alice"),
            ("a2", "llm-research", 1, "alice"),
            ("b1", "vision-team", 4, "bob"),
        ]
        for name, queue, gpus, who in jobs:
            r = api.req(
                "POST",
                "/v1/workloads",
                token=tokens[who],
                json=wl(name, queue=queue, gpus=gpus, duration="1h"),
            )
            assert r.status_code == 201, r.text
        for name, *_ in jobs:
            api.wait_phase(name, "Succeeded", timeout=20)
        live = wl("live", queue="llm-research", gpus=1)
        assert api.req("POST", "/v1/workloads", token=tokens["alice"], json=live).status_code == 201
        api.wait_phase("live", "Running")
        yield api, tokens, state


def test_admin_chargeback_reconciles_and_names_every_team(world: tuple[Api, dict[str, str], Path]) -> None:
    api, _, _ = world
    rep = api.get("/v1/reports/chargeback")
    assert rep["scope"] == "cluster" and rep["summary"]["reconciles"] is True
    pools = table(rep, "pools")
    assert all(column(rep, "pools", "reconciles")) and pools["rows"]
    teams = dict(zip(column(rep, "teams", "queue"), column(rep, "teams", "listCost"), strict=True))
    assert {"llm-research", "vision-team", "llm-team", "ai-org"} <= set(teams)
    assert float(teams["ai-org"]) == pytest.approx(
        float(teams["llm-team"]) + float(teams["vision-team"]) + float(teams.get("serving", 0))
    )
    # the store's clock is wall time (an "hour" at 3600x is a second): amounts are small, not zero
    hours = dict(zip(column(rep, "charges", "queue"), column(rep, "charges", "gpuHours"), strict=False))
    assert hours["vision-team"] > 0 and hours["llm-research"] > 0


def test_usage_counts_each_run_and_the_running_one(world: tuple[Api, dict[str, str], Path]) -> None:
    api, _, _ = world
    rep = api.get("/v1/reports/usage")
    by_queue = dict(zip(column(rep, "queues", "key"), column(rep, "queues", "runs"), strict=True))
    assert by_queue["llm-research"] == 3 and by_queue["vision-team"] == 1
    assert rep["summary"]["runs"] == 4


def test_a_team_sees_only_its_subtree(world: tuple[Api, dict[str, str], Path]) -> None:
    api, tokens, _ = world
    r = api.req("GET", "/v1/reports/chargeback", token=tokens["alice"])
    assert r.status_code == 200, r.text
    rep = r.json()
    assert rep["scope"] == "subtree"
    assert "pools" not in [t["name"] for t in rep["tables"]]  # capacity and idle are everyone's
    assert set(column(rep, "teams", "queue")) == {"llm-research"}
    bob = api.req("GET", "/v1/reports/usage", token=tokens["bob"]).json()
    assert set(column(bob, "queues", "key")) == {"vision-team"}
    lead = api.req("GET", "/v1/reports/usage", token=tokens["lead"]).json()
    assert "vision-team" not in column(lead, "queues", "key") and "llm-research" in column(
        lead, "queues", "key"
    )
    weekly = api.req("GET", "/v1/reports/weekly", token=tokens["bob"]).json()
    assert "operations" not in [t["name"] for t in weekly["tables"]]


def test_reports_refuse_bad_input_and_anonymous_callers(world: tuple[Api, dict[str, str], Path]) -> None:
    api, _, _ = world
    assert api.req("GET", "/v1/reports/usage", token="").status_code == 401
    r = api.req("GET", "/v1/reports/usage", params={"from": "yesterday"})
    assert r.status_code == 422 and r.json()["error"]["errors"][0]["field"] == "from"
    r = api.req("GET", "/v1/reports/usage", params={"from": "2026-12-02", "to": "2026-12-01"})
    assert r.status_code == 422 and r.json()["error"]["errors"][0]["field"] == "to"
    assert api.req("GET", "/v1/reports/colour").status_code == 422
    r = api.req("GET", "/v1/reports/weekly", params={"from": "0001-01-01", "to": "9999-12-31"})
    assert r.status_code == 422 and r.json()["error"]["errors"][0]["field"] == "from"
    year = api.get("/v1/reports/weekly", params={"from": "2026-01-01", "to": "2027-01-01"})
    assert 0 < len(year["series"]["h100-training"]["t"]) <= 2000


def test_weekly_html_is_one_offline_page(world: tuple[Api, dict[str, str], Path]) -> None:
    api, _, _ = world
    r = api.req("GET", "/v1/reports/weekly", params={"format": "html"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    page = r.text
    assert "<script src=" not in page  # plotly is inlined, nothing fetched
    for title in (
        "Utilization per pool over time",
        "Allocated versus idle",
        "Top reasons for waiting",
        "Failures by reason",
        "Cost per team",
        "Week-over-week change",
        "Operations review",
    ):
        assert title in page
    rep = api.get("/v1/reports/weekly")
    ops = dict(table(rep, "operations")["rows"])
    assert ops["configuration changes"] == 0 and ops["failures left to a person (retries exhausted)"] == 0
    assert len(rep["series"]["h100-training"]["allocated"]) == 168


def test_cli_reads_the_store_directly(world: tuple[Api, dict[str, str], Path], tmp_path: Path) -> None:
    _, _, state = world
    db = f"sqlite:///{state}/gpupool.db"
    res = runner.invoke(app, ["report", "chargeback", "--db", db, "-o", "json"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    assert rep["summary"]["reconciles"] is True
    out = tmp_path / "week.html"
    res = runner.invoke(app, ["report", "weekly", "--db", db, "-o", "html", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "plotly" in out.read_text()
    csv = runner.invoke(app, ["report", "usage", "--db", db, "-o", "csv"])
    assert csv.exit_code == 0 and csv.stdout.startswith("# queues\nkey,gpuHours")
    text = runner.invoke(app, ["report", "usage", "--db", db])
    assert "By queue" in text.stdout and "llm-research" in text.stdout


def test_cli_through_the_api_and_its_errors(
    world: tuple[Api, dict[str, str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    api, tokens, _ = world

    class Through:
        def __init__(self, server: str | None, token: str | None) -> None:
            self.token = token

        def call(self, method: str, path: str, **kw: Any) -> Any:
            r = api.req(method, path, token=self.token, **kw)
            assert r.status_code == 200, r.text
            return r.json()

    monkeypatch.setattr("gpupool.cli.report.Api", Through)
    res = runner.invoke(app, ["report", "usage", "--token", tokens["bob"], "-o", "json"])
    assert res.exit_code == 0, res.output
    assert set(column(json.loads(res.stdout), "queues", "key")) == {"vision-team"}
    bad = runner.invoke(app, ["report", "usage", "--db", "sqlite://", "--from", "nope"])
    assert bad.exit_code == 2 and "--from" in bad.output
    missing = runner.invoke(app, ["report", "usage", "--db", "sqlite://", "--policy", "/nonexistent.yaml"])
    assert missing.exit_code == 2 and "--policy" in missing.output


def test_render_formats_share_one_shape() -> None:
    rep = {
        "kind": "usage",
        "from": datetime(2026, 11, 1, tzinfo=UTC).isoformat(),
        "to": (datetime(2026, 11, 1, tzinfo=UTC) + timedelta(days=1)).isoformat(),
        "summary": {"gpuHours": 1.5},
        "tables": [{"name": "t", "title": "T", "columns": ["a", "b"], "rows": [["x<y", None]]}],
    }
    assert "x&lt;y" in render(rep, "html")
    assert render(rep, "csv") == "# t\na,b\nx<y,\n"
    assert json.loads(render(rep, "json")) == rep
    with pytest.raises(ValueError, match="output"):
        render(rep, "pdf")


def test_evidence_bundle_from_the_live_store(world: tuple[Api, dict[str, str], Path], tmp_path: Path) -> None:
    _, _, state = world
    out = tmp_path / "poc.zip"
    res = runner.invoke(app, ["evidence", "--db", f"sqlite:///{state}/gpupool.db", "-o", str(out)])
    assert res.exit_code == 0, res.output
    with zipfile.ZipFile(out) as z:
        manifest = json.loads(z.read("MANIFEST.json"))
        for name, meta in manifest["files"].items():
            assert hashlib.sha256(z.read(name)).hexdigest() == meta["sha256"]
        admitted = [
            json.loads(line)["name"] for line in z.read("allocation/admissions.jsonl").decode().splitlines()
        ]
        assert sorted(admitted) == ["a1", "a2", "b1", "live"]
        assert json.loads(z.read("audit/verify.json"))["ok"] is True
        runs = z.read("run/runs.csv").decode().splitlines()
        assert runs[0].startswith("workload,attempt,pool") and len(runs) == 5
    both = runner.invoke(app, ["evidence", "-o", str(out)])
    assert both.exit_code == 2 and "exactly one of --db" in both.output


def test_the_service_reads_its_cost_policy_from_the_state_dir(
    world: tuple[Api, dict[str, str], Path],
) -> None:
    api, _, state = world
    policy = state / "cost.yaml"
    try:
        policy.write_text("kind: CostPolicy\nspec: {currency: EUR, pricePerGpuHour: {h100-training: 1000}}\n")
        rep = api.get("/v1/reports/chargeback")
        assert rep["currency"] == "EUR"
        prices = dict(zip(column(rep, "pools", "pool"), column(rep, "pools", "pricePerGpuHour"), strict=True))
        assert prices["h100-training"] == "1000" and prices["a100-inference"] == "1.8"
        assert rep["summary"]["reconciles"] is True
        policy.write_text("kind: CostPolicy\nspec: {retentionDays: -3}\n")
        r = api.req("GET", "/v1/reports/usage")
        assert r.status_code == 422 and "spec.retentionDays" in r.json()["error"]["message"]
    finally:
        policy.unlink(missing_ok=True)


# ---------------------------------------------------------------------- incidents in the week


def test_the_weekly_report_counts_incidents_on_a_replayed_scenario(tmp_path: Path) -> None:
    """A week replayed on the store's and the controller's clock: the H100 pool full and work
    waiting fire three incidents at +5 h, which clear 30 min later; waiting again fires them at
    +11 h, one is resolved by a person 2 h later and the other two stay open."""
    from gpupool.cost.metering import Window
    from gpupool.cost.policy import CostPolicySpec
    from gpupool.cost.reports import load_store
    from gpupool.cost.weekly import render_weekly_html, weekly_report
    from gpupool.service import alerts
    from tests.service.test_alert_loop import Clock, _svc
    from tests.test_service_support import in_process_controller, submit_to

    store, ctl, _ = in_process_controller(f"sqlite:///{tmp_path}/w.db", tmp_path)
    clock = Clock()
    t0 = clock.t
    ctl.clock = clock
    store.clock = lambda: datetime.fromtimestamp(clock.t, UTC)
    try:
        ctl.recover()
        for i in range(8):
            submit_to(store, ctl, f"run-{i}", queue="vision-team", gpus=8, duration="1000h")
        ctl.cycle()
        svc = _svc(ctl, store)

        def at(hours: float) -> tuple[int, int]:
            clock.t = t0 + hours * 3600
            ctl.cycle()
            return alerts.refresh(svc)

        submit_to(store, ctl, "waits", queue="vision-team", gpus=8, duration="1000h")
        assert at(5) == (3, 0)
        ctl.cancel("waits", "alice")
        assert at(5.5) == (0, 3)
        clock.t = t0 + 6 * 3600
        submit_to(store, ctl, "waits-again", queue="vision-team", gpus=8, duration="1000h")
        assert at(11) == (3, 0)
        idle = next(i for i in store.list_incidents(open_only=True) if i["subject"] == "pool/l40s-experiment")
        clock.t = t0 + 13 * 3600
        store.resolve_incident(idle["id"], "alice", "moved the experiments there")
        start = datetime.fromtimestamp(t0, UTC)
        rep = weekly_report(
            load_store(store, Window(start, start + timedelta(days=7)), CostPolicySpec()), store
        )
    finally:
        store.close()
    rows = {r[0]: r[1:] for r in table(rep, "incidents")["rows"]}
    # rule: opened, resolved, still open, median and p90 minutes to resolve, resolved by the platform
    assert rows == {
        "QueueOldestPendingAboveTarget": [2, 1, 1, 30.0, 30.0, 1],
        "PoolIdleWhileWorkWaits": [4, 3, 1, 30.0, 120.0, 2],
    }
    assert "Incidents per rule" in render_weekly_html(rep)
