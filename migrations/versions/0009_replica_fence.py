"""A replica's fence counter: one row lock a commit instead of one a log

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02

- ``replicas.fence``: bumped, in the same transaction, by every claim of one of the replica's
  responses and every delete of one (``SqlStore.claim``, ``SqlStore.delete``). A PostgreSQL
  commit share-locks its own replica's row and reads it: a log whose epoch it last checked at
  this value needs no check of its own (``persistence.sql``), so a commit that appends to 256 logs
  locks one row, not 256.
- PostgreSQL: the trigger ``responses_delete_fence`` bumps it for a response deleted by hand
  (``DELETE FROM responses ...`` in psql), so its owner stops appending to it as it did before.
  BEFORE the row goes: the bump waits for a commit of the owner in flight, so the events that
  commit makes are there when ``responses_delete_events`` (AFTER) deletes the response's events.

Plain ``ADD COLUMN`` on both databases (see 0003).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "replicas", sa.Column("fence", sa.BigInteger(), server_default="0", nullable=False)
    )
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(
        """
        CREATE FUNCTION responses_delete_fence() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            UPDATE replicas SET fence = fence + 1 WHERE id = OLD.owner;
            RETURN OLD;
        END
        $$
        """
    )
    op.execute(
        """
        CREATE TRIGGER responses_delete_fence BEFORE DELETE ON responses
        FOR EACH ROW EXECUTE FUNCTION responses_delete_fence()
        """
    )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS responses_delete_fence ON responses")
        op.execute("DROP FUNCTION IF EXISTS responses_delete_fence()")
    op.drop_column("replicas", "fence")
