"""Connecting to the database and migrating it, and the ``Database`` part every repository
writes through: engine settings for SQLite and PostgreSQL, sessions, the fence, the clock.

Why the SQLite settings: WAL and an explicit ``BEGIN IMMEDIATE`` for writers make concurrent
writers queue on the lock instead of deadlocking on a lock upgrade.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool

from gpupool.store import lease as leaselib
from gpupool.store.errors import ValidationFailed
from gpupool.store.rows import ANCHOR
from gpupool.store.turns import WriteTurn

DEFAULT_URL = "sqlite:///./.gpupool/gpupool.db"
MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"
SQLITE_BUSY_TIMEOUT_MS = 30_000


def create_engine(url: str, echo: bool) -> Engine:
    """SQLite: WAL, foreign keys, busy timeout, explicit BEGIN (IMMEDIATE for writers). PG: pre-ping."""
    u = make_url(url)
    if u.get_backend_name() != "sqlite":
        return sa.create_engine(u, echo=echo, pool_pre_ping=True)
    db = u.database or ""
    memory = db in ("", ":memory:") or "mode=memory" in db or u.query.get("mode") == "memory"
    kwargs: dict[str, Any] = {
        "connect_args": {"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000, "check_same_thread": False}
    }
    if memory:
        kwargs["poolclass"] = StaticPool
    else:
        Path(db).expanduser().parent.mkdir(parents=True, exist_ok=True)
    engine = sa.create_engine(u, echo=echo, **kwargs)

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # we issue BEGIN ourselves (see _on_begin)
        cur = dbapi_conn.cursor()
        if not memory:
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cur.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        # Writers take the write lock up front: no lock-upgrade deadlocks, appends serialize.
        mode = conn.get_execution_options().get("gpupool_begin", "DEFERRED")
        conn.exec_driver_sql(f"BEGIN {mode}")

    return engine


def lease_engine(engine: Engine) -> Engine:
    """An engine of one connection for the leader lease alone, on ``engine``'s database.

    Why its own: the lease is renewed from its own thread; sharing the store's pool, a renewal
    could wait for a connection behind busy request threads until the lease expired. An
    in-memory SQLite database exists only on the store's one connection: it is shared there."""
    if isinstance(engine.pool, StaticPool):
        return engine
    url = engine.url.render_as_string(hide_password=False)
    if engine.dialect.name == "sqlite":
        return create_engine(url, bool(engine.echo))
    return sa.create_engine(url, echo=engine.echo, pool_pre_ping=True, pool_size=1, max_overflow=1)


def run_migrations(engine: Engine) -> None:
    """Upgrade the database to head, serialized against other processes doing the same."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    locked = engine.execution_options(gpupool_begin="IMMEDIATE")
    with locked.connect() as conn, conn.begin():
        if conn.dialect.name == "postgresql":
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(7461931)"))
        cfg.attributes["connection"] = conn
        refuse_newer_store(conn, ScriptDirectory.from_config(cfg))
        command.upgrade(cfg, "head")


class StoreTooNew(RuntimeError):
    """The database was migrated by a newer gpupool than this one (a rollback of the binary
    without its store): running on it would misread columns this release does not know."""


def refuse_newer_store(conn: sa.Connection, scripts: ScriptDirectory) -> None:
    """Raise StoreTooNew when the store's Alembic revision is not one this release ships.

    Why refuse and not just run: Alembic would fail deep inside with "Can't locate revision",
    and a downgrade is not ours to do implicitly; the message names both revisions so the
    operator knows to run the newer release (or restore a backup)."""
    current = MigrationContext.configure(conn).get_current_heads()
    known = {rev.revision for rev in scripts.walk_revisions()}
    unknown = sorted(r for r in current if r not in known)
    if unknown:
        head = scripts.get_current_head()
        raise StoreTooNew(
            f"the store is at schema revision {', '.join(unknown)}, newer than this gpupool "
            f"(its newest revision is {head}): run the release that migrated it, or restore a backup"
        )


Clock = Callable[[], datetime]


def utcnow() -> datetime:
    """The default clock: now, in UTC."""
    return datetime.now(UTC)


class Database:
    """The engine, its read and write sessions, the fence and the clock: what every repository
    of the store writes through.

    Why one object passed to each repository: they all write the same way (the audit anchor
    locked first, the fence checked, one transaction per call) and share one fence, so a fenced
    view of the store is a fenced copy of this object and nothing else (``fenced``).
    """

    def __init__(self, engine: Engine, *, clock: Clock | None = None) -> None:
        self.engine = engine
        self.clock: Clock = clock or utcnow
        sqlite = engine.dialect.name == "sqlite"
        writer = engine.execution_options(gpupool_begin="IMMEDIATE") if sqlite else engine
        snapshot = engine if sqlite else engine.execution_options(isolation_level="REPEATABLE READ")
        #: the writer engine for Core-level bulk writes that open their own connection
        self.core_writer = writer
        self._reader = sessionmaker(engine, expire_on_commit=False)
        self._writer = sessionmaker(writer, expire_on_commit=False)
        self._snapshot = sessionmaker(snapshot, expire_on_commit=False)
        #: fencing token every write of this view checks (None: unfenced; see ``fenced``)
        self.fence: int | None = None
        self.fence_idle_ms = 0
        #: the lease keeper's own connection (gpupool.store.leadership) and its turn at the
        #: database between a bulk write's batches (gpupool.store.turns); shared by fenced views
        self.lease_engine = lease_engine(engine)
        self.turn = WriteTurn()

    @property
    def dialect(self) -> str:
        """``sqlite`` or ``postgresql``."""
        return str(self.engine.dialect.name)

    def fenced(self, epoch: int, idle_timeout_s: float) -> Database:
        """A copy whose every write transaction first checks the lease's ``epoch``; it shares
        the engine, the sessions and the write turn (do not ``close`` it)."""
        view = copy.copy(self)
        view.fence = epoch
        view.fence_idle_ms = max(1, int(idle_timeout_s * 1000))
        return view

    def close(self) -> None:
        """Release pooled connections (the lease keeper's too)."""
        if self.lease_engine is not self.engine:
            self.lease_engine.dispose()
        self.engine.dispose()

    @contextmanager
    def write(self, join: Session | None = None) -> Iterator[Session]:
        """One write transaction, or ``join``: the transaction a caller already opened (so a
        write spanning aggregates is one transaction; its opener locked and checked already).

        On PostgreSQL it takes the audit anchor's row lock first: every writer then locks in the
        same order (anchor, then rows), so a scheduling cycle, a batch of submits and an
        approval can never deadlock each other. (SQLite's writer is already exclusive.)"""
        if join is not None:
            yield join
            return
        with self._writer.begin() as s:
            if self.dialect == "postgresql":
                s.execute(sa.select(ANCHOR.c.id).where(ANCHOR.c.id == 1).with_for_update())
            self.check_fence(s.connection())
            yield s

    def check_fence(self, conn: sa.Connection) -> None:
        """In a fenced view, fail the transaction (NotLeader) unless we still hold the lease."""
        if self.fence is not None:
            leaselib.check_fence(conn, self.fence, self.fence_idle_ms)

    @contextmanager
    def read(self, snapshot: bool = False) -> Iterator[Session]:
        """A read transaction; ``snapshot``: one consistent view (REPEATABLE READ on PostgreSQL)."""
        with (self._snapshot if snapshot else self._reader).begin() as s:
            yield s

    def now(self, at: datetime | None) -> datetime:
        """``at`` (or the clock's now) in UTC; a naive time is refused, naming the field."""
        now = at if at is not None else self.clock()
        if now.tzinfo is None:
            raise ValidationFailed("at", "times must be timezone-aware")
        return now.astimezone(UTC)

    def lease_writer(self) -> sa.Engine:
        """The lease's own connection, writing as the store's writers do (SQLite: BEGIN IMMEDIATE)."""
        eng = self.lease_engine
        return eng.execution_options(gpupool_begin="IMMEDIATE") if eng.dialect.name == "sqlite" else eng
