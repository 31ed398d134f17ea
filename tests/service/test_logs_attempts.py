"""Logs of every attempt: ``gpupool logs NAME [--attempt N | --previous] [--pod K] [-f] [--tail N]``
and ``GET /v1/workloads/{name}/logs`` (attempt, previous, pod, tailLines; ``/logs/attempts``).

A real ``gpupool serve --backend local`` on two fake GPUs runs a workload that fails once and
succeeds when retried; every read is checked against what each attempt printed. The virtual
cluster's synthetic line per attempt and the tail reader are tested without processes.
"""

from __future__ import annotations

import io
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from gpupool.cli.main import app
from tests.service.test_local_backend import PY, serve, workload
from tests.test_service_support import REPO, free_port, running_app, wait_for, wl

FLAKY = (
    "import os, pathlib, sys\n"
    "m = pathlib.Path({mark!r})\n"
    "if not m.exists():\n"
    "    m.write_text('1'); print('first attempt output', flush=True); sys.exit(3)\n"
    "print('second attempt output', flush=True)\n"
)
GANG = "import os; print('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'], flush=True)"
#: prints, then waits (without a deadline of its own) for the test to create the release file
HOLD = (
    "import pathlib, time\n"
    "print('holding', flush=True)\n"
    "while not pathlib.Path({release!r}).exists(): time.sleep(0.05)\n"
    "print('released', flush=True)\n"
)


class Local:
    """The server and a client for it."""

    def __init__(self, base: str, token: str, tmp: Path) -> None:
        self.base, self.token, self.tmp = base, token, tmp
        self.http = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=30)
        self.env = {"GPUPOOL_SERVER": base, "GPUPOOL_TOKEN": token, "GPUPOOL_CONFIG": "/nonexistent"}

    def cli(self, *args: str) -> Any:
        return CliRunner().invoke(app, ["logs", *args], env=self.env)

    def submit(self, m: dict[str, Any]) -> None:
        r = self.http.post("/v1/workloads", json=m)
        assert r.status_code in (200, 201), r.text

    def done(self, name: str, timeout: float = 30) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            w: dict[str, Any] = self.http.get(f"/v1/workloads/{name}").json()
            return w if w["phase"] in ("Succeeded", "Failed") else None

        w: dict[str, Any] = wait_for(probe, timeout, f"{name} to finish")
        return w


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Local]:
    tmp = tmp_path_factory.mktemp("logs")
    state, port = tmp / "state", free_port()
    state.mkdir()
    srv = serve(state, port)
    try:
        loc = Local(f"http://127.0.0.1:{port}", (state / "admin-token").read_text().strip(), tmp)
        flaky = workload("flaky", FLAKY.format(mark=str(tmp / "flaky.mark")), maxRetries=1)
        flaky["metadata"]["annotations"] = {"gpupool.io/retry-backoff": "0.2s"}
        loc.submit(flaky)
        gang = workload("gang", GANG)
        gang["spec"]["podGroups"][0]["replicas"] = 2
        loc.submit(gang)
        assert loc.done("flaky")["phase"] == "Succeeded"
        assert loc.done("gang")["phase"] == "Succeeded"
        yield loc
    finally:
        srv.terminate()
        srv.wait(10)


# ---------------------------------------------------------------------- the CLI
def test_previous_and_attempt_1_show_the_first_attempts_output(local: Local) -> None:
    w = local.http.get("/v1/workloads/flaky").json()
    assert w["attempts"] == 2 and [f["exitCode"] for f in w["failures"]] == [3]
    latest = local.cli("flaky")
    assert latest.exit_code == 0 and latest.stdout == "second attempt output\n", latest.output
    for args in (["--previous"], ["-p"], ["--attempt", "1"]):
        r = local.cli("flaky", *args)
        assert r.exit_code == 0 and r.stdout == "first attempt output\n", (args, r.output)
    assert local.cli("flaky", "--attempt", "2").stdout == "second attempt output\n"


def test_pod_reads_one_pod_of_a_gang(local: Local) -> None:
    assert local.cli("gang", "--pod", "1").stdout == "rank 1 of 2\n"
    assert local.cli("gang").stdout == "rank 0 of 2\n"


def test_a_missing_attempt_or_pod_names_the_flag_and_what_exists(local: Local) -> None:
    r = local.cli("flaky", "--attempt", "3")
    assert r.exit_code == 1 and "--attempt: workload 'flaky' has no attempt 3" in r.output, r.output
    assert "attempts with logs: 1, 2" in r.output
    r = local.cli("gang", "--previous")
    assert r.exit_code == 1 and "--previous: workload 'gang' has no previous attempt" in r.output
    assert "attempts with logs: 1" in r.output
    r = local.cli("gang", "--pod", "2")
    assert r.exit_code == 1 and "--pod:" in r.output and "pods with logs: 0, 1" in r.output, r.output
    r = local.cli("flaky", "--attempt", "1", "--previous")
    assert r.exit_code == 2 and "--attempt, --previous" in r.output
    r = local.cli("flaky", "--attempt", "0")
    assert r.exit_code == 2 and "--attempt" in r.output and "Traceback" not in r.output
    r = local.cli("nobody")
    assert r.exit_code == 1 and "nobody" in r.output and "Traceback" not in r.output


def test_tail_keeps_the_last_lines(local: Local) -> None:
    assert local.cli("gang", "--tail", "0").stdout == ""
    assert local.cli("flaky", "--previous", "--tail", "5").stdout == "first attempt output\n"


def test_follow_streams_the_running_attempt_until_it_ends(local: Local) -> None:
    release = local.tmp / "release"
    local.submit(workload("held", HOLD.format(release=str(release))))
    wait_for(lambda: local.http.get("/v1/workloads/held").json()["phase"] == "Running", 30, "held to run")
    cmd = [PY, "-c", "from gpupool.cli import main; main()", "logs", "held", "-f"]
    cmd += ["--server", local.base, "--token", local.token]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(REPO)) as p:
        assert p.stdout is not None
        assert p.stdout.readline() == "holding\n"  # streamed while the attempt still runs
        assert p.poll() is None
        release.touch()
        out, err = p.communicate(timeout=60)
    assert p.returncode == 0 and out == "released\n", err
    # a finished earlier attempt is followed to its end at once
    r = local.cli("flaky", "--attempt", "1", "-f")
    assert r.exit_code == 0 and r.stdout == "first attempt output\n"


# ---------------------------------------------------------------------- the API
def test_api_attempt_previous_pod_tail_and_the_attempts_list(local: Local) -> None:
    h = local.http
    r = h.get("/v1/workloads/flaky/logs", params={"previous": "true"})
    assert r.text == "first attempt output\n" and r.headers["x-gpupool-attempt"] == "1"
    r = h.get("/v1/workloads/flaky/logs")
    assert r.text == "second attempt output\n" and r.headers["x-gpupool-attempt"] == "2"
    assert (
        h.get("/v1/workloads/flaky/logs", params={"attempt": 1, "tailLines": 1}).text
        == "first attempt output\n"
    )
    assert h.get("/v1/workloads/gang/logs", params={"pod": 1, "attempt": 1}).text == "rank 1 of 2\n"
    listed = h.get("/v1/workloads/flaky/logs/attempts").json()
    assert listed == {
        "workload": "flaky",
        "latest": 2,
        "items": [{"attempt": 1, "pods": [0]}, {"attempt": 2, "pods": [0]}],
    }
    assert h.get("/v1/workloads/gang/logs/attempts").json()["items"] == [{"attempt": 1, "pods": [0, 1]}]


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"attempt": 0}, "attempt"),
        ({"attempt": "one"}, "attempt"),
        ({"tailLines": -1}, "tailLines"),
        ({"pod": -1}, "pod"),
        ({"previous": "maybe"}, "previous"),
        ({"attempt": 1, "previous": "true"}, "previous"),
    ],
)
def test_api_bad_values_are_422_naming_the_parameter(
    local: Local, params: dict[str, Any], field: str
) -> None:
    r = local.http.get("/v1/workloads/flaky/logs", params=params)
    assert r.status_code == 422, r.text
    assert [e["field"] for e in r.json()["error"]["errors"]] == [field], r.text


@pytest.mark.parametrize(
    ("name", "params", "field", "words"),
    [
        ("flaky", {"attempt": 9}, "attempt", "has no attempt 9 (attempts with logs: 1, 2)"),
        ("gang", {"previous": "true"}, "previous", "has no previous attempt (attempts with logs: 1)"),
        ("gang", {"pod": 5}, "pod", "no log for pod 5 in attempt 1 (pods with logs: 0, 1)"),
    ],
)
def test_api_missing_attempt_or_pod_is_404_naming_it(
    local: Local, name: str, params: dict[str, Any], field: str, words: str
) -> None:
    r = local.http.get(f"/v1/workloads/{name}/logs", params=params)
    assert r.status_code == 404 and words in r.json()["error"]["message"], r.text
    assert r.json()["error"]["errors"][0]["field"] == field
    assert local.http.get("/v1/workloads/nobody/logs/attempts").status_code == 404
    assert httpx.get(local.base + "/v1/workloads/flaky/logs/attempts").status_code == 401


# ---------------------------------------------------------------------- the virtual cluster
def test_the_virtual_cluster_has_a_synthetic_line_per_attempt(tmp_path: Path) -> None:
    with running_app(tmp_path) as api:
        m = wl("vflaky", duration="1h", maxRetries=1)
        m["metadata"]["annotations"] = {
            "gpupool.io/fail-after": "60s",
            "gpupool.io/exit-code": "137",
            "gpupool.io/retry-backoff": "0.1s",
        }
        assert api.req("POST", "/v1/workloads", json=m).status_code == 201
        wait_for(lambda: api.get("/v1/workloads/vflaky")["attempts"] == 2, 20, "a second attempt")
        assert [a["attempt"] for a in api.get("/v1/workloads/vflaky/logs/attempts")["items"]] == [1, 2]
        first = api.req("GET", "/v1/workloads/vflaky/logs", params={"previous": "true"}).text
        assert first.startswith("[virtual cluster] vflaky attempt 1:") and first.count("\n") == 1
        assert api.req("GET", "/v1/workloads/vflaky/logs").text.startswith(
            "[virtual cluster] vflaky attempt 2:"
        )
        assert api.req("POST", "/v1/workloads", json=wl("vrun", duration="100h")).status_code == 201
        w = api.wait_phase("vrun", "Running")
        line = api.req("GET", "/v1/workloads/vrun/logs").text
        assert line.startswith("[virtual cluster] vrun attempt 1: started ")
        assert f" on {w['placement']['pods'][0]['node']};" in line


def test_a_backend_without_logs_answers_501(tmp_path: Path) -> None:
    with running_app(tmp_path) as api:
        api.req("POST", "/v1/workloads", json=wl("v", duration="1h"))
        served: Any = api.c.app
        served.state.svc.backend.run_logs = None  # as the Kubernetes backend: no run_logs
        r = api.req("GET", "/v1/workloads/v/logs")
        assert r.status_code == 501 and "keeps no logs" in r.json()["error"]["message"]
        assert "kubectl logs" in r.json()["error"]["message"]


# ---------------------------------------------------------------------- the tail reader
@given(
    st.lists(st.binary(max_size=12).map(lambda b: b.replace(b"\n", b"").replace(b"\r", b"")), max_size=30),
    st.booleans(),
    st.integers(0, 40),
)
def test_last_lines_are_the_lines_splitlines_ends_with(lines: list[bytes], ending: bool, n: int) -> None:
    from gpupool.service.backends import run_logs
    from gpupool.service.backends.run_logs import last_lines

    data = b"\n".join(lines) + (b"\n" if ending and lines else b"")
    old, run_logs._BLOCK = run_logs._BLOCK, 5  # several blocks for any data
    try:
        f = io.BytesIO(data)
        got = last_lines(f, n)
        assert f.tell() == len(data)  # where a follow goes on
    finally:
        run_logs._BLOCK = old
    want = b"".join(data.splitlines(keepends=True)[-n:]) if n else b""
    assert got == want


def test_a_plain_read_keeps_the_last_bytes_and_says_what_it_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpupool.service.routes import logs as route

    monkeypatch.setattr(route, "MAX_READ", 10)
    data = b"".join(b"line %d\n" % i for i in range(5))  # 35 bytes
    assert route._read(io.BytesIO(data), None) == b"[gpupool: the first 25 bytes are left out]\n" + data[-10:]
    assert route._read(io.BytesIO(data), 1) == b"line 4\n"
    assert (
        route._read(io.BytesIO(data), 3) == b"[gpupool: the start of these lines is left out]\n" + data[-10:]
    )
