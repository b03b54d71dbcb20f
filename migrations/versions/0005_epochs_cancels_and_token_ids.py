"""Takeover: epochs that fence appends, cross-replica cancel requests, durable output token ids

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01

- ``responses.epoch``: bumped by every claim (``SqlStore.claim``). A replica appends to a log only
  while the epoch it claimed (0: it created the response) is still the row's, checked in the
  append's own transaction, so a replica that lost its lease and was taken over cannot write.
- ``responses.cancel_requested_at``: a cancel asked of a response that another replica is
  generating, recorded here for the owner (which learns of it through the doorbell).
- ``response_events.token_ids``: the output token ids that produced the events of one write, on
  the last event of that write (uint32 little-endian, like ``response_audit.token_ids``); NULL on
  every other event. Durable in the same transaction as the events they produced, so a takeover
  can replay exactly the tokens behind the logged events.

Plain ``ADD COLUMN`` on both databases (see 0003).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("responses", sa.Column("epoch", sa.Integer(), server_default="0", nullable=False))
    op.add_column("responses", sa.Column("cancel_requested_at", sa.Double(), nullable=True))
    op.add_column("response_events", sa.Column("token_ids", sa.LargeBinary(), nullable=True))


def downgrade() -> None:
    op.drop_column("response_events", "token_ids")
    op.drop_column("responses", "cancel_requested_at")
    op.drop_column("responses", "epoch")
