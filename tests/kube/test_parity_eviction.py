"""The Eviction API and PodDisruptionBudgets on the fake and on the real API server (issue 24):
what gpupool's evictor reads when it preempts (201, or 429 naming the budget)."""

from __future__ import annotations

import time
from typing import Any

from tests.kube.conftest import KubeTarget


def pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "w"}},
        "spec": {"schedulerName": "gpupool", "containers": [{"name": "c", "image": "x"}]},
    }


def running(k: KubeTarget, name: str, node: str) -> None:
    """Create, bind, and report the pod Running and Ready, as a kubelet would."""
    assert k.http.post(k.path("pods"), json=pod(name)).status_code == 201
    bind = {"metadata": {"name": name}, "target": {"kind": "Node", "name": node}}
    assert k.http.post(k.path("pods", f"{name}/binding"), json=bind).status_code == 201
    ready = {"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-01T00:00:00Z"}
    r = k.http.patch(
        k.path("pods", f"{name}/status"),
        json={"status": {"phase": "Running", "conditions": [ready]}},
        headers={"Content-Type": "application/strategic-merge-patch+json"},
    )
    assert r.status_code == 200, r.text


def evict(k: KubeTarget, name: str) -> Any:
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name}}
    return k.http.post(k.path("pods", f"{name}/eviction"), json=body)


def test_a_budget_refuses_an_eviction_and_a_pending_pod_is_evicted_anyway(kube_api: KubeTarget) -> None:
    node = kube_api.add_gpu_nodes(1)[0]
    for name in ("a", "b"):
        running(kube_api, name, node)
    pdb = {
        "metadata": {"name": "keep2"},
        "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "w"}}},
    }
    assert (
        kube_api.http.post(kube_api.path("poddisruptionbudgets", group="policy"), json=pdb).status_code == 201
    )
    # The real server answers from the budget's status, which its disruption controller writes.
    deadline = time.monotonic() + 60
    while True:
        r = evict(kube_api, "a")
        if r.status_code == 429 and r.json().get("details", {}).get("causes"):
            break
        assert time.monotonic() < deadline, f"no budget refusal within 60 s: {r.status_code} {r.text}"
        time.sleep(0.3)
    assert r.json()["details"]["causes"][0]["reason"] == "DisruptionBudget"
    assert kube_api.http.get(kube_api.path("pods", "a")).json()["metadata"].get("deletionTimestamp") is None
    # A pod that is not running disrupts nothing: the budget does not hold it.
    assert kube_api.http.post(kube_api.path("pods"), json=pod("pending")).status_code == 201
    assert evict(kube_api, "pending").status_code == 201
