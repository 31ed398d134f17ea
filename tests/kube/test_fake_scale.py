"""The fake server's ``/scale`` subresource, through the real ``kubectl scale`` (and what an HPA
writes): only ``spec.replicas`` changes, the Deployment controller follows, bad counts are
refused naming the field."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from typing import Any

import pytest

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")

DEPLOYMENT = """
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: default, labels: {app: web}}
spec:
  replicas: 1
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers: [{name: c, image: busybox}]
"""


def kubectl(
    srv: Any, *args: str, stdin: str | None = None, ok: bool = True
) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(
        ["kubectl", "--kubeconfig", str(srv.kubeconfig), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if ok:
        assert r.returncode == 0, f"kubectl {' '.join(args)}: {r.stderr}"
    return r


def test_kubectl_scale_changes_replicas_and_the_controller_follows(fake_server: Any) -> None:
    kubectl(fake_server, "apply", "-f", "-", stdin=DEPLOYMENT)
    kubectl(fake_server, "scale", "deployment/web", "--replicas", "3")
    dep = json.loads(kubectl(fake_server, "get", "deployment", "web", "-o", "json").stdout)
    assert dep["spec"]["replicas"] == 3
    assert dep["spec"]["template"]["spec"]["containers"][0]["image"] == "busybox"  # nothing else moved
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        pods = json.loads(kubectl(fake_server, "get", "pods", "-l", "app=web", "-o", "json").stdout)["items"]
        if len([p for p in pods if not p["metadata"].get("deletionTimestamp")]) == 3:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the Deployment controller did not follow the new scale")
    scale = json.loads(
        kubectl(fake_server, "get", "--raw", "/apis/apps/v1/namespaces/default/deployments/web/scale").stdout
    )
    assert scale["kind"] == "Scale" and scale["apiVersion"] == "autoscaling/v1"
    assert scale["spec"]["replicas"] == 3 and scale["status"]["selector"] == "app=web"


def test_a_negative_scale_is_refused_naming_the_field(fake_server: Any) -> None:
    kubectl(fake_server, "apply", "-f", "-", stdin=DEPLOYMENT)
    r = kubectl(
        fake_server,
        "patch",
        "deployment",
        "web",
        "--subresource",
        "scale",
        "--type",
        "merge",
        "-p",
        '{"spec": {"replicas": -2}}',
        ok=False,
    )
    assert r.returncode != 0
    assert "spec.replicas" in r.stderr
    dep = json.loads(kubectl(fake_server, "get", "deployment", "web", "-o", "json").stdout)
    assert dep["spec"]["replicas"] == 1
