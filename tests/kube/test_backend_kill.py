"""kill -9 of the binding process in the middle of a gang: the next backend finishes the gang as
decided, binds no pod twice and double-books no device, on both servers (issue 24).

The binding process must be slow for the kill to land in the middle of the gang: on the fake,
every request is slowed by fault injection (``FaultConfig(latency_s=0.1)``); on the real server,
the process talks to the kube-apiserver through a TCP proxy that delays every chunk it forwards
(tests/kube/slowproxy.py), TLS and token unchanged. What is checked is read from the server's
objects (each pod's node, devices and uid; the kubelets' HAMi ledger, the fake's or the node
agents'), and from the new backend's own binder count; the fake's count of binds besides.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from gpupool.kube.exclusive import overbooked
from gpupool.kube.fake.faults import FaultConfig
from gpupool.service.backends import RunSpec
from tests.kube.cluster import Cluster, bound, job, pods_of, wait_for
from tests.kube.slowproxy import SlowProxy

pytestmark = pytest.mark.both_servers

REPO = Path(__file__).resolve().parents[2]
DELAY_S = 0.1

CHILD = """
import json, sys, time
from gpupool.kube.adapters.backend import connect
from gpupool.service.backends import RunSpec
kubeconfig, name, placement = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
be = connect(kubeconfig, backoff_s=(0.02, 0.2))
while be.tracker.top_by_name(name) is None:
    time.sleep(0.02)
print("ready", flush=True)
sys.stdin.readline()
be.start([RunSpec(name, placement)])
print("started", flush=True)
time.sleep(600)
"""


def uids(pods: list[dict[str, Any]]) -> dict[str, str]:
    """The bound pods' uids and nodes."""
    return {p["metadata"]["uid"]: p["spec"]["nodeName"] for p in pods if p["spec"].get("nodeName")}


@contextmanager
def slowed(cluster: Cluster, tmp_path: Path) -> Iterator[tuple[Path, SlowProxy | None]]:
    """The kubeconfig the binding process uses and what slows it: the fake's fault config, or a
    proxy in front of the real server (``delay_s`` 0 until ``slow``)."""
    if cluster.fake is not None:
        yield cluster.kubeconfig, None
        cluster.fake.faults = FaultConfig()
        return
    proxy = SlowProxy(str(cluster.target.http.base_url).rstrip("/"))
    try:
        yield proxy.kubeconfig(cluster.kubeconfig, tmp_path / "slow.kubeconfig"), proxy
    finally:
        proxy.close()


def test_kill9_in_the_middle_of_a_gang(cluster: Cluster, tmp_path: Path) -> None:
    node0, node1 = cluster.nodes[:2]
    cluster.create(job("big", pods=8, run_s=10_000))
    name = cluster.workload("job", "big")
    slots = [("main", i, node0 if i < 4 else node1, [i % 4]) for i in range(8)]
    pl = {
        "pool": "p",
        "admittedAt": time.time(),
        "pods": [
            {"group": g, "index": i, "node": n, "devices": d, "gpuMilli": 1000, "gpuMemoryMiB": 81559}
            for g, i, n, d in slots
        ],
    }
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    with slowed(cluster, tmp_path) as (kubeconfig, proxy):
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(kubeconfig), name, json.dumps(pl)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            cwd=REPO,
        )
        try:
            assert child.stdin is not None and child.stdout is not None
            assert child.stdout.readline().strip() == b"ready"
            # slow every request from now: the gang takes seconds to bind
            if cluster.fake is not None:
                cluster.fake.faults = FaultConfig(latency_s=DELAY_S)
            else:
                assert proxy is not None
                proxy.delay_s = DELAY_S
            child.stdin.write(b"go\n")
            child.stdin.flush()
            assert child.stdout.readline().strip() == b"started"
            wait_for(lambda: len(bound(pods_of(cluster, "job-name=big"))) >= 1, 60, "a first bind")
            child.send_signal(signal.SIGKILL)
            child.wait(10)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait(10)
    at_kill = uids(pods_of(cluster, "job-name=big"))
    partial = len(at_kill)
    print(f"killed after {partial} of 8 binds")
    assert 1 <= partial < 8, f"the kill came too late to test anything ({partial} of 8 bound)"
    be = cluster.fresh()
    assert name in be.runs()  # adopted from the admission recorded on the Job
    assert be.runs()[name].placement["pods"] == pl["pods"]
    wait_for(lambda: len(bound(pods_of(cluster, "job-name=big"))) == 8, 60, "the gang completed")
    be.start([RunSpec(name, pl)])  # the controller's recovery starting it again changes nothing
    pods = pods_of(cluster, "job-name=big")
    assert len(pods) == 8, [p["metadata"]["name"] for p in pods]  # no pod replaced
    where = {
        int(p["metadata"]["annotations"]["gpupool.io/pod-index"]): (
            p["spec"]["nodeName"],
            p["metadata"]["annotations"]["gpupool.io/gpu-indices"],
        )
        for p in pods
    }
    assert where == {i: (n, str(d[0])) for _, i, n, d in slots}  # as decided
    # each pod bound exactly once, across both processes: the ones bound before the kill are the
    # same pods on the same nodes, and the new backend bound only the rest
    now = uids(pods)
    assert {uid: now.get(uid) for uid in at_kill} == at_kill
    assert be.binder.stats["bound"] == 8 - partial
    if cluster.fake is not None:
        assert cluster.fake.stats.binds == 8
    wait_for(
        lambda: all(p["status"].get("phase") == "Running" for p in pods_of(cluster, "job-name=big")),
        60,
        "the gang Running",
    )
    assert [o.message() for o in overbooked(pods_of(cluster, "job-name=big"))] == []
    assert cluster.violations() == []
