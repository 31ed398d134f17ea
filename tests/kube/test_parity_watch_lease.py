"""Watches and the leader Lease on the fake and on the real API server (issue 24): what
gpupool's informers and its leader election rely on behaves the same on both."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpupool.kube.client import KubeApi, make_client
from gpupool.kube.runtime.lease import KubeApiLeases, KubeLease, KubeLeaseSettings, LeaseConflict
from tests.kube.conftest import KubeTarget


def cm(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}}


def watch(k: KubeTarget, **params: Any) -> list[dict[str, Any]]:
    """Every event of one watch stream on the test's ConfigMaps, until the server ends it."""
    q = {"watch": "1", **{key: str(v) for key, v in params.items()}}
    with k.http.stream("GET", k.path("configmaps"), params=q) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("application/json")
        return [json.loads(line) for line in r.iter_lines() if line]


def test_watch_replays_events_after_a_resource_version(kube_api: KubeTarget) -> None:
    rv = kube_api.http.post(kube_api.path("configmaps"), json=cm("a")).json()["metadata"]["resourceVersion"]
    kube_api.http.post(kube_api.path("configmaps"), json=cm("b"))
    kube_api.http.patch(
        kube_api.path("configmaps", "b"),
        json={"data": {"k": "v"}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    kube_api.http.delete(kube_api.path("configmaps", "a"))
    evs = watch(kube_api, resourceVersion=rv, timeoutSeconds=1)
    got = [(e["type"], e["object"]["metadata"]["name"]) for e in evs if e["type"] != "BOOKMARK"]
    assert got == [("ADDED", "b"), ("MODIFIED", "b"), ("DELETED", "a")]


def test_send_initial_events_ends_with_a_marked_bookmark(kube_api: KubeTarget) -> None:
    kube_api.http.post(kube_api.path("configmaps"), json=cm("a"))
    evs = watch(
        kube_api,
        sendInitialEvents="true",
        allowWatchBookmarks="true",
        resourceVersionMatch="NotOlderThan",
        timeoutSeconds=2,
    )
    added = [e["object"]["metadata"]["name"] for e in evs if e["type"] == "ADDED"]
    assert "a" in added
    marked = [e for e in evs if e["type"] == "BOOKMARK" and e["object"]["metadata"].get("annotations")]
    assert marked and marked[0]["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
    assert evs.index(marked[0]) > max(i for i, e in enumerate(evs) if e["type"] == "ADDED")


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_two_replicas_one_holder_and_a_stale_write_conflicts(kube_api: KubeTarget) -> None:
    """One replica creates and holds the Lease, the other sees it held; a release hands it over
    with leaseTransitions counted; a write on an old resourceVersion is a conflict."""
    name = "sched"
    api = KubeApi(make_client(str(kube_api.kubeconfig)))
    clk = Clock()
    settings = KubeLeaseSettings(namespace=kube_api.namespace, name=name)
    a = KubeLease(KubeApiLeases(api), settings, identity="a", monotonic=clk)
    b = KubeLease(KubeApiLeases(api), settings, identity="b", monotonic=clk)
    try:
        assert a.step() is True
        assert b.step() is False and b.holder == "a"
        first = KubeApiLeases(api).get(kube_api.namespace, name)
        assert first is not None
        assert a.step() is True  # a renewal: an update on the current resourceVersion
        a.stop()
        assert b.step() is True
        got = KubeApiLeases(api).get(kube_api.namespace, name)
        assert got is not None
        assert got["spec"]["holderIdentity"] == "b" and got["spec"]["leaseTransitions"] == 1
        # The real server formats MicroTime with microseconds; gpupool's writes are accepted.
        assert got["spec"]["renewTime"].endswith("Z")
        with pytest.raises(LeaseConflict):
            KubeApiLeases(api).replace(first)
    finally:
        api.close()
