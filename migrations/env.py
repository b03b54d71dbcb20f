"""Alembic environment, async, for SQLite and PostgreSQL.

Two ways in:

- the ``alembic`` command line (alembic.ini at the repository root): the URL comes from
  ``-x url=...``, else ``$DATABASE_URL``, else ``sqlalchemy.url``;
- ``persistence.migrate`` (what the server runs on start): it passes an open connection in
  ``config.attributes["connection"]`` so migrations run inside the caller's event loop.

``render_as_batch`` is on for SQLite, whose ALTER TABLE cannot change most things. Views and
triggers are created by the migrations and are not part of ``target_metadata``; autogenerate
only compares tables, so ``alembic check`` reports table drift only.
"""

from __future__ import annotations

import asyncio
import os
from logging.config import fileConfig

from alembic import context
from sqlalchemy.engine import Connection

from persistence.database import create_engine
from persistence.migrate import take_migration_lock
from persistence.schema import DIALECTS, metadata

config = context.config

if config.config_file_name is not None and "connection" not in config.attributes:
    fileConfig(config.config_file_name, disable_existing_loggers=False)


def _database_url() -> str:
    url = context.get_x_argument(as_dictionary=True).get("url")
    return url or os.environ.get("DATABASE_URL") or str(config.get_main_option("sqlalchemy.url"))


def _include_name(name: str | None, type_: str, _parent: object) -> bool:
    # Only our tables: never the views (some dialects reflect them as tables) or alembic's own.
    if type_ == "table":
        return name in metadata.tables
    return True


def _run(connection: Connection) -> None:
    dialect = connection.dialect.name

    def include_object(
        obj: object, _name: str | None, _type: str, reflected: bool, _other: object
    ) -> bool:
        # A constraint declared for other dialects only (schema.DIALECTS) is not expected here.
        dialects = getattr(obj, "info", {}).get(DIALECTS)
        return reflected or dialects is None or dialect in dialects

    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=dialect == "sqlite",
        include_name=_include_name,
        include_object=include_object,
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def _run_locked(connection: Connection) -> None:
    take_migration_lock(connection)
    _run(connection)


async def _run_async() -> None:
    engine = create_engine(_database_url(), role="migrations")
    try:
        async with engine.begin() as connection:  # one transaction, as persistence.migrate
            await connection.run_sync(_run_locked)
    finally:
        await engine.dispose()


def _run_offline() -> None:
    context.configure(
        url=_database_url(),
        target_metadata=metadata,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
        render_as_batch=True,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    _run_offline()
elif (shared := config.attributes.get("connection")) is not None:
    _run(shared)
else:
    asyncio.run(_run_async())
