"""Initial schema

Revision ID: 0001
Revises:
Create Date: 2025-11-30

Responses, their event logs, input items, audit records, server secrets, the append-only
triggers on ``response_events`` and the cookbook views. The views are written once per dialect: SQLite reads JSON text with ``json_extract`` and
PostgreSQL reads JSONB with ``->``/``->>``. ``persistence/COOKBOOK.md`` shows how to use them.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_VIEWS = (
    "response_timeline",
    "response_text",
    "response_output_items",
    "function_calls",
    "conversation_chains",
)


def _json() -> sa.types.TypeEngine[object]:
    return sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "responses",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("model", sa.Text(), nullable=False),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("completed_at", sa.BigInteger(), nullable=True),
        sa.Column("previous_response_id", sa.Text(), nullable=True),
        sa.Column("background", sa.Boolean(), nullable=False),
        sa.Column("input_tokens", sa.Integer(), nullable=True),
        sa.Column("output_tokens", sa.Integer(), nullable=True),
        sa.Column("reasoning_tokens", sa.Integer(), nullable=True),
        sa.Column("error_code", sa.Text(), nullable=True),
        sa.Column("incomplete_reason", sa.Text(), nullable=True),
        sa.Column("request", _json(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_responses"),
    )
    op.create_index("ix_responses_created_at", "responses", ["created_at"])
    op.create_index("ix_responses_status", "responses", ["status"])
    op.create_index("ix_responses_previous_response_id", "responses", ["previous_response_id"])

    op.create_table(
        "response_events",
        sa.Column("response_id", sa.Text(), nullable=False),
        sa.Column("seq", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("type", sa.Text(), nullable=False),
        sa.Column("payload", _json(), nullable=False),
        sa.Column("recorded_at", sa.Double(), nullable=False),
        sa.ForeignKeyConstraint(
            ["response_id"],
            ["responses.id"],
            name="fk_response_events_response_id_responses",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("response_id", "seq", name="pk_response_events"),
        sqlite_with_rowid=False,
    )

    op.create_table(
        "response_input_items",
        sa.Column("response_id", sa.Text(), nullable=False),
        sa.Column("position", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("item_id", sa.Text(), nullable=False),
        sa.Column("item", _json(), nullable=False),
        sa.ForeignKeyConstraint(
            ["response_id"],
            ["responses.id"],
            name="fk_response_input_items_response_id_responses",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("response_id", "position", name="pk_response_input_items"),
        sqlite_with_rowid=False,
    )
    op.create_index(
        "ix_response_input_items_response_id_item_id",
        "response_input_items",
        ["response_id", "item_id"],
    )

    op.create_table(
        "response_audit",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("response_id", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("token_count", sa.Integer(), nullable=False),
        sa.Column("token_ids", sa.LargeBinary(), nullable=False),
        sa.Column("detail", _json(), nullable=True),
        sa.Column("recorded_at", sa.Double(), nullable=False),
        sa.ForeignKeyConstraint(
            ["response_id"],
            ["responses.id"],
            name="fk_response_audit_response_id_responses",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_response_audit"),
    )
    op.create_index("ix_response_audit_response_id_id", "response_audit", ["response_id", "id"])

    op.create_table(
        "server_secrets",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("value", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_server_secrets"),
    )

    if op.get_bind().dialect.name == "postgresql":
        _statements = _POSTGRESQL_TRIGGERS + _POSTGRESQL_VIEWS
    else:
        _statements = _SQLITE_TRIGGERS + _SQLITE_VIEWS
    for statement in _statements:
        op.execute(statement)


def downgrade() -> None:
    for view in reversed(_VIEWS):
        op.execute(f"DROP VIEW IF EXISTS {view}")
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS response_events_append_only ON response_events")
        op.execute("DROP FUNCTION IF EXISTS response_events_append_only()")
    else:
        op.execute("DROP TRIGGER IF EXISTS responses_delete_cascade")
        op.execute("DROP TRIGGER IF EXISTS response_events_no_update")
        op.execute("DROP TRIGGER IF EXISTS response_events_no_delete")
    op.drop_table("server_secrets")
    op.drop_index("ix_response_audit_response_id_id", table_name="response_audit")
    op.drop_table("response_audit")
    op.drop_index("ix_response_input_items_response_id_item_id", table_name="response_input_items")
    op.drop_table("response_input_items")
    op.drop_table("response_events")
    op.drop_index("ix_responses_previous_response_id", table_name="responses")
    op.drop_index("ix_responses_status", table_name="responses")
    op.drop_index("ix_responses_created_at", table_name="responses")
    op.drop_table("responses")


# Append only: an event row is never updated, and is deleted only with its response (the
# cascade runs after the responses row is gone, which is what the guard checks).
_SQLITE_TRIGGERS = (
    """
    CREATE TRIGGER response_events_no_update BEFORE UPDATE ON response_events
    BEGIN
        SELECT RAISE(ABORT, 'response_events is append-only');
    END
    """,
    """
    CREATE TRIGGER response_events_no_delete BEFORE DELETE ON response_events
    WHEN EXISTS (SELECT 1 FROM responses WHERE responses.id = OLD.response_id)
    BEGIN
        SELECT RAISE(ABORT, 'response_events is append-only: delete the response instead');
    END
    """,
    # ON DELETE CASCADE needs PRAGMA foreign_keys = ON, which every sqlite3 session must set
    # for itself; this makes deleting a response complete in any session.
    """
    CREATE TRIGGER responses_delete_cascade AFTER DELETE ON responses
    BEGIN
        DELETE FROM response_events WHERE response_id = OLD.id;
        DELETE FROM response_input_items WHERE response_id = OLD.id;
        DELETE FROM response_audit WHERE response_id = OLD.id;
    END
    """,
)

_POSTGRESQL_TRIGGERS = (
    """
    CREATE FUNCTION response_events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF TG_OP = 'UPDATE' THEN
            RAISE EXCEPTION 'response_events is append-only';
        END IF;
        IF EXISTS (SELECT 1 FROM responses WHERE responses.id = OLD.response_id) THEN
            RAISE EXCEPTION 'response_events is append-only: delete the response instead';
        END IF;
        RETURN OLD;
    END
    $$
    """,
    """
    CREATE TRIGGER response_events_append_only
    BEFORE UPDATE OR DELETE ON response_events
    FOR EACH ROW EXECUTE FUNCTION response_events_append_only()
    """,
)

_SQLITE_VIEWS = (
    # Every event of every log, with a readable time and the text it carries.
    """
    CREATE VIEW response_timeline AS
    SELECT e.response_id,
           e.seq,
           e.type,
           strftime('%Y-%m-%dT%H:%M:%fZ', e.recorded_at, 'unixepoch') AS recorded_at,
           coalesce(json_extract(e.payload, '$.item_id'),
                    json_extract(e.payload, '$.item.id')) AS item_id,
           json_extract(e.payload, '$.output_index') AS output_index,
           coalesce(json_extract(e.payload, '$.delta'),
                    json_extract(e.payload, '$.text'),
                    json_extract(e.payload, '$.arguments'),
                    json_extract(e.payload, '$.input'),
                    json_extract(e.payload, '$.refusal')) AS text,
           e.payload
    FROM response_events AS e
    """,
    # The final text of each response: its output_text.done texts in log order.
    """
    CREATE VIEW response_text AS
    SELECT r.id AS response_id,
           r.model,
           r.status,
           r.created_at,
           t.text
    FROM responses AS r
    LEFT JOIN (
        SELECT response_id, text
        FROM (
            SELECT e.response_id,
                   group_concat(json_extract(e.payload, '$.text'), '') OVER (
                       PARTITION BY e.response_id ORDER BY e.seq
                       ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING
                   ) AS text,
                   row_number() OVER (PARTITION BY e.response_id ORDER BY e.seq) AS n
            FROM response_events AS e
            WHERE e.type = 'response.output_text.done'
        )
        WHERE n = 1
    ) AS t ON t.response_id = r.id
    """,
    # Every finished output item (message, reasoning, function_call, ...).
    """
    CREATE VIEW response_output_items AS
    SELECT e.response_id,
           json_extract(e.payload, '$.output_index') AS output_index,
           json_extract(e.payload, '$.item.id') AS item_id,
           json_extract(e.payload, '$.item.type') AS item_type,
           json_extract(e.payload, '$.item.status') AS status,
           json_extract(e.payload, '$.item') AS item,
           e.seq,
           strftime('%Y-%m-%dT%H:%M:%fZ', e.recorded_at, 'unixepoch') AS recorded_at
    FROM response_events AS e
    WHERE e.type = 'response.output_item.done'
    """,
    # Each function call a response made, with the output a later request sent for it.
    """
    CREATE VIEW function_calls AS
    SELECT c.response_id,
           json_extract(c.payload, '$.item.id') AS item_id,
           json_extract(c.payload, '$.item.call_id') AS call_id,
           json_extract(c.payload, '$.item.name') AS name,
           json_extract(c.payload, '$.item.arguments') AS arguments,
           strftime('%Y-%m-%dT%H:%M:%fZ', c.recorded_at, 'unixepoch') AS called_at,
           o.response_id AS output_response_id,
           json_extract(o.item, '$.output') AS output
    FROM response_events AS c
    LEFT JOIN response_input_items AS o
      ON json_extract(o.item, '$.type') = 'function_call_output'
     AND json_extract(o.item, '$.call_id') = json_extract(c.payload, '$.item.call_id')
     AND o.response_id <> c.response_id
    WHERE c.type = 'response.output_item.done'
      AND json_extract(c.payload, '$.item.type') = 'function_call'
    """,
    # Each response with the first response of its previous_response_id chain (depth 0).
    """
    CREATE VIEW conversation_chains AS
    WITH RECURSIVE chain(root_id, response_id, depth) AS (
        SELECT r.id, r.id, 0
        FROM responses AS r
        WHERE r.previous_response_id IS NULL
           OR NOT EXISTS (SELECT 1 FROM responses AS p WHERE p.id = r.previous_response_id)
        UNION ALL
        SELECT chain.root_id, r.id, chain.depth + 1
        FROM responses AS r
        JOIN chain ON r.previous_response_id = chain.response_id
    )
    SELECT chain.root_id,
           chain.depth,
           chain.response_id,
           r.previous_response_id,
           r.model,
           r.status,
           r.created_at
    FROM chain
    JOIN responses AS r ON r.id = chain.response_id
    """,
)

_POSTGRESQL_VIEWS = (
    """
    CREATE VIEW response_timeline AS
    SELECT e.response_id,
           e.seq,
           e.type,
           to_timestamp(e.recorded_at) AS recorded_at,
           coalesce(e.payload ->> 'item_id', e.payload -> 'item' ->> 'id') AS item_id,
           (e.payload ->> 'output_index')::integer AS output_index,
           coalesce(e.payload ->> 'delta',
                    e.payload ->> 'text',
                    e.payload ->> 'arguments',
                    e.payload ->> 'input',
                    e.payload ->> 'refusal') AS text,
           e.payload
    FROM response_events AS e
    """,
    """
    CREATE VIEW response_text AS
    SELECT r.id AS response_id,
           r.model,
           r.status,
           r.created_at,
           t.text
    FROM responses AS r
    LEFT JOIN (
        SELECT e.response_id, string_agg(e.payload ->> 'text', '' ORDER BY e.seq) AS text
        FROM response_events AS e
        WHERE e.type = 'response.output_text.done'
        GROUP BY e.response_id
    ) AS t ON t.response_id = r.id
    """,
    """
    CREATE VIEW response_output_items AS
    SELECT e.response_id,
           (e.payload ->> 'output_index')::integer AS output_index,
           e.payload -> 'item' ->> 'id' AS item_id,
           e.payload -> 'item' ->> 'type' AS item_type,
           e.payload -> 'item' ->> 'status' AS status,
           e.payload -> 'item' AS item,
           e.seq,
           to_timestamp(e.recorded_at) AS recorded_at
    FROM response_events AS e
    WHERE e.type = 'response.output_item.done'
    """,
    """
    CREATE VIEW function_calls AS
    SELECT c.response_id,
           c.payload -> 'item' ->> 'id' AS item_id,
           c.payload -> 'item' ->> 'call_id' AS call_id,
           c.payload -> 'item' ->> 'name' AS name,
           c.payload -> 'item' ->> 'arguments' AS arguments,
           to_timestamp(c.recorded_at) AS called_at,
           o.response_id AS output_response_id,
           o.item ->> 'output' AS output
    FROM response_events AS c
    LEFT JOIN response_input_items AS o
      ON o.item ->> 'type' = 'function_call_output'
     AND o.item ->> 'call_id' = c.payload -> 'item' ->> 'call_id'
     AND o.response_id <> c.response_id
    WHERE c.type = 'response.output_item.done'
      AND c.payload -> 'item' ->> 'type' = 'function_call'
    """,
    """
    CREATE VIEW conversation_chains AS
    WITH RECURSIVE chain(root_id, response_id, depth) AS (
        SELECT r.id, r.id, 0
        FROM responses AS r
        WHERE r.previous_response_id IS NULL
           OR NOT EXISTS (SELECT 1 FROM responses AS p WHERE p.id = r.previous_response_id)
        UNION ALL
        SELECT chain.root_id, r.id, chain.depth + 1
        FROM responses AS r
        JOIN chain ON r.previous_response_id = chain.response_id
    )
    SELECT chain.root_id,
           chain.depth,
           chain.response_id,
           r.previous_response_id,
           r.model,
           r.status,
           r.created_at
    FROM chain
    JOIN responses AS r ON r.id = chain.response_id
    """,
)
