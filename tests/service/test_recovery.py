"""Crash recovery: kill -9 the real server during a stream of submissions, restart, check.

After every restart: no acknowledged workload is lost, none was started twice, and no GPU is
allocated twice (neither in the store's placements nor in the backend). The write-ahead steps
are also checked one by one in-process, on SQLite and PostgreSQL.
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpupool.service.backends import RunSpec
from tests.test_service_support import (
    Server,
    backend_state,
    db_url,
    device_overcommit,
    in_process_controller,
    submit_to,
    wait_for,
    wl,
)

__all__ = ["db_url"]


def _check_consistent(srv: Server, acked: set[str]) -> dict[str, Any]:
    # the backend first, then the store: whatever the backend runs was Admitted in the store
    # before it started (write-ahead), so it must be active or already finished there
    st = backend_state(srv.state_dir)
    with srv.client() as c:
        items = c.get("/v1/workloads", params={"limit": 10_000}).json()["items"]
    by_name = {w["name"]: w for w in items}
    lost = sorted(acked - set(by_name))
    assert not lost, f"acknowledged workloads lost: {lost}"
    active = [w for w in items if w["phase"] in ("Admitted", "Running")]
    assert not device_overcommit([w["placement"] for w in active]), "a GPU is allocated twice in the store"
    assert not st["violations"], st["violations"]
    twice = {n: k for n, k in st["starts"].items() if k > 1}
    assert not twice, f"started more than once: {twice}"
    for n, r in st["runs"].items():
        if not r["finished"]:
            assert by_name[n]["phase"] in ("Admitted", "Running", "Succeeded"), (n, by_name[n]["phase"])
    return by_name


@pytest.mark.slow
def test_kill9_during_submissions(tmp_path: Path, db_url: str) -> None:
    rnd = random.Random(7)
    srv = Server(tmp_path / "state", time_scale=60.0, url=db_url)
    srv.start()
    acked: set[str] = set()
    stop = threading.Event()
    names = [f"job-{i:03d}" for i in range(200)]
    cursor = {"i": 0}

    def submitter() -> None:
        while not stop.is_set() and cursor["i"] < len(names):
            i = cursor["i"]
            name = names[i]
            queue = ("llm-research", "vision-team", "llm-pretrain")[i % 3]
            # the same manifest on every try of a name: a retry after a lost answer is a resubmission
            pick = random.Random(i)
            body = wl(
                name, queue=queue, gpus=pick.choice([1, 2, 4, 8]), duration=pick.choice(["5s", "10s", "20s"])
            )
            try:
                r = httpx.post(
                    srv.base + "/v1/workloads",
                    json=body,
                    timeout=2.0,
                    headers={"Authorization": f"Bearer {srv.token}"},
                )
            except httpx.HTTPError:
                time.sleep(0.05)  # server down: retry the same name later (idempotent)
                continue
            assert r.status_code in (200, 201), r.text
            acked.add(name)
            cursor["i"] += 1

    t = threading.Thread(target=submitter, daemon=True)
    t.start()
    try:
        for _ in range(3):
            time.sleep(rnd.uniform(0.3, 1.0))
            # a few more acknowledged since the last start, however slow the machine: the kill must
            # land inside a running stream (a fixed sleep saw 5-8 in all at load 12, not 10)
            want = len(acked) + 4

            def enough(want: int = want) -> bool:
                return len(acked) >= want

            wait_for(enough, timeout=120, what="submissions before the kill")
            srv.kill9()
            srv.start()
            _check_consistent(srv, set(acked))
        stop.set()
        t.join(10)

        # everything acknowledged eventually runs to completion exactly once
        def all_done() -> bool:
            by_name = _check_consistent(srv, set(acked))
            return all(by_name[n]["phase"] == "Succeeded" for n in acked)

        wait_for(all_done, timeout=60, what="all acknowledged workloads to succeed")
        st = backend_state(srv.state_dir)
        assert all(st["starts"].get(n) == 1 for n in acked)
        with srv.client() as c:
            assert c.get("/v1/audit/verify").json()["ok"] is True
        assert len(acked) >= 10  # the stream really ran across the restarts
        print(
            f"kill -9 x3 during submissions ({db_url.split(':')[0]}): {len(acked)} acknowledged, "
            "0 lost, 0 started twice, 0 devices over-committed"
        )
    finally:
        stop.set()
        srv.stop()


class Crash(BaseException):
    """Stands in for kill -9 at a chosen point (a BaseException, like the process dying: the
    controller turns any Exception from one backend run into that run's failure, which a kill
    is not)."""


_controller = in_process_controller
_submit = submit_to


@pytest.mark.parametrize("crash_at", ["after-admit-commit", "after-backend-start"])
def test_write_ahead_recovery(tmp_path: Path, db_url: str, crash_at: str) -> None:
    store, ctl, be = _controller(db_url, tmp_path)
    ctl.recover()
    _submit(store, ctl, "w1")
    if crash_at == "after-admit-commit":

        def boom(*a: Any, **k: Any) -> None:
            raise Crash

        be.start = boom  # type: ignore[method-assign]
    else:
        real = ctl.commit.start_specs

        def start_then_die(specs: Any, now: float) -> None:
            ctl.backend.start([RunSpec(n, p, w.expected_duration_s) for n, w, p in specs])
            raise Crash

        ctl.commit.start_specs = start_then_die  # type: ignore[method-assign]
        assert real is not None
    with pytest.raises(Crash):
        ctl.cycle()
    assert store.get_workload("w1").phase == "Admitted"  # the decision was durable first
    store.close()
    # restart: a new controller and a backend that reads its state back
    store2, ctl2, be2 = _controller(db_url, tmp_path)
    try:
        ctl2.recover()
        w = store2.get_workload("w1")
        assert w.phase == "Running"
        assert be2.starts == {"w1": 1}
        assert "w1" in ctl2.engine.running
        # the GPUs it holds are charged: a 64-GPU request in the same cohort no longer fits now
        ctl2.cycle()
        assert ctl2.engine.cluster.used_gpu_milli("h100-training") == 1000
    finally:
        store2.close()


def test_recovery_stops_preempted_and_cancelled(tmp_path: Path, db_url: str) -> None:
    from gpupool.store import PhaseChange

    store, ctl, be = _controller(db_url, tmp_path)
    ctl.recover()
    _submit(store, ctl, "p1")
    _submit(store, ctl, "c1")
    ctl.cycle()
    assert be.runs().keys() == {"p1", "c1"}
    # crash right after the store recorded an eviction and a cancel, before the backend heard of them
    store.apply_transitions([PhaseChange("p1", "Preempted", "test"), PhaseChange("c1", "Cancelled", "test")])
    store.close()
    store2, ctl2, be2 = _controller(db_url, tmp_path)
    try:
        ctl2.recover()
        assert be2.runs() == {}
        assert store2.get_workload("p1").phase == "Pending"
        assert store2.get_workload("c1").phase == "Cancelled"
        assert ctl2.engine.running == {}
        ctl2.cycle()
        assert store2.get_workload("p1").phase == "Running" and be2.starts["p1"] == 2
    finally:
        store2.close()


def _spy_reason_writes(store: Any) -> list[dict[str, str]]:
    """Record every batch of pending reasons the store is asked to write (and still write it)."""
    writes: list[dict[str, str]] = []
    real = store.set_pending_reasons

    def spy(reasons: Any) -> int:
        writes.append(dict(reasons))
        return real(reasons)

    store.set_pending_reasons = spy
    return writes


BIG = {"podGroups": [{"replicas": 5, "resources": {"nvidia.com/gpu": 8, "cpu": 8, "memory": "64Gi"}}]}


def test_pending_reasons_are_stored_when_they_change_and_survive_a_restart(
    tmp_path: Path, db_url: str
) -> None:
    """The engine's reason is written only when its text changes, and explain has it after a restart."""
    store, ctl, _ = _controller(db_url, tmp_path)
    ctl.reason_interval_s = 0.0  # every cycle may write: what is checked is "only when changed"
    writes = _spy_reason_writes(store)
    try:
        ctl.recover()
        for i in range(3):
            _submit(store, ctl, f"big-{i}", **BIG)
        ctl.cycle()
        assert store.get_workload("big-0").phase == "Running"
        assert len(writes) == 1 and set(writes[0]) == {"big-1", "big-2"}  # one batch per cycle
        stored = store.get_workload("big-2").reason
        assert stored.split(": ")[0] in ("QuotaExceeded", "InsufficientCapacity"), stored
        for _ in range(3):
            ctl.cycle()
        assert len(writes) == 1  # same texts: nothing written again
        before = ctl.explain(store.get_workload("big-2"))
        assert before["code"] != "NotConsidered"
    finally:
        ctl.stop()
        store.close()

    store2, ctl2, _ = _controller(db_url, tmp_path)
    ctl2.reason_interval_s = 0.0
    try:
        ctl2.recover()  # no cycle yet: the stored reason is all it knows
        after = ctl2.explain(store2.get_workload("big-2"))
        assert (after["code"], after["reason"]) == (before["code"], before["reason"])
        writes2 = _spy_reason_writes(store2)
        ctl2.cycle()
        assert writes2 == []  # recovered texts are known: a restart rewrites nothing
        # cancelled or admitted workloads keep their own reason
        ctl2.cancel("big-2", "alice")
        assert store2.set_pending_reasons({"big-2": "QuotaExceeded: stale"}) == 0
        assert store2.get_workload("big-2").reason == "cancelled by alice"
    finally:
        ctl2.stop()
        store2.close()


def test_cancel_before_the_first_cycle_and_cancel_many(tmp_path: Path, db_url: str) -> None:
    """A workload cancelled between its commit and the next cycle is never scheduled; bulk cancel."""
    store, ctl, be = _controller(db_url, tmp_path)
    try:
        ctl.recover()
        _submit(store, ctl, "early")  # handed to the controller, not yet in a cycle
        ctl.cancel("early", "alice")
        stats = ctl.cycle()  # used to try to admit it, failing the whole cycle
        assert stats.admitted == 0 and store.get_workload("early").phase == "Cancelled"
        for i in range(4):
            _submit(store, ctl, f"bulk-{i}", duration="1h")
        ctl.cycle()
        assert store.get_workload("bulk-0").phase == "Running"
        _submit(store, ctl, "bulk-9")  # not yet in a cycle either
        names = [f"bulk-{i}" for i in (0, 1, 2, 3, 9)] + ["early", "ghost"]
        assert ctl.cancel_many(names, "bench", chunk=2) == 5  # finished and unknown are skipped
        ctl.cycle()
        assert {w.phase for w in store.list_workloads() if w.name != "early"} == {"Cancelled"}
        assert not ctl.pending and not ctl.engine.running and not be.runs()
        acts = [r.action for r in store.audit_records()]
        assert acts.count("workload.cancel") == 6 and store.verify_audit().ok
    finally:
        ctl.stop()
        store.close()
