"""PostgreSQL group commit in three round trips (psycopg pipeline mode).

Why: on PostgreSQL each statement is a round trip to another process; on a busy machine
every one of them waits to be scheduled, and the batch (anchor lock, insert, events, audit,
anchor update, commit) took seven. Pipelined, it takes three: [lock anchor + insert],
[events + audit + anchor update], [commit], with the same statements and the same
transaction. Durability is unchanged (the commit is a normal synchronous commit).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError

from gpupool.store.records import WorkloadSubmission
from gpupool.store.rows import chunks

_WORKLOAD_COLUMNS = (
    "name, queue, priority_class, owner, manifest, phase, placement, reason, "
    "submitted_at, admitted_at, finished_at, resource_version"
)


@functools.cache
def pg_pipeline_ok() -> bool:
    try:
        import psycopg
    except ImportError:  # pragma: no cover - psycopg is a dependency
        return False
    return bool(psycopg.Pipeline.is_supported())


def _raw_connection(conn: sa.Connection) -> Any:
    return conn.connection.dbapi_connection


def pg_lock_and_insert(
    conn: sa.Connection, subs: Sequence[WorkloadSubmission], now: datetime
) -> tuple[tuple[int, str], dict[str, int]]:
    """``Store._lock_and_insert`` in one round trip (errors surface as SQLAlchemy DBAPIError)."""
    from psycopg.types.json import Json

    raw = _raw_connection(conn)
    try:
        with raw.pipeline(), raw.cursor() as c1:
            c1.execute("SELECT count, head_hash FROM audit_anchor WHERE id = 1 FOR UPDATE")
            curs = []
            for part in chunks(subs):
                cur = raw.cursor()
                curs.append(cur)
                cur.execute(
                    f"INSERT INTO workloads ({_WORKLOAD_COLUMNS}) VALUES "
                    + ",".join(["(%s,%s,%s,%s,%s,%s,NULL,'',%s,NULL,NULL,1)"] * len(part))
                    + " ON CONFLICT (name) DO NOTHING RETURNING seq, name",
                    [
                        v
                        for sub in part
                        for v in (
                            sub.name,
                            sub.queue,
                            sub.priority_class,
                            sub.owner,
                            Json(sub.manifest),
                            sub.phase,
                            now,
                        )
                    ],
                )
            row = c1.fetchone()
            seqs: dict[str, int] = {}
            for cur in curs:
                seqs.update((name, seq) for seq, name in cur.fetchall())
                cur.close()
    except Exception as exc:
        raise _as_dbapi_error(exc) from exc
    assert row is not None
    return (int(row[0]), str(row[1])), seqs


def pg_append(
    conn: sa.Connection,
    events: Sequence[Mapping[str, Any]],
    audit_rows: Sequence[Mapping[str, Any]],
    count: int,
    head: str,
) -> None:
    """Events, audit records and the anchor update in one round trip."""
    from psycopg.types.json import Json

    raw = _raw_connection(conn)
    try:
        with raw.pipeline(), raw.cursor() as cur:
            for part in chunks(events):
                cur.execute(
                    "INSERT INTO events (workload, type, reason, message, at) VALUES "
                    + ",".join(["(%s,%s,%s,%s,%s)"] * len(part)),
                    [v for e in part for v in (e["workload"], e["type"], e["reason"], e["message"], e["at"])],
                )
            for part in chunks(audit_rows):
                cur.execute(
                    "INSERT INTO audit (seq, at, actor, action, kind, name, detail, prev_hash, hash) VALUES "
                    + ",".join(["(%s,%s,%s,%s,%s,%s,%s,%s,%s)"] * len(part)),
                    [
                        v
                        for a in part
                        for v in (
                            a["seq"],
                            a["at"],
                            a["actor"],
                            a["action"],
                            a["kind"],
                            a["name"],
                            Json(a["detail"]),
                            a["prev_hash"],
                            a["hash"],
                        )
                    ],
                )
            if audit_rows:
                cur.execute("UPDATE audit_anchor SET count = %s, head_hash = %s WHERE id = 1", (count, head))
    except Exception as exc:
        raise _as_dbapi_error(exc) from exc


def _as_dbapi_error(exc: Exception) -> Exception:
    """psycopg errors from the raw connection as SQLAlchemy's, as every other store call raises."""
    import psycopg

    if isinstance(exc, psycopg.Error):
        return DBAPIError(None, None, exc)
    return exc
