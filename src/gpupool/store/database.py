"""Connecting to the database and migrating it: engine settings for SQLite and PostgreSQL.

Why the SQLite settings: WAL and an explicit ``BEGIN IMMEDIATE`` for writers make concurrent
writers queue on the lock instead of deadlocking on a lock upgrade.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.pool import StaticPool

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
