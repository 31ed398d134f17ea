"""Initial schema: objects, workloads, events, audit (+anchor), tokens, approvals.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision: str | None = None
branch_labels: str | None = None
depends_on: str | None = None

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


def _ts() -> sa.DateTime:
    return sa.DateTime(timezone=True)


def upgrade() -> None:
    """Create every table (the ORM in gpupool.store.schema must match; a test checks)."""
    _create_objects()
    _create_workloads()
    _create_events()
    _create_audit()
    _create_audit_anchor()
    _create_tokens()
    _create_approvals()


def _create_objects() -> None:
    """Configuration objects (pools, queues, priority classes, clusters), unique by kind and name."""
    op.create_table(
        "objects",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("name", sa.String(253), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("annotations", sa.JSON(), nullable=False),
        sa.Column("resource_version", sa.Integer(), nullable=False),
        sa.Column("created_at", _ts(), nullable=False),
        sa.Column("updated_at", _ts(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_objects"),
        sa.UniqueConstraint("kind", "name", name="uq_objects_kind_name"),
    )


def _create_workloads() -> None:
    """Workloads in arrival order (``seq``), unique by name, with the two indexes the store filters by."""
    op.create_table(
        "workloads",
        sa.Column("seq", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(253), nullable=False),
        sa.Column("queue", sa.String(253), nullable=False),
        sa.Column("priority_class", sa.String(253), nullable=True),
        sa.Column("owner", sa.String(253), nullable=False),
        sa.Column("manifest", sa.JSON(), nullable=False),
        sa.Column("phase", sa.String(32), nullable=False),
        sa.Column("placement", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("submitted_at", _ts(), nullable=False),
        sa.Column("admitted_at", _ts(), nullable=True),
        sa.Column("finished_at", _ts(), nullable=True),
        sa.Column("resource_version", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("seq", name="pk_workloads"),
        sa.UniqueConstraint("name", name="uq_workloads_name"),
        sa.CheckConstraint(sa.column("phase").in_(PHASES), name=op.f("ck_workloads_phase")),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_workloads_queue_phase", "workloads", ["queue", "phase"])
    op.create_index("ix_workloads_phase_seq", "workloads", ["phase", "seq"])


def _create_events() -> None:
    """Workload events, indexed by workload."""
    op.create_table(
        "events",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("workload", sa.String(253), nullable=False),
        sa.Column("type", sa.String(16), nullable=False),
        sa.Column("reason", sa.String(128), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("at", _ts(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_events"),
        sa.ForeignKeyConstraint(["workload"], ["workloads.name"], name="fk_events_workload_workloads"),
    )
    op.create_index("ix_events_workload", "events", ["workload"])


def _create_audit() -> None:
    """The hash-chained audit records."""
    op.create_table(
        "audit",
        sa.Column("seq", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("at", _ts(), nullable=False),
        sa.Column("actor", sa.String(253), nullable=False),
        sa.Column("action", sa.String(128), nullable=False),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("name", sa.String(253), nullable=False),
        sa.Column("detail", sa.JSON(), nullable=False),
        sa.Column("prev_hash", sa.String(64), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.PrimaryKeyConstraint("seq", name="pk_audit"),
        sa.UniqueConstraint("hash", name="uq_audit_hash"),
    )


def _create_audit_anchor() -> None:
    """The audit chain's anchor row (count and head hash), created with the empty chain."""
    anchor = op.create_table(
        "audit_anchor",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("head_hash", sa.String(64), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_audit_anchor"),
    )
    op.bulk_insert(anchor, [{"id": 1, "count": 0, "head_hash": "0" * 64}])


def _create_tokens() -> None:
    """API tokens, kept as their hash."""
    op.create_table(
        "tokens",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("name", sa.String(253), nullable=False),
        sa.Column("role", sa.String(32), nullable=False),
        sa.Column("scope", sa.String(253), nullable=True),
        sa.Column("created_at", _ts(), nullable=False),
        sa.Column("revoked", sa.Boolean(), nullable=False),
        sa.Column("revoked_at", _ts(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_tokens"),
        sa.UniqueConstraint("token_hash", name="uq_tokens_token_hash"),
    )


def _create_approvals() -> None:
    """Approval requests, indexed by workload."""
    op.create_table(
        "approvals",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("workload", sa.String(253), nullable=False),
        sa.Column("requested_by", sa.String(253), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("approver", sa.String(253), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("requested_at", _ts(), nullable=False),
        sa.Column("decided_at", _ts(), nullable=True),
        sa.Column("expires_at", _ts(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_approvals"),
        sa.ForeignKeyConstraint(["workload"], ["workloads.name"], name="fk_approvals_workload_workloads"),
        sa.CheckConstraint(sa.column("state").in_(APPROVAL_STATES), name=op.f("ck_approvals_state")),
    )
    op.create_index("ix_approvals_workload", "approvals", ["workload"])


def downgrade() -> None:
    """Drop everything (development only)."""
    for table in ("approvals", "tokens", "audit_anchor", "audit", "events", "workloads", "objects"):
        op.drop_table(table)
