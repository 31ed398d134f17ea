"""``gpupool bench burst``: submit latency of a real server while its scheduling cycles run.

Why a separate process and a raw client: the figure users feel is a submit answered by a real
``gpupool serve`` (uvicorn, the controller cycling over a growing backlog in the same process),
not an in-process call. The load comes from many keep-alive connections driven by one asyncio
loop writing HTTP/1.1 by hand, so the client costs little CPU next to the server on a small
machine. The baseline, run in the same invocation against the same server, is the same burst of
``GET /healthz``: what the HTTP stack alone costs at that concurrency.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import typer

from gpupool.bench.submit import _manifest as submit_manifest


def _pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))] if s else 0.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _manifest(i: int, run: str) -> bytes:
    """The submit benchmark's workload, as a request body (same shape: one comparable figure)."""
    return json.dumps(submit_manifest(i, f"burst-{run}")).encode()


class _Conn:
    """One keep-alive HTTP/1.1 connection; requests written and responses read by hand."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, token: str) -> None:
        self.r, self.w = reader, writer
        self.auth = f"Authorization: Bearer {token}\r\n".encode()

    async def call(self, method: str, path: str, body: bytes = b"") -> int:
        head = f"{method} {path} HTTP/1.1\r\nHost: bench\r\n".encode() + self.auth
        if body:
            head += b"Content-Type: application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n"
        self.w.write(head + b"\r\n" + body)
        status_line = await self.r.readline()
        length = 0
        while True:
            line = await self.r.readline()
            if line in (b"\r\n", b""):
                break
            k, _, v = line.partition(b":")
            if k.lower() == b"content-length":
                length = int(v)
        if length:
            await self.r.readexactly(length)
        return int(status_line.split()[1])


async def _burst(port: int, token: str, n: int, clients: int, make: Any) -> dict[str, float]:
    conns = []
    for _ in range(clients):
        r, w = await asyncio.open_connection("127.0.0.1", port)
        conns.append(_Conn(r, w, token))
    lat: list[float] = []
    errors = 0
    todo = iter(range(n))

    async def client(c: _Conn) -> None:
        nonlocal errors
        for i in todo:
            method, path, body, ok = make(i)
            t = time.perf_counter()
            status = await c.call(method, path, body)
            lat.append(time.perf_counter() - t)
            errors += status != ok

    t0 = time.perf_counter()
    await asyncio.gather(*(client(c) for c in conns))
    wall = time.perf_counter() - t0
    for c in conns:
        c.w.close()
    return {
        "n": n,
        "per_s": n / wall,
        "p50_ms": _pct(lat, 50) * 1e3,
        "p99_ms": _pct(lat, 99) * 1e3,
        "max_ms": max(lat) * 1e3,
        "errors": errors,
    }


def _cycles(base: str, token: str) -> tuple[float, float]:
    text = httpx.get(base + "/metrics", headers={"Authorization": f"Bearer {token}"}).text
    count = total = 0.0
    for line in text.splitlines():
        if line.startswith("gpupool_scheduling_cycle_seconds_count"):
            count = float(line.split()[-1])
        elif line.startswith("gpupool_scheduling_cycle_seconds_sum"):
            total = float(line.split()[-1])
    return count, total


def _start_server(state: Path, port: int, extra: list[str]) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-c", "from gpupool.cli import main; main()", "serve", "--state-dir", str(state)]
    cmd += ["--port", str(port), "--time-scale", "60", *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    end = time.monotonic() + 60
    while time.monotonic() < end:
        try:
            if httpx.get(base + "/readyz", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("the server did not become ready within 60 s")


def run_burst(n: int, clients: int, extra: list[str], backlog: int = 0) -> dict[str, Any]:
    """Baseline (GET /healthz) and submit bursts against one fresh server, after ``backlog``
    submits that stay pending (so every cycle of the measured burst decides over them too)."""
    state = Path(tempfile.mkdtemp(prefix="gpupool-burst-"))
    port = _free_port()
    proc = _start_server(state, port, extra)
    try:
        token = (state / "admin-token").read_text().strip()
        base = f"http://127.0.0.1:{port}"
        run = os.urandom(3).hex()
        if backlog:
            asyncio.run(
                _burst(
                    port,
                    token,
                    backlog,
                    clients,
                    lambda i: ("POST", "/v1/workloads", _manifest(i, "b" + run), 201),
                )
            )
        health = asyncio.run(_burst(port, token, n, clients, lambda i: ("GET", "/healthz", b"", 200)))
        c0, s0 = _cycles(base, token)
        submit = asyncio.run(
            _burst(port, token, n, clients, lambda i: ("POST", "/v1/workloads", _manifest(i, run), 201))
        )
        c1, s1 = _cycles(base, token)
        return {
            "clients": clients,
            "backlog": backlog,
            "baseline_healthz": health,
            "submit": submit,
            "cycles_during_burst": c1 - c0,
            "cycle_seconds_during_burst": s1 - s0,
            "load_average_1m": os.getloadavg()[0],
            "target": {"p99_ms": 100},
            "meets_target": submit["p99_ms"] < 100 and submit["errors"] == 0,
        }
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(state, ignore_errors=True)


def bench_burst_command(
    n: int = typer.Option(2000, "-n", help="requests per burst"),
    clients: int = typer.Option(32, "--clients", "-c", help="concurrent keep-alive connections"),
    backlog: int = typer.Option(0, "--backlog", help="submits made (unmeasured) before the bursts"),
    server_arg: list[str] = typer.Option(
        [], "--server-arg", help="extra argument for gpupool serve (repeat)"
    ),
    output: str = typer.Option("table", "-o", "--output", help="table or json"),
) -> None:
    """Submit p50/p99 of a real server under a burst, against a GET /healthz burst baseline."""
    r = run_burst(n, clients, server_arg, backlog)
    if output == "json":
        sys.stdout.write(json.dumps(r, indent=2) + "\n")
        return
    h, s = r["baseline_healthz"], r["submit"]
    sys.stdout.write(
        f"real gpupool serve, {r['clients']} keep-alive clients, {s['n']} requests per burst,"
        f" {r['backlog']} pending before\n"
        f"  baseline GET /healthz : {h['per_s']:7.0f}/s  p50 {h['p50_ms']:6.1f} ms  p99 {h['p99_ms']:6.1f} ms"
        f"  max {h['max_ms']:6.0f} ms\n"
        f"  POST /v1/workloads    : {s['per_s']:7.0f}/s  p50 {s['p50_ms']:6.1f} ms  p99 {s['p99_ms']:6.1f} ms"
        f"  max {s['max_ms']:6.0f} ms  errors {s['errors']}\n"
        f"  scheduling cycles during the burst: {r['cycles_during_burst']:.0f}"
        f" ({r['cycle_seconds_during_burst']:.2f} s); load average {r['load_average_1m']:.1f}\n"
        f"  target p99 < 100 ms: {'met' if r['meets_target'] else 'NOT met'}\n"
    )


__all__ = ["bench_burst_command", "run_burst"]
