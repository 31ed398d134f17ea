"""The local backend with real processes on fake GPUs: environment, gangs, exits, stops, logs,
restarts (adoption, pid reuse, interrupted starts), fractional refusal, unhealthy devices, and a
kill -9 of the real server while workloads run (nothing started twice).

Pods are small ``python -c`` scripts; each writes what it saw to a file the test reads.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from gpupool.discovery.nvml import Device, parse_fake_gpus
from gpupool.service.api import create_app
from gpupool.service.backends import BackendError, PodCommand, RunSpec, RunState
from gpupool.service.backends import local_process as proc
from gpupool.service.backends.local import LocalBackend
from gpupool.service.backends.local_host import seed_manifests, write_config_dir
from gpupool.service.backends.local_mps import MpsControl
from gpupool.service.config import ServiceConfig
from tests.test_service_support import REPO, free_port, wait_for

PY = sys.executable
NODE = "box"
ENV_KEYS = (
    "CUDA_VISIBLE_DEVICES",
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "GPUPOOL_WORKLOAD",
    "GPUPOOL_POD",
    "TEAM",
    "SECRET_OF_THE_SERVER",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
    "GPUPOOL_GPU_ISOLATION",
)


def backend(tmp: Path, gpus: str = "4xH100-80GB", **kw: Any) -> LocalBackend:
    kw.setdefault("grace_s", 0.5)
    return LocalBackend(tmp / "state", parse_fake_gpus(gpus), node=NODE, **kw)


def pods(*devices: list[int], milli: int = 1000, mem: int = 0) -> dict[str, Any]:
    return {
        "pods": [
            {"group": "main", "index": i, "node": NODE, "devices": d, "gpuMilli": milli, "memoryMiB": mem}
            for i, d in enumerate(devices)
        ]
    }


def run(name: str, placement: dict[str, Any], code: str, **cmd: Any) -> RunSpec:
    return RunSpec(name, placement, None, "batch", {}, {"main": PodCommand((PY, "-c", code), **cmd)})


def env_dump(out: Path) -> str:
    """A pod that writes its environment (and cwd) to ``out``-RANK.json."""
    keys = list(ENV_KEYS)
    return (
        "import json, os\n"
        f"d = {{k: os.environ.get(k) for k in {keys!r}}}\n"
        "d['cwd'] = os.getcwd()\n"
        f"open({str(out)!r} + '-' + os.environ['RANK'] + '.json', 'w').write(json.dumps(d))\n"
    )


def finished(be: LocalBackend, name: str, timeout: float = 10.0) -> RunState:
    def probe() -> RunState | None:
        return next((r for r in be.poll(time.time()) if r.name == name), None)

    r: RunState = wait_for(probe, timeout, f"{name} to finish")
    return r


def pod_pids(be: LocalBackend, name: str) -> list[int]:
    state = json.loads(be.path.read_text())
    return [int(p["pid"]) for p in state["runs"][name]["pods"]]


# ---------------------------------------------------------------------- starting
def test_a_gang_gets_its_devices_ranks_and_one_master_port(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SECRET_OF_THE_SERVER", "db-password")  # must not reach the pods
    be = backend(tmp_path)
    out = tmp_path / "env"
    wd = tmp_path / "work"
    wd.mkdir()
    be.start([run("g", pods([0, 1], [3]), env_dump(out), env={"TEAM": "vision"}, working_dir=str(wd))])
    r = finished(be, "g")
    assert r.outcome == "Succeeded", r.message
    e0, e1 = (json.loads((tmp_path / f"env-{k}.json").read_text()) for k in (0, 1))
    assert (e0["CUDA_VISIBLE_DEVICES"], e1["CUDA_VISIBLE_DEVICES"]) == ("0,1", "3")
    assert (e0["RANK"], e1["RANK"], e0["LOCAL_RANK"], e1["LOCAL_RANK"]) == ("0", "1", "0", "1")
    assert e0["WORLD_SIZE"] == e1["WORLD_SIZE"] == "2"
    assert e0["MASTER_ADDR"] == "127.0.0.1" and e0["MASTER_PORT"] == e1["MASTER_PORT"]
    assert int(e0["MASTER_PORT"]) > 0
    assert (e0["GPUPOOL_WORKLOAD"], e1["GPUPOOL_POD"]) == ("g", "main-1")
    assert e0["TEAM"] == "vision" and e0["SECRET_OF_THE_SERVER"] is None
    assert e0["cwd"] == str(wd)


def test_each_pod_is_its_own_process_group(tmp_path: Path) -> None:
    be = backend(tmp_path)
    be.start([run("s", pods([0], [1]), "import time; time.sleep(30)")])
    pids = pod_pids(be, "s")
    try:
        assert {os.getpgid(p) for p in pids} == set(pids)  # each pod leads its own group
        assert os.getpgid(pids[0]) != os.getpgrp()
    finally:
        be.stop(["s"])


def test_pods_without_a_command_sleep_their_duration_or_are_refused(tmp_path: Path) -> None:
    be = backend(tmp_path)
    be.start([RunSpec("d", pods([0]), 0.2, "batch")])
    assert finished(be, "d").outcome == "Succeeded"
    with pytest.raises(BackendError, match="declares nothing to run"):
        be.start([RunSpec("n", pods([1]), None, "batch")])
    with pytest.raises(BackendError, match="workingDir"):
        be.start([run("w", pods([1]), "pass", working_dir=str(tmp_path / "missing"))])
    assert "n" not in be.runs() and "w" not in be.runs()


# ---------------------------------------------------------------------- exits
@pytest.mark.parametrize(
    ("code", "outcome", "exit_code", "reason"),
    [
        ("raise SystemExit(0)", "Succeeded", None, ""),
        ("raise SystemExit(3)", "Failed", 3, "Error"),
        ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", "Failed", 137, "Killed"),
        ("import os, signal; os.kill(os.getpid(), signal.SIGTERM)", "Failed", 143, "Signaled"),
    ],
)
def test_exit_codes_become_outcomes_with_signals_named(
    tmp_path: Path, code: str, outcome: str, exit_code: int | None, reason: str
) -> None:
    be = backend(tmp_path)
    be.start([run("x", pods([0]), code)])
    r = finished(be, "x")
    assert (r.outcome, r.exit_code, r.reason) == (outcome, exit_code, reason), r.message
    if exit_code == 137:
        assert "SIGKILL" in r.message and "out-of-memory" in r.message


def test_a_command_that_does_not_exist_fails_with_127(tmp_path: Path) -> None:
    be = backend(tmp_path)
    be.start([RunSpec("m", pods([0]), None, "batch", {}, {"main": PodCommand(("no-such-binary-here",))})])
    r = finished(be, "m")
    assert (r.outcome, r.exit_code, r.reason) == ("Failed", 127, "StartError")


def test_one_failing_pod_fails_the_gang_and_stops_the_others(tmp_path: Path) -> None:
    be = backend(tmp_path)
    code = "import os, sys, time\nif os.environ['RANK'] == '1': sys.exit(7)\ntime.sleep(30)"
    be.start([run("gang", pods([0], [1]), code)])
    r = finished(be, "gang")
    assert (r.outcome, r.exit_code) == ("Failed", 7) and "pod 1 (main-1)" in r.message
    rank0 = pod_pids(be, "gang")[0]
    wait_for(
        lambda: not proc.alive(rank0, proc.start_ticks(rank0)),  # alive() reaps a zombie child
        5,
        "rank 0 stopped by SIGTERM",
    )


def test_exit_codes_map_shell_style_signal_codes() -> None:
    assert proc.ending({"returncode": 137, "oomKillsDuring": 1}).reason == "OOMKilled"
    assert proc.ending({"returncode": -9}).exit_code == 137
    assert proc.ending({"returncode": 1}).reason == "Error"
    assert proc.ending(None).reason == "Lost"


# ---------------------------------------------------------------------- stopping
def test_stop_sends_sigterm_then_sigkill_after_the_grace_period(tmp_path: Path) -> None:
    be = backend(tmp_path, grace_s=0.6)
    mark = tmp_path / "term"
    code = (
        "import signal, time\n"
        f"signal.signal(signal.SIGTERM, lambda *a: open({str(mark)!r}, 'w').write('TERM'))\n"
        "open(" + repr(str(tmp_path / "up")) + ", 'w').write('up')\n"
        "while True: time.sleep(0.05)\n"
    )
    be.start([run("stubborn", pods([0]), code)])
    wait_for(lambda: (tmp_path / "up").exists(), 10, "the pod to start")
    pgid = pod_pids(be, "stubborn")[0]
    t0 = time.monotonic()
    be.stop(["stubborn"])
    assert "stubborn" not in be.runs()  # released at once (the device is free for new work)
    wait_for(lambda: mark.exists(), 5, "SIGTERM to reach the command")
    assert proc.signal_group(pgid, 0)  # it ignores SIGTERM: still there within the grace period
    wait_for(lambda: not be.poll(time.time()) and not be._stopping, 10, "SIGKILL after the grace")
    assert time.monotonic() - t0 >= 0.6
    wait_for(lambda: not proc.alive(pgid, proc.start_ticks(pgid)), 5, "the wrapper gone")


def test_stop_of_a_polite_pod_needs_no_sigkill_and_unknown_names_are_ignored(tmp_path: Path) -> None:
    be = backend(tmp_path, grace_s=30)
    be.start([run("polite", pods([0]), "import time; time.sleep(30)")])
    pid = pod_pids(be, "polite")[0]
    be.stop(["polite", "never-heard-of"])
    wait_for(lambda: not be.poll(time.time()) and not be._stopping, 10, "the group to end on SIGTERM")
    assert not proc.alive(pid, proc.start_ticks(pid))


# ---------------------------------------------------------------------- logs
def test_each_pod_logs_to_its_own_file(tmp_path: Path) -> None:
    be = backend(tmp_path)
    be.start(
        [
            run(
                "l",
                pods([0], [1]),
                "import os, sys; print('hello from', os.environ['RANK']); print('oops', file=sys.stderr)",
            )
        ]
    )
    finished(be, "l")
    assert be.log_pods("l") == [0, 1]
    text = be.log_path("l", 1).read_text()  # type: ignore[union-attr]
    assert "hello from 1" in text and "oops" in text
    assert be.log_path("l", 5) is None and be.log_path("nobody") is None


# ---------------------------------------------------------------------- restarts
def test_a_restarted_backend_adopts_running_pods_and_never_starts_them_twice(tmp_path: Path) -> None:
    be = backend(tmp_path)
    count = tmp_path / "starts"
    code = f"open({str(count)!r}, 'a').write('x'); import time; time.sleep(1.0)"
    spec = run("long", pods([0]), code)
    be.start([spec])
    again = backend(tmp_path)  # a new process would see exactly this state
    assert not again.runs()["long"].finished
    again.start([spec])  # the controller re-applies its decision after a restart
    assert again.starts == {"long": 1}
    r = finished(again, "long")  # not its child: the status comes from the wrapper's exit.json
    assert r.outcome == "Succeeded"
    assert count.read_text() == "x"
    again.forget(["long"])
    assert backend(tmp_path).runs() == {}


def test_a_pod_that_died_while_the_backend_was_down_is_reported_with_its_status(tmp_path: Path) -> None:
    be = backend(tmp_path)
    be.start([run("dies", pods([0]), "raise SystemExit(5)")])
    wait_for(
        lambda: (
            Path(json.loads(be.path.read_text())["runs"]["dies"]["pods"][0]["dir"]) / "exit.json"
        ).exists(),
        10,
        "exit",
    )
    r = finished(backend(tmp_path), "dies")
    assert (r.outcome, r.exit_code) == ("Failed", 5)


def test_a_reused_pid_is_not_adopted(tmp_path: Path) -> None:
    be = backend(tmp_path)
    be.start([run("victim", pods([0]), "import time; time.sleep(30)")])
    pid = pod_pids(be, "victim")[0]
    state = json.loads(be.path.read_text())
    state["runs"]["victim"]["pods"][0]["ticks"] += 1  # as if pid now belonged to a younger process
    be.path.write_text(json.dumps(state))
    try:
        r = finished(backend(tmp_path), "victim")
        assert (r.outcome, r.reason) == ("Failed", "Lost")
        assert proc.alive(pid, proc.start_ticks(pid))  # the stranger was not signalled
    finally:
        proc.signal_group(pid, signal.SIGKILL)


def test_an_interrupted_start_is_adopted_from_pid_files_or_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(LocalBackend, "PID_FILE_WAIT_S", 0.3)
    be = backend(tmp_path)
    be.start([run("half", pods([0], [1]), "import time; time.sleep(30)")])
    pids = pod_pids(be, "half")
    state = json.loads(be.path.read_text())
    state["runs"]["half"]["phase"] = "starting"
    for p in state["runs"]["half"]["pods"]:
        p["pid"] = p["ticks"] = None  # killed after spawning, before saving the pids
    be.path.write_text(json.dumps(state))
    adopted = backend(tmp_path)
    assert not adopted.runs()["half"].finished and adopted.starts == {"half": 1}
    # and a pod whose wrapper never wrote its pid file: the start is undone, the run dropped
    state["runs"]["half"]["pods"][1]["dir"] = str(tmp_path / "never-started")
    be.path.write_text(json.dumps(state))
    dropped = backend(tmp_path)
    assert "half" not in dropped.runs()
    wait_for(lambda: not proc.alive(pids[0], proc.start_ticks(pids[0])), 5, "the started pod killed")
    proc.signal_group(pids[1], signal.SIGKILL)


# ---------------------------------------------------------------------- fractional GPUs
def test_fractions_are_refused_on_fake_gpus_with_the_reason(tmp_path: Path) -> None:
    be = backend(tmp_path)
    with pytest.raises(BackendError, match="fractional GPUs are refused on this host: its GPUs are fake"):
        be.start([run("half", pods([0], milli=500), "pass")])
    assert be.health().detail["fractionalGpus"] == "refused"


def test_fractions_are_refused_without_mps_on_real_gpus(tmp_path: Path) -> None:
    dev = Device(0, "GPU-real-0", "L4-24GB", 24576)
    be = LocalBackend(tmp_path / "s", [dev], node=NODE, mps=MpsControl(tmp_path / "mps", binary=None))
    with pytest.raises(BackendError, match="nvidia-cuda-mps-control"):
        be.start([run("half", pods([0], milli=500), "pass")])


def test_a_fraction_runs_as_an_mps_client_with_its_share_and_memory_limit(tmp_path: Path) -> None:
    fake_mps = tmp_path / "nvidia-cuda-mps-control"  # answers like the daemon: -d, get_server_list
    fake_mps.write_text(
        '#!/bin/sh\nmkdir -p "$CUDA_MPS_PIPE_DIRECTORY"; touch "$CUDA_MPS_PIPE_DIRECTORY/control"\n'
    )
    fake_mps.chmod(0o755)
    dev = Device(0, "GPU-real-0", "A100-40GB", 40960)
    mps = MpsControl(tmp_path / "mps", binary=str(fake_mps))
    be = LocalBackend(tmp_path / "s", [dev], node=NODE, mps=mps)
    out = tmp_path / "env"
    be.start([run("half", pods([0], milli=250), env_dump(out))])
    assert finished(be, "half").outcome == "Succeeded"
    e = json.loads((tmp_path / "env-0.json").read_text())
    assert e["CUDA_VISIBLE_DEVICES"] == "GPU-real-0"  # real devices by UUID
    assert e["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert e["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=10240M"  # a quarter of 40 GiB
    assert e["GPUPOOL_GPU_ISOLATION"] == "mps"


def test_allow_unenforced_runs_a_fraction_and_says_so(tmp_path: Path) -> None:
    be = backend(tmp_path, allow_unenforced=True)
    out = tmp_path / "env"
    be.start([run("demo", pods([0], milli=500), env_dump(out))])
    assert finished(be, "demo").outcome == "Succeeded"
    assert "without" in be.health().detail["warning"].lower()
    assert "nothing limits" in json.loads((tmp_path / "env-0.json").read_text())["GPUPOOL_GPU_ISOLATION"]


# ---------------------------------------------------------------------- with the controller
API = "gpupool.io/v1alpha1"


def workload(name: str, code: str, gpus: Any = 1, **spec: Any) -> dict[str, Any]:
    group = {
        "resources": {"nvidia.com/gpu": gpus, "cpu": "100m", "memory": "256Mi"},
        "command": [PY, "-c", code],
    }
    s = {"queue": "default", "podGroups": [group], **spec}
    return {"apiVersion": API, "kind": "Workload", "metadata": {"name": name}, "spec": s}


@contextlib.contextmanager
def app_with(be: LocalBackend, state: Path) -> Iterator[tuple[TestClient, dict[str, str]]]:
    cfg_dir = write_config_dir(state / "cfg", seed_manifests(be.cluster_manifest()))
    cfg = ServiceConfig(state_dir=state, config_dir=cfg_dir, tick_s=0.05, min_interval_s=0.0)
    app = create_app(cfg, backend=be)
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c, {"Authorization": f"Bearer {app.state.svc.bootstrap_token}"}
    be.close()


def phase(c: TestClient, h: dict[str, str], name: str, *phases: str, timeout: float = 10.0) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        w: dict[str, Any] = c.get(f"/v1/workloads/{name}", headers=h).json()
        return w if w["phase"] in phases else None

    w: dict[str, Any] = wait_for(probe, timeout, f"{name} in {phases}")
    return w


def test_a_refused_fraction_is_the_workloads_recorded_reason_and_logs_are_served(tmp_path: Path) -> None:
    be = backend(tmp_path, gpus="2xH100-80GB")
    with app_with(be, tmp_path / "svc") as (c, h):
        assert c.post("/v1/workloads", json=workload("frac", "pass", gpus=0.5), headers=h).status_code in (
            200,
            201,
        )
        assert c.post("/v1/workloads", json=workload("ok", "print('it ran')"), headers=h).status_code in (
            200,
            201,
        )
        w = phase(c, h, "frac", "Failed")
        assert "fractional GPUs are refused" in w["reason"] and "显存隔离" in w["reason"]
        phase(c, h, "ok", "Succeeded")
        r = c.get("/v1/workloads/ok/logs", headers=h)
        assert r.status_code == 200 and "it ran" in r.text
        assert c.get("/v1/workloads/ok/logs?pod=3", headers=h).status_code == 404
        assert c.get("/v1/workloads/ok/logs?follow=true", headers=h).text.count("it ran") == 1
        assert c.get("/v1/workloads/ok/logs").status_code == 401
        node = c.get("/v1/nodes", headers=h).json()["items"][0]
        assert node["name"] == NODE and node["gpus"] == 2


def test_an_unhealthy_device_requeues_its_work_elsewhere(tmp_path: Path) -> None:
    be = backend(tmp_path, gpus="2xH100-80GB", health_interval_s=0.1)
    with app_with(be, tmp_path / "svc") as (c, h):
        c.post("/v1/workloads", json=workload("w", "import time; time.sleep(30)"), headers=h)
        w = phase(c, h, "w", "Running")
        first = w["placement"]["pods"][0]["devices"][0]
        pid = pod_pids(be, "w")[0]
        be.discovery.mark_unhealthy(first, "Xid 79 (fallen off the bus)")  # type: ignore[attr-defined]
        wait_for(lambda: be.starts.get("w") == 2, 10, "the workload to run again")
        w = phase(c, h, "w", "Running")
        assert w["placement"]["pods"][0]["devices"] == [1 - first]
        assert any("DeviceUnhealthy" in f["reason"] for f in w["failures"])
        wait_for(lambda: not proc.alive(pid, proc.start_ticks(pid)), 5, "the first run stopped")
        dev = c.get(f"/v1/nodes/{NODE}", headers=h).json()["devices"][first]
        assert dev["healthy"] is False and "Xid 79" in dev["healthReason"]
        c.post("/v1/workloads/w/cancel", headers=h)


# ---------------------------------------------------------------------- kill -9 of the server
def serve(state: Path, port: int) -> subprocess.Popen[bytes]:
    cmd = [PY, "-c", "from gpupool.cli import main; main()", "serve", "--backend", "local"]
    cmd += ["--fake-gpus", "2xH100-80GB", "--state-dir", str(state), "--port", str(port), "--tick", "0.05"]
    log = open(state.parent / "server.log", "ab")  # noqa: SIM115 (the child writes it)
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=str(REPO), env=dict(os.environ))
    wait_for(lambda: _ready(port), 180, "the server to be ready")  # a loaded 2-core machine
    return p


def _ready(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_kill9_of_the_server_leaves_pods_running_and_a_restart_starts_nothing_twice(tmp_path: Path) -> None:
    state, port = tmp_path / "state", free_port()
    starts = tmp_path / "starts.log"
    srv = serve(state, port)
    token = (state / "admin-token").read_text().strip()
    http = httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {token}"})
    code = (
        f"import os, time; open({str(starts)!r}, 'a').write(os.environ['GPUPOOL_WORKLOAD'] + '\\n'); "
        "print('ran', os.environ['GPUPOOL_WORKLOAD'], flush=True); time.sleep(2.5)"
    )
    for n in ("a", "b"):
        assert http.post("/v1/workloads", json=workload(n, code)).status_code in (200, 201)
    wait_for(lambda: len(starts.read_text().split()) == 2 if starts.exists() else False, 15, "both started")
    os.kill(srv.pid, signal.SIGKILL)
    srv.wait(10)
    pids = [
        p["pid"]
        for r in json.loads((state / "local-backend.json").read_text())["runs"].values()
        for p in r["pods"]
    ]
    assert all(proc.start_ticks(p) is not None for p in pids)  # the pods outlived the server
    srv = serve(state, port)
    try:

        def done() -> bool:
            return all(http.get(f"/v1/workloads/{n}").json()["phase"] == "Succeeded" for n in ("a", "b"))

        wait_for(done, 15, "both to succeed")
        assert sorted(starts.read_text().split()) == ["a", "b"]  # each ran once
        assert json.loads((state / "local-backend.json").read_text())["starts"] == {"a": 1, "b": 1}
        # gpupool logs, through the restarted server (the log was written before the kill)
        cli = [PY, "-c", "from gpupool.cli import main; main()", "logs", "a"]
        cli += ["--server", f"http://127.0.0.1:{port}", "--token", token]
        out = subprocess.run([*cli, "-f"], capture_output=True, text=True, timeout=30, cwd=str(REPO))
        assert out.returncode == 0 and out.stdout.count("ran a") == 1, out.stderr
        out = subprocess.run([*cli, "--pod", "3"], capture_output=True, text=True, timeout=30, cwd=str(REPO))
        assert out.returncode == 1 and "no log for pod 3" in out.stderr  # the server's 404, one line
    finally:
        srv.terminate()
        srv.wait(10)


# ---------------------------------------------------------------------- resources and retries
def test_a_cpu_only_pod_gets_no_gpus_and_its_memory_as_an_address_space_limit(tmp_path: Path) -> None:
    be = backend(tmp_path)
    out = tmp_path / "env"
    be.start([run("cpu", pods([], mem=1024), env_dump(out))])
    assert finished(be, "cpu").outcome == "Succeeded"
    assert json.loads((tmp_path / "env-0.json").read_text())["CUDA_VISIBLE_DEVICES"] == ""
    be.start([run("hog", pods([], mem=1024), "x = bytearray(3 << 30)")])  # 3 GiB > its 1 GiB
    r = finished(be, "hog")
    assert (r.outcome, r.exit_code) == ("Failed", 1)
    assert "MemoryError" in be.log_path("hog").read_text()  # type: ignore[union-attr]


def test_devices_are_released_on_every_path(tmp_path: Path) -> None:
    be = backend(tmp_path, gpus="1xH100-80GB")
    for name, code in (("ok", "pass"), ("bad", "raise SystemExit(1)")):
        be.start([run(name, pods([0]), code)])
        with pytest.raises(BackendError, match="already fully allocated"):
            be.start([run("other", pods([0]), "pass")])
        finished(be, name)
        be.forget([name])
    be.start([run("stopped", pods([0]), "import time; time.sleep(30)")])
    be.stop(["stopped"])
    be.start([run("next", pods([0]), "pass")])  # the device is free at once after a stop
    assert finished(be, "next").outcome == "Succeeded"


def test_a_failing_command_is_retried_with_backoff_then_fails(tmp_path: Path) -> None:
    be = backend(tmp_path, gpus="1xH100-80GB")
    with app_with(be, tmp_path / "svc") as (c, h):
        m = workload("flaky", "raise SystemExit(4)", maxRetries=1)
        m["metadata"]["annotations"] = {"gpupool.io/retry-backoff": "0.3s"}
        c.post("/v1/workloads", json=m, headers=h)
        w = phase(c, h, "flaky", "Failed", timeout=15)
        assert be.starts["flaky"] == 2 and w["reason"].startswith("RetriesExhausted")
        assert [f["exitCode"] for f in w["failures"]] == [4, 4]
        assert w["failures"][0]["retryAt"] is not None and w["failures"][1]["retryAt"] is None


def test_a_host_without_gpus_serves_cpu_only_work(tmp_path: Path) -> None:
    be = LocalBackend(tmp_path / "state", [], node=NODE, grace_s=0.5)
    assert be.cluster_manifest()["spec"]["nodes"][0]["gpu"]["count"] == 0
    with app_with(be, tmp_path / "svc") as (c, h):
        c.post("/v1/workloads", json=workload("cpu", "print('no gpu needed')", gpus=0), headers=h)
        phase(c, h, "cpu", "Succeeded")
        assert "no gpu needed" in c.get("/v1/workloads/cpu/logs", headers=h).text


def test_make_backend_builds_the_local_backend_from_the_service_options(tmp_path: Path) -> None:
    from gpupool.composition import make_backend

    opts = {"time_scale": 60.0, "failure_rates": {}, "node_mtbf_s": None, "node_repair_s": 7200.0}
    be = make_backend("local", state_file=tmp_path / "virtual-cluster.json", **opts)
    assert isinstance(be, LocalBackend) and be.state_dir == tmp_path
    assert be.health().detail["backend"] == "local"


def test_the_virtual_backend_answers_logs_with_its_synthetic_line(tmp_path: Path) -> None:
    from tests.test_service_support import running_app, wl

    with running_app(tmp_path) as api:
        assert api.req("POST", "/v1/workloads", json=wl("v", duration="100h")).status_code in (200, 201)
        api.wait_phase("v", "Running")
        r = api.req("GET", "/v1/workloads/v/logs")
        assert r.status_code == 200 and r.text.startswith("[virtual cluster] v attempt 1: started")
        assert api.req("GET", "/v1/workloads/nobody/logs").status_code == 404


def test_a_stop_in_progress_is_finished_by_the_next_backend_after_a_restart(tmp_path: Path) -> None:
    be = backend(tmp_path, grace_s=0.3)
    code = "import signal, time\nsignal.signal(signal.SIGTERM, lambda *a: None)\nwhile True: time.sleep(0.05)"
    be.start([run("stubborn", pods([0]), code)])
    pid = pod_pids(be, "stubborn")[0]
    time.sleep(0.3)  # let the command install its SIGTERM handler
    be.stop(["stubborn"])
    nxt = backend(tmp_path, grace_s=0.3)  # the controller died during the grace period
    assert nxt.next_finish() is not None  # it wakes the controller for the SIGKILL
    wait_for(lambda: not nxt.poll(time.time()) and not nxt._stopping, 10, "the SIGKILL")
    wait_for(lambda: not proc.alive(pid, proc.start_ticks(pid)), 5, "the pod gone")
