"""Errors that say which (issue 29): a refused set names each document (file, number, kind/name)
and field; an onboarding refusal names the over-subscribed queue and the numbers; the CLI finds
the token in the state dir it is pointed at, and says where it looked when it cannot.

Against a real ``gpupool serve`` (child process, real HTTP), as a user meets it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner, Result

from gpupool.cli import app
from tests.test_service_support import REPO, Server, wl

runner = CliRunner()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(tmp_path_factory.mktemp("errors") / "state", time_scale=1.0)
    srv.start(timeout=180)  # a loaded 2-core machine starts a server slowly
    try:
        yield srv
    finally:
        srv.stop()


def run(server: Server, *args: str, token: str | None = "", **env: str | None) -> Result:
    """The CLI against ``server``; ``token`` None: no token given (the CLI looks for one)."""
    e: dict[str, str | None] = {
        "GPUPOOL_SERVER": server.base,
        "GPUPOOL_TOKEN": (token or server.token) if token is not None else None,
        "GPUPOOL_STATE_DIR": None,
        "GPUPOOL_TOKEN_FILE": None,
        "GPUPOOL_CONFIG": "/nonexistent",
        "COLUMNS": "200",
    }
    e.update(env)
    r = runner.invoke(app, list(args), env=e)
    assert "Traceback" not in r.output
    return r


def _exists(server: Server, name: str) -> bool:
    with server.client() as c:
        return c.get(f"/v1/workloads/{name}").status_code == 200


def _batch(tmp_path: Path, bad: dict[int, dict[str, object]]) -> Path:
    """24 workloads in one file; document N (1-based) replaced by ``bad[N]``'s options."""
    docs = [wl(f"batch-{n:02d}", **bad.get(n, {})) for n in range(1, 25)]  # type: ignore[arg-type]
    f = tmp_path / "batch.yaml"
    f.write_text(yaml.safe_dump_all(docs))
    return f


def test_a_refused_24_document_submit_names_each_document_and_field(server: Server, tmp_path: Path) -> None:
    f = _batch(tmp_path, {7: {"gpus": 4096}, 19: {"gpus": 4096}})  # only the server knows the nodes
    r = run(server, "submit", "-f", str(f))
    assert r.exit_code == 1, r.output
    assert "2 problem(s)" in r.output and "nothing was applied" in r.output
    for n in (7, 19):
        assert f"{f}: document {n} (Workload/batch-{n:02d}): spec.podGroups" in r.output, r.output
    assert "items[" not in r.output  # the server's numbering is the user's documents
    assert not _exists(server, "batch-01")


def test_a_set_the_caller_may_not_write_names_each_document(server: Server, tmp_path: Path) -> None:
    with server.client() as c:
        t = c.post("/v1/tokens", json={"name": "ann", "role": "member", "scope": "llm-research"}).json()
    f = _batch(tmp_path, {3: {"queue": "serving"}, 20: {"queue": "serving"}})
    r = run(server, "submit", "-f", str(f), token=t["token"])
    assert r.exit_code == 1, r.output
    assert "2 object(s) of the set refused; nothing was applied" in r.output and "(HTTP 403)" in r.output
    for n in (3, 20):
        assert f"{f}: document {n} (Workload/batch-{n:02d}): spec.queue: forbidden" in r.output, r.output
    assert not _exists(server, "batch-01")


def test_an_onboarding_refusal_names_the_queue_and_the_numbers(server: Server) -> None:
    r = run(server, "onboard", str(REPO / "examples/templates/training-team.yaml"), "--team", "nlp")
    assert r.exit_code == 1, r.output
    out = " ".join(r.output.split())
    assert "queue 'ai-org' is over-subscribed on pool h100-training" in out, out
    assert "team 'nlp' asks a guarantee of 8 GPUs (nlp 8)" in out
    assert "ai-org guarantees 64 GPUs there and has already promised 64 (llm-team 40, vision-team 24)" in out
    assert "leaving 0; the pool has 64 GPUs" in out and "nothing was created" in out


def test_the_token_is_found_in_the_state_dir_pointed_at(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no ./.gpupool here: the state dir is elsewhere
    state = str(server.state_dir)
    banner = server.log.read_text()  # serve says how to point the CLI at it
    assert "the CLI reads it from there when pointed at this state dir" in banner
    assert f"export GPUPOOL_STATE_DIR={server.state_dir.absolute()}" in banner
    r = run(server, "--state-dir", state, "get", "queues", "-o", "name", token=None)
    assert r.exit_code == 0 and "queue/llm-research" in r.stdout, r.output
    r = run(server, "get", "queues", "-o", "name", token=None, GPUPOOL_STATE_DIR=state)
    assert r.exit_code == 0 and "queue/llm-research" in r.stdout, r.output
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"stateDir": state}))
    r = run(server, "get", "queues", "-o", "name", token=None, GPUPOOL_CONFIG=str(config))
    assert r.exit_code == 0 and "queue/llm-research" in r.stdout, r.output


def test_without_a_token_the_cli_says_where_it_looked_and_how_to_pass_one(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    r = run(server, "get", "queues", token=None)
    assert r.exit_code == 1 and "(HTTP 401)" in r.output
    out = " ".join(r.output.split())
    assert f"no token found: looked in {tmp_path / '.gpupool' / 'admin-token'}" in out, out
    assert "--token" in out and "GPUPOOL_STATE_DIR" in out and "--state-dir" in out
    other = tmp_path / "other"
    other.mkdir()
    (other / "admin-token").write_text("gpt_not-this-servers\n")
    r = run(server, "get", "queues", token=None, GPUPOOL_STATE_DIR=str(other))
    out = " ".join(r.output.split())
    assert r.exit_code == 1 and f"the token from {other / 'admin-token'} was refused" in out, out
