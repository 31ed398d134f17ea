"""The tables as SQLAlchemy Core handles, and each ORM row as the record the store returns.

Why records, not rows: callers get plain frozen values that outlive the session, and the
store's layout can change without them noticing.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from gpupool.audit import AuditRecord
from gpupool.store.records import ApprovalRecord, EventRecord, ObjectRecord, TokenRecord, WorkloadRecord
from gpupool.store.schema import (
    ApprovalRow,
    AuditAnchorRow,
    AuditRow,
    EventRow,
    ObjectRow,
    TokenRow,
    WorkloadRow,
)

#: the largest value an id or seq column holds on every backend: they are INTEGER, which
#: PostgreSQL keeps in 32 bits (SQLite in 64). Why it matters: PostgreSQL refuses to compare an
#: INTEGER column with a larger parameter (NumericValueOutOfRange, a 500) where SQLite answers,
#: so a cursor or id past it is answered here, the same on both, before the query is sent.
INT_MAX = 2**31 - 1


def beyond_ids(value: int) -> bool:
    """True when no id or seq column can hold ``value`` (no row has it, none lies after it)."""
    return value > INT_MAX


def table_of(cls: Any) -> sa.Table:
    t: sa.Table = cls.__table__
    return t


WORKLOADS, EVENTS, AUDIT, ANCHOR = (
    table_of(WorkloadRow),
    table_of(EventRow),
    table_of(AuditRow),
    table_of(AuditAnchorRow),
)


def object_record(row: ObjectRow) -> ObjectRecord:
    return ObjectRecord(
        row.kind,
        row.name,
        row.spec,
        row.labels,
        row.annotations,
        row.resource_version,
        row.created_at,
        row.updated_at,
    )


def workload_record(row: Any) -> WorkloadRecord:
    """A Core result row of the workloads table as a record."""
    return WorkloadRecord(
        seq=row.seq,
        name=row.name,
        queue=row.queue,
        priority_class=row.priority_class,
        owner=row.owner,
        manifest=row.manifest,
        phase=row.phase,
        placement=row.placement,
        reason=row.reason,
        submitted_at=row.submitted_at,
        admitted_at=row.admitted_at,
        finished_at=row.finished_at,
        resource_version=row.resource_version,
    )


def event_record(row: EventRow) -> EventRecord:
    return EventRecord(row.id, row.workload, row.type, row.reason, row.message, row.at)


def token_record(row: TokenRow) -> TokenRecord:
    return TokenRecord(row.id, row.name, row.role, row.scope, row.created_at, row.revoked, row.revoked_at)


def approval_record(row: ApprovalRow) -> ApprovalRecord:
    return ApprovalRecord(
        row.id,
        row.workload,
        row.requested_by,
        row.state,
        row.approver,
        row.reason,
        row.requested_at,
        row.decided_at,
        row.expires_at,
    )


def audit_record(row: AuditRow) -> AuditRecord:
    return AuditRecord(
        row.seq, row.at, row.actor, row.action, row.kind, row.name, row.detail, row.prev_hash, row.hash
    )


def insert_ignore(dialect: str, table: sa.Table) -> Any:
    """``INSERT .. ON CONFLICT DO NOTHING`` for the dialect (both support it with RETURNING)."""
    if dialect == "postgresql":
        return pg_insert(table).on_conflict_do_nothing(index_elements=["name"])
    return sqlite_insert(table).on_conflict_do_nothing(index_elements=["name"])


def chunks(items: Sequence[Any], size: int = 1000) -> Iterator[Sequence[Any]]:
    """Slices small enough for PostgreSQL's 65,535 bind parameters per statement."""
    for i in range(0, len(items), size):
        yield items[i : i + size]
