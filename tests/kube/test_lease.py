"""Leader election on a coordination.k8s.io/v1 Lease (gpupool.kube.runtime.lease), and its place in the
store-lease elector: a replica acts only while it holds both."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpupool.kube.runtime.lease import KubeLease, KubeLeaseSettings, LeaseConflict
from gpupool.service.backends import Capability
from gpupool.service.leader import LeaderElector
from tests.kube.conftest import KubeTarget

S = KubeLeaseSettings(namespace="ns", name="sched", duration_s=15, renew_s=10, retry_s=2)


class MemLeases:
    """A LeaseApi with the API server's optimistic concurrency (resourceVersion, 409)."""

    def __init__(self) -> None:
        self.objs: dict[tuple[str, str], dict[str, Any]] = {}
        self.rv = 0
        self.writes = 0
        self.fail = False

    def _key(self, obj: dict[str, Any]) -> tuple[str, str]:
        return obj["metadata"]["namespace"], obj["metadata"]["name"]

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        if self.fail:
            raise ConnectionError("api server down")
        o = self.objs.get((namespace, name))
        return copy.deepcopy(o) if o else None

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        if self._key(obj) in self.objs:
            raise LeaseConflict("exists")
        return self._store(obj)

    def replace(self, obj: dict[str, Any]) -> dict[str, Any]:
        cur = self.objs.get(self._key(obj))
        if cur is None or cur["metadata"]["resourceVersion"] != obj["metadata"].get("resourceVersion"):
            raise LeaseConflict("conflict")
        return self._store(obj)

    def _store(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.rv += 1
        self.writes += 1
        o = copy.deepcopy(obj)
        o["metadata"]["resourceVersion"] = str(self.rv)
        self.objs[self._key(o)] = o
        return copy.deepcopy(o)

    def spec(self) -> dict[str, Any]:
        return dict(self.objs[("ns", "sched")]["spec"])


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def lease(api: MemLeases, ident: str, clock: Clock, **kw: Any) -> KubeLease:
    return KubeLease(api, S, identity=ident, clock=lambda: 1.7e9 + clock.t, monotonic=clock, **kw)


def test_first_replica_creates_the_lease_and_holds_it() -> None:
    api, clk = MemLeases(), Clock()
    a = lease(api, "a", clk)
    assert a.step() is True and a.held()
    spec = api.spec()
    assert spec["holderIdentity"] == "a"
    assert spec["leaseDurationSeconds"] == 15
    assert spec["leaseTransitions"] == 0
    assert spec["acquireTime"] == spec["renewTime"]
    assert spec["renewTime"].endswith("Z")


def test_second_replica_waits_the_duration_by_its_own_clock() -> None:
    api, clk = MemLeases(), Clock()
    a, b = lease(api, "a", clk), lease(api, "b", clk)
    a.step()
    assert b.step() is False and b.holder == "a"
    clk.t += 14
    assert b.step() is False  # unchanged for 14 s of b's clock: not yet expired
    clk.t += 2
    assert b.step() is True  # 16 s without a renewal: b takes over
    spec = api.spec()
    assert spec["holderIdentity"] == "b" and spec["leaseTransitions"] == 1
    assert a.held() is False  # a's own deadline (duration - skew) passed without a renewal


def test_a_renewal_resets_the_standbys_observation() -> None:
    api, clk = MemLeases(), Clock()
    a, b = lease(api, "a", clk), lease(api, "b", clk)
    a.step()
    b.step()
    clk.t += 10
    assert a.step() is True  # renewal: renewTime and resourceVersion change
    clk.t += 10
    assert b.step() is False  # only 10 s since b saw the record change
    acquire = api.spec()["acquireTime"]
    assert api.spec()["renewTime"] != acquire  # renewal keeps acquireTime


def test_lost_race_is_a_conflict_not_an_error() -> None:
    """Two standbys see the same expired record; the one whose update lands second gets a 409
    (its resourceVersion is stale) and does not hold the lease."""
    api, clk = MemLeases(), Clock()
    a, b, c = lease(api, "a", clk), lease(api, "b", clk), lease(api, "c", clk)
    a.step()
    b.step()
    c.step()
    clk.t += 20
    real_get = api.get

    def racing_get(namespace: str, name: str) -> dict[str, Any] | None:
        seen = real_get(namespace, name)
        api.get = real_get  # type: ignore[method-assign]
        assert c.step() is True  # c writes between b's read and b's update
        return seen

    api.get = racing_get  # type: ignore[method-assign]
    assert b.step() is False
    assert b.last_error == "" and not b.held()
    assert api.spec()["holderIdentity"] == "c"


def test_release_lets_a_standby_take_over_at_once() -> None:
    api, clk = MemLeases(), Clock()
    a, b = lease(api, "a", clk), lease(api, "b", clk)
    a.step()
    b.step()
    a.stop()
    assert api.spec()["holderIdentity"] == ""
    assert b.step() is True and api.spec()["leaseTransitions"] == 1


def test_dead_local_holder_is_taken_over_at_once() -> None:
    api, clk = MemLeases(), Clock()
    import socket

    from gpupool.service.leader import _pid_namespace

    dead = f"{socket.gethostname()}:{_pid_namespace()}:999999999:abcd"
    lease(api, dead, clk).step()
    b = lease(api, "b", clk)
    assert b.step() is True  # no 15 s wait after a kill -9 and restart on this host


def test_unreachable_api_keeps_the_lease_until_its_deadline_only() -> None:
    api, clk = MemLeases(), Clock()
    changes: list[bool] = []
    a = lease(api, "a", clk, on_change=changes.append)
    a.step()
    api.fail = True
    clk.t += 5
    assert a.step() is True and a.last_error  # still inside duration - skew
    assert a._interval() == S.retry_s  # retried soon, not after a full renew interval
    clk.t += 10
    assert a.step() is False
    assert changes == [True, False]


@pytest.mark.parametrize(
    ("field", "kw"),
    [("renew", {"renew_s": 15}), ("retry", {"retry_s": 0})],
)
def test_bad_settings_name_the_field(field: str, kw: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=field):
        KubeLeaseSettings(**kw)


class _Backend:
    name = "fake"
    capabilities: frozenset[Any] = frozenset({Capability.LEADER_GATE})

    def __init__(self, gate: KubeLease) -> None:
        self.leader_gate = gate.held


def test_store_elector_requires_the_kube_lease(tmp_path: Any) -> None:
    """The store lease is taken only while the Kubernetes Lease is held, and losing the Kubernetes
    Lease deposes the replica at once (may_act false) and releases the store lease."""
    from gpupool.store import Store

    api, clk = MemLeases(), Clock()
    other = lease(api, "other", clk)
    other.step()
    mine = lease(api, "mine", clk)
    st = Store.open(f"sqlite:///{tmp_path / 'db.sqlite'}")

    class Ctl:
        backend: Any = _Backend(mine)
        alive = True
        ready = True

        def stop(self) -> None:
            self.alive = False

    el = LeaderElector(st, Ctl(), url="http://x")  # type: ignore[arg-type]
    assert mine.step() is False
    assert el._try_acquire() is False  # the other replica holds the Kubernetes Lease
    clk.t += 20
    assert mine.step() is True
    assert el._try_acquire() is True and el.may_act()
    clk.t += 20  # mine not renewed: past its deadline
    assert el.may_act() is False
    el.tick()
    assert el._leading is False
    assert st.get_lease().holder == ""  # released for the replica that holds the Kubernetes Lease
    st.close()


def test_two_replicas_over_http_one_holder(kube_api: KubeTarget) -> None:
    """Over HTTP, on the fake and on the real API server (``kube_api``): one replica creates and
    holds the Lease, the other sees it held; a renewal is an update on the current
    resourceVersion; a release hands it over with leaseTransitions counted; a write on an old
    resourceVersion is a conflict. The other tests here use an in-memory Lease API."""
    from gpupool.kube.client import KubeApi, make_client
    from gpupool.kube.runtime.lease import KubeApiLeases

    ns, name = kube_api.namespace, "sched"
    api = KubeApi(make_client(str(kube_api.kubeconfig)))
    clk = Clock()
    http = KubeLeaseSettings(namespace=ns, name=name)
    a = KubeLease(KubeApiLeases(api), http, identity="a", monotonic=clk)
    b = KubeLease(KubeApiLeases(api), http, identity="b", monotonic=clk)
    try:
        assert a.step() is True
        assert b.step() is False and b.holder == "a"
        first = KubeApiLeases(api).get(ns, name)
        assert first is not None
        assert a.step() is True
        a.stop()
        assert b.step() is True
        got = KubeApiLeases(api).get(ns, name)
        assert got is not None
        assert got["spec"]["holderIdentity"] == "b" and got["spec"]["leaseTransitions"] == 1
        # The real server formats MicroTime with microseconds; gpupool's writes are accepted.
        assert got["spec"]["renewTime"].endswith("Z")
        with pytest.raises(LeaseConflict):
            KubeApiLeases(api).replace(first)
    finally:
        api.close()


def test_no_lease_reclaim_local_reaches_the_kubernetes_lease(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``serve --no-lease-reclaim-local`` was ignored for the Kubernetes Lease (issue 23)."""
    import gpupool.kube.wiring as wiring
    from gpupool.cli.server import KubeExtras, _kube_options

    kc = tmp_path / "kubeconfig"
    kc.write_text("apiVersion: v1\nkind: Config\n")
    got: list[Any] = []
    monkeypatch.setattr(wiring, "kube_runtime", lambda opts: got.append(opts) or opts)
    _kube_options("kubernetes", kc, None, [], False, "default", KubeExtras(reclaim_local=False))
    _kube_options("kubernetes", kc, None, [], False, "default", KubeExtras())
    assert [o.lease.reclaim_local for o in got] == [False, True]
