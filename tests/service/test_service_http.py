"""The real thing over HTTP: ``gpupool serve`` in a child process on a free port, driven by the
kubectl-like CLI (in-process CliRunner, real HTTP) — output formats, errors, audit tamper."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from typer.testing import CliRunner

from gpupool.cli.main import app
from tests.test_service_support import REPO, Server, free_port, wait_for, wl

runner = CliRunner()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(tmp_path_factory.mktemp("http") / "state", time_scale=1.0)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def cli(
    srv: Server, *args: str, token: str | None = None, env: dict[str, str] | None = None
) -> tuple[int, str]:
    e = {
        "GPUPOOL_SERVER": srv.base,
        "GPUPOOL_TOKEN": token if token is not None else srv.token,
        "GPUPOOL_CONFIG": "/nonexistent",
        "COLUMNS": "200",
    }
    e.update(env or {})
    r = runner.invoke(app, list(args), env=e)
    assert "Traceback" not in r.output
    return r.exit_code, r.output


def test_first_start_banner_and_token_file(server: Server) -> None:
    log = server.log.read_text()
    assert "bootstrap admin token: created (not printed: stdout is not a terminal)" in log
    assert server.token not in log and "gpupool submit -f examples/workloads/demo.yaml" in log
    assert (server.state_dir / "admin-token").stat().st_mode & 0o777 == 0o600
    assert httpx.get(server.base + "/openapi.json").json()["info"]["title"] == "gpupool"


def test_cli_submit_get_explain_describe(server: Server) -> None:
    code, out = cli(server, "submit", "-f", str(REPO / "examples/workloads/demo.yaml"))
    assert code == 0, out
    assert "llama-405b-pretrain" in out
    code, out = cli(server, "submit", "-f", str(REPO / "examples/workloads/demo.yaml"), "-o", "json")
    assert code == 0 and len(json.loads(out)) == 8  # idempotent resubmit

    def admitted() -> bool:
        _code, out = cli(server, "get", "workloads", "-o", "json")
        return sum(w["phase"] == "Running" for w in json.loads(out)["items"]) >= 5

    wait_for(admitted, 15, "admissions")
    code, out = cli(server, "get", "workloads", "-o", "yaml")
    assert code == 0 and len(yaml.safe_load(out)["items"]) == 8
    code, out = cli(server, "explain", "llama-405b-pretrain")
    assert code == 0 and "QuotaExceeded" in out and "position 1 of 1" in out
    code, out = cli(server, "describe", "workload", "chat-serving")
    assert code == 0 and "Admitted" in out and "placement: pool a100-inference" in out
    for kind in ("pools", "queues", "priorityclasses", "nodes", "quota", "approvals", "tokens"):
        code, out = cli(server, "get", kind)
        assert code == 0, (kind, out)
    code, out = cli(server, "apply", "-f", str(REPO / "examples/cluster"))
    assert code == 0 and "unchanged" in out
    code, out = cli(server, "cancel", "llama-405b-pretrain")
    assert code == 0 and "Cancelled" in out
    assert httpx.get(server.base + "/metrics").status_code == 401  # it names every queue
    m = httpx.get(server.base + "/metrics", headers={"Authorization": f"Bearer {server.token}"}).text
    assert "gpupool_workloads{phase=" in m and "gpupool_admission_wait_time_seconds" in m


def test_cli_errors_are_one_line(server: Server, tmp_path: Path) -> None:
    code, out = cli(server, "get", "workloads", token="gpt_wrong")
    assert code == 1 and out.strip().startswith("error: authentication failed") and "(HTTP 401)" in out
    code, out = cli(server, "get", "workloads", env={"GPUPOOL_SERVER": f"http://127.0.0.1:{free_port()}"})
    assert code == 1 and "cannot reach the gpupool server" in out
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: Workload\n  metadata: [\n")
    code, out = cli(server, "submit", "-f", str(bad))
    assert code == 2 and "invalid YAML" in out and "line" in out
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "gpupool.io/v1alpha1",
                "kind": "Workload",
                "metadata": {"name": "w"},
                "spec": {"queue": "llm-research", "podGroups": []},
            }
        )
    )
    code, out = cli(server, "submit", "-f", str(wrong))  # checked locally, with the server's validator
    assert code == 2 and f"{wrong}: document 1 (Workload/w): spec.podGroups" in out
    wrong.write_text(yaml.safe_dump(wl("w", queue="no-such-queue")))
    code, out = cli(server, "submit", "-f", str(wrong))  # checked against the server's queues first
    assert code == 2 and "queue 'no-such-queue' does not exist" in out and "nothing was sent" in out
    code, out = cli(server, "get", "widgets")
    assert code == 2 and "unknown resource type" in out
    code, out = cli(server, "explain", "ghost")
    assert code == 1 and "not found" in out


def test_cli_config_file_and_member_isolation(server: Server, tmp_path: Path) -> None:
    code, out = cli(
        server, "token", "create", "dora", "--role", "member", "--scope", "vision-team", "-o", "json"
    )
    assert code == 0, out
    tok = json.loads(out)["token"]
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump({"server": server.base, "token": tok}))
    env = {"GPUPOOL_CONFIG": str(cfg), "GPUPOOL_SERVER": "", "GPUPOOL_TOKEN": ""}
    code, out = cli(server, "get", "workloads", "-o", "json", env=env)
    assert code == 0 and {w["queue"] for w in json.loads(out)["items"]} <= {"vision-team"}
    code, out = cli(server, "cancel", "chat-serving", env=env)
    assert code == 1 and "not found" in out
    code, out = cli(server, "audit", "verify", env=env)
    assert code == 1 and "forbidden" in out and "(HTTP 403)" in out


def test_audit_tamper_detected_by_cli(server: Server, tmp_path: Path) -> None:
    code, out = cli(server, "audit", "verify")
    assert code == 0 and "audit log intact" in out
    out_file = tmp_path / "audit.jsonl"
    code, _ = cli(server, "audit", "export", "--format", "jsonl", "--out", str(out_file))
    assert code == 0 and len(out_file.read_text().splitlines()) > 5
    with sqlite3.connect(server.state_dir / "gpupool.db") as db:
        db.execute("DELETE FROM audit WHERE seq = 3")
    code, out = cli(server, "audit", "verify")
    assert code == 1 and "broken at seq 3" in out and "deleted" in out
