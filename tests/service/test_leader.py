"""One writer only: the leader lease, fencing, standby replicas, and a leader killed under load.

Store-level tests run on SQLite and PostgreSQL (``db_url``); the in-process controller tests
show that a deposed leader cannot write a decision; the end-to-end test runs two real
``gpupool serve`` replicas on one store and one virtual cluster and kills the leader.
"""

from __future__ import annotations

import contextlib
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
import yaml
from alembic import command
from alembic.config import Config

from gpupool.service.backends import RunSpec
from gpupool.service.backends.virtual import VirtualBackend
from gpupool.service.config import EXAMPLES, seed_config
from gpupool.service.leader import GuardedBackend, LeaderElector, LeaseSettings, dead_here, holder_id
from gpupool.store import NotLeader, PhaseChange, Store
from gpupool.store.store import MIGRATIONS_DIR, _create_engine
from tests.test_service_support import (
    Server,
    backend_state,
    db_url,
    device_overcommit,
    in_process_controller,
    running_app,
    submit_to,
    wait_for,
    wl,
)

__all__ = ["db_url"]

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
FAST = LeaseSettings(ttl_s=2.0, renew_s=0.3, retry_s=0.1)


def _at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


# ---------------------------------------------------------------------- the lease in the store
def test_acquire_renew_release(db_url: str) -> None:
    with Store.open(db_url) as st:
        assert st.get_lease().holder == ""
        a = st.acquire_lease("a", "http://a", 8, at=_at(0))
        assert a is not None and (a.holder, a.url, a.epoch) == ("a", "http://a", 1)
        assert st.acquire_lease("b", "http://b", 8, at=_at(1)) is None  # held: no takeover
        renewed = st.renew_lease("a", 1, 8, at=_at(5))
        assert renewed.expires_at == _at(13) and renewed.epoch == 1  # renewing keeps the token
        assert st.acquire_lease("b", "http://b", 8, at=_at(12)) is None  # the renewal counts
        assert st.release_lease("a", 1, at=_at(6))
        b = st.acquire_lease("b", "http://b", 8, at=_at(6))  # released: taken at once
        assert b is not None and (b.holder, b.epoch) == ("b", 2)
        assert not st.release_lease("a", 1, at=_at(7))  # not ours any more


def test_expired_lease_is_taken_over_with_a_new_token(db_url: str) -> None:
    with Store.open(db_url) as st:
        assert st.acquire_lease("a", "http://a", 8, at=_at(0)) is not None
        assert st.acquire_lease("b", "http://b", 8, at=_at(7.9)) is None
        b = st.acquire_lease("b", "http://b", 8, at=_at(8.0))
        assert b is not None and b.epoch == 2 and st.get_lease().url == "http://b"
        with pytest.raises(NotLeader):
            st.renew_lease("a", 1, 8, at=_at(8.1))  # the deposed leader cannot extend it
        # a dead holder (known gone) is taken over before its lease expires
        c = st.acquire_lease("c", "http://c", 8, dead_holder="b", at=_at(9))
        assert c is not None and c.epoch == 3


def test_concurrent_takeovers_elect_exactly_one(db_url: str) -> None:
    with Store.open(db_url) as st:
        wins: list[str] = []
        barrier = threading.Barrier(6)

        def race(name: str) -> None:
            barrier.wait()
            if st.acquire_lease(name, f"http://{name}", 8) is not None:
                wins.append(name)

        threads = [threading.Thread(target=race, args=(f"r{i}",)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert len(wins) == 1 and st.get_lease().holder == wins[0] and st.get_lease().epoch == 1


def test_fenced_writes_fail_once_the_lease_moved_on(db_url: str) -> None:
    with Store.open(db_url) as st:
        seed_config(st, EXAMPLES / "cluster")
        st.submit_workload(wl("w1"), owner="t")
        lease = st.acquire_lease("a", "http://a", 8, at=_at(0))
        assert lease is not None
        fenced = st.fenced(lease.epoch)
        fenced.set_pending_reasons({"w1": "InsufficientCapacity: full"})  # ours: allowed
        assert st.get_lease().epoch == 1
        assert st.acquire_lease("b", "http://b", 8, at=_at(9)) is not None  # taken over
        before = (st.get_workload("w1"), st.audit_head(), len(st.list_events("w1")))
        for write in (
            lambda: fenced.transition_workload("w1", "Admitted", placement={"pods": []}),
            lambda: fenced.apply_transitions([PhaseChange("w1", "Cancelled", "x")]),
            lambda: fenced.set_pending_reasons({"w1": "x: y"}),
            lambda: fenced.add_event("w1", "Normal", "Note"),
            lambda: fenced.submit_workload(wl("w2"), owner="t"),
            lambda: fenced.expire_approvals(),
        ):
            with pytest.raises(NotLeader):
                write()
        assert (st.get_workload("w1"), st.audit_head(), len(st.list_events("w1"))) == before
        assert [w.name for w in st.list_workloads()] == ["w1"]
        assert st.fenced(2).transition_workload("w1", "Cancelled").phase == "Cancelled"  # the new leader


def test_existing_database_gains_the_lease_table(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/old.db"
    engine = _create_engine(url, False)
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    with engine.connect() as conn, conn.begin():
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0001")  # a database made before the lease existed
    engine.dispose()
    with Store.open(url) as st:
        st.submit_workload(wl("kept"), owner="t")
    with Store.open(url) as st:
        assert st.get_lease().epoch == 0 and st.get_workload("kept").phase == "Pending"
        with st.engine.connect() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM leader_lease")).scalar() == 1


def test_dead_here_only_for_gone_processes_of_this_host() -> None:
    import os
    import socket
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait(10)
    host, ns, pid, _ = holder_id().split(":")
    assert host == socket.gethostname() and pid == str(os.getpid())
    assert dead_here(f"{host}:{ns}:{p.pid}:abcd")
    assert not dead_here(f"{host}:{ns}:{pid}:abcd")  # this very process
    assert not dead_here(f"other-host:{ns}:{p.pid}:abcd")  # elsewhere: only the TTL can tell
    assert not dead_here(f"{host}:another-container:{p.pid}:abcd")
    assert not dead_here("garbage")


# ---------------------------------------------------------------------- a deposed controller
_controller = in_process_controller
_submit = submit_to


def test_deposed_controller_cannot_commit_a_decision(tmp_path: Path, db_url: str) -> None:
    store, ctl, be = _controller(db_url, tmp_path)
    try:
        lease = store.acquire_lease("old", "http://old", 8)
        assert lease is not None
        ctl.store = store.fenced(lease.epoch)
        ctl.recover()
        _submit(store, ctl, "w1")
        ctl.cycle()
        assert store.get_workload("w1").phase == "Running"
        # between two cycles the old leader is paused past its lease and another one takes over
        later = datetime.now(UTC) + timedelta(seconds=9)
        assert store.acquire_lease("new", "http://new", 8, at=later) is not None
        _submit(store, ctl, "w2")
        before = ([(w.name, w.phase, w.resource_version) for w in store.list_workloads()], store.audit_head())
        with pytest.raises(NotLeader):
            ctl.cycle()
        with pytest.raises(NotLeader):
            ctl.cancel("w1", "alice")
        after = ([(w.name, w.phase, w.resource_version) for w in store.list_workloads()], store.audit_head())
        assert after == before and store.get_workload("w2").phase == "Pending"
        assert "w2" not in be.runs()  # the decision never reached the cluster either
    finally:
        store.close()


def test_guarded_backend_refuses_to_act_without_the_lease() -> None:
    be = VirtualBackend(None)
    leading = {"v": True}
    g = GuardedBackend(be, lambda: leading["v"])
    g.poll(0.0)
    leading["v"] = False
    for act in (lambda: g.start([]), lambda: g.stop(["x"]), lambda: g.poll(0.0), lambda: g.forget([])):
        with pytest.raises(NotLeader):
            act()
    assert g.runs() == {} and g.health().ok and g.name == "virtual"  # reads still pass


def test_guarded_backend_refuses_a_shrink_without_the_lease() -> None:
    """A deposed leader must not take pods from an elastic gang either: ``shrink`` reached the
    inner backend unchecked through the wrapper's attribute pass-through."""
    be = VirtualBackend(None)
    calls: list[str] = []
    be.shrink = lambda name, placement, message: calls.append(name)  # type: ignore[method-assign]
    leading = {"v": False}
    g = GuardedBackend(be, lambda: leading["v"])
    with pytest.raises(NotLeader):
        g.shrink("gang", None, "reclaim")
    assert calls == []
    leading["v"] = True
    g.shrink("gang", None, "reclaim")
    assert calls == ["gang"]


def test_guarded_backend_refuses_a_move_without_the_lease() -> None:
    """A deposed leader must not move work either (a consolidation move stops pods and starts
    them elsewhere): ``move`` reached the inner backend unchecked through the pass-through."""
    be = VirtualBackend(None)
    calls: list[str] = []
    be.move = lambda run, message: calls.append(run.name) or True  # type: ignore[method-assign]
    leading = {"v": False}
    g = GuardedBackend(be, lambda: leading["v"])
    with pytest.raises(NotLeader):
        g.move(RunSpec("moved", {}), "consolidation")
    assert calls == []
    leading["v"] = True
    assert g.move(RunSpec("moved", {}), "consolidation") is True
    assert calls == ["moved"]


def test_a_refused_start_fails_no_workload_when_deposed(tmp_path: Path, db_url: str) -> None:
    """The backend guard refusing a start (lease past its local deadline) is not the workload's
    fault: it stays Admitted for the next leader's recovery, it is not marked Failed."""
    store, ctl, be = _controller(db_url, tmp_path)
    try:
        lease = store.acquire_lease("old", "http://old", 8)
        assert lease is not None
        acting = {"v": True}
        ctl.store = store.fenced(lease.epoch)
        ctl.backend = GuardedBackend(be, lambda: acting["v"])
        ctl.recover()
        _submit(store, ctl, "w1")
        ctl.finishing.process_finished = lambda now: 0  # type: ignore[method-assign]  # the decision, then the start
        acting["v"] = False  # the local deadline passes between the commit and the start
        with pytest.raises(NotLeader):
            ctl.cycle()
        assert store.get_workload("w1").phase == "Admitted" and "w1" not in be.runs()
    finally:
        store.close()


def _elector(url: str, state: Path, name: str, settings: LeaseSettings) -> tuple[Store, LeaderElector]:
    store, ctl, _ = _controller(url, state)  # one cluster for every replica, as in production
    return store, LeaderElector(store, ctl, url=f"http://{name}", settings=settings)


def _freeze(el: LeaderElector) -> None:
    """Stop the lease keeper without releasing: the process is paused (SIGSTOP) or cut off."""
    el._stop.set()
    assert el._thread is not None
    el._thread.join(5)


def _takeover(tmp_path: Path, db_url: str, settings: LeaseSettings) -> float:
    """Leader A is frozen; returns how long until standby B leads. Asserts A stepped down."""
    sa_, a = _elector(db_url, tmp_path, "a", settings)
    sb, b = _elector(db_url, tmp_path, "b", settings)
    try:
        a.start()
        b.start()
        assert a.is_leader and not b.is_leader and b.leader_url == "http://a"
        assert a.controller.alive and a.controller.ready and not b.controller.alive
        _submit(sa_, a.controller, "busy", duration="1h")  # A's loop keeps cycling meanwhile
        t0 = time.monotonic()
        _freeze(a)
        wait_for(lambda: b.is_leader and b.controller.ready, settings.ttl_s + 5, "standby B to take over")
        took = time.monotonic() - t0
        # A's controller, still looping, gets NotLeader from the backend guard or the fence
        wait_for(lambda: not a.controller.alive, 5, "the deposed controller to stop")
        assert b.epoch == a.epoch + 1 and sb.get_lease().holder == b.holder
        _submit(sb, b.controller, "after")
        wait_for(lambda: sb.get_workload("after").phase == "Running", 10, "B to schedule")
        return took
    finally:
        b.stop()
        a.stop()
        sa_.close()
        sb.close()


def test_standby_takes_over_a_frozen_leader(tmp_path: Path, db_url: str) -> None:
    took = _takeover(tmp_path, db_url, FAST)
    assert took <= FAST.ttl_s + FAST.retry_s + 2.0


@pytest.mark.slow
def test_takeover_time_with_the_default_lease(tmp_path: Path, db_url: str) -> None:
    s = LeaseSettings()
    took = _takeover(tmp_path, db_url, s)
    db = db_url.split(":")[0].split("+")[0]
    print(f"\ntakeover of a frozen leader ({db}, ttl {s.ttl_s:g}s): {took:.2f}s")
    assert took <= 15.0


# ---------------------------------------------------------------------- standby over HTTP
def test_standby_serves_reads_refuses_writes_and_takes_over(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/shared.db"
    opts: dict[str, Any] = {"lease_ttl_s": 2.0, "lease_renew_s": 0.3, "lease_retry_s": 0.1}
    with contextlib.ExitStack() as leader:
        a = leader.enter_context(running_app(tmp_path, url, port=9101, **opts))
        r = a.req("POST", "/v1/workloads", json=wl("on-a"))
        assert r.status_code == 201, r.text
        token = a.token
        with running_app(tmp_path, url, port=9102, write_token_file=False, **opts) as b:
            b.token = token
            ra, rb = a.req("GET", "/readyz"), b.req("GET", "/readyz")
            assert ra.status_code == 200 and ra.json()["role"] == "leader", ra.text
            assert rb.status_code == 200 and rb.json()["status"] == "standby", rb.text
            assert rb.json()["leader"] == "http://127.0.0.1:9101"
            assert b.get("/v1/workloads/on-a")["name"] == "on-a"  # reads are served
            assert [n["name"] for n in b.get("/v1/nodes")["items"]]  # and the cluster view
            refused = b.req("POST", "/v1/workloads", json=wl("on-b"))
            assert refused.status_code == 503 and refused.headers["Retry-After"] == "1"
            err = refused.json()["error"]
            assert err["status"] == 503 and "http://127.0.0.1:9101" in err["message"]
            assert err["errors"] == [{"field": "leader", "problem": "http://127.0.0.1:9101"}]
            assert b.req("POST", "/v1/workloads/on-a/cancel").status_code == 503
            assert b.req("DELETE", "/v1/config/queues/llm-research").status_code == 503
            assert "gpupool_leader 1.0" in a.req("GET", "/metrics").text
            assert "gpupool_leader 0.0" in b.req("GET", "/metrics").text
            leader.close()  # the leader stops cleanly: it releases the lease
            wait_for(lambda: b.req("GET", "/readyz").json().get("role") == "leader", 5, "B to lead")
            assert b.req("POST", "/v1/workloads", json=wl("on-b")).status_code == 201
            assert b.wait_phase("on-b", "Running")["phase"] == "Running"


# ---------------------------------------------------------------------- two real replicas
def _stream(servers: list[Server], names: list[str], acked: set[str], stop: threading.Event) -> None:
    """Submit ``names`` in order, each to one replica and, on 503 or no answer, to the other."""
    i, k = 0, 0
    while i < len(names) and not stop.is_set():
        srv = servers[k % 2]
        try:
            r = httpx.post(
                srv.base + "/v1/workloads",
                json=wl(names[i], gpus=(1, 2, 4)[i % 3], duration=("5s", "10s")[i % 2]),
                headers={"Authorization": f"Bearer {srv.token}"},
                timeout=3.0,
            )
        except httpx.HTTPError:
            r = None
        if r is not None and r.status_code in (200, 201):
            acked.add(names[i])
            i += 1
            continue
        assert r is None or r.status_code == 503, r.text
        k += 1  # the other replica
        time.sleep(0.02)


def _role(srv: Server) -> str:
    """``leader`` once the replica leads and has recovered, ``standby``, or "" (no answer, busy)."""
    try:
        body = httpx.get(srv.base + "/readyz", timeout=1.0).json()
    except (httpx.HTTPError, ValueError):
        return ""
    return str(body.get("role")) if body.get("status") in ("ready", "standby") else ""


@pytest.mark.slow
@pytest.mark.parametrize("path", ["dead-holder", "ttl"])
@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_leader_killed_with_two_replicas(tmp_path: Path, backend: str, path: str) -> None:
    """``dead-holder``: the standby sees the leader's process is gone (same host) and takes over at
    once; ``ttl``: it cannot tell (as from another host) and waits for the lease to expire."""
    from tests import pg

    ctx = pg.fresh_schema_url() if backend == "postgresql" else None
    url = ctx.__enter__() if ctx is not None else f"sqlite:///{tmp_path}/state/gpupool.db"
    state = tmp_path / "state"  # ONE state dir: both drive the same (virtual) cluster
    args = ["--no-lease-reclaim-local"] if path == "ttl" else []
    a, b = (Server(state, time_scale=60.0, url=url, args=args) for _ in range(2))
    a.log, b.log = tmp_path / "a.log", tmp_path / "b.log"
    acked: set[str] = set()
    stop = threading.Event()
    try:
        a.start()
        b.start()
        assert _role(a) == "leader" and _role(b) == "standby"
        names = [f"ha-{i:03d}" for i in range(80)]
        t = threading.Thread(target=_stream, args=([b, a], names, acked, stop), daemon=True)
        t.start()
        wait_for(lambda: len(acked) >= 15, 20, "submissions before the kill")
        a.kill9()
        t0 = time.monotonic()
        wait_for(lambda: _role(b) == "leader", 15, "the standby to take over")
        took = time.monotonic() - t0
        print(f"\ntakeover after kill -9 of the leader ({backend}, {path}): {took:.2f}s")
        t.join(30)
        assert not t.is_alive() and len(acked) == len(names)
        with b.client() as c:

            def settled() -> list[dict[str, Any]] | None:
                items: list[dict[str, Any]] = c.get("/v1/workloads", params={"limit": 1000}).json()["items"]
                done = all(w["phase"] == "Succeeded" for w in items if w["name"] in acked)
                active = [w["placement"] for w in items if w["phase"] in ("Admitted", "Running")]
                assert not device_overcommit(active), "a GPU is allocated twice in the store"
                return items if done else None

            items = wait_for(settled, 60, "every acknowledged workload to finish")
            assert acked <= {w["name"] for w in items}, "an acknowledged submission was lost"
            assert c.get("/v1/audit/verify").json()["ok"] is True
        st = backend_state(state)
        assert not st["violations"], st["violations"]  # the cluster never double-booked a device
        assert {n: k for n, k in st["starts"].items() if k != 1} == {}, "started twice"
        assert took <= 15.0
    finally:
        stop.set()
        a.stop()
        b.stop()
        if ctx is not None:
            ctx.__exit__(None, None, None)


@pytest.mark.slow
def test_the_cli_sends_a_write_refused_by_a_standby_to_the_leader(tmp_path: Path) -> None:
    from tests.service.test_service_http import cli

    a = Server(tmp_path / "state")
    a.start()
    b = Server(tmp_path / "state")
    try:
        b.start()
        assert httpx.get(b.base + "/readyz").json()["status"] == "standby"
        f = tmp_path / "w.yaml"
        f.write_text(yaml.safe_dump(wl("via-standby", duration="1h")))
        code, out = cli(b, "submit", "-f", str(f))
        assert code == 0, out
        assert "standby" in out and a.base in out
        with a.client() as c:
            assert c.get("/v1/workloads/via-standby").status_code == 200
    finally:
        b.stop()
        a.stop()
