"""Conversations: a conversation row per conversation and its append-only log of items

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01

- ``conversations``: id, project, created_at, metadata, ``next_seq`` (the length of its log,
  bumped by every append in the append's transaction) and ``deleted_at`` (a deleted
  conversation keeps its row and log; the API answers 404 for it).
- ``conversation_items``: ``(conversation_id, seq)`` is the key; ``kind`` is ``added`` (with the
  ``item``) or ``deleted`` (the item ``item_id`` leaves the conversation; its ``added`` entry
  stays). Append-only: triggers refuse ``UPDATE``, and ``DELETE`` unless the conversation row is
  gone (as for ``response_events``).
- Views: ``conversation_timeline`` (every entry of every log, with a readable time and the text
  of message items) and ``conversation_current_items`` (the items a conversation holds now, in
  order: what the next response naming it is given as its history).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_VIEWS = ("conversation_timeline", "conversation_current_items")


def _json() -> sa.types.TypeEngine[object]:
    return sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "conversations",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("project", sa.Text(), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("metadata", _json(), nullable=False),
        sa.Column("next_seq", sa.Integer(), server_default="0", nullable=False),
        sa.Column("deleted_at", sa.Double(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_conversations"),
    )
    op.create_index(
        "ix_conversations_project_created_at", "conversations", ["project", "created_at"]
    )
    op.create_table(
        "conversation_items",
        sa.Column("conversation_id", sa.Text(), nullable=False),
        sa.Column("seq", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("item_id", sa.Text(), nullable=False),
        sa.Column("item", _json(), nullable=True),
        sa.Column("response_id", sa.Text(), nullable=True),
        sa.Column("recorded_at", sa.Double(), nullable=False),
        sa.ForeignKeyConstraint(
            ["conversation_id"],
            ["conversations.id"],
            name="fk_conversation_items_conversation_id_conversations",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("conversation_id", "seq", name="pk_conversation_items"),
        sqlite_with_rowid=False,
    )
    op.create_index(
        "ix_conversation_items_conversation_id_item_id_kind",
        "conversation_items",
        ["conversation_id", "item_id", "kind"],
        unique=True,
    )
    postgres = op.get_bind().dialect.name == "postgresql"
    for statement in _POSTGRESQL if postgres else _SQLITE:
        op.execute(statement)


def downgrade() -> None:
    for view in reversed(_VIEWS):
        op.execute(f"DROP VIEW IF EXISTS {view}")
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS conversation_items_append_only ON conversation_items")
        op.execute("DROP FUNCTION IF EXISTS conversation_items_append_only()")
    else:
        op.execute("DROP TRIGGER IF EXISTS conversations_delete_cascade")
        op.execute("DROP TRIGGER IF EXISTS conversation_items_no_update")
        op.execute("DROP TRIGGER IF EXISTS conversation_items_no_delete")
    op.drop_index(
        "ix_conversation_items_conversation_id_item_id_kind", table_name="conversation_items"
    )
    op.drop_table("conversation_items")
    op.drop_index("ix_conversations_project_created_at", table_name="conversations")
    op.drop_table("conversations")


# The items a conversation holds now: its added entries without a later deleted entry.
_CURRENT = """
    CREATE VIEW conversation_current_items AS
    SELECT a.conversation_id,
           a.seq,
           a.item_id,
           {item_type} AS item_type,
           {role} AS role,
           a.item,
           a.response_id
    FROM conversation_items AS a
    JOIN conversations AS c ON c.id = a.conversation_id AND c.deleted_at IS NULL
    WHERE a.kind = 'added'
      AND NOT EXISTS (
          SELECT 1 FROM conversation_items AS d
          WHERE d.conversation_id = a.conversation_id
            AND d.item_id = a.item_id
            AND d.kind = 'deleted'
      )
"""

_SQLITE = (
    """
    CREATE TRIGGER conversation_items_no_update BEFORE UPDATE ON conversation_items
    BEGIN
        SELECT RAISE(ABORT, 'conversation_items is append-only');
    END
    """,
    """
    CREATE TRIGGER conversation_items_no_delete BEFORE DELETE ON conversation_items
    WHEN EXISTS (SELECT 1 FROM conversations WHERE conversations.id = OLD.conversation_id)
    BEGIN
        SELECT RAISE(ABORT, 'conversation_items is append-only: delete an item by appending a deletion');
    END
    """,
    """
    CREATE TRIGGER conversations_delete_cascade AFTER DELETE ON conversations
    BEGIN
        DELETE FROM conversation_items WHERE conversation_id = OLD.id;
    END
    """,
    """
    CREATE VIEW conversation_timeline AS
    SELECT e.conversation_id,
           e.seq,
           e.kind,
           strftime('%Y-%m-%dT%H:%M:%fZ', e.recorded_at, 'unixepoch') AS recorded_at,
           e.item_id,
           json_extract(e.item, '$.type') AS item_type,
           json_extract(e.item, '$.role') AS role,
           coalesce(json_extract(e.item, '$.content[0].text'),
                    json_extract(e.item, '$.content'),
                    json_extract(e.item, '$.arguments'),
                    json_extract(e.item, '$.output')) AS text,
           e.response_id
    FROM conversation_items AS e
    """,
    _CURRENT.format(
        item_type="json_extract(a.item, '$.type')", role="json_extract(a.item, '$.role')"
    ),
)

_POSTGRESQL = (
    """
    CREATE FUNCTION conversation_items_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF TG_OP = 'UPDATE' THEN
            RAISE EXCEPTION 'conversation_items is append-only';
        END IF;
        IF EXISTS (SELECT 1 FROM conversations WHERE conversations.id = OLD.conversation_id) THEN
            RAISE EXCEPTION 'conversation_items is append-only: delete an item by appending a deletion';
        END IF;
        RETURN OLD;
    END
    $$
    """,
    """
    CREATE TRIGGER conversation_items_append_only
    BEFORE UPDATE OR DELETE ON conversation_items
    FOR EACH ROW EXECUTE FUNCTION conversation_items_append_only()
    """,
    """
    CREATE VIEW conversation_timeline AS
    SELECT e.conversation_id,
           e.seq,
           e.kind,
           to_timestamp(e.recorded_at) AS recorded_at,
           e.item_id,
           e.item ->> 'type' AS item_type,
           e.item ->> 'role' AS role,
           coalesce(CASE jsonb_typeof(e.item -> 'content')
                        WHEN 'array' THEN e.item -> 'content' -> 0 ->> 'text'
                        ELSE e.item ->> 'content' END,
                    e.item ->> 'arguments',
                    e.item ->> 'output') AS text,
           e.response_id
    FROM conversation_items AS e
    """,
    _CURRENT.format(item_type="a.item ->> 'type'", role="a.item ->> 'role'"),
)
