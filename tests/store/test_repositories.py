"""The store's parts in isolation: a repository built over a ``Database`` and an ``AuditLog``
alone, a write joining a transaction another opened, and a fenced copy of the ``Database``.

Why: ``Store`` only composes these parts; each must work when given just what it needs.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpupool.audit import AuditEntry
from gpupool.store import NotLeader
from gpupool.store.audit_log import AuditLog
from gpupool.store.database import Database, create_engine, run_migrations
from gpupool.store.leadership import LeaseRepository
from gpupool.store.objects import ObjectRepository
from gpupool.store.records import API_VERSION
from gpupool.store.tokens import TokenRepository
from gpupool.store.validation import object_parts
from tests import pg

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    def opened(url: str) -> Database:
        engine = create_engine(url, False)
        run_migrations(engine)
        return Database(engine, clock=lambda: T0)

    if request.param == "sqlite":
        d = opened(f"sqlite:///{tmp_path}/gpupool.db")
        yield d
        d.close()
    else:
        with pg.fresh_schema_url() as url:
            d = opened(url)
            yield d
            d.close()


def _queue(name: str) -> dict[str, object]:
    return {"apiVersion": API_VERSION, "kind": "Queue", "metadata": {"name": name}, "spec": {}}


def test_token_repository_alone_audits_in_its_write(db: Database) -> None:
    audit = AuditLog(db)
    tokens = TokenRepository(db, audit)
    issued = tokens.create_token("ci", "member", "team-a", audit=AuditEntry("alice", "token.create"))
    principal = tokens.authenticate(issued.token)
    assert principal is not None and principal.scope == "team-a"
    (rec,) = audit.audit_records()
    assert (rec.actor, rec.action, rec.kind, rec.name) == ("alice", "token.create", "Token", "ci")
    assert audit.verify_audit().ok


def test_a_write_joining_another_transaction_rolls_back_with_it(db: Database) -> None:
    audit = AuditLog(db)
    objects = ObjectRepository(db, audit, TokenRepository(db, audit))
    entry = AuditEntry("alice", "object.create")
    with pytest.raises(RuntimeError), db.write() as s:
        with db.write(join=s) as joined:
            assert joined is s
            objects.put_in(joined, object_parts(_queue("team-a")), "create", None, entry, T0)
        audit.append(s, AuditEntry("alice", "onboard"), T0)
        raise RuntimeError("the opener fails after both writes")
    assert objects.list_objects("Queue") == [] and audit.audit_records() == []
    with db.write() as s:
        objects.put_in(s, object_parts(_queue("team-a")), "create", None, entry, T0)
        audit.append(s, AuditEntry("alice", "onboard"), T0)
    assert [r.name for r in objects.list_objects("Queue")] == ["team-a"]
    assert [r.action for r in audit.audit_records()] == ["object.create", "onboard"]


def test_a_fenced_copy_refuses_writes_once_the_lease_moved_on(db: Database) -> None:
    leases = LeaseRepository(db)
    first = leases.acquire_lease("a", "http://a", 30.0)
    assert first is not None
    stale = db.fenced(first.epoch, idle_timeout_s=4.0)
    assert db.fence is None and stale.engine is db.engine and stale.turn is db.turn
    with stale.write():
        pass  # still the holder's epoch
    assert leases.acquire_lease("b", "http://b", 30.0, dead_holder="a") is not None
    audit = AuditLog(stale)
    with pytest.raises(NotLeader):
        audit.append_audit(AuditEntry("a", "late.write"))
    assert AuditLog(db).audit_records() == []  # the plain database is not fenced
