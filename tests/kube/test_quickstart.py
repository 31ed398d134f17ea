"""The README's Kubernetes quick-start runs as pasted (issue 29): the block is read from the
README itself and run in a fresh directory, changed only in the two ports (so tests can run side
by side), with kubectl as the client. Before, it raced the fake's kubeconfig and named a
``my-job.yaml`` that did not exist."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_service_support import REPO, free_port

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")


def readme_block(after: str) -> str:
    """The first ``sh`` code block after the line containing ``after``."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    m = re.search(re.escape(after) + r".*?```sh\n(.*?)```", text, re.S)
    assert m is not None, f"no sh block after {after!r} in README.md"
    return m.group(1)


def test_the_kubernetes_quick_start_runs_as_pasted(tmp_path: Path) -> None:
    block = readme_block("Try it without a cluster:")
    assert "examples/kubernetes/my-job.yaml" in block
    fake, api = free_port(), free_port()
    block = block.replace("gpupool kube fake", f"gpupool kube fake --port {fake}", 1)
    block = block.replace("gpupool serve", f"gpupool serve --port {api}", 1)
    (tmp_path / "examples").symlink_to(REPO / "examples")
    script = (
        "set -euo pipefail\n"
        "trap 'kill $(jobs -p) 2>/dev/null || true; wait' EXIT\n"
        f"{block}\n"
        # the block's last line may run before the Job is seen: the test waits for it, not the reader
        "end=$((SECONDS + 120))\n"
        "until gpupool get workloads | grep -q my-job; do [ $SECONDS -lt $end ] || exit 3; sleep 0.2; done\n"
        "gpupool get workloads\n"
    )
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    env["GPUPOOL_SERVER"] = f"http://127.0.0.1:{api}"
    env.pop("KUBECONFIG", None)
    # its own process group: a timeout kills the servers the block started in the background too
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
        out, err = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    last = out.strip().splitlines()
    assert any("my-job" in line and "llm-research" in line for line in last), out[-2000:]
    assert "the example configuration" in out, out[-2000:]
