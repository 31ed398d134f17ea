"""``gpupool kube fake``: serves until interrupted, writes a kubeconfig, builds nodes from
``--nodes`` or a Cluster manifest, and refuses bad input with a message."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import httpx
import yaml
from typer.testing import CliRunner

from gpupool.cli.main import app

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def serve(*args: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", "from gpupool.cli import main; main()", "kube", "fake", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    lines = [proc.stdout.readline(), proc.stdout.readline()]
    assert lines[1].startswith("export KUBECONFIG="), (lines, proc.stderr.read() if proc.poll() else "")
    return proc, lines[0].split(" at ")[1].split()[0]


def stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGINT)
    assert proc.wait(20) == 0


def test_serves_nodes_and_writes_kubeconfig(tmp_path: Path) -> None:
    kc = tmp_path / "kc"
    proc, url = serve("--port", "0", "--nodes", "3", "--kubeconfig", str(kc), "--time-scale", "0.01")
    try:
        cfg = yaml.safe_load(kc.read_text())
        assert cfg["clusters"][0]["cluster"]["server"] == url
        nodes = httpx.get(f"{url}/api/v1/nodes").json()["items"]
        assert len(nodes) == 3 and nodes[0]["metadata"]["labels"]["nvidia.com/gpu.count"] == "8"
        assert httpx.get(f"{url}/apis/kubeflow.org/v1/pytorchjobs").status_code == 200
    finally:
        stop(proc)


def test_nodes_from_a_cluster_manifest(tmp_path: Path) -> None:
    proc, url = serve(
        "--port", "0", "--cluster", str(EXAMPLES / "cluster"), "--kubeconfig", str(tmp_path / "kc")
    )
    try:
        nodes = httpx.get(f"{url}/api/v1/nodes", params={"labelSelector": "gpupool.io/environment=training"})
        items = nodes.json()["items"]
        assert len(items) == 8 and items[0]["metadata"]["name"].startswith("h100-")
        assert items[0]["status"]["allocatable"]["nvidia.com/gpu"] == "8"
        assert items[0]["metadata"]["labels"]["nvidia.com/gpu.memory"] == "81920"
    finally:
        stop(proc)


def test_bad_cluster_file_is_a_message_not_a_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "c.yaml"
    bad.write_text("kind: Cluster\nspec:\n  nodeGroups:\n  - count: 1\n")
    r = CliRunner().invoke(app, ["kube", "fake", "--cluster", str(bad), "--kubeconfig", str(tmp_path / "kc")])
    assert r.exit_code == 2 and "nodeGroups[0].name is required" in r.output
    assert not isinstance(r.exception, ValueError | KeyError)


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def test_ctrl_c_and_sigterm_stop_it_even_when_started_with_sigint_ignored(tmp_path: Path) -> None:
    """A process started with SIGINT ignored (``cmd &`` in a script; this suite's workers in CI)
    inherits that; the fake then ignored Ctrl-C and this file's tests timed out in stop()."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        proc = subprocess.Popen(
            [sys.executable, "-c", "from gpupool.cli import main; main()", "kube", "fake", "--port", "0",
             "--nodes", "1", "--kubeconfig", str(tmp_path / "kc")],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_ignore_sigint,
        )  # fmt: skip
        assert proc.stdout is not None
        assert proc.stdout.readline() and proc.stdout.readline().startswith("export KUBECONFIG=")
        proc.send_signal(sig)
        try:
            assert proc.wait(20) == 0, sig
        finally:
            proc.kill()
