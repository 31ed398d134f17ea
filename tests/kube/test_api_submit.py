"""A Workload sent to gpupool's API while it runs on Kubernetes (issue 23): refused at submit
with the reason, so it never preempts anything first and then fails to start. On both the fake
and the real API server (``kube_api``, issue 24)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from gpupool.kube.adapters.recovery import submit_refusal
from gpupool.kube.adapters.source import SYSTEM_NAME
from gpupool.service.config import EXAMPLES, ServiceConfig
from tests.kube.conftest import KubeTarget
from tests.kube.test_kubectl_e2e import TRAINING


def test_an_api_workload_on_kubernetes_is_refused_naming_what_to_do(
    kube_api: KubeTarget, tmp_path: Path
) -> None:
    from gpupool.kube.wiring import kube_app, kube_options

    kube_api.add_kubelet_nodes(1, gpus=8, hami=True, labels=TRAINING)
    cfg = ServiceConfig(
        state_dir=tmp_path,
        config_dir=EXAMPLES / "cluster",
        backend="kubernetes",
        tick_s=0.05,
        min_interval_s=0.0,
    )
    # the lease in the test's own namespace: the real server is shared by the session's tests
    opts = kube_options(kube_api.kubeconfig, None, [], False, kube_api.namespace)
    body: dict[str, Any] = {
        "apiVersion": "gpupool.io/v1alpha1",
        "kind": "Workload",
        "metadata": {"name": "from-the-api"},
        "spec": {
            "queue": "llm-research",
            "podGroups": [{"name": "w", "replicas": 1, "resources": {"nvidia.com/gpu": 1}}],
        },
    }
    with TestClient(kube_app(cfg, opts), raise_server_exceptions=False) as c:
        token = (tmp_path / "admin-token").read_text().strip()
        r = c.post("/v1/workloads", json=body, headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 422, r.text
        err = r.json()["error"]
        assert err["errors"][0]["field"] == "kind"
        assert "no Kubernetes object stands for workload from-the-api" in err["message"]
        assert "kubectl" in err["message"]
        listed = c.get("/v1/workloads", headers={"Authorization": f"Bearer {token}"}).json()
        assert all(w["name"] != "from-the-api" for w in listed["items"])


def test_the_sources_own_submissions_and_objects_that_exist_pass() -> None:
    assert submit_refusal("x", SYSTEM_NAME, False) is None
    assert submit_refusal("x", "alice", True) is None
    assert "no Kubernetes object" in (submit_refusal("x", "alice", False) or "")
