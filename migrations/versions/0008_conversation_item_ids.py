"""An index of conversation items by item id, for item_reference

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01

An ``item_reference`` may name an item a conversation holds (added through the conversation
items API, not by a response): ``ix_conversation_items_item_id`` finds it in one probe, whatever
the conversations hold.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_conversation_items_item_id", "conversation_items", ["item_id"])


def downgrade() -> None:
    op.drop_index("ix_conversation_items_item_id", table_name="conversation_items")
