"""The store's plumbing while its mixins become repositories: a ``Database`` (sessions,
transactions, the clock, the fence) and an ``AuditLog`` (appends inside a caller's
transaction), with the names the mixins still call.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Self

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from gpupool.audit import AuditEntry, AuditRecord
from gpupool.store.audit_log import AuditLog, chain_rows
from gpupool.store.database import (
    DEFAULT_URL,
    Clock,
    Database,
    create_engine,
    run_migrations,
    utcnow,
)
from gpupool.store.turns import WriteTurn

__all__ = ["Clock", "StoreBase", "chain_rows", "utcnow"]


class StoreBase:
    """The parts every mixin of the store writes through (see ``Store``): a ``Database`` and
    its ``AuditLog``; the methods below delegate to them while the mixins become repositories."""

    def __init__(self, engine: Engine, *, clock: Clock | None = None) -> None:
        self._compose(Database(engine, clock=clock))

    def _compose(self, db: Database) -> None:
        self.db = db
        self.audit_log = AuditLog(db)

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
        self.db.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def engine(self) -> Engine:
        """The SQLAlchemy engine (shared by fenced views)."""
        return self.db.engine

    @property
    def clock(self) -> Clock:
        """The store's clock (tests set it to drive time)."""
        return self.db.clock

    @clock.setter
    def clock(self, clock: Clock) -> None:
        self.db.clock = clock

    @property
    def turn(self) -> WriteTurn:
        """The lease keeper's turn at the database between a bulk write's batches."""
        return self.db.turn

    @property
    def dialect(self) -> str:
        """``sqlite`` or ``postgresql``."""
        return self.db.dialect

    def ping(self) -> None:
        """One round trip to the database; raises what the driver raises when it is unreachable
        (readiness reports the exception's type)."""
        with self.engine.connect() as c:
            c.execute(sa.text("SELECT 1"))

    @property
    def _core_writer(self) -> Engine:
        return self.db.core_writer

    @property
    def _lease_engine(self) -> Engine:
        return self.db.lease_engine

    def _write(self) -> AbstractContextManager[Session]:
        return self.db.write()

    def _check_fence(self, conn: sa.Connection) -> None:
        self.db.check_fence(conn)

    def _read(self, snapshot: bool = False) -> AbstractContextManager[Session]:
        return self.db.read(snapshot)

    def _now(self, at: datetime | None) -> datetime:
        return self.db.now(at)

    def _audit(
        self, s: Session, entry: AuditEntry | None, at: datetime, kind: str = "", name: str = ""
    ) -> AuditRecord | None:
        return self.audit_log.append(s, entry, at, kind, name)

    def _audit_many(
        self, s: Session, entries: Sequence[AuditEntry], at: datetime, kind: str = "", name: str = ""
    ) -> None:
        self.audit_log.append_many(s, entries, at, kind, name)
