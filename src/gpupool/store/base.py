"""The store's plumbing every part shares: sessions, transactions, the clock, the fence and
appending to the audit chain inside a caller's transaction.

Why one base: each kind of state (objects, workloads, tokens, approvals ...) is a mixin over
this class, so they all write the same way: the anchor locked first, the fence checked, the
audit record in the same transaction as the change.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Self

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from gpupool import audit as auditlog
from gpupool.audit import AuditEntry, AuditRecord
from gpupool.store import lease as leaselib
from gpupool.store.database import DEFAULT_URL, create_engine, lease_engine, run_migrations
from gpupool.store.errors import ValidationFailed
from gpupool.store.rows import ANCHOR, AUDIT
from gpupool.store.schema import AuditAnchorRow, AuditRow
from gpupool.store.turns import WriteTurn

Clock = Callable[[], datetime]


def utcnow() -> datetime:
    """The default clock: now, in UTC."""
    return datetime.now(UTC)


def chain_rows(
    entries: Sequence[AuditEntry], now: datetime, count: int, head: str
) -> tuple[list[dict[str, Any]], int, str]:
    """Audit rows chained after (count, head) from the locked anchor; returns (rows, count, head)."""
    rows = []
    for entry in entries:
        try:
            rec = auditlog.chain(entry, seq=count + 1, at=now, prev_hash=head)
        except ValueError as exc:
            raise ValidationFailed("audit", str(exc)) from exc
        count, head = rec.seq, rec.hash
        rows.append(
            {
                "seq": rec.seq,
                "at": rec.at,
                "actor": rec.actor,
                "action": rec.action,
                "kind": rec.kind,
                "name": rec.name,
                "detail": dict(rec.detail),
                "prev_hash": rec.prev_hash,
                "hash": rec.hash,
            }
        )
    return rows, count, head


class StoreBase:
    """Engine, sessions and the shared write path of the store (see ``Store``)."""

    def __init__(self, engine: Engine, *, clock: Clock | None = None) -> None:
        self.engine = engine
        self.clock: Clock = clock or utcnow
        sqlite = engine.dialect.name == "sqlite"
        writer = engine.execution_options(gpupool_begin="IMMEDIATE") if sqlite else engine
        snapshot = engine if sqlite else engine.execution_options(isolation_level="REPEATABLE READ")
        self._core_writer = writer
        self._reader = sessionmaker(engine, expire_on_commit=False)
        self._writer = sessionmaker(writer, expire_on_commit=False)
        self._snapshot = sessionmaker(snapshot, expire_on_commit=False)
        #: fencing token every write of this view checks (None: unfenced; see ``fenced``)
        self._fence: int | None = None
        self._fence_idle_ms = 0
        #: the lease keeper's own connection (gpupool.store.leadership) and its turn at the
        #: database between a bulk write's batches (gpupool.store.turns); shared by fenced views
        self._lease_engine = lease_engine(engine)
        self.turn = WriteTurn()

    @classmethod
    def open(cls, url: str = DEFAULT_URL, *, clock: Clock | None = None, echo: bool = False) -> Self:
        """Connect and migrate to the latest schema (``alembic upgrade head``); no separate step."""
        engine = create_engine(url, echo)
        try:
            run_migrations(engine)
        except Exception:
            engine.dispose()
            raise
        return cls(engine, clock=clock)

    def close(self) -> None:
        """Release pooled connections (the lease keeper's too)."""
        if self._lease_engine is not self.engine:
            self._lease_engine.dispose()
        self.engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def dialect(self) -> str:
        """``sqlite`` or ``postgresql``."""
        return str(self.engine.dialect.name)

    def ping(self) -> None:
        """One round trip to the database; raises what the driver raises when it is unreachable
        (readiness reports the exception's type)."""
        with self.engine.connect() as c:
            c.execute(sa.text("SELECT 1"))

    @contextmanager
    def _write(self) -> Iterator[Session]:
        """One write transaction. On PostgreSQL it takes the audit anchor's row lock first:
        every writer then locks in the same order (anchor, then rows), so a scheduling cycle, a
        batch of submits and an approval can never deadlock each other. (SQLite's writer is
        already exclusive.)"""
        with self._writer.begin() as s:
            if self.dialect == "postgresql":
                s.execute(sa.select(ANCHOR.c.id).where(ANCHOR.c.id == 1).with_for_update())
            self._check_fence(s.connection())
            yield s

    def _check_fence(self, conn: sa.Connection) -> None:
        """In a fenced view, fail the transaction (NotLeader) unless we still hold the lease."""
        if self._fence is not None:
            leaselib.check_fence(conn, self._fence, self._fence_idle_ms)

    @contextmanager
    def _read(self, snapshot: bool = False) -> Iterator[Session]:
        with (self._snapshot if snapshot else self._reader).begin() as s:
            yield s

    def _now(self, at: datetime | None) -> datetime:
        now = at if at is not None else self.clock()
        if now.tzinfo is None:
            raise ValidationFailed("at", "times must be timezone-aware")
        return now.astimezone(UTC)

    def _audit(
        self, s: Session, entry: AuditEntry | None, at: datetime, kind: str = "", name: str = ""
    ) -> AuditRecord | None:
        """Append to the chain inside the caller's transaction (its writer locked the anchor first)."""
        if entry is None:
            return None
        entry = replace(entry, kind=entry.kind or kind, name=entry.name or name)
        anchor = s.execute(
            sa.select(AuditAnchorRow)
            .where(AuditAnchorRow.id == 1)
            .with_for_update()
            .execution_options(populate_existing=True)
        ).scalar_one()
        try:
            rec = auditlog.chain(entry, seq=anchor.count + 1, at=at, prev_hash=anchor.head_hash)
        except ValueError as exc:
            raise ValidationFailed("audit", str(exc)) from exc
        s.add(
            AuditRow(
                seq=rec.seq,
                at=rec.at,
                actor=rec.actor,
                action=rec.action,
                kind=rec.kind,
                name=rec.name,
                detail=dict(rec.detail),
                prev_hash=rec.prev_hash,
                hash=rec.hash,
            )
        )
        anchor.count = rec.seq
        anchor.head_hash = rec.hash
        s.flush()
        return rec

    def _audit_many(
        self, s: Session, entries: Sequence[AuditEntry], at: datetime, kind: str = "", name: str = ""
    ) -> None:
        """Append several records under one anchor lock, one INSERT and one anchor update.

        Why: a scheduling cycle (or a bulk cancel) audits one decision per workload; appending
        them one by one cost an anchor read and a flush each.
        """
        if len(entries) <= 1:
            for entry in entries:
                self._audit(s, entry, at, kind, name)
            return
        s.flush()
        conn = s.connection()
        row = conn.execute(
            sa.select(ANCHOR.c.count, ANCHOR.c.head_hash).where(ANCHOR.c.id == 1).with_for_update()
        ).one()
        full = [replace(e, kind=e.kind or kind, name=e.name or name) for e in entries]
        rows, count, head = chain_rows(full, at, int(row[0]), str(row[1]))
        conn.execute(sa.insert(AUDIT), rows)
        conn.execute(sa.update(ANCHOR).where(ANCHOR.c.id == 1).values(count=count, head_hash=head))
