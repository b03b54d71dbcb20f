"""Projects and API keys

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01

Every response belongs to a project (``responses.project``) and records the key that made it
(``responses.api_key_id``, NULL for the static key or a server run without keys). Rows made
before this migration belong to the ``default`` project: the server default fills them in, so
the upgrade rewrites nothing by hand. ``api_keys`` holds each key's SHA-256, never the key.

The columns are added with a plain ``ALTER TABLE ... ADD COLUMN`` on both databases (SQLite
takes a NOT NULL column with a constant default that way), not in batch mode: rebuilding
``responses`` on SQLite would drop the triggers that hang on it.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "responses", sa.Column("project", sa.Text(), nullable=False, server_default="default")
    )
    op.add_column("responses", sa.Column("api_key_id", sa.Text(), nullable=True))
    op.create_index("ix_responses_project_created_at", "responses", ["project", "created_at"])
    op.create_index("ix_responses_api_key_id", "responses", ["api_key_id"])
    op.create_table(
        "api_keys",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("project", sa.Text(), nullable=False),
        sa.Column("role", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=True),
        sa.Column("secret_hash", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("revoked_at", sa.Double(), nullable=True),
        sa.Column("max_streams", sa.Integer(), nullable=True),
        sa.Column("requests_per_minute", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_api_keys"),
        sa.UniqueConstraint("secret_hash", name="uq_api_keys_secret_hash"),
    )
    op.create_index("ix_api_keys_project", "api_keys", ["project"])


def downgrade() -> None:
    op.drop_index("ix_api_keys_project", table_name="api_keys")
    op.drop_table("api_keys")
    op.drop_index("ix_responses_api_key_id", table_name="responses")
    op.drop_index("ix_responses_project_created_at", table_name="responses")
    # SQLite >= 3.35 drops a column in place (no table rebuild, the triggers stay)
    op.drop_column("responses", "api_key_id")
    op.drop_column("responses", "project")
