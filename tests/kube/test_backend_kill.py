"""kill -9 of the binding process in the middle of a gang: the next backend finishes the gang as
decided, binds no pod twice and double-books no device (the fake HAMi plugin's ledger)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from gpupool.kube.fake import FakeApiServer
from gpupool.kube.fake.faults import FaultConfig
from gpupool.service.backends import RunSpec
from tests.kube.test_backend import NODE0, NODE1, Cluster, bound, job, pods_of, wait_for

REPO = Path(__file__).resolve().parents[2]

CHILD = """
import json, sys, time
from gpupool.kube.adapters.backend import connect
from gpupool.service.backends import RunSpec
kubeconfig, name, placement = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
be = connect(kubeconfig, backoff_s=(0.02, 0.2))
while be.tracker.top_by_name(name) is None:
    time.sleep(0.02)
be.start([RunSpec(name, placement)])
print("started", flush=True)
time.sleep(600)
"""


def test_kill9_in_the_middle_of_a_gang(fake_server: FakeApiServer) -> None:
    srv = fake_server
    srv.add_gpu_nodes(2, gpus=8, hami=True)
    srv.create(job("big", pods=8, run_s=10_000))
    name = "default.job.big"
    slots = [("main", i, NODE0 if i < 4 else NODE1, [i % 4]) for i in range(8)]
    pl = {
        "pool": "p",
        "admittedAt": time.time(),
        "pods": [
            {"group": g, "index": i, "node": n, "devices": d, "gpuMilli": 1000, "gpuMemoryMiB": 81559}
            for g, i, n, d in slots
        ],
    }
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(srv.kubeconfig), name, json.dumps(pl)],
        stdout=subprocess.PIPE,
        env=env,
        cwd=REPO,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == b"started"
        srv.faults = FaultConfig(latency_s=0.1)  # slow every request: the gang takes seconds
        wait_for(lambda: len(bound(pods_of(srv, "job-name=big"))) >= 1, what="a first bind")
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
    srv.faults = FaultConfig()
    partial = len(bound(pods_of(srv, "job-name=big")))
    assert 1 <= partial < 8, f"the kill came too late to test anything ({partial} of 8 bound)"
    cluster = Cluster(srv)
    try:
        be = cluster.fresh()
        assert name in be.runs()  # adopted from the admission recorded on the Job
        assert be.runs()[name].placement["pods"] == pl["pods"]
        wait_for(lambda: len(bound(pods_of(srv, "job-name=big"))) == 8, what="the gang completed")
        be.start([RunSpec(name, pl)])  # the controller's recovery starting it again changes nothing
        pods = pods_of(srv, "job-name=big")
        where = {
            int(p["metadata"]["annotations"]["gpupool.io/pod-index"]): (
                p["spec"]["nodeName"],
                p["metadata"]["annotations"]["gpupool.io/gpu-indices"],
            )
            for p in pods
        }
        assert where == {i: (n, str(d[0])) for _, i, n, d in slots}
        assert srv.stats.binds == 8  # each pod bound exactly once, across both processes
        wait_for(lambda: all(p["status"].get("phase") == "Running" for p in pods_of(srv, "job-name=big")))
        assert srv.stats.violations == []
    finally:
        cluster.close()
