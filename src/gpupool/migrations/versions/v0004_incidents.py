"""Incidents: alert conditions gpupool evaluates itself, with owner, acknowledgement and resolution.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision: str | None = "0003"
branch_labels: str | None = None
depends_on: str | None = None

STATES = ("Firing", "Acknowledged", "Resolved")


def upgrade() -> None:
    """Create ``incidents`` (one row per firing of a rule on a subject)."""
    op.create_table(
        "incidents",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("rule", sa.String(128), nullable=False),
        sa.Column("subject", sa.String(253), nullable=False),
        sa.Column("severity", sa.String(16), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("fired_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("owner", sa.String(253), nullable=False),
        sa.Column("acked_by", sa.String(253), nullable=False),
        sa.Column("acked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("resolved_by", sa.String(253), nullable=False),
        sa.Column("resolved_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("resolution", sa.Text(), nullable=False),
        sa.CheckConstraint(sa.column("state").in_(STATES), name=op.f("ck_incidents_state")),
        sa.PrimaryKeyConstraint("id", name="pk_incidents"),
    )
    op.create_index("ix_incidents_rule_subject_state", "incidents", ["rule", "subject", "state"])


def downgrade() -> None:
    """Drop the incidents (development only)."""
    op.drop_index("ix_incidents_rule_subject_state", "incidents")
    op.drop_table("incidents")
