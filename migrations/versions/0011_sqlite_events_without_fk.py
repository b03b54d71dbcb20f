"""SQLite: response_events without a foreign key, as on PostgreSQL since 0002

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-04

SQLite checks a foreign key on every inserted row: it looks the response up in ``responses``'
key index, one B-tree descent an event, on the writer thread of a server that has one core.
Measured with the ledger's columns and settings (``python -m bench.sqlite_pages``, live logs
appended to together, medians of 3-5 runs): about 1 µs of CPU an event, 5-6 % of what an event
costs SQLite there (256 logs: 16.1 against 15.3 µs with 2,256 responses stored, 27.2 against
26.3 with 302,256; 64 logs: 17.7 against 16.7).

What it guarded, the store now checks itself, as on PostgreSQL: a commit looks up every log it
does not know (``_TAILS``) and refuses one whose response is not there, and the writer trusts
the tails it keeps in memory only while no other connection has committed since its last
transaction (``PRAGMA data_version``; ``SqlStore._write_direct``), so a ``DELETE`` typed in
``sqlite3`` while a response streams still refuses the rest of its events. Deleting a response
deletes its events through the trigger ``responses_delete_cascade``, which runs in every
session (``PRAGMA foreign_keys`` is per connection, so the trigger was already what made a
deletion from ``sqlite3`` complete).

SQLite cannot drop a constraint, but this change does not touch what is on disk, so the table's
definition is edited in place by the procedure SQLite documents for exactly this ("Making Other
Kinds Of Table Schema Changes", https://www.sqlite.org/lang_altertable.html: removing a FOREIGN
KEY constraint): in one transaction, the table's ``CREATE TABLE`` text is rewritten in
``sqlite_schema`` and the schema version is bumped, so every open connection re-reads it. It takes
no time however many events are stored (0010 had to copy them all). The new text is checked
first by creating a temporary table from it. PostgreSQL: nothing to do.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from alembic import op
from sqlalchemy import text

revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TABLE = "response_events"
_FK_SQL = (
    "CONSTRAINT fk_response_events_response_id_responses FOREIGN KEY(response_id)"
    " REFERENCES responses (id) ON DELETE CASCADE"
)
_FK = re.compile(
    r",\s*CONSTRAINT\s+fk_response_events_response_id_responses\s+FOREIGN\s+KEY\s*\(\s*response_id\s*\)"
    r"\s*REFERENCES\s+\"?responses\"?\s*\(\s*id\s*\)\s*ON\s+DELETE\s+CASCADE",
    re.IGNORECASE,
)


def upgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    ddl = _table_sql()
    new, found = _FK.subn("", ddl)
    if found != 1:
        raise RuntimeError(f"{_TABLE}: expected one foreign key in its definition, found {found}: {ddl}")
    _replace_table_sql(new)


def downgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    ddl = _table_sql()
    if _FK.search(ddl):
        return
    body, close = ddl.rstrip().rsplit(")", 1)
    assert not close.strip(), ddl  # (a rowid table: nothing after the columns)
    _replace_table_sql(f"{body.rstrip()}, \n\t{_FK_SQL}\n)")


def _table_sql() -> str:
    sql: str = (
        op.get_bind()
        .execute(text("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = :name"), {"name": _TABLE})
        .scalar_one()
    )
    return sql


def _replace_table_sql(ddl: str) -> None:
    """Rewrite the table's definition in place (see the module's docstring); the rows, the key's
    index and the triggers are untouched. ``ddl`` is parsed first, as a temporary table's."""
    bind = op.get_bind()
    head, body = ddl.split("(", 1)
    assert head.split()[:2] == ["CREATE", "TABLE"], ddl
    bind.execute(text(f"CREATE TEMP TABLE response_events_probe ({body}"))
    bind.execute(text("DROP TABLE temp.response_events_probe"))
    version = bind.execute(text("PRAGMA schema_version")).scalar_one()
    bind.execute(text("PRAGMA writable_schema = ON"))
    try:
        bind.execute(
            text("UPDATE sqlite_master SET sql = :sql WHERE type = 'table' AND name = :name"),
            {"sql": ddl, "name": _TABLE},
        )
        bind.execute(text(f"PRAGMA schema_version = {int(version) + 1}"))
    finally:
        bind.execute(text("PRAGMA writable_schema = OFF"))
