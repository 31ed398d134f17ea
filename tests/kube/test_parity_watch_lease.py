"""The leader Lease on the fake and on the real API server (issue 24): what gpupool's leader
election relies on behaves the same on both. The watch tests that were here are in
tests/kube/test_fake_watch.py, which runs on both servers."""

from __future__ import annotations

import pytest

from gpupool.kube.client import KubeApi, make_client
from gpupool.kube.lease import KubeApiLeases, KubeLease, KubeLeaseSettings, LeaseConflict
from tests.kube.conftest import KubeTarget


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
