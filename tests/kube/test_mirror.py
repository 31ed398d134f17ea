"""Workload status mirrors: ``kubectl get workloads.gpupool.io`` shows why work waits.

End to end with the real kubectl and ``gpupool serve --backend kubernetes`` in-process, on the
fake and on the real API server (``kube_api``: a labelled node with a kubelet on each); the
write rate limit (status only on change) and a cluster without the
CRD are checked on ``WorkloadMirror`` directly with a recording API.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpupool.kube.adapters.mirror import WorkloadMirror, mirror_name
from gpupool.kube.adapters.waiting import Waiting
from gpupool.kube.client import ApiError
from tests.kube.conftest import KubeTarget
from tests.kube.test_kubectl_e2e import TRAINING, bound, kubectl, kueue_job, serving, wait

CHART_CRDS = Path(__file__).resolve().parents[2] / "charts" / "gpupool" / "crds"


def _mirrors(srv: Any) -> dict[str, dict[str, Any]]:
    out = json.loads(kubectl(srv, "get", "workloads.gpupool.io", "-n", "default", "-o", "json"))
    return {o["metadata"]["name"]: o for o in out["items"]}


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kubectl_get_workloads_shows_queue_phase_position_reason_and_pool(
    kube_api: KubeTarget, tmp_path: Path
) -> None:
    """The Jobs are in ``default``, the namespace the service maps to its queue; on a real
    server, shared by the session, they are deleted after the test."""
    kube_api.add_kubelet_nodes(1, labels=TRAINING)
    kubectl(kube_api, "apply", "-f", str(CHART_CRDS / "gpupool.io_workloads.yaml"))
    wait(lambda: kube_api.http.get("/apis/gpupool.io/v1alpha1/workloads").status_code == 200, 60, "served")
    try:
        _mirrors_follow_the_jobs(kube_api, tmp_path)
    finally:
        for job in ("first", "later"):
            kubectl(
                kube_api, "delete", "job", job, "-n", "default", "--ignore-not-found", "--cascade=foreground"
            )


def _mirrors_follow_the_jobs(k: KubeTarget, tmp_path: Path) -> None:
    with serving(k, tmp_path / "a"):
        kubectl(k, "apply", "-f", "-", stdin=kueue_job("first", pods=1, gpus=8))
        wait(lambda: bound(k, "job-name=first", 1), 60, "the first Job bound")
        kubectl(k, "apply", "-f", "-", stdin=kueue_job("later", pods=1, gpus=8))

        def both() -> dict[str, dict[str, Any]] | None:
            got = _mirrors(k)
            ok = got.get("job.first", {}).get("status", {}).get("admission") and got.get("job.later", {}).get(
                "status", {}
            ).get("position")
            return got if ok else None

        got = wait(both, 60, "both Workload mirrors with their status")
        first, later = got["job.first"]["status"], got["job.later"]["status"]
        assert first["phase"] in ("Admitted", "Running") and first["queue"] == "llm-research"
        assert first["admission"]["pool"] and first["admission"]["nodes"]
        assert later["phase"] == "Pending" and later["position"] == 1 and later["reason"]
        owner = got["job.later"]["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"]) == ("Job", "later")

        table = kubectl(k, "get", "workloads.gpupool.io", "-n", "default")
        header, *rows = table.splitlines()
        assert header.split()[:6] == ["NAME", "QUEUE", "PHASE", "POSITION", "REASON", "POOL"], header
        row = next(r for r in rows if r.startswith("job.later "))
        assert "llm-research" in row and "Pending" in row, table

        # the Job deleted: its mirror goes too
        kubectl(k, "delete", "job", "later", "-n", "default")
        wait(lambda: "job.later" not in _mirrors(k), 60, "the deleted Job's mirror removed")


class _Api:
    """A recording KubeApi: serves the CRD or not; every write is kept."""

    def __init__(self, served: bool = True) -> None:
        self._served = served
        self.calls: list[tuple[str, str, Any]] = []

    def served(self, res: Any) -> bool:
        return self._served

    def create(self, res: Any, ns: str, body: Any) -> Any:
        self.calls.append(("create", body["metadata"]["name"], body))
        return body

    def patch(self, res: Any, ns: str, name: str, body: Any, sub: str | None = None) -> Any:
        self.calls.append((f"patch/{sub}", name, body))
        return body

    def delete(self, res: Any, ns: str, name: str) -> Any:
        self.calls.append(("delete", name, None))
        return {}


def _rec(name: str, phase: str = "Pending", placement: Any = None) -> Any:
    manifest = {"spec": {"queue": "q", "podGroups": [{"name": "main", "replicas": 1}]}}
    return SimpleNamespace(
        name=name, queue="q", phase=phase, placement=placement, reason="", manifest=manifest
    )


def test_status_is_written_only_when_it_changes() -> None:
    api = _Api()
    mirror = WorkloadMirror(api)
    recs = [_rec("ns.job.a")]
    ns_of = {"ns.job.a": "ns"}
    wait1 = {"ns.job.a": Waiting("QuotaExceeded", "queue q is full", "q", 2, 3)}
    mirror.sync(recs, wait1, ns_of, lambda n: None)
    assert [c[0] for c in api.calls] == ["create", "patch/status"]
    assert api.calls[1][2]["status"]["position"] == 2
    api.calls.clear()
    for _ in range(3):  # nothing changed: not one write
        assert mirror.sync(recs, wait1, ns_of, lambda n: None) == 0
    assert api.calls == []
    wait2 = {"ns.job.a": Waiting("QuotaExceeded", "queue q is full", "q", 1, 2)}
    assert mirror.sync(recs, wait2, ns_of, lambda n: None) == 1  # moved up: one status patch
    assert [c[0] for c in api.calls] == ["patch/status"]
    api.calls.clear()
    mirror.sync([], {}, {}, lambda n: None)  # the source forgot it: the mirror is deleted
    assert api.calls == [("delete", "job.a", None)]


def test_a_failed_write_is_retried_and_a_cluster_without_the_crd_gets_none() -> None:
    api = _Api()
    failing = {"n": 1}
    real_patch = api.patch

    def flaky(*args: Any, **kw: Any) -> Any:
        if failing["n"]:
            failing["n"] -= 1
            raise ApiError(500, "InternalError", "boom")
        return real_patch(*args, **kw)

    api.patch = flaky  # type: ignore[method-assign]
    mirror = WorkloadMirror(api)
    recs, ns_of = [_rec("ns.job.a")], {"ns.job.a": "ns"}
    mirror.sync(recs, {}, ns_of, lambda n: None)
    mirror.sync(recs, {}, ns_of, lambda n: None)  # retried: created again (409 tolerated), patched
    assert [c[0] for c in api.calls] == ["create", "create", "patch/status"]

    none = _Api(served=False)
    assert WorkloadMirror(none).sync(recs, {}, ns_of, lambda n: None) == 0
    assert none.calls == []


def test_mirror_names_drop_the_namespace_prefix() -> None:
    assert mirror_name("team-a.job.train", "team-a") == "job.train"
    assert mirror_name("other-abc123", "team-a") == "other-abc123"
