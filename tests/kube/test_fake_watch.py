"""Watch over HTTP: replay from a resourceVersion, bookmarks, timeouts, selectors, 410 Gone
outside the history window, initial events, and watches dropped by fault injection."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gpupool.kube.fake import FakeApiServer, FaultConfig

CM = "/api/v1/namespaces/default/configmaps"


def cm(name: str, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "default", "labels": labels},
    }


def watch(url: str, path: str, **params: Any) -> list[dict[str, Any]]:
    """Every event of one watch stream, until the server ends it."""
    q = {"watch": "1", **{k: str(v) for k, v in params.items()}}
    with httpx.Client(base_url=url, timeout=30) as c, c.stream("GET", path, params=q) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("application/json")
        return [json.loads(line) for line in r.iter_lines() if line]


@pytest.fixture
def srv(fake_server: FakeApiServer) -> Iterator[FakeApiServer]:
    yield fake_server


def test_watch_replays_events_after_a_resource_version(srv: FakeApiServer) -> None:
    rv = srv.create(cm("a"))["metadata"]["resourceVersion"]
    srv.create(cm("b"))
    srv.patch("configmaps", "default", "b", {"data": {"k": "v"}})
    srv.delete("configmaps", "default", "a")
    evs = watch(srv.url, CM, resourceVersion=rv, timeoutSeconds=1)
    got = [(e["type"], e["object"]["metadata"]["name"]) for e in evs]
    assert got == [("ADDED", "b"), ("MODIFIED", "b"), ("DELETED", "a")]
    rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in evs]
    assert rvs == sorted(rvs) and rvs[0] > int(rv)


def test_watch_without_resource_version_starts_with_current_objects(srv: FakeApiServer) -> None:
    srv.create(cm("a"))
    srv.create(cm("b"))
    evs = watch(srv.url, CM, timeoutSeconds=1)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in evs] == [("ADDED", "a"), ("ADDED", "b")]


def test_send_initial_events_ends_with_a_marked_bookmark(srv: FakeApiServer) -> None:
    srv.create(cm("a"))
    evs = watch(
        srv.url,
        CM,
        sendInitialEvents="true",
        allowWatchBookmarks="true",
        resourceVersionMatch="NotOlderThan",
        timeoutSeconds=1,
    )
    assert evs[0]["type"] == "ADDED"
    marked = [e for e in evs if e["type"] == "BOOKMARK" and e["object"]["metadata"].get("annotations")]
    assert marked and marked[0]["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}


def test_live_events_arrive_and_bookmarks_carry_progress(srv: FakeApiServer) -> None:
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
    srv.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "other"}})  # not a configmap
    t.join(10)
    evs = result[0]
    assert [e["object"]["metadata"]["name"] for e in evs if e["type"] == "ADDED"] == ["live"]
    bookmarks = [e for e in evs if e["type"] == "BOOKMARK"]
    assert bookmarks, "bookmarks are sent every 0.2 s in the fixture"
    assert bookmarks[-1]["object"]["kind"] == "ConfigMap"
    assert int(bookmarks[-1]["object"]["metadata"]["resourceVersion"]) == srv.store.rv


def test_watch_filters_by_label_and_namespace(srv: FakeApiServer) -> None:
    rv = srv.store.rv
    srv.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"}})
    srv.create(cm("x", app="x"))
    srv.create(cm("y", app="y"))
    srv.create({**cm("z", app="x"), "metadata": {"name": "z", "namespace": "team", "labels": {"app": "x"}}})
    evs = watch(srv.url, CM, resourceVersion=rv, labelSelector="app=x", timeoutSeconds=1)
    assert [e["object"]["metadata"]["name"] for e in evs] == ["x"]
    evs = watch(srv.url, "/api/v1/configmaps", resourceVersion=rv, labelSelector="app=x", timeoutSeconds=1)
    assert [e["object"]["metadata"]["name"] for e in evs] == ["x", "z"]


def test_too_old_resource_version_gets_410_gone(tmp_path: Any) -> None:
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
    srv.faults = FaultConfig(drop_watches_after_s=0.3)
    evs = watch(srv.url, CM, resourceVersion=srv.store.rv, timeoutSeconds=60)
    assert evs == [] or all(e["type"] == "BOOKMARK" for e in evs)
    assert srv.stats.watches_dropped == 1


def test_watch_counts_in_stats_and_unregisters(srv: FakeApiServer) -> None:
    watch(srv.url, CM, timeoutSeconds=1)
    srv.wait_for(lambda: srv.store.watch_count() == 0, what="the watch to unregister")
    assert srv.stats.requests["watch configmaps"] == 1


def test_each_event_keeps_the_version_it_was_written_at(srv: FakeApiServer) -> None:
    """A status write shares the stored object's metadata; giving the new version its
    resourceVersion must not relabel the previous version's event, which a watch encodes only
    when it sends it. It did: two quick status writes made the first event say the second's
    version, and an informer then skipped the real second event as a replay (the backend never
    saw the Job complete: tests/kube/test_backend.py flaked on it)."""
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "j", "namespace": "default"},
        "spec": {"suspend": True, "template": {"spec": {"containers": [{"name": "c", "image": "x"}]}}},
    }
    rv = srv.create(job)["metadata"]["resourceVersion"]
    cur = srv.get("jobs.batch", "default", "j")
    written = []
    for n in (1, 2):
        cur = srv.update("jobs.batch", {**cur, "status": {"active": n}}, "status")
        written.append((cur["metadata"]["resourceVersion"], n))
    evs = watch(srv.url, "/apis/batch/v1/namespaces/default/jobs", resourceVersion=rv, timeoutSeconds=1)
    got = [(e["object"]["metadata"]["resourceVersion"], e["object"]["status"].get("active")) for e in evs]
    for pair in written:
        assert pair in got, got
    rvs = [int(r) for r, _ in got]
    assert rvs == sorted(set(rvs)), f"each event its own, increasing version: {got}"
