"""OIDC group grants recorded by onboarding: a group's members act as a role over a team's queue.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision: str | None = "0004"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Create ``oidc_group_grants`` (one row per group, role and queue scope)."""
    op.create_table(
        "oidc_group_grants",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("group_name", sa.String(253), nullable=False),
        sa.Column("role", sa.String(32), nullable=False),
        sa.Column("scope", sa.String(253), nullable=False),
        sa.Column("team", sa.String(253), nullable=False),
        sa.Column("created_by", sa.String(253), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_oidc_group_grants"),
        sa.UniqueConstraint("group_name", "role", "scope", name="uq_oidc_group_grants_group_name_role_scope"),
    )


def downgrade() -> None:
    """Drop the grants (development only)."""
    op.drop_table("oidc_group_grants")
