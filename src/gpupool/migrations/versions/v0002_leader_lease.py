"""Leader lease: the one row that says which replica may schedule (holder, URL, fencing epoch, expiry).

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision: str | None = "0001"
branch_labels: str | None = None
depends_on: str | None = None

NEVER = datetime(1970, 1, 1, tzinfo=UTC)


def upgrade() -> None:
    """Create ``leader_lease`` with its single unheld row (epoch 0, expired)."""
    lease = op.create_table(
        "leader_lease",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("holder", sa.String(253), nullable=False),
        sa.Column("url", sa.String(2000), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("acquired_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_leader_lease"),
    )
    op.bulk_insert(
        lease, [{"id": 1, "holder": "", "url": "", "epoch": 0, "acquired_at": NEVER, "expires_at": NEVER}]
    )


def downgrade() -> None:
    """Drop the lease (development only)."""
    op.drop_table("leader_lease")
