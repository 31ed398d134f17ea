"""The gpupool server processes the Kubernetes benchmarks start (``bench kube``, its ``--chaos``
and ``--versus`` runs): the configuration they are served with, and ``gpupool serve --backend
kubernetes`` started in its own process group, waited for and killed.

Why a module of its own: the three benchmarks share these helpers; kept in ``bench.kube`` they
made ``kube`` -> ``chaos`` / ``kueue_versus`` -> ``kube`` an import circle.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

API = "gpupool.io/v1alpha1"
LABELS = {"gpupool.io/environment": "bench"}
QUEUE = "bench"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def config_dir(root: Path, nodes: int, *, cluster: bool) -> Path:
    """Pool ``bench`` (the bench nodes), queue ``bench`` owning all their GPUs; the Cluster
    manifest only for the virtual backend (on Kubernetes the cluster says which nodes exist)."""
    d = root / ("virtual-config" if cluster else "kube-config")
    d.mkdir(parents=True, exist_ok=True)
    docs: list[dict[str, Any]] = [
        {
            "apiVersion": API,
            "kind": "ResourcePool",
            "metadata": {"name": "bench"},
            "spec": {"nodeSelector": LABELS},
        },
        {
            "apiVersion": API,
            "kind": "Queue",
            "metadata": {"name": QUEUE},
            "spec": {"quotas": [{"pool": "bench", "guarantee": {"nvidia.com/gpu": (nodes + 2) * 8}}]},
        },
    ]
    if cluster:
        group = {
            "name": "h100",
            "count": nodes,
            "gpu": {"model": "H100-80GB", "count": 8, "memory": "80Gi"},
            "cpu": 192,
            "memory": "2Ti",
            "labels": LABELS,
        }
        docs.insert(
            0,
            {
                "apiVersion": API,
                "kind": "Cluster",
                "metadata": {"name": "bench"},
                "spec": {"nodeGroups": [group]},
            },
        )
    (d / "bench.yaml").write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return d


def serve(
    kubeconfig: Path, state: Path, cfg: Path, log: Path, lease_namespace: str | None = None
) -> tuple[subprocess.Popen[bytes], int]:
    """``gpupool serve --backend kubernetes`` in its own process group; (process, port); its
    leader Lease in ``lease_namespace`` when given."""
    port = free_port()
    cmd = [
        sys.executable, "-m", "gpupool.cli.main", "serve", "--backend", "kubernetes",
        "--kubeconfig", str(kubeconfig), "--config", str(cfg), "--state-dir", str(state),
        "--port", str(port), "--tick", "0.2", "--log-level", "warning",
    ]  # fmt: skip
    if lease_namespace:
        cmd += ["--lease-namespace", lease_namespace]
    env = server_env(state.parent)
    with log.open("ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    return proc, port


def server_env(work: Path) -> dict[str, str]:
    """The servers' environment: bytecode cached under ``work`` (as an installed package has it).
    Why: the development environment sets ``PYTHONDONTWRITEBYTECODE``, so every start would
    compile gpupool's modules from source, seconds a deployed server never spends, counted in
    restart-to-first-bind."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONUNBUFFERED": "1", "PYTHONPYCACHEPREFIX": str(work / "pycache")}


def compile_bytecode(work: Path) -> None:
    """gpupool's bytecode, once, before the first server starts (see ``server_env``)."""
    import gpupool

    pkg = str(Path(gpupool.__file__).parent)
    cmd = [sys.executable, "-m", "compileall", "-q", pkg]
    subprocess.run(cmd, env=server_env(work), check=False, stdout=subprocess.DEVNULL)


def wait_ready(proc: subprocess.Popen[bytes], port: int, log: Path, timeout_s: float = 300.0) -> None:
    import httpx

    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"gpupool serve exited ({proc.returncode}): {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"gpupool serve not ready after {timeout_s:g}s: {log.read_text()[-2000:]}")


def kill(proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        return
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(20)
