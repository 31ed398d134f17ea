"""PostgreSQL helpers for tests (``from tests import pg``; not a conftest on purpose).

Why: the store must pass the same tests on PostgreSQL as on SQLite. Tests read
``GPUPOOL_TEST_PG_URL`` (``.ci/postgres.sh`` starts a server and prints one) and
skip with a clear reason when it is unset or unreachable. Each test gets its own
fresh schema (via the libpq ``options=-csearch_path=...`` URL parameter), dropped
afterwards, so tests never see each other's tables.
"""

from __future__ import annotations

import functools
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

ENV = "GPUPOOL_TEST_PG_URL"


@functools.cache
def _probe(url: str) -> str | None:
    """None when the server answers, else why not (cached: probe once per process)."""
    try:
        engine = sa.create_engine(url, connect_args={"connect_timeout": 3})
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
        engine.dispose()
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return None


def pg_url() -> str:
    """The base PostgreSQL URL, or skip the test when none is configured or reachable."""
    url = os.environ.get(ENV)
    # CI sets GPUPOOL_REQUIRE_PG=1: there a missing server is a failure, not a quiet skip
    give_up = pytest.fail if os.environ.get("GPUPOOL_REQUIRE_PG") == "1" else pytest.skip
    if not url:
        give_up(f"no PostgreSQL: {ENV} is not set (run .ci/postgres.sh and export the URL it prints)")
        raise AssertionError  # unreachable
    problem = _probe(url)
    if problem is not None:
        give_up(f"no PostgreSQL: cannot connect to {make_url(url).render_as_string()}: {problem}")
    return url


def with_search_path(url: str, schema: str) -> str:
    """``url`` with every connection's search_path set to ``schema``."""
    u = make_url(url).update_query_dict({"options": f"-csearch_path={schema}"})
    return u.render_as_string(hide_password=False)


@contextmanager
def fresh_schema_url() -> Iterator[str]:
    """Create a unique empty schema, yield a URL that uses it, then drop it."""
    base = pg_url()
    schema = f"t_{uuid.uuid4().hex[:16]}"
    admin = sa.create_engine(base)
    try:
        with admin.begin() as conn:
            conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
        yield with_search_path(base, schema)
    finally:
        with admin.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        admin.dispose()
