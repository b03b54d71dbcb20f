"""Item index: where every stored item is, for ``item_reference`` to any of them

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01

``item_index`` maps an item id to the response that holds it: ``source`` ``input`` (the row of
``response_input_items`` at ``position``) or ``output`` (the ``response.output_item.done`` event at
``seq`` of the response's log; ``position`` is its ``output_index``). The store writes a row in
the same transaction as what makes the item durable: the input items with the response row, an
output item with its ``output_item.done`` event. The project is the response's (join
``responses``): an append never needs to know it.

Keyed by ``(item_id, response_id, source, position)``: a look-up by id is a range scan of the key
(a client may send one item id in several requests, so an id alone is not unique); the index on
``response_id`` makes the cascade of a deleted response cheap.

Rows for what was stored before this revision are filled in from the input items and the logs.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "item_index",
        sa.Column("item_id", sa.Text(), nullable=False),
        sa.Column("response_id", sa.Text(), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("position", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("seq", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(
            ["response_id"],
            ["responses.id"],
            name="fk_item_index_response_id_responses",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "item_id", "response_id", "source", "position", name="pk_item_index"
        ),
        sqlite_with_rowid=False,
    )
    op.create_index("ix_item_index_response_id", "item_index", ["response_id"])
    postgres = op.get_bind().dialect.name == "postgresql"
    if postgres:
        input_type = "item->>'type'"
        output_id, output_index = "payload->'item'->>'id'", "(payload->>'output_index')::integer"
    else:
        input_type = "json_extract(item, '$.type')"
        output_id, output_index = (
            "json_extract(payload, '$.item.id')",
            "json_extract(payload, '$.output_index')",
        )
    op.execute(
        "INSERT INTO item_index (item_id, response_id, source, position, seq)"
        " SELECT item_id, response_id, 'input', position, NULL FROM response_input_items"
        f" WHERE coalesce({input_type}, '') <> 'item_reference'"
    )
    op.execute(
        "INSERT INTO item_index (item_id, response_id, source, position, seq)"
        f" SELECT DISTINCT {output_id}, response_id, 'output', {output_index}, seq FROM response_events"
        f" WHERE type = 'response.output_item.done' AND {output_id} IS NOT NULL"
    )


def downgrade() -> None:
    op.drop_index("ix_item_index_response_id", table_name="item_index")
    op.drop_table("item_index")
