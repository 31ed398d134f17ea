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
import itertools
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
        "p95_ms": _pct(lat, 95) * 1e3,
        "p99_ms": _pct(lat, 99) * 1e3,
        "max_ms": max(lat) * 1e3,
        "errors": errors,
    }


def _proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) the server process used so far: read from /proc, because the
    figure that explains a latency on a loaded machine is the server's own CPU, not the host's."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _measured(pid: int, fn: Any) -> dict[str, Any]:
    """Run one burst and add the server's and the client's CPU per request and the load average
    at start and end beside its latencies (a latency alone means nothing on a shared machine)."""
    load0, srv0, cli0 = os.getloadavg()[0], _proc_cpu(pid), time.process_time()
    r: dict[str, Any] = fn()
    srv, cli = _proc_cpu(pid) - srv0, time.process_time() - cli0
    r["server_cpu_ms_per_request"] = srv / r["n"] * 1e3
    r["client_cpu_ms_per_request"] = cli / r["n"] * 1e3
    r["load_average_start"], r["load_average_end"] = load0, os.getloadavg()[0]
    return r


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


def _database(extra: list[str]) -> str:
    """The database the server ran on, without its credentials."""
    url = next((b for a, b in itertools.pairwise(extra) if a == "--database-url"), "sqlite (state dir)")
    return url.split("://")[0] + "://" + url.split("@")[-1].split("://")[-1] if "://" in url else url


def _token(state: Path, extra: list[str]) -> str:
    """The server's bootstrap token, or, on a database that already had tokens (a second run on
    one PostgreSQL database: no bootstrap token is written then), a platform-admin token issued
    for this run."""
    path = state / "admin-token"
    if path.is_file():
        return path.read_text().strip()
    from gpupool.store import Store

    url = next(b for a, b in itertools.pairwise(extra) if a == "--database-url")
    st = Store.open(url)
    try:
        return st.create_token(f"bench-burst-{os.urandom(3).hex()}", "platform-admin").token
    finally:
        st.close()


def run_burst(n: int, clients: int, extra: list[str], backlog: int = 0) -> dict[str, Any]:
    """Baseline (GET /healthz) and submit bursts against one fresh server, after ``backlog``
    submits that stay pending (so every cycle of the measured burst decides over them too)."""
    state = Path(tempfile.mkdtemp(prefix="gpupool-burst-"))
    port = _free_port()
    proc = _start_server(state, port, extra)
    try:
        token = _token(state, extra)
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
        health = _measured(
            proc.pid,
            lambda: asyncio.run(_burst(port, token, n, clients, lambda i: ("GET", "/healthz", b"", 200))),
        )
        c0, s0 = _cycles(base, token)
        submit = _measured(
            proc.pid,
            lambda: asyncio.run(
                _burst(port, token, n, clients, lambda i: ("POST", "/v1/workloads", _manifest(i, run), 201))
            ),
        )
        c1, s1 = _cycles(base, token)
        return {
            "database": _database(extra),
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
    database_url: list[str] = typer.Option(
        [], "--database-url", help="run once per database (repeat; default: SQLite in the state dir)"
    ),
    output: str = typer.Option("table", "-o", "--output", help="table or json"),
) -> None:
    """Submit p50/p99 of a real server under a burst, against a GET /healthz burst baseline."""
    urls: list[str | None] = list(database_url) or [None]
    results = [
        run_burst(n, clients, [*server_arg, *(["--database-url", u] if u else [])], backlog) for u in urls
    ]
    if output == "json":
        sys.stdout.write(json.dumps(results if database_url else results[0], indent=2) + "\n")
        return
    for r in results:
        sys.stdout.write(format_burst(r))


def _line(name: str, b: dict[str, Any]) -> str:
    return (
        f"  {name:<21} : {b['per_s']:7.0f}/s  p50 {b['p50_ms']:6.1f}  p95 {b['p95_ms']:6.1f}"
        f"  p99 {b['p99_ms']:6.1f}  max {b['max_ms']:6.0f} ms  errors {b['errors']}\n"
        f"  {'':<21}   CPU per request: server {b['server_cpu_ms_per_request']:.2f} ms,"
        f" client {b['client_cpu_ms_per_request']:.2f} ms; load average"
        f" {b['load_average_start']:.1f} -> {b['load_average_end']:.1f}\n"
    )


def format_burst(r: dict[str, Any]) -> str:
    """The table form: latencies with the CPU they cost and the load they were taken under."""
    return (
        f"real gpupool serve on {r['database']}, {r['clients']} keep-alive clients,"
        f" {r['submit']['n']} requests per burst, {r['backlog']} pending before\n"
        + _line("baseline GET /healthz", r["baseline_healthz"])
        + _line("POST /v1/workloads", r["submit"])
        + f"  scheduling cycles during the burst: {r['cycles_during_burst']:.0f}"
        f" ({r['cycle_seconds_during_burst']:.2f} s); {os.cpu_count()} CPUs\n"
        f"  target p99 < 100 ms: {'met' if r['meets_target'] else 'NOT met'}\n"
    )


__all__ = ["bench_burst_command", "format_burst", "run_burst"]
