"""ORM tables (SQLAlchemy 2 typed declarative).

Why: one definition drives the typed repository code; the Alembic migrations
create exactly these tables (a test compares them). JSON columns use the
portable JSON type (``json``, not ``jsonb``, on PostgreSQL) so stored documents
round-trip byte-for-byte in meaning, which the audit hashes rely on.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, ClassVar

import sqlalchemy as sa
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

PHASES = (
    "Pending",
    "AwaitingApproval",
    "Admitted",
    "Running",
    "Succeeded",
    "Failed",
    "Cancelled",
    "Preempted",
    "Rejected",
)
APPROVAL_STATES = ("Pending", "Approved", "Rejected", "Expired")


class UTCDateTime(sa.types.TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite has no time zones)."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime passed to the store; use timezone-aware UTC")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    metadata = sa.MetaData(naming_convention=NAMING)
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        datetime: UTCDateTime(),
        dict[str, Any]: sa.JSON(),
        Any: sa.JSON(),
    }


class ObjectRow(Base):
    """Cluster configuration objects: ResourcePool, Queue, PriorityClass, Cluster."""

    __tablename__ = "objects"
    __table_args__ = (sa.UniqueConstraint("kind", "name"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    kind: Mapped[str] = mapped_column(sa.String(64))
    name: Mapped[str] = mapped_column(sa.String(253))
    spec: Mapped[dict[str, Any]]
    labels: Mapped[dict[str, Any]]
    annotations: Mapped[dict[str, Any]]
    resource_version: Mapped[int]
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]


class WorkloadRow(Base):
    """Workloads; ``seq`` (autoincrement, never reused) gives arrival order."""

    __tablename__ = "workloads"
    __table_args__ = (
        sa.CheckConstraint(sa.column("phase").in_(PHASES), name="phase"),
        sa.Index("ix_workloads_queue_phase", "queue", "phase"),
        sa.Index("ix_workloads_phase_seq", "phase", "seq"),
        {"sqlite_autoincrement": True},
    )

    seq: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(sa.String(253), unique=True)
    queue: Mapped[str] = mapped_column(sa.String(253))
    priority_class: Mapped[str | None] = mapped_column(sa.String(253))
    owner: Mapped[str] = mapped_column(sa.String(253))
    manifest: Mapped[dict[str, Any]]
    phase: Mapped[str] = mapped_column(sa.String(32))
    placement: Mapped[dict[str, Any] | None] = mapped_column(sa.JSON(none_as_null=True))
    reason: Mapped[str] = mapped_column(sa.Text)
    submitted_at: Mapped[datetime]
    admitted_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    resource_version: Mapped[int]


class EventRow(Base):
    """Per-workload event stream (kubectl-describe style)."""

    __tablename__ = "events"

    id: Mapped[int] = mapped_column(primary_key=True)
    workload: Mapped[str] = mapped_column(sa.ForeignKey("workloads.name"), index=True)
    type: Mapped[str] = mapped_column(sa.String(16))
    reason: Mapped[str] = mapped_column(sa.String(128))
    message: Mapped[str] = mapped_column(sa.Text)
    at: Mapped[datetime]


class AuditRow(Base):
    """Hash-chained audit records; never updated or deleted by the store."""

    __tablename__ = "audit"

    seq: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    at: Mapped[datetime]
    actor: Mapped[str] = mapped_column(sa.String(253))
    action: Mapped[str] = mapped_column(sa.String(128))
    kind: Mapped[str] = mapped_column(sa.String(64))
    name: Mapped[str] = mapped_column(sa.String(253))
    detail: Mapped[dict[str, Any]]
    prev_hash: Mapped[str] = mapped_column(sa.String(64))
    hash: Mapped[str] = mapped_column(sa.String(64), unique=True)


class AuditAnchorRow(Base):
    """Single row (id=1) holding the chain head; locked to serialize appends and to detect tail loss."""

    __tablename__ = "audit_anchor"

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    count: Mapped[int]
    head_hash: Mapped[str] = mapped_column(sa.String(64))


class TokenRow(Base):
    """API tokens; only the sha256 of the token is stored (unique, so lookup is O(1))."""

    __tablename__ = "tokens"

    id: Mapped[int] = mapped_column(primary_key=True)
    token_hash: Mapped[str] = mapped_column(sa.String(64), unique=True)
    name: Mapped[str] = mapped_column(sa.String(253))
    role: Mapped[str] = mapped_column(sa.String(32))
    scope: Mapped[str | None] = mapped_column(sa.String(253))
    created_at: Mapped[datetime]
    revoked: Mapped[bool] = mapped_column(sa.Boolean)
    revoked_at: Mapped[datetime | None]


class ApprovalRow(Base):
    """Approval requests for workloads that need a human decision."""

    __tablename__ = "approvals"
    __table_args__ = (sa.CheckConstraint(sa.column("state").in_(APPROVAL_STATES), name="state"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    workload: Mapped[str] = mapped_column(sa.ForeignKey("workloads.name"), index=True)
    requested_by: Mapped[str] = mapped_column(sa.String(253))
    state: Mapped[str] = mapped_column(sa.String(16))
    approver: Mapped[str | None] = mapped_column(sa.String(253))
    reason: Mapped[str] = mapped_column(sa.Text)
    requested_at: Mapped[datetime]
    decided_at: Mapped[datetime | None]
    expires_at: Mapped[datetime]


class LeaderLeaseRow(Base):
    """Single row (id=1): which process may decide (holder), where it listens, until when.

    ``epoch`` is the fencing token: incremented on every takeover, checked inside every
    decision transaction, so a deposed leader's writes fail even if it still believes it leads.
    An empty holder means nobody holds the lease.
    """

    __tablename__ = "leader_lease"

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    holder: Mapped[str] = mapped_column(sa.String(253))
    url: Mapped[str] = mapped_column(sa.String(2000))
    epoch: Mapped[int]
    acquired_at: Mapped[datetime]
    expires_at: Mapped[datetime]
