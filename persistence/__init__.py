"""Where responses are kept: one append-only event log per response.

- ``records``: the values that cross this boundary (``StoredEvent``, ``NewResponse``, ...).
- ``store``: the ``EventStore`` contract; ``memory.MemoryStore`` and ``sql.SqlStore`` keep it.
- ``sql.open_store(url)``: SQLite or PostgreSQL, created and migrated on first start.
- ``group_commit``: many writers, one transaction per few milliseconds.
- ``lifecycle``: which events end a log and how they move the ``responses`` row.
- ``schema`` (tables), ``migrate`` (Alembic from code), ``database`` (engines, SQLite pragmas).
- ``COOKBOOK.md``: answering questions with ``sqlite3``/``psql`` and the views.

Importing this package imports nothing else, so the domain and the tests can pick a module.
"""
