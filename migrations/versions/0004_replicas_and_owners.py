"""Replicas with leases, and the owner of each response

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01

Each server process keeps a row in ``replicas`` and renews its lease (``expires_at``) every
heartbeat; ``responses.owner`` names the replica generating a response. Start-up recovery and
the repair loop close only responses whose owner has no live lease, so a server that starts (or
sweeps) never fails the live responses of another. Rows made before this migration have no
owner: the first server to sweep closes those left in progress, as start-up recovery always did.

Plain ``ADD COLUMN`` on both databases (see 0003: a batch rebuild would drop SQLite's triggers).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("responses", sa.Column("owner", sa.Text(), nullable=True))
    op.create_table(
        "replicas",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("host", sa.Text(), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.Double(), nullable=False),
        sa.Column("heartbeat_at", sa.Double(), nullable=False),
        sa.Column("expires_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_replicas"),
    )


def downgrade() -> None:
    op.drop_table("replicas")
    op.drop_column("responses", "owner")
