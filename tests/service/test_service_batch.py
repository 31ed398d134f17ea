"""Group commit of submissions: same semantics as Store.submit_workload, SQLite and PostgreSQL."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.audit import AuditEntry
from gpupool.service.batch import SubmitBatcher
from gpupool.store import Conflict, Store, ValidationFailed
from tests.test_service_support import db_url, wl

__all__ = ["db_url"]


@pytest.fixture
def batcher(db_url: str) -> Iterator[tuple[Store, SubmitBatcher]]:
    store = Store.open(db_url)
    b = SubmitBatcher(store)
    try:
        yield store, b
    finally:
        b.close()
        store.close()


def _audit(name: str) -> AuditEntry:
    return AuditEntry("alice", "workload.submit", "Workload", name)


def test_concurrent_submits_are_durable_ordered_and_chained(batcher: tuple[Store, SubmitBatcher]) -> None:
    store, b = batcher
    results: dict[str, tuple[int, bool]] = {}
    lock = threading.Lock()

    def client(k: int) -> None:
        for i in range(25):
            name = f"w-{k}-{i}"
            rec, created = b.submit(wl(name), owner="alice", phase="Pending", audit=_audit(name)).result(10)
            with lock:
                results[name] = (rec.seq, created)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 200 and all(c for _, c in results.values())
    stored = store.list_workloads()
    assert {w.name: w.seq for w in stored} == {n: s for n, (s, _) in results.items()}
    assert b.batches < 200  # some submits really shared a commit
    v = store.verify_audit()
    assert v.ok and v.count == 200
    assert all(e.reason == "Submitted" for e in store.list_events("w-3-7"))


def test_idempotency_and_conflicts_within_and_across_batches(batcher: tuple[Store, SubmitBatcher]) -> None:
    store, b = batcher
    f1 = b.submit(wl("a"), owner="alice", phase="Pending", audit=_audit("a"))
    f2 = b.submit(wl("a"), owner="alice", phase="Pending", audit=_audit("a"))
    f3 = b.submit(wl("a", gpus=2), owner="alice", phase="Pending", audit=_audit("a"))
    r1, r2 = f1.result(5), f2.result(5)
    assert r1[1] is True and r2 == (r1[0], False)
    with pytest.raises(Conflict):
        f3.result(5)
    assert b.submit(wl("a"), owner="alice", phase="Pending", audit=_audit("a")).result(5) == (r1[0], False)
    with pytest.raises(Conflict, match="different manifest or owner"):
        b.submit(wl("a"), owner="bob", phase="Pending", audit=_audit("a")).result(5)
    with pytest.raises(ValidationFailed):
        b.submit({"kind": "Workload"}, owner="alice", phase="Pending", audit=_audit("x"))
    assert [w.name for w in store.list_workloads()] == ["a"]
    assert store.verify_audit().count == 1


def test_batcher_and_store_interleave_on_one_chain(
    batcher: tuple[Store, SubmitBatcher], tmp_path: Path
) -> None:
    store, b = batcher
    b.submit(wl("x1"), owner="alice", phase="Pending", audit=_audit("x1")).result(5)
    store.submit_workload(wl("x2"), owner="alice", audit=_audit("x2"))
    b.submit(wl("x3"), owner="alice", phase="AwaitingApproval", audit=_audit("x3")).result(5)
    assert store.get_workload("x3").phase == "AwaitingApproval"
    v = store.verify_audit()
    assert v.ok and v.count == 3
