"""The README's Kubernetes quick-start runs as pasted (issue 29): the block is read from the
README itself and run in a fresh directory, changed only in the two ports (so tests can run side
by side), with kubectl as the client. Before, it raced the fake's kubeconfig and named a
``my-job.yaml`` that did not exist.

On both servers (issue 24): ``fake`` runs the block as it is; ``real`` (marked ``realkube``) runs
the same block against a real control plane, its first line (``gpupool kube fake``) replaced by
the ``gpupool kube cluster up`` line of docs/kubernetes.md ("Against a real local control
plane"), with the README's nodes (``--cluster examples/cluster``, the alternative that line's
comment names) and its kubeconfig in the other lines. The real case skips, with the reason, when
the binaries of ``make kube-bin`` are not built (a failure under ``GPUPOOL_REQUIRE_KUBE=1``)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gpupool.kube.realcluster import MissingBinaries, find_binaries
from tests.test_service_support import REPO, free_port

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")


def doc_block(after: str, doc: str = "README.md") -> str:
    """The first ``sh`` code block after the line containing ``after`` in ``doc``."""
    text = (REPO / doc).read_text(encoding="utf-8")
    m = re.search(re.escape(after) + r".*?```sh\n(.*?)```", text, re.S)
    assert m is not None, f"no sh block after {after!r} in {doc}"
    return m.group(1)


def on_the_real_control_plane(block: str) -> str:
    """The README's block with docs/kubernetes.md's ``gpupool kube cluster up`` as its server."""
    real = doc_block("Against a real local control plane", "docs/kubernetes.md")
    [line] = [ln for ln in real.splitlines() if ln.startswith("gpupool kube cluster up ")]
    command, _, comment = line.partition("#")
    assert "or --cluster examples/cluster" in comment, line
    m = re.search(r"--kubeconfig (\S+)", command)
    assert m is not None, line
    kubeconfig = m.group(1)
    up = re.sub(r"--nodes \d+", "--cluster examples/cluster", command.strip())
    [fake] = [ln for ln in block.splitlines() if ln.startswith("gpupool kube fake ")]
    block = block.replace(fake, up)
    block = block.replace(".gpupool/fake-kubeconfig", kubeconfig)
    block = block.replace("gpupool kube wait", f"gpupool kube wait --kubeconfig {kubeconfig}", 1)
    assert "gpupool kube fake" not in block and "fake-kubeconfig" not in block, block
    return block


@pytest.mark.parametrize("server", ["fake", pytest.param("real", marks=pytest.mark.realkube)])
def test_the_kubernetes_quick_start_runs_as_pasted(tmp_path: Path, server: str) -> None:
    block = doc_block("Try it without a cluster:")
    assert "examples/kubernetes/my-job.yaml" in block
    api = free_port()
    if server == "real":
        try:
            find_binaries()
        except MissingBinaries as exc:
            if os.environ.get("GPUPOOL_REQUIRE_KUBE") == "1":
                pytest.fail(f"GPUPOOL_REQUIRE_KUBE=1 but the real control plane cannot start: {exc}")
            pytest.skip(f"real API server: {exc}")
        block = on_the_real_control_plane(block)  # cluster up picks free ports of its own
    else:
        block = block.replace("gpupool kube fake", f"gpupool kube fake --port {free_port()}", 1)
    block = block.replace("gpupool serve", f"gpupool serve --port {api}", 1)
    (tmp_path / "examples").symlink_to(REPO / "examples")
    script = (
        "set -euo pipefail\n"
        "trap 'kill $(jobs -p) 2>/dev/null || true; wait' EXIT\n"
        f"{block}\n"
        # the block's last line may run before the Job is seen: the test waits for it, not the
        # reader, and for it to run (its pods bound by the backend, on either server)
        "end=$((SECONDS + 120))\n"
        "until gpupool get workloads | grep my-job | grep -q Running; do\n"
        "  [ $SECONDS -lt $end ] || { gpupool get workloads; exit 3; }; sleep 0.2\n"
        "done\n"
        "gpupool get workloads\n"
    )
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    env["GPUPOOL_SERVER"] = f"http://127.0.0.1:{api}"
    env.pop("KUBECONFIG", None)
    # its own process group: a timeout stops the servers the block started in the background too
    proc = subprocess.Popen(
        ["bash", "-c", script],
        cwd=tmp_path,
        env=env,
        text=True,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        out, err = proc.communicate(timeout=240 if server == "fake" else 480)
    except subprocess.TimeoutExpired:
        # SIGTERM first: cluster up stops its components, which run in sessions of their own
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    rows = [line.split() for line in out.strip().splitlines()]
    assert any(r[:3] == ["default.job.my-job", "llm-research", "Running"] for r in rows), out[-2000:]
    assert "the example configuration" in out, out[-2000:]
    if server == "real":
        assert "up: Kubernetes v1.36.3 API server at https://127.0.0.1:" in out, out[-2000:]
