"""One ``POST /v1/apply`` of N workloads or N queues against a real ``gpupool serve`` (issue 30).

Why a real server: the figure that mattered was a whole request, with the controller cycling
and the lease keeper renewing beside it. Prints the wall time, the server's CPU seconds over
the request (all its threads, from /proc) and the load average, and counts the lines in the
server's log that said the write went wrong ("database is locked", "stepped down").

    .venv/bin/python bench/bulk_apply.py 10000 workloads [--pg]     # or: 10000 queues
    (--pg: GPUPOOL_TEST_PG_URL, a fresh schema dropped afterwards)
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.test_service_support import Server, wl


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _items(n: int, kind: str) -> list[dict[str, Any]]:
    if kind == "workloads":
        return [wl(f"bulk-{i}") for i in range(n)]
    return [
        {
            "apiVersion": "gpupool.io/v1alpha1",
            "kind": "Queue",
            "metadata": {"name": f"bulk-q{i}"},
            "spec": {"parent": "llm-team"},
        }
        for i in range(n)
    ]


def run(n: int, kind: str, url: str | None) -> None:
    server = Server(Path(tempfile.mkdtemp(prefix="bulk-apply-")), url=url)
    server.start(120)
    assert server.proc is not None
    try:
        items = _items(n, kind)
        cpu0, t0 = _cpu_s(server.proc.pid), time.monotonic()
        with server.client() as c:
            c.timeout = 900
            r = c.post("/v1/apply", json={"items": items})
        wall, cpu = time.monotonic() - t0, _cpu_s(server.proc.pid) - cpu0
        print(
            f"{n:,} {kind} in one apply on {'postgresql' if url else 'sqlite'}: HTTP {r.status_code}, "
            f"{wall:.1f} s wall, {cpu:.1f} s server CPU, load {os.getloadavg()[0]:.1f}"
        )
        if r.status_code >= 300:
            print(r.text[:500])
        log = server.log.read_text()
        print({w: log.count(w) for w in ("database is locked", "stepped down", "Traceback")})
    finally:
        server.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("n", type=int)
    ap.add_argument("kind", choices=["workloads", "queues"])
    ap.add_argument("--pg", action="store_true", help="PostgreSQL at GPUPOOL_TEST_PG_URL")
    args = ap.parse_args()
    if not args.pg:
        run(args.n, args.kind, None)
        return
    from tests import pg

    with pg.fresh_schema_url() as url:
        run(args.n, args.kind, url)


if __name__ == "__main__":
    main()
