"""Watch over HTTP: replay from a resourceVersion, the current objects first, initial events,
live events, selectors, each event's own version (on the fake and on the real API server,
``kube_api``); bookmarks every 0.2 s, 410 Gone outside the history window, fault injection and
the fake's watch counts (fake only: see each test)."""

from __future__ import annotations

import json
import secrets
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gpupool.kube.fake import FakeApiServer, FaultConfig
from tests.kube.conftest import KubeTarget

CM = "/api/v1/namespaces/default/configmaps"
#: the ConfigMap the real controller manager publishes in every namespace (the fake does not)
ROOT_CA = "kube-root-ca.crt"
MERGE = {"Content-Type": "application/merge-patch+json"}


def cm(name: str, namespace: str = "default", **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
    }


def watch(url: str, path: str, **params: Any) -> list[dict[str, Any]]:
    """Every event of one watch stream, until the server ends it."""
    with httpx.Client(base_url=url, timeout=30) as c:
        return stream(c, path, **params)


def stream(c: httpx.Client, path: str, **params: Any) -> list[dict[str, Any]]:
    q = {"watch": "1", **{k: str(v) for k, v in params.items()}}
    with c.stream("GET", path, params=q) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("application/json")
        return [json.loads(line) for line in r.iter_lines() if line]


def objects(evs: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(type, name) of the object events, without bookmarks and the real server's root CA."""
    return [
        (e["type"], e["object"]["metadata"]["name"])
        for e in evs
        if e["type"] != "BOOKMARK" and e["object"]["metadata"]["name"] != ROOT_CA
    ]


class Cms:
    """The test's ConfigMaps on either server."""

    def __init__(self, k: KubeTarget) -> None:
        self.k = k

    def create(self, name: str, namespace: str = "", **labels: str) -> dict[str, Any]:
        ns = namespace or self.k.namespace
        r = self.k.http.post(f"/api/v1/namespaces/{ns}/configmaps", json=cm(name, ns, **labels))
        assert r.status_code == 201, r.text
        return dict(r.json())

    def rv(self) -> str:
        """The list's resourceVersion: a watch from it sees every later write."""
        return str(self.k.http.get(self.k.path("configmaps")).json()["metadata"]["resourceVersion"])

    def watch(self, path: str = "", **params: Any) -> list[dict[str, Any]]:
        return stream(self.k.http, path or self.k.path("configmaps"), **params)


@pytest.fixture
def cms(kube_api: KubeTarget) -> Cms:
    return Cms(kube_api)


@pytest.fixture
def srv(fake_server: FakeApiServer) -> Iterator[FakeApiServer]:
    yield fake_server


def test_watch_replays_events_after_a_resource_version(cms: Cms, kube_api: KubeTarget) -> None:
    rv = cms.create("a")["metadata"]["resourceVersion"]
    cms.create("b")
    kube_api.http.patch(kube_api.path("configmaps", "b"), json={"data": {"k": "v"}}, headers=MERGE)
    kube_api.http.delete(kube_api.path("configmaps", "a"))
    evs = [e for e in cms.watch(resourceVersion=rv, timeoutSeconds=1) if e["type"] != "BOOKMARK"]
    assert objects(evs) == [("ADDED", "b"), ("MODIFIED", "b"), ("DELETED", "a")]
    rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in evs]
    assert rvs == sorted(rvs) and rvs[0] > int(rv)


def test_watch_without_resource_version_starts_with_current_objects(cms: Cms) -> None:
    cms.create("a")
    cms.create("b")
    assert objects(cms.watch(timeoutSeconds=1)) == [("ADDED", "a"), ("ADDED", "b")]


def test_send_initial_events_ends_with_a_marked_bookmark(cms: Cms) -> None:
    cms.create("a")
    evs = cms.watch(
        sendInitialEvents="true",
        allowWatchBookmarks="true",
        resourceVersionMatch="NotOlderThan",
        timeoutSeconds=2,
    )
    assert ("ADDED", "a") in objects(evs)
    marked = [e for e in evs if e["type"] == "BOOKMARK" and e["object"]["metadata"].get("annotations")]
    assert marked and marked[0]["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
    assert evs.index(marked[0]) > max(i for i, e in enumerate(evs) if e["type"] == "ADDED")


def test_live_events_arrive_on_an_open_watch(cms: Cms, kube_api: KubeTarget) -> None:
    """Objects written while the watch is open arrive on it; a write of another kind does not."""
    rv, result = cms.rv(), []
    t = threading.Thread(target=lambda: result.append(cms.watch(resourceVersion=rv, timeoutSeconds=2)))
    t.start()
    cms.create("live")
    other = f"other-{secrets.token_hex(3)}"  # not a configmap of this namespace
    assert kube_api.http.post("/api/v1/namespaces", json={"metadata": {"name": other}}).status_code == 201
    try:
        t.join(30)
        assert [n for typ, n in objects(result[0]) if typ == "ADDED"] == ["live"]
    finally:
        kube_api.http.delete(f"/api/v1/namespaces/{other}")


def test_bookmarks_carry_progress(srv: FakeApiServer) -> None:
    """Fake only: its fixture sends a bookmark every 0.2 s; the real server sends one about once
    a minute, too seldom for a test."""
    rv = srv.store.rv
    result: list[list[dict[str, Any]]] = []
    t = threading.Thread(
        target=lambda: result.append(
            watch(srv.url, CM, resourceVersion=rv, allowWatchBookmarks="true", timeoutSeconds=2)
        )
    )
    t.start()
    srv.wait_for(lambda: srv.store.watch_count() > 0, what="the watch to register")
    srv.create(cm("live"))
    t.join(10)
    bookmarks = [e for e in result[0] if e["type"] == "BOOKMARK"]
    assert bookmarks, "bookmarks are sent every 0.2 s in the fixture"
    assert bookmarks[-1]["object"]["kind"] == "ConfigMap"
    assert int(bookmarks[-1]["object"]["metadata"]["resourceVersion"]) == srv.store.rv


def test_watch_filters_by_label_and_namespace(cms: Cms, kube_api: KubeTarget) -> None:
    rv = cms.rv()
    team = f"team-{secrets.token_hex(3)}"
    assert kube_api.http.post("/api/v1/namespaces", json={"metadata": {"name": team}}).status_code == 201
    app = f"x-{secrets.token_hex(3)}"  # a label no other test's object carries on a shared server
    try:
        cms.create("x", app=app)
        cms.create("y", app="y")
        cms.create("z", team, app=app)
        evs = cms.watch(resourceVersion=rv, labelSelector=f"app={app}", timeoutSeconds=1)
        assert objects(evs) == [("ADDED", "x")]
        evs = cms.watch(
            "/api/v1/configmaps", resourceVersion=rv, labelSelector=f"app={app}", timeoutSeconds=1
        )
        assert objects(evs) == [("ADDED", "x"), ("ADDED", "z")]
    finally:
        kube_api.http.delete(f"/api/v1/namespaces/{team}")


def test_too_old_resource_version_gets_410_gone(tmp_path: Any) -> None:
    """Fake only: it needs a history of 5 writes; the real server keeps etcd's history until a
    compaction, every five minutes."""
    with FakeApiServer(history_size=5, controllers=False, kubelet=False) as srv:
        first = srv.create(cm("c0"))["metadata"]["resourceVersion"]
        for i in range(1, 20):
            srv.create(cm(f"c{i}"))
        evs = watch(srv.url, CM, resourceVersion=first, timeoutSeconds=1)
        assert len(evs) == 1 and evs[0]["type"] == "ERROR"
        status = evs[0]["object"]
        assert status["kind"] == "Status" and status["code"] == 410 and status["reason"] == "Expired"
        assert "too old resource version" in status["message"]
        recent = srv.store.rv - 2
        assert [e["type"] for e in watch(srv.url, CM, resourceVersion=recent, timeoutSeconds=1)] == [
            "ADDED"
        ] * 2


def test_fault_injection_drops_watches(srv: FakeApiServer) -> None:
    """Fake only: fault injection."""
    srv.faults = FaultConfig(drop_watches_after_s=0.3)
    evs = watch(srv.url, CM, resourceVersion=srv.store.rv, timeoutSeconds=60)
    assert evs == [] or all(e["type"] == "BOOKMARK" for e in evs)
    assert srv.stats.watches_dropped == 1


def test_watch_counts_in_stats_and_unregisters(srv: FakeApiServer) -> None:
    """Fake only: its request statistics."""
    watch(srv.url, CM, timeoutSeconds=1)
    srv.wait_for(lambda: srv.store.watch_count() == 0, what="the watch to unregister")
    assert srv.stats.requests["watch configmaps"] == 1


def test_each_event_keeps_the_version_it_was_written_at(kube_api: KubeTarget) -> None:
    """A status write shares the stored object's metadata; giving the new version its
    resourceVersion must not relabel the previous version's event, which a watch encodes only
    when it sends it. It did: two quick status writes made the first event say the second's
    version, and an informer then skipped the real second event as a replay (the backend never
    saw the Job complete: tests/kube/test_backend.py flaked on it). An unbound pod's status, which
    no controller of either server writes."""
    pod = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "x"}]}}
    created = kube_api.http.post(kube_api.path("pods"), json=pod)
    assert created.status_code == 201, created.text
    rv = created.json()["metadata"]["resourceVersion"]
    written = []
    for n in ("1", "2"):
        r = kube_api.http.patch(
            kube_api.path("pods", "p/status"), json={"status": {"message": n}}, headers=MERGE
        )
        assert r.status_code == 200, r.text
        written.append((r.json()["metadata"]["resourceVersion"], n))
    evs = stream(kube_api.http, kube_api.path("pods"), resourceVersion=rv, timeoutSeconds=1)
    got = [
        (e["object"]["metadata"]["resourceVersion"], e["object"]["status"].get("message"))
        for e in evs
        if e["type"] != "BOOKMARK"
    ]
    for pair in written:
        assert pair in got, got
    rvs = [int(r) for r, _ in got]
    assert rvs == sorted(set(rvs)), f"each event its own, increasing version: {got}"
