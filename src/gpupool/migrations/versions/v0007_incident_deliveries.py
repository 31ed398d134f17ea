"""Notifications of incidents: each delivery to a sink, with its attempts, outcome and last error.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision: str | None = "0006"
branch_labels: str | None = None
depends_on: str | None = None

OUTCOMES = ("pending", "retrying", "delivered", "failed", "dropped")


def upgrade() -> None:
    """Create ``incident_deliveries`` (one row per change of an incident and sink)."""
    op.create_table(
        "incident_deliveries",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("incident_id", sa.Integer(), nullable=False),
        sa.Column("sink", sa.String(63), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(sa.column("outcome").in_(OUTCOMES), name=op.f("ck_incident_deliveries_outcome")),
        sa.ForeignKeyConstraint(
            ["incident_id"], ["incidents.id"], name=op.f("fk_incident_deliveries_incident_id_incidents")
        ),
        sa.PrimaryKeyConstraint("id", name="pk_incident_deliveries"),
    )
    op.create_index("ix_incident_deliveries_incident_id", "incident_deliveries", ["incident_id"])


def downgrade() -> None:
    """Drop the deliveries (development only)."""
    op.drop_index("ix_incident_deliveries_incident_id", "incident_deliveries")
    op.drop_table("incident_deliveries")
