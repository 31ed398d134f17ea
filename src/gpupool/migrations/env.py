"""Alembic environment for gpupool.

Why: migrations ship inside the package and run programmatically from
``Store.open``; the store hands over an open connection (already inside a
locked transaction) via ``config.attributes["connection"]``. Run standalone
(``alembic -c src/gpupool/migrations/alembic.ini upgrade head``) it builds an
engine from ``sqlalchemy.url`` / ``GPUPOOL_DB_URL``.
"""

from __future__ import annotations

import os

import sqlalchemy as sa
from alembic import context

from gpupool.store.schema import Base

config = context.config
target_metadata = Base.metadata


def _run(connection: sa.Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Use the caller's connection when given, else connect from the configured URL."""
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = os.environ.get("GPUPOOL_DB_URL") or config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("set GPUPOOL_DB_URL or sqlalchemy.url")
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        _run(conn)
        conn.commit()
    engine.dispose()


if context.is_offline_mode():
    raise RuntimeError("offline (SQL script) migrations are not supported; use Store.open")
run_migrations_online()
