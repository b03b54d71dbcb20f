"""SQLite: ``response_events`` becomes a rowid table (its key an index), as it is on PostgreSQL

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02

A ``WITHOUT ROWID`` table is one B-tree ordered by its key, ``(response_id, seq)``: a commit that
appends one event to each of 256 live logs writes 256 places in it, and every full leaf there
is split and rebalanced with its neighbours, a full page a time into the WAL. As a rowid table
the events are stored in the order they are appended (a commit's rows fill a few pages at the
end) and only the key's index, whose entries are a third of an event's size, takes the 256
scattered writes: 14.3 -> 10.2 µs of CPU a row in a stand-alone reproduction, 29 -> 25 µs a
paced token in process (bench/RESULTS.md, "SQLite events in append order"). Reading a log back
reads its rows through the index, as PostgreSQL always has.

The table is rebuilt (SQLite cannot change this in place): same columns, key, foreign key and
triggers, every row copied in log order. The time it takes grows with the number of events
stored; a server that starts on an older file runs it once. PostgreSQL: nothing to do (its
tables were always heap tables).
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op
from sqlalchemy import text

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TABLE = "response_events"
_NEW = "response_events_rebuilt"


def upgrade() -> None:
    _rebuild(without_rowid=False)


def downgrade() -> None:
    _rebuild(without_rowid=True)


def _rebuild(*, without_rowid: bool) -> None:
    """Copy ``response_events`` into a table of the same definition, with or without rowid,
    and put its triggers back. Views and other tables' triggers name the table and find the
    new one under the same name (the rename runs with ``legacy_alter_table`` on, so SQLite
    neither checks nor rewrites them while the old table is gone)."""
    bind = op.get_bind()
    if bind.dialect.name != "sqlite":
        return
    ddl = bind.execute(
        text("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = :name"),
        {"name": _TABLE},
    ).scalar_one()
    triggers = [
        sql
        for (sql,) in bind.execute(
            text(
                "SELECT sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name = :name ORDER BY rowid"
            ),
            {"name": _TABLE},
        )
    ]
    head, body = ddl.split("(", 1)
    body = body.rstrip()
    if body.upper().endswith("WITHOUT ROWID"):
        body = body[: -len("WITHOUT ROWID")].rstrip()
    if without_rowid:
        body += " WITHOUT ROWID"
    assert head.split()[:2] == ["CREATE", "TABLE"], ddl
    columns = [row[1] for row in bind.execute(text(f"PRAGMA table_info({_TABLE})"))]
    listed = ", ".join(columns)
    op.execute(f"CREATE TABLE {_NEW} ({body}")
    op.execute(
        f"INSERT INTO {_NEW} ({listed}) SELECT {listed} FROM {_TABLE} ORDER BY response_id, seq"
    )
    op.execute(f"DROP TABLE {_TABLE}")  # its own triggers go with it
    op.execute("PRAGMA legacy_alter_table = ON")
    try:
        op.execute(f"ALTER TABLE {_NEW} RENAME TO {_TABLE}")
    finally:
        op.execute("PRAGMA legacy_alter_table = OFF")
    for sql in triggers:
        op.execute(sql)
