"""Store tests, run against SQLite and (when reachable) PostgreSQL.

PostgreSQL: run ``.ci/postgres.sh`` and export GPUPOOL_TEST_PG_URL (see tests/pg.py).
"""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory

from gpupool.audit import AuditEntry, read_csv, read_jsonl, verify
from gpupool.auth import Role
from gpupool.store import (
    KEEP,
    Conflict,
    NotFound,
    PhaseChange,
    Store,
    StoreError,
    ValidationFailed,
    check_submission,
)
from gpupool.store.schema import Base
from gpupool.store.store import MIGRATIONS_DIR
from tests import pg

API = "gpupool.io/v1alpha1"
T0 = datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)


class FakeClock:
    """Deterministic, advanceable clock injected into the store."""

    def __init__(self, start: datetime = T0) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def url(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/gpupool.db"
    else:
        with pg.fresh_schema_url() as u:
            yield u


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(url: str, clock: FakeClock) -> Iterator[Store]:
    s = Store.open(url, clock=clock)
    try:
        yield s
    finally:
        s.close()


def pool(name: str = "h100", gpus: int = 8, **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "ResourcePool",
        "metadata": {"name": name, **meta},
        "spec": {"gpus": gpus},
    }


def workload(name: str = "train-1", queue: str = "team-a", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "Workload",
        "metadata": {"name": name},
        "spec": {"queue": queue, "replicas": 2, "gpusPerReplica": 4, **spec},
    }


def raw(store: Store, sql: str, **params: Any) -> Any:
    with store.engine.begin() as conn:
        return conn.execute(sa.text(sql), params)


# ---------------------------------------------------------------- migrations


def test_fresh_database_is_migrated_to_head(url: str) -> None:
    s = Store.open(url)
    try:
        names = set(sa.inspect(s.engine).get_table_names())
        assert {"objects", "workloads", "events", "audit", "audit_anchor", "tokens", "approvals"} <= names
        assert "alembic_version" in names
        with s.engine.connect() as conn:
            head = ScriptDirectory(str(MIGRATIONS_DIR)).get_current_head()
            assert conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar() == head
        assert s.audit_head() == (0, "0" * 64)
    finally:
        s.close()
    again = Store.open(url)  # reopening is a no-op migration and keeps data
    try:
        assert again.audit_head()[0] == 0
    finally:
        again.close()


def test_migrations_match_the_orm(store: Store) -> None:
    with store.engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True})
        diff = compare_metadata(ctx, Base.metadata)
    assert diff == []


def test_sqlite_pragmas(tmp_path: Any) -> None:
    s = Store.open(f"sqlite:///{tmp_path}/sub/dir/g.db")  # parent dirs are created
    try:
        with s.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30000
    finally:
        s.close()


def test_in_memory_sqlite_works() -> None:
    with Store.open("sqlite://") as s:
        s.create_object(pool())
        assert s.get_object("ResourcePool", "h100").spec == {"gpus": 8}


# ------------------------------------------------------------------- objects


def test_object_crud(store: Store, clock: FakeClock) -> None:
    rec = store.create_object(pool(labels={"tier": "gold"}))
    assert (rec.kind, rec.name, rec.resource_version) == ("ResourcePool", "h100", 1)
    assert rec.created_at == T0 and rec.labels == {"tier": "gold"}
    assert store.get_object("ResourcePool", "h100") == rec

    with pytest.raises(Conflict) as ei:
        store.create_object(pool())
    assert ei.value.field == "metadata.name" and ei.value.status_code == 409

    same, outcome = store.apply_object(pool(labels={"tier": "gold"}))
    assert outcome == "unchanged" and same.resource_version == 1

    clock.advance(5)
    upd, outcome = store.apply_object(pool(gpus=16, labels={"tier": "gold"}))
    assert outcome == "updated" and upd.resource_version == 2 and upd.spec == {"gpus": 16}
    assert upd.updated_at == T0 + timedelta(seconds=5) and upd.created_at == T0

    with pytest.raises(Conflict) as ei:
        store.update_object(pool(gpus=32), expected_version=1)
    assert ei.value.field == "metadata.resourceVersion"
    assert (
        store.update_object(pool(gpus=32, labels={"tier": "gold"}), expected_version=2).resource_version == 3
    )

    with pytest.raises(NotFound) as nf:
        store.update_object(pool("a100"))
    assert nf.value.status_code == 404 and nf.value.kind == "ResourcePool"

    q = {"apiVersion": API, "kind": "Queue", "metadata": {"name": "team-a"}, "spec": {"parent": "org"}}
    _, outcome = store.apply_object(q)
    assert outcome == "created"
    assert [(o.kind, o.name) for o in store.list_objects()] == [("Queue", "team-a"), ("ResourcePool", "h100")]
    assert [o.name for o in store.list_objects("Queue")] == ["team-a"]

    m = store.get_object("ResourcePool", "h100").to_manifest()
    assert m["metadata"] == {"name": "h100", "resourceVersion": "3", "labels": {"tier": "gold"}}

    with pytest.raises(Conflict):
        store.delete_object("ResourcePool", "h100", expected_version=1)
    gone = store.delete_object("ResourcePool", "h100")
    assert gone.resource_version == 3
    with pytest.raises(NotFound):
        store.get_object("ResourcePool", "h100")
    with pytest.raises(NotFound):
        store.delete_object("ResourcePool", "h100")


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda m: m.update(apiVersion="v1"), "apiVersion"),
        (lambda m: m.update(kind="Workload"), "kind"),
        (lambda m: m.update(kind="Secret"), "kind"),
        (lambda m: m.pop("metadata"), "metadata"),
        (lambda m: m["metadata"].update(name="Bad_Name"), "metadata.name"),
        (lambda m: m["metadata"].update(name=""), "metadata.name"),
        (lambda m: m["metadata"].update(labels={"a": 1}), "metadata.labels"),
        (lambda m: m["metadata"].update(annotations=["x"]), "metadata.annotations"),
        (lambda m: m.update(spec=[1, 2]), "spec"),
        (lambda m: m.update(spec={"x": float("nan")}), "spec"),
        (lambda m: m.update(spec={"x": object()}), "spec"),
    ],
)
def test_object_validation(store: Store, mutate: Callable[[dict[str, Any]], Any], field: str) -> None:
    m = pool()
    mutate(m)
    with pytest.raises(ValidationFailed) as ei:
        store.apply_object(m)
    assert ei.value.field == field and ei.value.status_code == 422
    assert store.list_objects() == []


def test_store_rejects_non_mapping_manifest(store: Store) -> None:
    with pytest.raises(ValidationFailed):
        store.apply_object(["not", "a", "dict"])  # type: ignore[arg-type]
    with pytest.raises(ValidationFailed):
        store.list_objects("Secret")


# ----------------------------------------------------------------- workloads


def test_submit_is_idempotent_by_name(store: Store) -> None:
    rec, created = store.submit_workload(workload(), owner="alice")
    assert created and rec.phase == "Pending" and rec.seq >= 1 and rec.queue == "team-a"
    assert rec.submitted_at == T0 and rec.resource_version == 1

    again, created = store.submit_workload(workload(), owner="alice")
    assert not created and again == rec

    with_status = {**workload(), "status": {"phase": "Running"}}
    assert store.submit_workload(with_status, owner="alice") == (rec, False)

    with pytest.raises(Conflict) as ei:
        store.submit_workload(workload(replicas=3), owner="alice")
    assert ei.value.field == "metadata.name" and "different manifest" in ei.value.problem
    with pytest.raises(Conflict) as ei:
        store.submit_workload(workload(), owner="mallory")
    assert "owner" in ei.value.problem
    assert len(store.list_workloads()) == 1


def test_submit_workloads_is_one_transaction_with_per_item_results(store: Store, clock: FakeClock) -> None:
    store.submit_workload(workload("old"), owner="alice", audit=AuditEntry("alice", "workload.submit"))
    clock.advance(5)

    def sub(name: str, owner: str = "alice", **spec: Any) -> Any:
        return check_submission(
            workload(name, **spec),
            owner=owner,
            audit=AuditEntry(owner, "workload.submit", detail={"n": name}),
        )

    batch = [
        sub("a"),
        sub("old"),  # resubmit of a stored workload: unchanged, not audited again
        sub("old", replicas=9),  # a different manifest under a stored name: Conflict, alone
        sub("b", owner="bob"),
        sub("a"),  # the same name twice in one batch: a resubmit of the first
        sub("b", owner="mallory"),  # ... by another owner: Conflict
    ]
    res = store.submit_workloads(batch)
    assert len(res) == len(batch)
    a, old, bad, b, a2, b2 = res
    assert (
        isinstance(a, tuple) and a[1] and a[0].name == "a" and a[0].submitted_at == T0 + timedelta(seconds=5)
    )
    assert isinstance(b, tuple) and b[1] and b[0].owner == "bob" and b[0].seq > a[0].seq
    assert isinstance(old, tuple) and not old[1] and old[0] == store.get_workload("old")
    assert a2 == (a[0], False)
    assert isinstance(bad, Conflict) and "different manifest" in bad.problem
    assert isinstance(b2, Conflict) and "or owner" in b2.problem and "another owner" not in b2.problem
    assert [w.name for w in store.list_workloads()] == ["old", "a", "b"]
    assert store.get_workload("a") == a[0] and store.get_workload("b") == b[0]
    assert [e.reason for e in store.list_events("a")] == ["Submitted"]
    # one audit record per created workload, chained, under one anchor update
    assert [(r.action, r.name, r.detail) for r in store.audit_records()] == [
        ("workload.submit", "old", {}),
        ("workload.submit", "a", {"n": "a"}),
        ("workload.submit", "b", {"n": "b"}),
    ]
    assert store.verify_audit().ok and store.audit_head()[0] == 3
    assert store.submit_workloads([]) == []


def test_submit_workloads_large_batch(store: Store) -> None:
    """More rows than one statement takes on PostgreSQL (bind-parameter limit): still one batch."""
    subs = [
        check_submission(workload(f"w{i}"), owner="alice", audit=AuditEntry("alice", "workload.submit"))
        for i in range(2100)
    ]
    res = store.submit_workloads(subs)
    assert all(isinstance(r, tuple) and r[1] for r in res)
    seqs = [r[0].seq for r in res if isinstance(r, tuple)]
    assert len(set(seqs)) == 2100
    assert len(store.list_workloads()) == 2100 and len(store.list_events()) == 2100
    assert store.audit_head()[0] == 2100 and store.verify_audit().ok


def test_submit_workloads_writes_nothing_when_the_batch_fails(store: Store) -> None:
    """All or nothing: an audit entry the chain refuses fails the whole batch, rows included."""
    good = check_submission(workload("a"), owner="alice", audit=AuditEntry("alice", "workload.submit"))
    bad = check_submission(workload("b"), owner="alice", audit=AuditEntry("", "workload.submit"))
    with pytest.raises(ValidationFailed):
        store.submit_workloads([good, bad])
    assert store.list_workloads() == [] and store.list_events() == [] and store.audit_head()[0] == 0


def test_submit_workloads_concurrent_batches_with_overlapping_names(url: str) -> None:
    """Two stores (as two processes) submit overlapping batches: each name is created once."""
    s1, s2 = Store.open(url), Store.open(url)
    try:
        names = [f"w{i}" for i in range(40)]
        results: list[Any] = []

        def work(i: int) -> None:
            st = s1 if i % 2 else s2
            subs = [
                check_submission(workload(n), owner="alice", audit=AuditEntry("alice", "workload.submit"))
                for n in (names if i % 2 else names[::-1])
            ]
            results.append(st.submit_workloads(subs))

        assert _run_threads(4, work) == []
        created = [r[0].name for batch in results for r in batch if isinstance(r, tuple) and r[1]]
        assert sorted(created) == sorted(names)
        assert all(isinstance(r, tuple) for batch in results for r in batch)
        assert len(s1.list_workloads()) == 40 and s1.verify_audit().ok and s1.audit_head()[0] == 40
    finally:
        s1.close()
        s2.close()


def test_pending_reasons_touch_only_pending_rows(store: Store) -> None:
    for n in ("p1", "p2", "done"):
        store.submit_workload(workload(n), owner="alice")
    store.transition_workload("done", "Cancelled", reason="cancelled by alice")
    v = store.get_workload("p1").resource_version
    assert store.set_pending_reasons({"p1": "QuotaExceeded: x", "p2": "O'Brien: 100%", "done": "y"}) == 2
    assert store.set_pending_reasons({}) == 0
    assert store.pending_reasons() == {"p1": "QuotaExceeded: x", "p2": "O'Brien: 100%"}
    assert store.pending_reasons(names=["p2", "done", "ghost"]) == {"p2": "O'Brien: 100%"}
    assert store.get_workload("done").reason == "cancelled by alice"
    assert store.get_workload("p1").resource_version == v  # advisory status: no new version
    assert store.audit_head()[0] == 0  # ... and no audit records


def test_submit_validation(store: Store) -> None:
    for manifest, field in [
        ({**workload(), "spec": {"replicas": 1}}, "spec.queue"),
        (workload(queue="Not Valid"), "spec.queue"),
        (workload(priorityClass=7), "spec.priorityClass"),
        (pool(), "kind"),
    ]:
        with pytest.raises(ValidationFailed) as ei:
            store.submit_workload(manifest, owner="alice")
        assert ei.value.field == field
    with pytest.raises(ValidationFailed) as ei:
        store.submit_workload(workload(), owner="")
    assert ei.value.field == "owner"
    assert store.list_workloads() == []


def test_arrival_order_and_filters(store: Store) -> None:
    seqs = []
    for i, q in enumerate(["a", "b", "a", "c"]):
        rec, _ = store.submit_workload(workload(f"w{i}", queue=q, priorityClass="high"), owner=f"u{i % 2}")
        seqs.append(rec.seq)
    assert seqs == sorted(seqs) and len(set(seqs)) == 4
    assert [w.name for w in store.list_workloads()] == ["w0", "w1", "w2", "w3"]
    assert [w.name for w in store.list_workloads(queues=["a"])] == ["w0", "w2"]
    assert [w.name for w in store.list_workloads(owner="u1")] == ["w1", "w3"]
    assert [w.name for w in store.list_workloads(after_seq=seqs[1], limit=1)] == ["w2"]
    assert store.get_workload("w1").priority_class == "high"
    store.transition_workload("w2", "Admitted")
    assert [w.name for w in store.list_workloads(phases=["Admitted"])] == ["w2"]
    with pytest.raises(ValidationFailed):
        store.list_workloads(phases=["Sleeping"])
    with pytest.raises(NotFound):
        store.get_workload("nope")


def test_lifecycle_timestamps_placement_and_events(store: Store, clock: FakeClock) -> None:
    store.submit_workload(workload(), owner="alice")
    clock.advance(10)
    placement = {"pool": "h100", "nodes": {"n1": [0, 1, 2, 3], "n2": [0, 1, 2, 3]}}
    rec = store.transition_workload(
        "train-1", "Admitted", reason="fits", placement=placement, expected_version=1
    )
    assert (
        rec.phase == "Admitted"
        and rec.placement == placement
        and rec.admitted_at == T0 + timedelta(seconds=10)
    )
    assert rec.resource_version == 2 and rec.finished_at is None
    clock.advance(1)
    rec = store.transition_workload("train-1", "Running")
    assert rec.placement == placement  # kept
    clock.advance(100)
    rec = store.transition_workload("train-1", "Succeeded", reason="exit 0")
    assert rec.finished_at == T0 + timedelta(seconds=111) and rec.reason == "exit 0"

    with pytest.raises(Conflict) as ei:
        store.transition_workload("train-1", "Running")
    assert ei.value.field == "phase"
    with pytest.raises(Conflict):
        store.transition_workload("train-1", "Succeeded")  # terminal: no self-transition
    with pytest.raises(ValidationFailed):
        store.transition_workload("train-1", "Sleeping")
    with pytest.raises(NotFound):
        store.transition_workload("ghost", "Running")

    evs = store.list_events("train-1")
    assert [e.reason for e in evs] == ["Submitted", "Admitted", "Running", "Succeeded"]
    assert evs[1].message == "fits" and evs[2].message == "Admitted -> Running"
    assert store.list_events("train-1", limit=1)[0].reason == "Succeeded"


def test_requeue_clears_placement_and_stale_version_conflicts(store: Store) -> None:
    store.submit_workload(workload(), owner="alice")
    store.transition_workload("train-1", "Admitted", placement={"pool": "p"})
    store.transition_workload("train-1", "Preempted")
    rec = store.transition_workload("train-1", "Pending", reason="requeued")
    assert rec.placement is None
    with pytest.raises(Conflict) as ei:
        store.transition_workload("train-1", "Admitted", expected_version=1)
    assert ei.value.field == "metadata.resourceVersion"


def test_batch_transitions_are_all_or_nothing(store: Store) -> None:
    for n in ("a", "b", "c"):
        store.submit_workload(workload(n), owner="alice")
    store.transition_workload("c", "Cancelled")
    with pytest.raises(Conflict):
        store.apply_transitions(
            [PhaseChange("a", "Admitted", placement={"x": 1}), PhaseChange("c", "Admitted")],
            audit=[AuditEntry("scheduler", "cycle.admit")],
        )
    assert store.get_workload("a").phase == "Pending"  # rolled back
    assert store.audit_head()[0] == 0  # audit rolled back with it
    recs = store.apply_transitions(
        [PhaseChange("b", "Admitted", placement={"x": 2}), PhaseChange("a", "Admitted", placement=KEEP)],
        audit=[AuditEntry("scheduler", "cycle.admit", detail={"admitted": ["b", "a"]})],
    )
    assert [r.name for r in recs] == ["b", "a"] and all(r.phase == "Admitted" for r in recs)
    assert store.audit_records()[0].detail == {"admitted": ["b", "a"]}
    with pytest.raises(ValidationFailed):
        store.apply_transitions([PhaseChange("a", "Running"), PhaseChange("a", "Failed")])


def test_events(store: Store) -> None:
    store.submit_workload(workload(), owner="alice")
    ev = store.add_event("train-1", "Warning", "NodeLost", "n3 unreachable")
    assert ev.at == T0 and ev.type == "Warning"
    with pytest.raises(NotFound):
        store.add_event("ghost", "Normal", "X")
    with pytest.raises(ValidationFailed) as ei:
        store.add_event("train-1", "Info", "X")
    assert ei.value.field == "type"
    assert store.list_events()[-1] == ev


def test_naive_time_rejected(store: Store) -> None:
    with pytest.raises(ValidationFailed) as ei:
        store.create_object(pool(), at=datetime(2026, 1, 1))
    assert ei.value.field == "at"


# --------------------------------------------------------------------- audit


def test_mutations_write_audit_atomically(store: Store) -> None:
    store.create_object(pool(), audit=AuditEntry("root", "pool.create", detail={"why": "new rack"}))
    with pytest.raises(Conflict):
        store.create_object(pool(), audit=AuditEntry("root", "pool.create"))
    store.apply_object(pool(), audit=AuditEntry("root", "pool.apply"))  # unchanged: not audited
    store.submit_workload(workload(), owner="alice", audit=AuditEntry("alice", "workload.submit"))
    store.transition_workload("train-1", "Cancelled", audit=AuditEntry("alice", "workload.cancel"))
    recs = store.audit_records()
    assert [(r.seq, r.action, r.kind, r.name) for r in recs] == [
        (1, "pool.create", "ResourcePool", "h100"),
        (2, "workload.submit", "Workload", "train-1"),
        (3, "workload.cancel", "Workload", "train-1"),
    ]
    assert recs[0].detail == {"why": "new rack"} and recs[0].at == T0 and recs[0].actor == "root"
    assert recs[1].prev_hash == recs[0].hash
    assert store.verify_audit().ok
    assert store.audit_head() == (3, recs[-1].hash)
    with pytest.raises(ValidationFailed):
        store.append_audit(AuditEntry("", "x"))
    assert store.audit_head()[0] == 3


def _five(store: Store) -> None:
    for i in range(5):
        store.append_audit(AuditEntry(f"user{i}", "thing.do", "Queue", f"q{i}", {"i": i}))
    assert store.verify_audit().ok


def test_tamper_edit_row(store: Store) -> None:
    _five(store)
    raw(store, "UPDATE audit SET actor = 'mallory' WHERE seq = 3")
    res = store.verify_audit()
    assert (res.ok, res.first_bad_seq) == (False, 3) and "edited" in res.problem


def test_tamper_edit_detail(store: Store) -> None:
    _five(store)
    raw(store, "UPDATE audit SET detail = :d WHERE seq = 2", d=json.dumps({"i": 99}))
    assert store.verify_audit().first_bad_seq == 2


def test_tamper_delete_row(store: Store) -> None:
    _five(store)
    raw(store, "DELETE FROM audit WHERE seq = 2")
    res = store.verify_audit()
    assert (res.ok, res.first_bad_seq) == (False, 2) and "deleted" in res.problem


def test_tamper_insert_row_at_tail(store: Store) -> None:
    _five(store)
    raw(
        store,
        "INSERT INTO audit (seq, at, actor, action, kind, name, detail, prev_hash, hash) "
        "VALUES (6, :at, 'mallory', 'x', 'Queue', 'q', '{}', :prev, :h)",
        at=T0.replace(tzinfo=None) if store.dialect == "sqlite" else T0,
        prev=store.audit_head()[1],
        h="f" * 64,
    )
    res = store.verify_audit()
    assert (res.ok, res.first_bad_seq) == (False, 6)


def test_tamper_truncate_tail(store: Store) -> None:
    _five(store)
    raw(store, "DELETE FROM audit WHERE seq >= 4")
    res = store.verify_audit()
    assert (res.ok, res.first_bad_seq) == (False, 4) and "tail" in res.problem


def test_tamper_truncate_tail_and_anchor_caught_by_external_head(store: Store) -> None:
    _five(store)
    count, head = store.audit_head()  # an operator's external copy
    second = store.audit_records()[1]
    raw(store, "DELETE FROM audit WHERE seq >= 3")
    raw(store, "UPDATE audit_anchor SET count = 2, head_hash = :h", h=second.hash)
    assert store.verify_audit().ok  # self-consistent forgery...
    res = store.verify_audit(expected_count=count, expected_head=head)  # ...but not vs the external anchor
    assert (res.ok, res.first_bad_seq) == (False, 3)


def test_tamper_reorder_rows(store: Store) -> None:
    _five(store)
    raw(store, "UPDATE audit SET seq = 100 WHERE seq = 2")
    raw(store, "UPDATE audit SET seq = 2 WHERE seq = 3")
    raw(store, "UPDATE audit SET seq = 3 WHERE seq = 100")
    res = store.verify_audit()
    assert (res.ok, res.first_bad_seq) == (False, 2)


def test_export_formats(store: Store) -> None:
    _five(store)
    buf = io.StringIO()
    assert store.export_audit("jsonl", buf) == 5
    lines = buf.getvalue().splitlines()
    assert len(lines) == 5
    first = json.loads(lines[0])
    assert set(first) == {"seq", "at", "actor", "action", "kind", "name", "detail", "prev_hash", "hash"}
    assert first["at"] == "2026-03-01T12:00:00.123456+00:00"
    count, head = store.audit_head()
    assert verify(read_jsonl(lines), expected_count=count, expected_head=head).ok
    assert read_jsonl(lines) == store.audit_records()

    cbuf = io.StringIO()
    assert store.export_audit("csv", cbuf) == 5
    assert cbuf.getvalue().splitlines()[0].startswith("seq,at,actor")
    assert verify(read_csv(io.StringIO(cbuf.getvalue())), expected_count=count, expected_head=head).ok
    with pytest.raises(ValidationFailed):
        store.export_audit("xml", io.StringIO())  # type: ignore[arg-type]


# -------------------------------------------------------------------- tokens


def test_tokens(store: Store) -> None:
    issued = store.create_token("ci", Role.MEMBER, "team-a", audit=AuditEntry("root", "token.create"))
    assert issued.record.role == "member" and issued.record.scope == "team-a" and not issued.record.revoked
    p = store.authenticate(issued.token)
    assert p is not None and (p.name, p.role, p.scope, p.token_id) == (
        "ci",
        Role.MEMBER,
        "team-a",
        issued.record.id,
    )
    assert store.authenticate(issued.token + "x") is None
    assert store.authenticate("") is None
    with store.engine.connect() as conn:
        stored = conn.execute(sa.text("SELECT token_hash FROM tokens")).scalars().all()
    assert issued.token not in stored and all(len(h) == 64 for h in stored)
    assert store.audit_records()[0].detail["role"] == "member"

    revoked = store.revoke_token(issued.record.id, audit=AuditEntry("root", "token.revoke"))
    assert revoked.revoked and revoked.revoked_at == T0
    assert store.authenticate(issued.token) is None
    assert store.revoke_token(issued.record.id).revoked  # idempotent
    assert store.list_tokens(include_revoked=False) == []
    assert len(store.list_tokens()) == 1
    with pytest.raises(NotFound):
        store.revoke_token(999)


@pytest.mark.parametrize(
    ("role", "scope", "field"),
    [
        ("member", None, "scope"),
        ("queue-admin", None, "scope"),
        ("platform-admin", "q", "scope"),
        ("god", None, "role"),
    ],
)
def test_token_validation(store: Store, role: str, scope: str | None, field: str) -> None:
    with pytest.raises(ValidationFailed) as ei:
        store.create_token("x", role, scope)
    assert ei.value.field == field


def test_bootstrap_admin_once(store: Store) -> None:
    token = store.ensure_bootstrap_admin()
    assert token is not None
    p = store.authenticate(token)
    assert p is not None and p.role is Role.PLATFORM_ADMIN and p.scope is None
    assert store.ensure_bootstrap_admin() is None
    assert store.audit_records()[0].action == "token.bootstrap"


# ----------------------------------------------------------------- approvals


def test_approval_flow(store: Store, clock: FakeClock) -> None:
    store.submit_workload(workload(), owner="alice", phase="AwaitingApproval")
    ap = store.request_approval("train-1", "alice", expires_at=T0 + timedelta(hours=1), reason="big job")
    assert ap.state == "Pending"
    with pytest.raises(Conflict):
        store.request_approval("train-1", "alice", expires_at=T0 + timedelta(hours=1))
    with pytest.raises(Conflict) as ei:
        store.decide_approval(ap.id, approver="alice", approve=True)
    assert ei.value.field == "approver"
    clock.advance(60)
    done = store.decide_approval(
        ap.id, approver="qa", approve=True, audit=AuditEntry("qa", "approval.approve")
    )
    assert (done.state, done.approver, done.decided_at) == ("Approved", "qa", T0 + timedelta(seconds=60))
    assert store.get_workload("train-1").phase == "Pending"
    with pytest.raises(Conflict):
        store.decide_approval(ap.id, approver="qa", approve=False)
    assert store.list_approvals(state="Approved") == [done]
    with pytest.raises(NotFound):
        store.request_approval("ghost", "alice", expires_at=T0 + timedelta(hours=2))
    with pytest.raises(ValidationFailed):
        store.request_approval("train-1", "alice", expires_at=T0 - timedelta(hours=2))


def test_approval_reject_and_expiry(store: Store, clock: FakeClock) -> None:
    store.submit_workload(workload("a"), owner="alice", phase="AwaitingApproval")
    store.submit_workload(workload("b"), owner="alice", phase="AwaitingApproval")
    ra = store.request_approval("a", "alice", expires_at=T0 + timedelta(minutes=5))
    rb = store.request_approval("b", "alice", expires_at=T0 + timedelta(minutes=5))
    store.decide_approval(ra.id, approver="qa", approve=False, reason="too big")
    a = store.get_workload("a")
    assert (a.phase, a.reason) == ("Rejected", "too big") and a.finished_at == T0
    clock.advance(301)
    with pytest.raises(Conflict) as ei:
        store.decide_approval(rb.id, approver="qa", approve=True)
    assert ei.value.field == "expires_at"
    expired = store.expire_approvals()
    assert [e.id for e in expired] == [rb.id] and expired[0].state == "Expired"
    assert store.get_workload("b").phase == "Rejected"
    assert store.audit_records()[-1].action == "approval.expire"
    assert store.expire_approvals() == []
    with pytest.raises(NotFound):
        store.get_approval(12345)


# --------------------------------------------------------------- concurrency


def _run_threads(n: int, target: Callable[[int], None]) -> list[BaseException]:
    errors: list[BaseException] = []

    def wrap(i: int) -> None:
        try:
            target(i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=wrap, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def test_concurrent_audit_appends_serialize(url: str) -> None:
    stores = [Store.open(url) for _ in range(2)]  # two engines = two "processes"
    try:

        def work(i: int) -> None:
            s = stores[i % 2]
            for k in range(15):
                s.append_audit(AuditEntry(f"t{i}", "append", detail={"k": k}))

        assert _run_threads(6, work) == []
        res = stores[0].verify_audit()
        assert res.ok and res.count == 90, res
    finally:
        for s in stores:
            s.close()


def test_concurrent_identical_submits_create_one(url: str) -> None:
    s = Store.open(url)
    try:
        results: list[bool] = []

        def work(_: int) -> None:
            results.append(s.submit_workload(workload("race"), owner="alice")[1])

        assert _run_threads(6, work) == []
        assert sorted(results) == [False] * 5 + [True]
        assert len(s.list_workloads()) == 1
    finally:
        s.close()


def test_errors_are_typed() -> None:
    assert issubclass(NotFound, StoreError) and issubclass(Conflict, StoreError)
    e = ValidationFailed("spec.queue", "required")
    assert str(e) == "spec.queue: required"


def test_concurrent_first_open_migrates_once(url: str) -> None:
    opened: list[Store] = []

    def work(_: int) -> None:
        opened.append(Store.open(url))

    try:
        assert _run_threads(4, work) == []
        assert len(opened) == 4
        with opened[0].engine.connect() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM alembic_version")).scalar() == 1
            assert conn.execute(sa.text("SELECT count(*) FROM audit_anchor")).scalar() == 1
    finally:
        for s in opened:
            s.close()
