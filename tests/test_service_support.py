"""Shared helpers for the service tests (imported by them; holds no tests itself).

Why a module and not a conftest: the test files of other engineers share this directory, and
fixtures here are only for the service tests that import them.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from gpupool.manifests.convert import workload_model
from gpupool.service.api import create_app
from gpupool.service.backends.virtual import VirtualBackend
from gpupool.service.config import EXAMPLES, ServiceConfig, seed_config
from gpupool.service.controller import Controller
from gpupool.store import Store
from tests import pg

API = "gpupool.io/v1alpha1"
REPO = Path(__file__).resolve().parents[1]


def wl(
    name: str, queue: str = "llm-research", gpus: Any = 1, duration: str | None = None, **spec: Any
) -> dict[str, Any]:
    """A small Workload manifest."""
    s: dict[str, Any] = {
        "queue": queue,
        "priorityClass": "experiment",
        "podGroups": [{"resources": {"nvidia.com/gpu": gpus, "cpu": 2, "memory": "8Gi"}}],
    }
    if duration is not None:
        s["duration"] = duration
    s.update(spec)
    return {"apiVersion": API, "kind": "Workload", "metadata": {"name": name}, "spec": s}


def wait_for(fn: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    """Poll ``fn`` until it returns something truthy."""
    end = time.monotonic() + timeout
    while True:
        v = fn()
        if v:
            return v
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def in_process_controller(url: str, state: Path) -> tuple[Store, Controller, VirtualBackend]:
    """A store on ``url`` seeded with the example cluster, and a controller driving the virtual
    cluster kept in ``state`` (not started: tests call ``recover`` and ``cycle`` themselves)."""
    store = Store.open(url)
    seed_config(store, EXAMPLES / "cluster")
    be = VirtualBackend(state / "vc.json", time_scale=1.0)
    return store, Controller(store, be, tick_s=0.05, min_interval_s=0.0), be


def submit_to(store: Store, ctl: Controller, name: str, **kw: Any) -> None:
    """Commit a workload and hand it to the controller, as the API's submit does."""
    m = wl(name, **kw)
    rec, _ = store.submit_workload(m, owner="t")
    ctl.submitted(rec, workload_model(m, ctl.bundle.priority_classes, 0.0))


class Api:
    """TestClient with a token, plus helpers."""

    def __init__(self, client: TestClient, token: str | None) -> None:
        self.c = client
        self.token = token

    def h(self, token: str | None = None) -> dict[str, str]:
        t = token if token is not None else self.token
        return {"Authorization": f"Bearer {t}"} if t else {}

    def req(self, method: str, path: str, token: str | None = None, **kw: Any) -> Any:
        """The response (httpx's or, under a newer Starlette test client, httpx2's: same API)."""
        return self.c.request(method, path, headers=self.h(token), **kw)

    def get(self, path: str, **kw: Any) -> Any:
        r = self.req("GET", path, **kw)
        assert r.status_code == 200, r.text
        return r.json()

    def phase(self, name: str) -> str:
        return str(self.get(f"/v1/workloads/{name}")["phase"])

    def wait_phase(self, name: str, *phases: str, timeout: float = 10.0) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            w: dict[str, Any] = self.get(f"/v1/workloads/{name}")
            return w if w["phase"] in phases else None

        return wait_for(probe, timeout, f"{name} in {phases}")

    def token_for(self, name: str, role: str, scope: str | None = None) -> str:
        r = self.req("POST", "/v1/tokens", json={"name": name, "role": role, "scope": scope})
        assert r.status_code == 201, r.text
        return str(r.json()["token"])


@contextlib.contextmanager
def running_app(state_dir: Path, url: str | None = None, **cfg: Any) -> Iterator[Api]:
    """The app in-process with its controller, on SQLite under ``state_dir`` (or ``url``)."""
    opts: dict[str, Any] = {"time_scale": 3600.0, "tick_s": 0.05, "min_interval_s": 0.0}
    opts.update(cfg)
    config = ServiceConfig(state_dir=state_dir, database_url=url, **opts)
    app = create_app(config)
    with TestClient(app, raise_server_exceptions=False) as c:
        token = app.state.svc.bootstrap_token or (state_dir / "admin-token").read_text().strip()
        yield Api(c, token)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/gpupool.db"
    else:
        with pg.fresh_schema_url() as u:
            yield u


# ---------------------------------------------------------------------- real server processes
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """``gpupool serve`` as a child process on a free port (killable with SIGKILL)."""

    def __init__(
        self, state_dir: Path, time_scale: float = 60.0, url: str | None = None, args: Sequence[str] = ()
    ) -> None:
        self.state_dir = state_dir
        self.args = list(args)  # more ``gpupool serve`` options
        self.time_scale = time_scale
        self.db = url
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = state_dir / "server.log"
        self.scheme = "http"  # "https" for a server started with --tls-cert (tests/service/test_tls.py)
        self.verify: Any = True  # httpx's verify= for it: an ssl.SSLContext trusting the test's CA

    @property
    def base(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def start(self, timeout: float = 180.0) -> None:
        """Start and wait for ``/readyz``. The deadline is generous because a loaded 2-core
        machine took 14 s to start one server; one that never becomes ready is stopped, not
        left running for the rest of the session."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable,
            "-c",
            "from gpupool.cli import main; main()",
            "serve",
            "--port",
            str(self.port),
            "--state-dir",
            str(self.state_dir),
            "--config",
            str(EXAMPLES / "cluster"),
            "--time-scale",
            str(self.time_scale),
            "--tick",
            "0.05",
        ]
        if self.db:
            cmd += ["--database-url", self.db]
        cmd += self.args
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        with open(self.log, "ab") as logf:
            self.proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env, cwd=str(REPO))
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited: {self.log.read_text()[-2000:]}")
            try:
                if httpx.get(self.base + "/readyz", timeout=1.0, verify=self.verify).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        self.stop()
        raise AssertionError(
            f"server did not become ready in {timeout:.0f} s: {self.log.read_text()[-2000:]}"
        )

    def kill9(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
            self.proc = None

    @property
    def token(self) -> str:
        return (self.state_dir / "admin-token").read_text().strip()

    def client(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.base,
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=60.0,  # a report page took over 10 s on a loaded 2-core machine
            verify=self.verify,
        )


def device_overcommit(placements: list[dict[str, Any]]) -> list[str]:
    """Devices whose shares add up to more than one GPU across the given placements."""
    use: dict[tuple[str, int], int] = defaultdict(int)
    for p in placements:
        for pod in p.get("pods", ()):
            for d in pod.get("devices", ()):
                use[(pod["node"], d)] += int(pod.get("gpuMilli", 1000))
    return [f"{n}/{d}: {m}" for (n, d), m in use.items() if m > 1000]


def backend_state(state_dir: Path) -> dict[str, Any]:
    f = state_dir / "virtual-cluster.json"
    return json.loads(f.read_text()) if f.exists() else {"runs": {}, "starts": {}, "violations": []}
