"""What one bind costs the fake server itself: ``python -m gpupool.kube.fake.selfbench``.

Why a separate measurement from ``gpupool bench kube``: that benchmark's binds/s are bounded by
whichever process is slowest. This one binds pods from a plain HTTP client (what a scheduler
would send: the node lock patch, the binding) and reports the CPU seconds the server's thread
spent per bind, including its kubelet, HAMi stand-in and watch traffic. That is the figure to
compare with a 2 ms per bind budget (500 binds/s on one core).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import threading
import time

import httpx

from gpupool.kube.fake.server import FakeApiServer


def thread_cpu_s(native_id: int) -> float:
    """User + system CPU seconds of one thread of this process (Linux ``/proc``)."""
    with open(f"/proc/self/task/{native_id}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _bind_all(url: str, pods: int, devices: dict[str, list[str]], concurrency: int) -> None:
    names = sorted(devices)
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=url, limits=httpx.Limits(max_connections=concurrency)) as c:

        async def one(i: int) -> None:
            # consecutive pods on different nodes: concurrent binds never contend for a node lock
            node = names[i % len(names)]
            dev = devices[node][i // len(names)]
            ann = {"hami.io/vgpu-devices-to-allocate": f"{dev},NVIDIA,81559,100:;"}
            lock = {"metadata": {"annotations": {"hami.io/mutex.lock": f"2026-01-01T00:00:00Z,default,p{i}"}}}
            async with sem:
                await c.patch(
                    f"/api/v1/nodes/{node}",
                    json=lock,
                    headers={"content-type": "application/merge-patch+json"},
                )
                body = {
                    "metadata": {"name": f"p{i}", "annotations": ann},
                    "target": {"kind": "Node", "name": node},
                }
                r = await c.post(f"/api/v1/namespaces/default/pods/p{i}/binding", json=body)
                r.raise_for_status()

        await asyncio.gather(*(one(i) for i in range(pods)))


def _watch(url: str, rv: int) -> None:
    """Read a pod watch as a scheduler would, so the server pays for encoding and sending it."""
    params = {"watch": "1", "resourceVersion": str(rv), "timeoutSeconds": "600"}
    try:
        with (
            httpx.Client(base_url=url, timeout=None) as c,
            c.stream("GET", "/api/v1/pods", params=params) as r,
        ):
            for _ in r.iter_lines():
                pass
    except httpx.HTTPError:
        pass  # the server stopped


def run(nodes: int, pods: int, concurrency: int, watchers: int) -> dict[str, float]:
    """Bind ``pods`` one-GPU pods over HTTP; the server's CPU per bind and the wall-clock rate."""
    srv = FakeApiServer()
    srv.add_gpu_nodes(nodes)
    for i in range(pods):
        srv.create(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"p{i}", "namespace": "default"},
                "spec": {
                    "schedulerName": "gpupool",
                    "containers": [
                        {"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
                    ],
                },
            }
        )
    url = srv.start()
    try:
        devices = {
            n["metadata"]["name"]: [
                d["id"] for d in json.loads(n["metadata"]["annotations"]["hami.io/node-nvidia-register"])
            ]
            for n in srv.list("nodes")
        }
        srv.wait_for(srv.runtime.idle, 60, "the simulators to settle")
        for _ in range(watchers):
            threading.Thread(target=_watch, args=(url, srv.store.rv), daemon=True).start()
        srv.wait_for(lambda: srv.store.watch_count() == watchers, 30, "the watches to open")
        cpu0, t0 = thread_cpu_s(srv.thread_native_id), time.monotonic()
        asyncio.run(_bind_all(url, pods, devices, concurrency))
        srv.wait_for(
            lambda: (
                srv.runtime.idle()
                and sum(1 for p in srv.store.objects["pods"].values() if p["status"]["phase"] == "Running")
                == pods
            ),
            120,
            "every pod running",
        )
        wall, cpu = time.monotonic() - t0, thread_cpu_s(srv.thread_native_id) - cpu0
        return {
            "binds": pods,
            "wall_s": round(wall, 2),
            "binds_per_s_wall": round(pods / wall, 1),
            "server_cpu_ms_per_bind": round(1000 * cpu / pods, 3),
            "server_binds_per_cpu_s": round(pods / cpu, 1) if cpu else 0.0,
            "violations": len(srv.stats.violations),
            "load_average_1m": round(os.getloadavg()[0], 2),
        }
    finally:
        srv.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--pods", type=int, default=4000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument(
        "--watchers", type=int, default=1, help="pod watches open during the run (a scheduler has one)"
    )
    a = ap.parse_args()
    if a.pods > a.nodes * 8:
        ap.error("--pods: at most 8 per node")
    print(json.dumps(run(a.nodes, a.pods, a.concurrency, a.watchers)))


if __name__ == "__main__":
    main()
