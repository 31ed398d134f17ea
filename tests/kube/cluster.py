"""``Cluster``: a Kubernetes backend over either API server, and a server-neutral object API for
the tests that drive it (issue 24).

The backend tests (tests/kube/test_backend.py and the modules built on it) were written against
the fake server's in-process API (``srv.create/get/list/patch``). ``Cluster`` gives them the same
calls over HTTP, on the fake and on the real kube-apiserver alike, through the ``KubeTarget`` of
tests/kube/conftest.py:

- objects live in ``cluster.ns``: ``default`` on the fake (as before), the test's own namespace on
  the real server; an object created without a namespace is put there, and a workload's name is
  ``cluster.workload("job", "train")`` (``<ns>.job.train``);
- ``cluster.nodes`` are two 8-GPU HAMi nodes with a kubelet: the fake's own simulated kubelet, or
  on the real server a ``NodeAgent`` (time scale 0.01 on both); their names are generated on the
  real server, so tests read them from here;
- ``set_node_ready`` is what that node's kubelet reports;
- ``violations()``: HAMi device double-bookings, seen by the fake's kubelet or the node agents;
- what only the fake has (request counters ``stats``, fault injection ``faults``) is reached
  through ``cluster.fake`` (None on the real server) or ``cluster.fake_only(reason)``, which skips
  the test on the real server with that reason.

The object helpers (``job``, ``bare_pod``, ``template``, ``placement`` ...) build objects without a
namespace, so ``cluster.create`` puts them in the cluster's (the fake's own ``create`` puts them in
``default``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from gpupool.kube.adapters.backend import KubernetesBackend
from gpupool.kube.client import MERGE_PATCH, RESOURCES, KubeApi, Resource, load_config
from gpupool.kube.fake import FakeApiServer
from gpupool.kube.runtime.informer import Informers
from tests.test_service_support import wait_for as support_wait_for

if TYPE_CHECKING:
    from tests.kube.conftest import KubeTarget

Obj = dict[str, Any]
QUEUE = {"kueue.x-k8s.io/queue-name": "llm-research"}

#: group -> the version the tests use
_VERSIONS = {
    "": "v1",
    "batch": "v1",
    "apps": "v1",
    "coordination.k8s.io": "v1",
    "policy": "v1",
    "scheduling.k8s.io": "v1",
    "kubeflow.org": "v1",
    "jobset.x-k8s.io": "v1alpha2",
}
_CLUSTER_SCOPED = {"nodes", "namespaces", "priorityclasses", "customresourcedefinitions"}
_KNOWN = {(r.plural, r.group): r for r in RESOURCES.values()}


def resource(key: str) -> Resource:
    """The ``Resource`` of a key as the fake names it: ``pods``, ``jobs.batch``, ``pytorchjobs.kubeflow.org``."""
    plural, _, group = key.partition(".")
    got = _KNOWN.get((plural, group))
    if got is not None:
        return got
    kind = plural[:-1].capitalize() if plural.endswith("s") else plural.capitalize()
    return Resource(group, _VERSIONS.get(group, "v1"), plural, kind, plural not in _CLUSTER_SCOPED)


def resource_of(obj: Mapping[str, Any]) -> Resource:
    """The ``Resource`` of an object from its apiVersion and kind."""
    api, kind = str(obj.get("apiVersion", "")), str(obj.get("kind", ""))
    group, _, version = api.rpartition("/")
    for r in RESOURCES.values():
        if r.kind == kind and r.group == group:
            return Resource(r.group, version, r.plural, r.kind, r.namespaced)
    plural = kind.lower() + ("es" if kind.endswith("s") else "s")
    return Resource(group, version, plural, kind, plural not in _CLUSTER_SCOPED)


def wait_for(fn: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    """Poll ``fn`` until it returns something truthy (deadline-based; 30 s unless told)."""
    return support_wait_for(fn, timeout, what)


class Cluster:
    """A backend (and its caches) on either server; ``fresh()`` makes another one (a restart)."""

    def __init__(self, target: KubeTarget | FakeApiServer, nodes: list[str] | None = None) -> None:
        """On ``target`` (a ``KubeTarget``, or a started fake server: its ``default`` namespace);
        ``nodes`` are the test's nodes (by default every node there is now)."""
        self._own_target = isinstance(target, FakeApiServer)
        if isinstance(target, FakeApiServer):
            from tests.kube.conftest import KubeTarget

            http = httpx.Client(base_url=target.url, timeout=30)
            target = KubeTarget(
                "fake", Path(str(target.kubeconfig)), http, "default", target, own_namespace=False
            )
        self.target = target
        self.kind = target.kind
        self.ns = target.namespace
        self.fake: FakeApiServer | None = target.fake
        self.api = KubeApi(load_config(str(target.kubeconfig)))
        self.nodes = nodes if nodes is not None else sorted(n["metadata"]["name"] for n in self.list("nodes"))
        self.made: list[tuple[KubernetesBackend, Informers, KubeApi]] = []

    # -- what only one server has ------------------------------------------------------------
    @property
    def srv(self) -> FakeApiServer:
        """The fake server's in-process API (a fake-only test's)."""
        return self.fake_only("the fake server's in-process API")

    def fake_only(self, reason: str) -> FakeApiServer:
        """The fake server; on the real one the test is skipped, naming ``reason``."""
        if self.fake is None:
            pytest.skip(f"fake server only: {reason}")
        return self.fake

    @property
    def kubeconfig(self) -> Path:
        return self.target.kubeconfig

    def workload(self, kind: str, name: str, ns: str | None = None) -> str:
        """gpupool's name of a workload in the cluster's namespace: ``<ns>.<kind>.<name>``."""
        return f"{ns or self.ns}.{kind}.{name}"

    def violations(self) -> list[str]:
        """HAMi device double-bookings the kubelets saw (the fake's, or the node agents')."""
        if self.fake is not None:
            return list(self.fake.stats.violations)
        return [v for a in self.target._agents for v in a.violations]

    # -- the backend ---------------------------------------------------------------------------
    def fresh(self, **kw: Any) -> KubernetesBackend:
        api = KubeApi(load_config(str(self.kubeconfig)))
        infs = Informers(api)
        kw.setdefault("bind_deadline_s", 5.0)
        kw.setdefault("backoff_s", (0.02, 0.2))
        be = KubernetesBackend(api, infs, **kw)
        be.run(30)
        self.made.append((be, infs, api))
        return be

    def close(self) -> None:
        for be, infs, api in self.made:
            be.close()
            infs.stop()
            api.close()
        self.made = []
        self.api.close()
        if self._own_target:
            self.target.cleanup()

    # -- objects, over HTTP on either server -------------------------------------------------
    def create(self, obj: Mapping[str, Any]) -> Obj:
        """Create ``obj`` (in its namespace, else the cluster's)."""
        res = resource_of(obj)
        ns = ((obj.get("metadata") or {}).get("namespace") or self.ns) if res.namespaced else None
        return self.api.create(res, ns, obj)

    def get(self, key: str, ns: str, name: str) -> Obj:
        """One object; raises ``ApiError`` (404) when it is absent."""
        return self.api.get(resource(key), ns or None, name)

    def list(self, key: str, ns: str = "", label_selector: str = "", field_selector: str = "") -> list[Obj]:
        """The objects of a resource in ``ns`` (all namespaces when '')."""
        params = {}
        if label_selector:
            params["labelSelector"] = label_selector
        if field_selector:
            params["fieldSelector"] = field_selector
        items, _ = self.api.list(resource(key), ns or None, params=params)
        return items

    def patch(
        self,
        key: str,
        ns: str,
        name: str,
        patch: Any,
        content_type: str = MERGE_PATCH,
        subresource: str = "",
    ) -> Obj:
        return self.api.patch(
            resource(key), ns or None, name, patch, sub=subresource or None, content_type=content_type
        )

    def delete(
        self,
        key: str,
        ns: str,
        name: str,
        grace_period_seconds: int | None = None,
        propagation_policy: str | None = None,
    ) -> Obj:
        body: dict[str, Any] = {}
        if grace_period_seconds is not None:
            body["gracePeriodSeconds"] = grace_period_seconds
        if propagation_policy is not None:
            body["propagationPolicy"] = propagation_policy
        return self.api.delete(resource(key), ns or None, name, body or None)

    # -- nodes -----------------------------------------------------------------------------------
    def add_nodes(self, count: int, gpus: int = 8, hami: bool = True, **model: Any) -> list[str]:
        """More GPU nodes with a kubelet (``KubeTarget.add_kubelet_nodes``: ``labels``,
        ``product``, ``memory_mib``); returns their names."""
        return self.target.add_kubelet_nodes(count, gpus=gpus, hami=hami, **model)

    def set_node_ready(self, name: str, ready: bool) -> None:
        """The node's kubelet reports it Ready or NotReady (its pods are parked while NotReady)."""
        if self.fake is not None:
            self.fake.set_node_ready(name, ready)
            return
        for agent in self.target._agents:
            if name in agent.nodes:
                agent.set_ready(name, ready)
                return
        raise KeyError(f"no kubelet for node {name}")


# -- objects the backend tests create -----------------------------------------------------------
def template(run_s: float = 100, exit_code: int = 0, gpus: int = 1) -> dict[str, Any]:
    ann = {"fake.gpupool.io/run-seconds": str(run_s)}
    if exit_code:
        ann["fake.gpupool.io/exit-code"] = str(exit_code)
    return {
        "metadata": {"annotations": ann},
        "spec": {
            "schedulerName": "gpupool",
            "restartPolicy": "Never",
            "containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": gpus}}}],
        },
    }


def _meta(name: str, ns: str | None, labels: dict[str, str], **more: Any) -> dict[str, Any]:
    md: dict[str, Any] = {"name": name, "labels": labels, **more}
    if ns:
        md["namespace"] = ns
    return md


def job(name: str, pods: int = 2, ns: str | None = None, **tpl: Any) -> dict[str, Any]:
    """A Job as written for Kueue: queue label, suspended, indexed (no namespace unless ``ns``)."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _meta(name, ns, dict(QUEUE)),
        "spec": {
            "suspend": True,
            "parallelism": pods,
            "completions": pods,
            "completionMode": "Indexed",
            "backoffLimit": 0,
            "template": template(**tpl),
        },
    }


def bare_pod(name: str, group: str | None = None, ns: str | None = None, **tpl: Any) -> dict[str, Any]:
    t = template(**tpl)
    labels = dict(QUEUE)
    if group:
        labels["scheduling.x-k8s.io/pod-group"] = group
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _meta(name, ns, labels, **t["metadata"]),
        "spec": t["spec"],
    }


def placement(*pods: tuple[str, int, str, list[int]], milli: int = 1000) -> dict[str, Any]:
    return {
        "pool": "p",
        "admittedAt": time.time(),
        "pods": [
            {"group": g, "index": i, "node": n, "devices": d, "gpuMilli": milli, "gpuMemoryMiB": 81559}
            for g, i, n, d in pods
        ],
    }


def pods_of(srv: Cluster | FakeApiServer, selector: str) -> list[dict[str, Any]]:
    """The pods matching ``selector`` in the cluster's namespace (the fake's ``default``)."""
    return srv.list("pods", srv.ns if isinstance(srv, Cluster) else "default", label_selector=selector)


def known(be: KubernetesBackend, name: str) -> bool:
    return be.tracker.top_by_name(name) is not None


def bound(pods: list[dict[str, Any]]) -> dict[str, str]:
    return {p["metadata"]["name"]: p["spec"].get("nodeName", "") for p in pods if p["spec"].get("nodeName")}
