"""``gpupool bench submit``: durable submits per second and submit latency (p50/p99).

Why measured this way: a submit is acknowledged only after its row, event and audit record are
committed, so the figure is the durable rate. Submits go through the real API (FastAPI app,
authentication, validation, store, audit) in-process over httpx's ASGI transport, with the
controller running, by ``--concurrency`` clients. The baseline, measured in the same run on the
same database, is a bare SQLAlchemy INSERT loop (one row per transaction): it shows what the
database alone allows, so the ratio shows the cost of everything else.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import typer

from gpupool.service.config import ServiceConfig


def _pct(xs: list[float], p: float) -> float:
    if not xs:
        return 0.0
    s = sorted(xs)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


def _manifest(i: int, run: str) -> dict[str, Any]:
    return {
        "apiVersion": "gpupool.io/v1alpha1",
        "kind": "Workload",
        "metadata": {"name": f"bench-{run}-{i}"},
        "spec": {
            "queue": "llm-research",
            "priorityClass": "experiment",
            "duration": "1h",
            "podGroups": [{"resources": {"nvidia.com/gpu": 1, "cpu": 4, "memory": "32Gi"}}],
        },
    }


def baseline_insert(url: str, n: int) -> dict[str, float]:
    """One INSERT per transaction into a scratch table, same database and settings."""
    import sqlalchemy as sa

    from gpupool.store import Store

    st = Store.open(url)
    table = f"bench_baseline_{uuid.uuid4().hex[:8]}"
    md = sa.MetaData()
    t = sa.Table(table, md, sa.Column("id", sa.Integer, primary_key=True), sa.Column("body", sa.JSON))
    md.create_all(st.engine)
    lat = []
    body = _manifest(0, "x")
    try:
        t0 = time.perf_counter()
        for _ in range(n):
            a = time.perf_counter()
            with st.engine.begin() as c:
                c.execute(t.insert().values(body=body))
            lat.append(time.perf_counter() - a)
        wall = time.perf_counter() - t0
    finally:
        md.drop_all(st.engine)
        st.close()
    return {"n": n, "per_s": n / wall, "p50_ms": _pct(lat, 50) * 1e3, "p99_ms": _pct(lat, 99) * 1e3}


class AsgiClient:
    """The smallest possible in-process HTTP client: one ASGI call per request.

    Why not httpx's ASGI transport: on a small machine the client's own request building and
    parsing costs as much CPU as the server; this measures the server (routing, auth, body
    parsing and validation, group commit, response) rather than the client library.
    """

    def __init__(self, app: Any, token: str) -> None:
        self.app = app
        self.headers = [
            (b"authorization", f"Bearer {token}".encode()),
            (b"content-type", b"application/json"),
        ]

    async def post(self, path: str, body: dict[str, Any]) -> tuple[int, bytes]:
        data = json.dumps(body).encode()
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": [*self.headers, (b"content-length", str(len(data)).encode())],
            "client": ("127.0.0.1", 1),
            "server": ("bench", 80),
        }
        sent = False
        status = 0
        chunks: list[bytes] = []

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": data, "more_body": False}
            await asyncio.sleep(3600)
            return {"type": "http.disconnect"}

        async def send(msg: dict[str, Any]) -> None:
            nonlocal status
            if msg["type"] == "http.response.start":
                status = msg["status"]
            elif msg["type"] == "http.response.body":
                chunks.append(msg.get("body", b""))

        await self.app(scope, receive, send)
        return status, b"".join(chunks)


async def _api_run(url: str, n: int, concurrency: int, state_dir: Path) -> dict[str, float]:
    from gpupool.service.api import create_app

    cfg = ServiceConfig(state_dir=state_dir, database_url=url, time_scale=1.0, write_token_file=False)
    app = create_app(cfg)
    async with app.router.lifespan_context(app):
        svc = app.state.svc
        tok = svc.bootstrap_token
        if tok is None:
            tok = svc.store.create_token("bench", "platform-admin").token
        run = uuid.uuid4().hex[:6]
        backlog = len(svc.store.pending_reasons())
        lat: list[float] = []
        errors = 0
        client = AsgiClient(app, tok)
        for i in range(20):  # warm up: first requests compile queries and fill caches
            await client.post("/v1/workloads", _manifest(i, run + "w"))
        counter = iter(range(n))

        async def worker() -> None:
            nonlocal errors
            for i in counter:
                a = time.perf_counter()
                status, _ = await client.post("/v1/workloads", _manifest(i, run))
                lat.append(time.perf_counter() - a)
                if status != 201:
                    errors += 1

        t0, c0 = time.perf_counter(), time.process_time()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        batches = svc.batcher.batches
        # leave the database as we found it: the bench's workloads would otherwise stay Pending
        # (the example cluster cannot run them all) and every later run would measure a larger
        # backlog, which the controller's cycles pay for (see docs/service.md)
        mine = [f"bench-{run}-{i}" for i in range(n)] + [f"bench-{run}w-{i}" for i in range(20)]
        await asyncio.to_thread(svc.controller.cancel_many, mine, "bench")
        return {
            "n": n,
            "per_s": n / wall,
            "p50_ms": _pct(lat, 50) * 1e3,
            "p99_ms": _pct(lat, 99) * 1e3,
            "mean_ms": statistics.fmean(lat) * 1e3 if lat else 0.0,
            "errors": errors,
            "commits": batches,
            "pending_backlog": backlog,
            # CPU of this process (client, API, controller, SQLite) per submit: on a busy machine
            # wall-clock figures understate what a dedicated core does; 1000 / cpu_ms_per_submit is
            # the rate one free core sustains (PostgreSQL's own CPU is not included)
            "cpu_ms_per_submit": cpu / n * 1e3,
            "cpu_bound_per_s": n / cpu if cpu else 0.0,
        }


def run_bench(url: str | None, n: int, concurrency: int) -> dict[str, Any]:
    """Baseline and API figures for one database (a temporary SQLite file when url is None)."""
    tmp = Path(tempfile.mkdtemp(prefix="gpupool-bench-"))
    try:
        db = url or f"sqlite:///{tmp / 'bench.db'}"
        base = baseline_insert(db, n)
        api = asyncio.run(_api_run(db, n, concurrency, tmp))
        return {
            "database": db.split("://")[0] + "://" + db.split("@")[-1].split("://")[-1],
            "mode": "in-process API (FastAPI app called over ASGI), controller running",
            "concurrency": concurrency,
            "baseline_raw_insert": base,
            "api_submit": api,
            "target": {"per_s": 1000, "p99_ms": 50},
            "load_average_1m": os.getloadavg()[0],
            "cpus": os.cpu_count(),
            "meets_target": api["per_s"] >= 1000 and api["p99_ms"] < 50 and api["errors"] == 0,
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def bench_submit_command(
    database_url: list[str] = typer.Option(
        [], "--database-url", help="repeat for several databases (default: a temporary SQLite file)"
    ),
    n: int = typer.Option(2000, "-n", help="submits per database"),
    concurrency: int = typer.Option(16, "--concurrency", "-c", help="concurrent clients"),
    output: str = typer.Option("table", "-o", "--output", help="table or json"),
) -> None:
    """Durable submits/s and p50/p99 latency through the API, against a raw INSERT baseline."""
    results = []
    urls: list[str | None] = list(database_url) or [None]
    for url in urls:
        try:
            results.append(run_bench(url, n, concurrency))
        except Exception as exc:  # an unreachable database: one line
            sys.stderr.write(
                f"error: {url}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}\n"
            )
            raise typer.Exit(2) from None
    if output == "json":
        sys.stdout.write(json.dumps(results, indent=2) + "\n")
        return
    for r in results:
        b, a = r["baseline_raw_insert"], r["api_submit"]
        sys.stdout.write(
            f"{r['database']} ({r['mode']}, {r['concurrency']} clients)\n"
            f"  baseline raw INSERT : {b['per_s']:8.0f}/s  p50 {b['p50_ms']:.2f} ms  p99 {b['p99_ms']:.2f} ms\n"
            f"  API durable submit  : {a['per_s']:8.0f}/s  p50 {a['p50_ms']:.2f} ms  p99 {a['p99_ms']:.2f} ms"
            f"  errors {a['errors']}, {a['commits']} commits; {a['pending_backlog']} pending before the run\n"
            f"  CPU per submit      : {a['cpu_ms_per_submit']:.2f} ms (one free core: {a['cpu_bound_per_s']:.0f}/s);"
            f" load average {r['load_average_1m']:.1f} on {r['cpus']} CPUs\n"
            f"  target >= 1000/s, p99 < 50 ms: {'met' if r['meets_target'] else 'NOT met'}\n"
        )
