"""Configuration kept in the cluster: ``kubectl apply -f pools.yaml`` with ResourcePool, Queue
and PriorityClass objects reaches gpupool's configuration through the API's apply path; a bad
object is refused alone (Warning Event, ``Accepted=False`` with the located errors).

The kubectl tests run on the fake and on the real API server (``kube_api``)."""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from gpupool.kube.adapters.config_source import ORIGIN, to_manifest
from gpupool.store import NotFound
from tests.kube.conftest import KubeTarget
from tests.kube.test_kubectl_e2e import kubectl, serving, wait

CHART_CRDS = Path(__file__).resolve().parents[2] / "charts" / "gpupool" / "crds"

POOLS = """
apiVersion: gpupool.io/v1alpha1
kind: ResourcePool
metadata: {name: cluster-pool}
spec: {nodeSelector: {gpupool.io/environment: cluster}, description: from kubectl}
---
apiVersion: gpupool.io/v1alpha1
kind: Queue
metadata: {name: cluster-team}
spec:
  weight: 3
  quotas:
    - {pool: cluster-pool, guarantee: {nvidia.com/gpu: 16}}
---
apiVersion: gpupool.io/v1alpha1
kind: Queue
metadata: {name: broken-team}
spec:
  quotas:
    - {pool: no-such-pool, guarantee: {nvidia.com/gpu: 4}}
---
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata:
  name: batch-low
  annotations: {gpupool.io/preemptible: "true"}
value: 50
description: from kubectl
"""


def _object(svc: Any, kind: str, name: str) -> Any:
    try:
        return svc.store.get_object(kind, name)
    except NotFound:
        return None


#: the cluster-scoped objects of ``POOLS``, removed after the test (a real server is shared)
APPLIED = (
    ("queues.gpupool.io", "cluster-team"),
    ("queues.gpupool.io", "broken-team"),
    ("resourcepools.gpupool.io", "cluster-pool"),
    ("priorityclasses.scheduling.k8s.io", "batch-low"),
)


def _served(k: KubeTarget, plural: str) -> bool:
    """Whether the server serves the CRD's kind yet (a real one once it is Established)."""
    return k.http.get(f"/apis/gpupool.io/v1alpha1/{plural}").status_code == 200


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kubectl_apply_pools_queues_and_classes_reaches_the_configuration(
    kube_api: KubeTarget, tmp_path: Path
) -> None:
    """On the fake and on the real API server (``kube_api``): the CRDs' status subresource,
    the Warning Event on a cluster-scoped object and the delete are the server's own."""
    for f in ("gpupool.io_resourcepools.yaml", "gpupool.io_queues.yaml"):
        kubectl(kube_api, "apply", "-f", str(CHART_CRDS / f))
    for plural in ("resourcepools", "queues"):
        wait(functools.partial(_served, kube_api, plural), 60, f"{plural} served")
    try:
        with serving(kube_api, tmp_path / "a") as app:
            _apply_and_check(kube_api, app.state.svc)
    finally:
        for kind, name in APPLIED:
            kubectl(kube_api, "delete", kind, name, "--ignore-not-found")


def _apply_and_check(k: KubeTarget, svc: Any) -> None:
    kubectl(k, "apply", "-f", "-", stdin=POOLS)
    queue = wait(lambda: _object(svc, "Queue", "cluster-team"), 60, "the queue applied")
    pool = _object(svc, "ResourcePool", "cluster-pool")
    pc = wait(lambda: _object(svc, "PriorityClass", "batch-low"), 60, "the priority class applied")
    assert queue.spec["weight"] == 3 and queue.annotations[ORIGIN] == "cluster"
    assert pool.spec["description"] == "from kubectl"
    assert (pc.spec["value"], pc.spec["preemptible"]) == (50, True)
    # the same revision path as the API: revision 1 each, and an audit record
    assert [r.revision for r in svc.store.list_revisions("Queue", "cluster-team")] == [1]
    wait(  # the controller reloads its configuration
        lambda: "cluster-team" in {q.name for q in svc.controller.bundle.queues}, 30, "the reload"
    )

    # the bad queue: refused alone, with the located error on the object and as an Event
    def refused() -> dict[str, Any] | None:
        obj = json.loads(kubectl(k, "get", "queues.gpupool.io", "broken-team", "-o", "json"))
        conds = (obj.get("status") or {}).get("conditions") or []
        return conds[0] if conds else None

    cond = wait(refused, 60, "the refused queue's condition")
    assert (cond["type"], cond["status"], cond["reason"]) == ("Accepted", "False", "Invalid")
    assert "no-such-pool" in cond["message"], cond
    assert _object(svc, "Queue", "broken-team") is None

    def event() -> bool:
        events = json.loads(kubectl(k, "get", "events", "-A", "-o", "json"))["items"]
        return any(e["reason"] == "GpupoolConfigRefused" and "broken-team" in e["message"] for e in events)

    wait(event, 30, "the Warning Event")
    good = json.loads(kubectl(k, "get", "queues.gpupool.io", "cluster-team", "-o", "json"))
    assert good["status"]["conditions"][0]["status"] == "True"

    # deleting the object deletes gpupool's copy; a queue from the files is untouched
    kubectl(k, "delete", "queues.gpupool.io", "cluster-team")
    wait(lambda: _object(svc, "Queue", "cluster-team") is None, 60, "the deleted queue removed")
    assert _object(svc, "Queue", "llm-research") is not None


def test_only_priority_classes_meant_for_gpupool_are_read() -> None:
    system = {"kind": "PriorityClass", "metadata": {"name": "system-node-critical"}, "value": 2000001000}
    assert to_manifest(system) is None
    ours = {
        "kind": "PriorityClass",
        "metadata": {"name": "serve", "annotations": {"gpupool.io/preemptible": "false"}},
        "value": 900,
    }
    assert to_manifest(ours) == {
        "apiVersion": "gpupool.io/v1alpha1",
        "kind": "PriorityClass",
        "metadata": {"name": "serve", "annotations": {ORIGIN: "cluster"}},
        "spec": {"value": 900, "preemptible": False},
    }


def test_a_priority_class_carries_its_preemption_wait_in_an_annotation() -> None:
    """``gpupool.io/preemption-wait`` is the class's ``spec.preemptionWait``; a bad value is
    refused by the apply path at that field, as from a file."""
    from gpupool.manifests import ManifestError, parse_documents
    from gpupool.manifests import build as build_bundle

    ann = {"gpupool.io/preemptible": "true", "gpupool.io/preemption-wait": "0s"}
    obj = {"kind": "PriorityClass", "metadata": {"name": "serve", "annotations": ann}, "value": 900}
    m = to_manifest(obj)
    assert m is not None and m["spec"]["preemptionWait"] == "0s"
    bundle = build_bundle(parse_documents(json.dumps(m), "cluster"))
    assert bundle.priority_classes[0].preemption_wait_s == 0.0
    ann["gpupool.io/preemption-wait"] = "soon"
    with pytest.raises(ManifestError) as e:
        build_bundle(parse_documents(json.dumps(to_manifest(obj)), "cluster"))
    assert "spec.preemptionWait" in str(e.value)


README = Path(__file__).resolve().parents[2] / "README.md"


def _readme_objects() -> str:
    """The README's `kubectl apply` block (pool, queue, Kueue-style Job), with the scheduler name
    the chart's mutating webhook would add (the fake server runs no webhook)."""
    text = README.read_text(encoding="utf-8")
    block = text.split("kubectl apply -f - <<'YAML'\n", 1)[1].split("\nYAML\n", 1)[0]
    return block.replace(
        "    spec:\n      restartPolicy", "    spec:\n      schedulerName: gpupool\n      restartPolicy"
    )


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_the_readme_pool_queue_and_job_run_and_show_in_get_workloads(
    kube_api: KubeTarget, tmp_path: Path
) -> None:
    """On both servers, on labelled nodes with a kubelet; the README's objects are deleted
    after (a real server is shared by the session)."""
    kube_api.add_kubelet_nodes(2, labels={"gpupool.io/managed": "true"})
    for f in ("gpupool.io_resourcepools.yaml", "gpupool.io_queues.yaml", "gpupool.io_workloads.yaml"):
        kubectl(kube_api, "apply", "-f", str(CHART_CRDS / f))
    for plural in ("resourcepools", "queues", "workloads"):
        wait(functools.partial(_served, kube_api, plural), 60, f"{plural} served")
    try:
        with serving(kube_api, tmp_path / "a"):
            _readme_runs(kube_api)
    finally:
        kubectl(
            kube_api,
            "delete",
            "--ignore-not-found",
            "--cascade=foreground",
            "-f",
            "-",
            stdin=_readme_objects(),
        )


def _readme_runs(k: KubeTarget) -> None:
    kubectl(k, "apply", "-f", "-", stdin=_readme_objects())

    def accepted() -> bool:
        obj = json.loads(kubectl(k, "get", "queues.gpupool.io", "team-a", "-o", "json"))
        conds = (obj.get("status") or {}).get("conditions") or []
        return bool(conds) and conds[0]["status"] == "True"

    wait(accepted, 60, "the README's queue accepted")

    def running() -> str | None:
        out = kubectl(k, "get", "workloads.gpupool.io", "-n", "default")
        row = next((r for r in out.splitlines() if r.startswith("job.train ")), "")
        return out if "team-a" in row and " gpu " in f" {row} " else None

    wait(running, 90, "the README's Job admitted to pool gpu in kubectl get workloads")


class _Cache:
    """An informer's cache as the source reads it (``get``), without a server."""

    def __init__(self) -> None:
        self.objs: dict[str, dict[str, Any]] = {}

    def add_listener(self, fn: Any) -> None:
        self.fn = fn

    def put(self, obj: dict[str, Any]) -> None:
        self.objs[obj["metadata"]["name"]] = obj
        self.fn("ADDED", obj)

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.objs.get(name)


class _Api:
    """The status subresource write: echoes the object with a new version."""

    def patch(self, res: Any, ns: Any, name: str, body: Any, sub: str = "") -> dict[str, Any]:
        return {"metadata": {"name": name, "resourceVersion": "99"}}


class _Events:
    def __init__(self) -> None:
        self.refused: list[str] = []

    def event(self, obj: Any, type_: str, reason: str, message: str) -> None:
        self.refused.append(message)


def test_a_queue_seen_before_its_pool_is_applied_once_the_pool_arrives(tmp_path: Path) -> None:
    """Each kind has its own watch, so the queue of one ``kubectl apply`` can reach the source a
    pass before the pool it names (a loaded machine): refused then, it is applied again when the
    pool is, not left refused until someone edits it."""
    from gpupool.kube.adapters.config_source import ConfigSource
    from tests.test_service_support import running_app

    caches = {"ResourcePool": _Cache(), "Queue": _Cache(), "PriorityClass": _Cache()}
    events = _Events()
    source = ConfigSource(_Api(), events, informers=caches)
    with running_app(tmp_path) as api:
        svc = api.c.app.state.svc
        source.svc = svc
        md = {"resourceVersion": "1", "generation": 1}
        queue = {"kind": "Queue", "metadata": {"name": "late-team", **md}, "spec": {"weight": 2}}
        queue["spec"]["quotas"] = [{"pool": "early-pool", "guarantee": {"nvidia.com/gpu": 4}}]
        caches["Queue"].put(queue)
        source.process()
        assert _object(svc, "Queue", "late-team") is None and len(events.refused) == 1
        spec = {"nodeSelector": {"gpupool.io/environment": "nowhere"}}
        pool = {"kind": "ResourcePool", "metadata": {"name": "early-pool", **md}, "spec": spec}
        caches["ResourcePool"].put(pool)
        source.process()
        source.process()  # the queue's retry may come in the next pass
        assert _object(svc, "ResourcePool", "early-pool") is not None, events.refused
        assert _object(svc, "Queue", "late-team") is not None, events.refused
