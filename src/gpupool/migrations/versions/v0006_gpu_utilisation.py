"""Hourly GPU utilisation rollups per workload (queue and pool kept with each row).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision: str | None = "0005"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Create ``gpu_utilisation_hourly`` (one row per hour and workload, sums only)."""
    op.create_table(
        "gpu_utilisation_hourly",
        sa.Column("hour", sa.DateTime(timezone=True), nullable=False),
        sa.Column("workload", sa.String(253), nullable=False),
        sa.Column("queue", sa.String(253), nullable=False),
        sa.Column("pool", sa.String(253), nullable=False),
        sa.Column("sampled_s", sa.Float(), nullable=False),
        sa.Column("gpu_s", sa.Float(), nullable=False),
        sa.Column("used_gpu_s", sa.Float(), nullable=False),
        sa.Column("memory_byte_s", sa.Float(), nullable=False),
        sa.Column("memory_max_bytes", sa.BigInteger(), nullable=False),
        sa.Column("idle_s", sa.Float(), nullable=False),
        sa.Column("idle_gpu_s", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("hour", "workload", name="pk_gpu_utilisation_hourly"),
    )


def downgrade() -> None:
    """Drop the rollups (development only)."""
    op.drop_table("gpu_utilisation_hourly")
