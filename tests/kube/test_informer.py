"""The informer cache over HTTP: list then watch, a kind that is not served until its CRD is
created (on the fake and on the real API server, ``kube_api``); bookmarks, 410 Gone, dropped
watches and the ``Informers`` set on a server without the training CRDs (fake only: see each
test)."""

from __future__ import annotations

import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube.resources.core_v1 import Namespace

from gpupool.kube.client import RESOURCES, KubeApi, KubeConfigError, Resource, make_client
from gpupool.kube.fake import FakeApiServer
from gpupool.kube.fake.faults import FaultConfig
from gpupool.kube.runtime.informer import Informer, Informers
from tests.kube.conftest import KubeTarget
from tests.test_service_support import wait_for as support_wait_for

MERGE = {"Content-Type": "application/merge-patch+json"}


def wait_for(fn: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    return support_wait_for(fn, timeout, what)


def pod(name: str, ns: str = "default") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": "t"}},
        "spec": {"schedulerName": "gpupool", "containers": [{"name": "c", "image": "busybox"}]},
    }


class Recorder:
    """What the listener heard, per object name."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def __call__(self, typ: str, obj: dict[str, Any]) -> None:
        with self.lock:
            self.events.append((typ, obj["metadata"]["name"]))

    def count(self, typ: str) -> Counter[str]:
        with self.lock:
            return Counter(n for t, n in self.events if t == typ)


@pytest.fixture
def api(fake_server: FakeApiServer) -> Iterator[KubeApi]:
    assert fake_server.kubeconfig is not None
    a = KubeApi(make_client(str(fake_server.kubeconfig)))
    yield a
    a.close()


def started(api: KubeApi, res: str = "pods", **kw: Any) -> tuple[Informer, Recorder]:
    inf = Informer(api, res, **kw)
    rec = Recorder()
    inf.add_listener(rec)
    inf.start()
    assert inf.wait_synced(30)
    return inf, rec


@pytest.fixture
def k8s(kube_api: KubeTarget) -> Iterator[KubeApi]:
    """gpupool's client on the test's server, fake or real."""
    a = KubeApi(make_client(str(kube_api.kubeconfig)))
    yield a
    a.close()


def test_make_client_reads_the_kubeconfig(kube_api: KubeTarget, tmp_path: Path) -> None:
    client = make_client(str(kube_api.kubeconfig))
    assert "kube-system" in {n.metadata.name for n in client.list(Namespace) if n.metadata}
    with pytest.raises(KubeConfigError, match="kubeconfig"):
        make_client(str(tmp_path / "missing"))
    with pytest.raises(KubeConfigError, match="nope"):
        make_client(str(kube_api.kubeconfig), context="nope")


def test_initial_list_then_watch_events(kube_api: KubeTarget, k8s: KubeApi) -> None:
    ns = kube_api.namespace
    for i in range(3):
        assert kube_api.http.post(kube_api.path("pods"), json=pod(f"p{i}", ns)).status_code == 201
    inf, rec = started(k8s, namespace=ns)
    try:
        assert sorted(o["metadata"]["name"] for o in inf.items()) == ["p0", "p1", "p2"]
        assert rec.count("ADDED") == Counter({"p0": 1, "p1": 1, "p2": 1})
        kube_api.http.post(kube_api.path("pods"), json=pod("p3", ns))
        kube_api.http.patch(
            kube_api.path("pods", "p0"), json={"metadata": {"labels": {"x": "y"}}}, headers=MERGE
        )
        kube_api.http.delete(kube_api.path("pods", "p1"), params={"gracePeriodSeconds": 0})
        wait_for(lambda: inf.get(ns, "p1") is None and inf.get(ns, "p3"), what="watch events")
        wait_for(lambda: (inf.get(ns, "p0") or {})["metadata"]["labels"].get("x") == "y")
        assert rec.count("DELETED") == Counter({"p1": 1})
        assert rec.count("MODIFIED")["p0"] == 1
        assert inf.stats["lists"] == 1
    finally:
        inf.stop()


def test_listed_objects_are_typed_as_watched_ones_are(kube_api: KubeTarget, k8s: KubeApi) -> None:
    """An object cached from the initial list reads its ``kind``/``apiVersion`` as one from a
    watch event does (the real server omits them on list items): the backend's evictor patches
    an owner by its kind, and once failed to suspend a Job its cache had only listed (issue 24)."""
    ns = kube_api.namespace
    assert kube_api.http.post(kube_api.path("pods"), json=pod("listed", ns)).status_code == 201
    items, _ = k8s.list(RESOURCES["pods"], ns)
    assert [(o["kind"], o["apiVersion"]) for o in items] == [("Pod", "v1")]
    inf, _rec = started(k8s, namespace=ns)
    try:
        got = inf.get(ns, "listed") or {}
        assert (got.get("kind"), got.get("apiVersion")) == ("Pod", "v1")
    finally:
        inf.stop()


def test_bookmarks_advance_the_version_without_objects(fake_server: FakeApiServer, api: KubeApi) -> None:
    """Fake only: its fixture sends a bookmark every 0.2 s, the real server about once a minute."""
    inf, rec = started(api)
    try:
        before = int(inf.resource_version)
        fake_server.create(pod("other", ns="kube-system"))  # bumps the global version
        wait_for(lambda: inf.stats["bookmarks"] >= 2, what="bookmarks")
        assert rec.events == [("ADDED", "other")]
        wait_for(lambda: int(inf.resource_version) > before, what="a newer version")
    finally:
        inf.stop()


def test_gone_relists_without_losing_or_repeating(tmp_path: Path) -> None:
    """Fake only: fault injection and a history of 5 writes."""
    srv = FakeApiServer(controllers=False, kubelet=False, history_size=5, bookmark_interval_s=30)
    srv.start()
    srv.write_kubeconfig(tmp_path / "kc")
    api = KubeApi(make_client(str(tmp_path / "kc")))
    try:
        for i in range(4):
            srv.create(pod(f"a{i}"))
        inf, rec = started(api, backoff_s=(0.05, 0.2), watch_timeout_s=1)
        # the watch ends (its timeout) and cannot come back while the history moves past it
        srv.faults = FaultConfig(error_rate=1.0)
        wait_for(lambda: inf.stats["errors"] >= 1, what="the watch to fail")
        for i in range(30):
            srv.create(pod(f"b{i}"))
        for i in range(2):
            srv.delete("pods", "default", f"a{i}", grace_period_seconds=0)
        srv.faults = FaultConfig()
        wait_for(lambda: inf.stats["gone"] >= 1 and len(inf.items()) == 32, what="relist after 410")
        names = {o["metadata"]["name"] for o in srv.list("pods", "default")}
        assert {o["metadata"]["name"] for o in inf.items()} == names
        assert all(n == 1 for n in rec.count("ADDED").values())
        assert set(rec.count("ADDED")) == names | {"a0", "a1"}
        assert rec.count("DELETED") == Counter({"a0": 1, "a1": 1})
        inf.stop()
    finally:
        api.close()
        srv.stop()


def test_reconnects_after_dropped_watches(fake_server: FakeApiServer, api: KubeApi) -> None:
    """Fake only: fault injection."""
    fake_server.faults = FaultConfig(drop_watches_after_s=0.15)
    inf, rec = started(api, backoff_s=(0.02, 0.1))
    try:
        for i in range(20):
            fake_server.create(pod(f"p{i}"))
            time.sleep(0.03)
        wait_for(lambda: len(inf.items()) == 20, what="all pods through reconnects")
        assert inf.stats["watches"] >= 3
        assert all(n == 1 for n in rec.count("ADDED").values())
        assert len(rec.count("ADDED")) == 20
    finally:
        fake_server.faults = FaultConfig()
        inf.stop()


def test_a_kind_not_served_is_found_once_its_crd_is_created(kube_api: KubeTarget, k8s: KubeApi) -> None:
    """A kind of a CRD not yet created: not served (a 404), looked for again, and cached once
    the server serves it (on the real server, once the CRD is Established)."""
    group = f"t{secrets.token_hex(4)}.example.com"
    inf = Informer(k8s, Resource(group, "v1", "widgets", "Widget"), absent_retry_s=0.1)
    inf.start()
    try:
        assert inf.wait_decided(30) and inf.served is False and inf.wait_synced(0) is False
        r = kube_api.http.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd(group))
        assert r.status_code == 201, r.text
        wait_for(lambda: inf.served, 60, what="the CRD to be picked up")
        assert inf.wait_synced(10)
    finally:
        inf.stop()
        kube_api.http.delete(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.{group}")


def crd(group: str) -> dict[str, Any]:
    schema = {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"widgets.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
            "versions": [{"name": "v1", "served": True, "storage": True, "schema": schema}],
        },
    }


def test_informers_skip_kinds_not_served_then_find_them(tmp_path: Path) -> None:
    """Fake only: it needs a server without the training CRDs, and the real one is shared by
    the session (another test may have installed them)."""
    srv = FakeApiServer(controllers=False, kubelet=False, bookmark_interval_s=0.2)
    srv.start()
    srv.write_kubeconfig(tmp_path / "kc")
    api = KubeApi(make_client(str(tmp_path / "kc")))
    infs = Informers(api, absent_retry_s=0.1)
    try:
        infs.start()
        assert infs.wait_synced(10)
        assert infs.pytorchjobs.served is False and infs.jobsets.served is False
        assert infs.nodes.served is True and infs.pods.wait_synced(0)
        srv.load_crds(["pytorchjobs"])
        wait_for(lambda: infs.pytorchjobs.served, what="the CRD to be picked up")
        assert infs.pytorchjobs.wait_synced(1)
        lonely = Informer(api, Resource("example.com", "v1", "widgets", "Widget"))
        lonely.start()
        assert lonely.wait_synced(5) is False and lonely.served is False
        lonely.stop()
    finally:
        infs.stop()
        api.close()
        srv.stop()


def test_resource_paths() -> None:
    assert RESOURCES["pods"].path("ns1", "p", "binding") == "/api/v1/namespaces/ns1/pods/p/binding"
    assert RESOURCES["nodes"].path("ignored", "n1") == "/api/v1/nodes/n1"
    assert RESOURCES["jobs"].path() == "/apis/batch/v1/jobs"
