"""Configuration history: one numbered revision per change of a pool, queue, priority class or cluster.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01

Why a table of its own (not the audit log): the audit detail holds what a caller chose to say;
a revision holds the whole object as it became, numbered per object, so any two can be diffed
and any one applied again (rollback). Objects that exist when this runs get revision 1, so
every object has a history to return to.
"""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision: str | None = "0002"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Create ``object_revisions`` and give every existing object its first revision."""
    revs = op.create_table(
        "object_revisions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("name", sa.String(253), nullable=False),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("action", sa.String(16), nullable=False),
        sa.Column("author", sa.String(253), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("annotations", sa.JSON(), nullable=False),
        sa.Column("resource_version", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_object_revisions"),
        sa.UniqueConstraint("kind", "name", "revision", name="uq_object_revisions_kind_name_revision"),
    )
    objects = sa.table(
        "objects",
        sa.column("kind", sa.String()),
        sa.column("name", sa.String()),
        sa.column("spec", sa.JSON()),
        sa.column("labels", sa.JSON()),
        sa.column("annotations", sa.JSON()),
        sa.column("resource_version", sa.Integer()),
        sa.column("updated_at", sa.DateTime(timezone=True)),
    )
    rows = op.get_bind().execute(sa.select(objects)).mappings().all()
    now = datetime.now(UTC)
    op.bulk_insert(
        revs,
        [
            {
                "kind": r["kind"],
                "name": r["name"],
                "revision": 1,
                "action": "apply",
                "author": "migration",
                "reason": "state when configuration history began",
                "at": r["updated_at"] or now,
                "spec": r["spec"],
                "labels": r["labels"],
                "annotations": r["annotations"],
                "resource_version": r["resource_version"],
            }
            for r in rows
        ],
    )


def downgrade() -> None:
    """Drop the history (development only)."""
    op.drop_table("object_revisions")
