"""PostgreSQL: ``response_events.payload`` is ``json`` (the event's text as streamed), not ``jsonb``

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-07

A log is written once a token and read rarely: ``jsonb`` parsed every event's text into its
binary form at each commit (the write's largest cost after the key's index: 3.1 against 2.6 ms
of the database's time for a commit of 250 deltas), and gave back its own rendering (keys
reordered, spaces added), so a stream replayed from PostgreSQL differed byte for byte from
the one streamed live, and from SQLite's. ``json`` keeps the text as written (it is still
checked to be JSON) and answers the same ``->``/``->>`` queries (bench/RESULTS.md, "the events'
payload as json").

The views that read the table, the cookbook's and an operator's own, and the views built on
them, are dropped and made again from their own definitions (PostgreSQL cannot change the type
of a column a view reads), and the table is rewritten once, locked meanwhile: the time it
takes grows with the number of events stored (3.2 s for a million events, 323 MB, on the
development VM; the downgrade 3.8 s). Rows written before keep ``jsonb``'s rendering of their
text. SQLite: nothing to do (its payloads were always text).
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op
from sqlalchemy import text

revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The views that read response_events, directly or through another view, oldest first.
_DEPENDENT_VIEWS = """
WITH RECURSIVE dependent(oid) AS (
    SELECT DISTINCT r.ev_class
    FROM pg_depend AS d
    JOIN pg_rewrite AS r ON r.oid = d.objid
    WHERE d.refobjid = 'response_events'::regclass AND r.ev_class <> d.refobjid
    UNION
    SELECT r.ev_class
    FROM dependent
    JOIN pg_depend AS d ON d.refobjid = dependent.oid
    JOIN pg_rewrite AS r ON r.oid = d.objid
    WHERE r.ev_class <> d.refobjid
)
SELECT c.relname, pg_get_viewdef(c.oid)
FROM dependent JOIN pg_class AS c ON c.oid = dependent.oid
WHERE c.relkind = 'v'
ORDER BY c.oid
"""


def upgrade() -> None:
    _payload_type("json")


def downgrade() -> None:
    _payload_type("jsonb")


def _payload_type(sql_type: str) -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    views = list(bind.execute(text(_DEPENDENT_VIEWS)))
    for name, _ in reversed(views):
        op.execute(f'DROP VIEW "{name}"')
    op.execute(
        f"ALTER TABLE response_events ALTER COLUMN payload TYPE {sql_type}"
        f" USING payload::{sql_type}"
    )
    for name, definition in views:
        op.execute(f'CREATE VIEW "{name}" AS {definition}')
