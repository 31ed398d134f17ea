"""Bulk applies (issue 30): written in batches, each its own transaction, and the leader lease
renewed on its own connection in between, so a long write cannot cost the leader its lease.

Before: a set was one transaction (configuration) or one transaction per workload; 10,000
objects held SQLite's only writer lock for over a minute and the lone server lost its own
lease. These tests assert the behaviour (batches, the lease kept during the write), not times.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from gpupool.audit import AuditEntry
from gpupool.store import Conflict, Store
from gpupool.store import objects as store_objects
from tests.test_service_support import db_url, running_app, wl

__all__ = ["db_url"]  # the fixture: every test here runs on SQLite and PostgreSQL

API = "gpupool.io/v1alpha1"


def queue(name: str, parent: str = "llm-team", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "Queue",
        "metadata": {"name": name},
        "spec": {"parent": parent, **spec},
    }


def _items(n: int, **spec: Any) -> list[tuple[dict[str, Any], AuditEntry, int | None]]:
    return [(queue(f"q{i}", **spec), AuditEntry("t", "queue.apply"), None) for i in range(n)]


def test_config_objects_are_written_in_batches_with_apply_semantics(db_url: str) -> None:
    with Store.open(db_url) as st:
        got = st.apply_objects(_items(25), batch_size=10)
        assert [o for _, o in got] == ["created"] * 25 and st.turn.batches == 3
        again = st.apply_objects(_items(25), batch_size=10)
        assert {o for _, o in again} == {"unchanged"}
        changed = _items(25)
        changed[12] = (queue("q12", weight=3), AuditEntry("t", "queue.apply", detail={"reason": "r"}), 1)
        out = st.apply_objects(changed, batch_size=10)
        assert out[12][1] == "updated" and out[12][0].resource_version == 2
        assert [o for i, (_, o) in enumerate(out) if i != 12] == ["unchanged"] * 24
        revs = st.list_revisions("Queue", "q12")
        assert [(r.revision, r.reason) for r in revs] == [(1, ""), (2, "r")]
        assert len(st.list_objects("Queue")) == 25
        assert st.verify_audit().ok  # one chained record per change, in order
        assert sum(1 for r in st.audit_records() if r.action == "queue.apply") == 26


def test_a_failing_batch_writes_nothing_of_itself_and_says_what_was_applied(db_url: str) -> None:
    with Store.open(db_url) as st:
        items = _items(25)
        items[14] = (queue("q14"), AuditEntry("t", "queue.apply"), 7)  # stale: it does not exist
        with pytest.raises(Conflict) as err:
            st.apply_objects(items, batch_size=10)
        assert "10 objects of the set were applied before it" in err.value.problem
        assert sorted(r.name for r in st.list_objects("Queue")) == sorted(f"q{i}" for i in range(10))
        with pytest.raises(Conflict) as first:  # within one batch: all or nothing, as before
            st.apply_objects(items[10:], batch_size=100)
        assert "applied before" not in first.value.problem
        assert len(st.list_objects("Queue")) == 10


def test_the_lease_is_renewed_between_the_batches_of_a_long_write(db_url: str) -> None:
    """Each batch is slowed (a sleep in its INSERT); the keeper renews on its own connection
    while the write goes on. Before: the renewal waited for the whole write on SQLite."""
    with Store.open(db_url) as st:
        assert st.acquire_lease("me", "http://me", 30) is not None

        @sa.event.listens_for(st.engine, "before_cursor_execute")
        def _slow(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            if statement.lstrip().upper().startswith("INSERT INTO OBJECTS"):
                time.sleep(0.15)

        seen: list[int] = []  # the number of batches committed at each renewal
        done = threading.Event()

        def keeper() -> None:
            while not done.is_set():
                st.renew_lease("me", 1, 30)
                seen.append(st.turn.batches)
                time.sleep(0.02)

        t = threading.Thread(target=keeper)
        t.start()
        try:
            st.apply_objects(_items(12), batch_size=1)
        finally:
            done.set()
            t.join(30)
        during = {b for b in seen if 0 < b < 12}
        assert len(during) >= 3, f"renewed only at batch counts {sorted(set(seen))}"
        assert st.get_lease().holder == "me" and st.get_lease().epoch == 1


def test_an_apply_of_many_workloads_and_queues_is_batched(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_objects, "OBJECT_BATCH", 40)
    with running_app(tmp_path, url=db_url) as api:
        svc = api.c.app.state.svc
        before = svc.batcher.batches
        items = [queue(f"bulk-q{i}") for i in range(100)] + [
            wl(f"bulk-{i}", queue="bulk-q0") for i in range(1100)
        ]
        r = api.req("POST", "/v1/apply", json={"items": items})
        assert r.status_code == 200, r.text[:500]
        results = r.json()["results"]
        assert [x["result"] for x in results] == ["created"] * 1200
        assert svc.store.turn.batches == 3  # 100 queues in batches of 40
        assert svc.batcher.batches - before >= 3  # 1,100 workloads in the group commit's batches
        assert svc.leader is None or svc.leader.is_leader
        again = api.req("POST", "/v1/apply", json={"items": items})
        assert {x["result"] for x in again.json()["results"]} == {"unchanged"}
        one = api.get("/v1/workloads/bulk-1099")
        assert one["queue"] == "bulk-q0"
