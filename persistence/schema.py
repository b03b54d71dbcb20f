"""The tables, as SQLAlchemy Core metadata: what migrations build and ``alembic check`` compares.

Every response is an append-only log in ``response_events``; ``responses`` holds one row per
response with the columns an operator filters on, updated in the same transaction as the
lifecycle events that move it. Views (created by the migrations, not declared here) answer the
common questions; see ``persistence/COOKBOOK.md``.

Conversations (migration 0006) are logs too: ``conversations`` holds one row per conversation
(its project, metadata, and ``next_seq``, the length of its log), ``conversation_items`` its
append-only log of items: an ``added`` entry per item, and a ``deleted`` entry when one is
deleted (the item stays in the log; the views and reads leave it out from then on).

Storage choices:

- ``response_events`` is keyed by ``(response_id, seq)``: the key both orders a log and makes
  two writers of the same ``seq`` collide. The rows are stored in the order they are appended
  and the key is an index, on both databases (SQLite's table was ``WITHOUT ROWID``, the key the
  table, until migration 0010: a commit appending to hundreds of logs then rewrote hundreds of
  full pages of events; now only the small index entries are scattered).
- An event's payload is its JSON text as streamed: text on SQLite (readable with ``sqlite3``,
  queried with ``json_extract``), ``json`` on PostgreSQL (queried with ``->>``; ``jsonb`` until
  migration 0011, which parsed every event at each commit and gave back its own rendering).
  The other JSON columns (a request, an input item, conversation items) are ``jsonb`` there.
- Times written by the store (``recorded_at``) are unix seconds as a double: one type on both
  databases, sub-second, rendered as timestamps by the views.
- Audit token ids are uint32 little-endian in a BLOB/BYTEA: 4 bytes a token.
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    Double,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    Table,
    Text,
)
from sqlalchemy.dialects.postgresql import JSONB

__all__ = [
    "DIALECTS",
    "api_keys",
    "conversation_items",
    "conversations",
    "item_index",
    "metadata",
    "replicas",
    "response_audit",
    "response_events",
    "response_input_items",
    "responses",
    "server_secrets",
]

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

_Json = JSON().with_variant(JSONB(), "postgresql")

#: ``info`` key of a constraint that exists only on these dialects (``alembic check`` compares
#: it only there; see migrations/env.py).
DIALECTS = "dialects"

responses = Table(
    "responses",
    metadata,
    Column("id", Text, primary_key=True),
    Column("model", Text, nullable=False),
    Column("status", Text, nullable=False),
    Column("created_at", BigInteger, nullable=False),
    Column("completed_at", BigInteger),
    Column("previous_response_id", Text),
    Column("background", Boolean, nullable=False),
    Column("input_tokens", Integer),
    Column("output_tokens", Integer),
    Column("reasoning_tokens", Integer),
    Column("error_code", Text),
    Column("incomplete_reason", Text),
    Column("request", _Json, nullable=False),
    # Whose response it is (migration 0003: rows made before it belong to "default"), and the
    # key that made it (NULL: the static key, or a server run without keys).
    Column("project", Text, nullable=False, server_default="default"),
    Column("api_key_id", Text),
    # The replica generating it (migration 0004; NULL: made before, or by a store without one).
    Column("owner", Text),
    # Bumped by every claim of a takeover (migration 0005): appends are fenced by it.
    Column("epoch", Integer, nullable=False, server_default="0"),
    # A cancel asked through another replica than the owner (migration 0005).
    Column("cancel_requested_at", Double),
    Index(None, "created_at"),
    Index(None, "project", "created_at"),
    Index(None, "api_key_id"),
    Index(None, "status"),
    Index(None, "previous_response_id"),
)

response_events = Table(
    "response_events",
    metadata,
    Column("response_id", Text, primary_key=True),
    Column("seq", Integer, primary_key=True, autoincrement=False),
    Column("type", Text, nullable=False),
    # ``json`` on PostgreSQL too (migration 0011): the text as streamed, checked, not re-rendered.
    Column("payload", JSON(), nullable=False),
    Column("recorded_at", Double, nullable=False),
    # The output token ids behind this write's events, on its last event (migration 0005).
    Column("token_ids", LargeBinary),
    # SQLite only. On PostgreSQL a foreign key is checked per inserted row by a trigger that
    # looks up and locks the parent row: 5.5 of the 13 us of database CPU per streamed event
    # (bench: 64 logs x 2,000-row commits). There the store checks that the response exists
    # before it appends (as it does on SQLite), and a trigger on ``responses`` deletes a
    # response's events with it (migration 0002).
    ForeignKeyConstraint(
        ["response_id"],
        ["responses.id"],
        ondelete="CASCADE",
        info={DIALECTS: ("sqlite",)},
    ).ddl_if(dialect="sqlite"),
)

response_input_items = Table(
    "response_input_items",
    metadata,
    Column(
        "response_id",
        Text,
        ForeignKey("responses.id", ondelete="CASCADE"),
        primary_key=True,
    ),
    Column("position", Integer, primary_key=True, autoincrement=False),
    Column("item_id", Text, nullable=False),
    Column("item", _Json, nullable=False),
    Index(None, "response_id", "item_id"),
    sqlite_with_rowid=False,
)

#: Where every stored item is (migration 0006): ``item_reference`` resolves any item of the caller's
#: project through it. ``source`` "input": ``response_input_items`` at ``position``; "output": the
#: ``response.output_item.done`` event at ``seq`` (``position`` is its ``output_index``). Written in
#: the same transaction as what makes the item durable; the project is the response's (a join).
item_index = Table(
    "item_index",
    metadata,
    Column("item_id", Text, primary_key=True),
    Column(
        "response_id",
        Text,
        ForeignKey("responses.id", ondelete="CASCADE"),
        primary_key=True,
    ),
    Column("source", Text, primary_key=True),
    Column("position", Integer, primary_key=True, autoincrement=False),
    Column("seq", Integer),
    Index(None, "response_id"),
    sqlite_with_rowid=False,
)

response_audit = Table(
    "response_audit",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True),
    Column(
        "response_id",
        Text,
        ForeignKey("responses.id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("kind", Text, nullable=False),
    Column("token_count", Integer, nullable=False),
    Column("token_ids", LargeBinary, nullable=False),
    Column("detail", _Json),
    Column("recorded_at", Double, nullable=False),
    Index(None, "response_id", "id"),
)

server_secrets = Table(
    "server_secrets",
    metadata,
    Column("name", Text, primary_key=True),
    Column("value", LargeBinary, nullable=False),
    Column("created_at", Double, nullable=False),
)

#: Server processes and their leases: each renews its row every heartbeat; a response whose
#: ``owner`` has no unexpired row here (or whose process is gone from this host) is orphaned,
#: and the other servers' repair loops close it.
replicas = Table(
    "replicas",
    metadata,
    Column("id", Text, primary_key=True),
    Column("host", Text, nullable=False),
    Column("pid", Integer, nullable=False),
    Column("started_at", Double, nullable=False),
    Column("heartbeat_at", Double, nullable=False),
    Column("expires_at", Double, nullable=False),
    #: Bumped by every claim and every delete of one of this replica's responses (by any
    #: server): a commit that reads it unchanged since it last checked a log's epoch need not
    #: check that log again (``persistence.sql``, the append fence).
    Column("fence", BigInteger, nullable=False, server_default="0"),
)

#: API keys (``responses-ledger keys create``): the SHA-256 of each key, never the key.
api_keys = Table(
    "api_keys",
    metadata,
    Column("id", Text, primary_key=True),
    Column("project", Text, nullable=False),
    Column("role", Text, nullable=False),
    Column("name", Text),
    Column("secret_hash", Text, nullable=False, unique=True),
    Column("created_at", Double, nullable=False),
    Column("revoked_at", Double),
    Column("max_streams", Integer),
    Column("requests_per_minute", Integer),
    Index(None, "project"),
)

#: One row per conversation (``app.conversations``). ``next_seq`` is the length of its item log:
#: every append bumps it first, in the append's own transaction, which both takes the
#: conversation's write lock and hands the append its seqs. A deleted conversation keeps its
#: row and its log (``deleted_at`` set); the API answers 404 for it from then on.
conversations = Table(
    "conversations",
    metadata,
    Column("id", Text, primary_key=True),
    Column("project", Text, nullable=False),
    Column("created_at", BigInteger, nullable=False),
    Column("metadata", _Json, nullable=False),
    Column("next_seq", Integer, nullable=False, server_default="0"),
    Column("deleted_at", Double),
    Index(None, "project", "created_at"),
)

#: The append-only log of a conversation's items: ``kind`` ``added`` (``item`` is the item as
#: listed) or ``deleted`` (``item`` NULL: the item of that ``item_id`` is gone from the
#: conversation from this entry on). ``response_id``: the response whose turn appended it
#: (NULL: added through the items API). An item id is added at most once and deleted at most
#: once per conversation (the unique index).
conversation_items = Table(
    "conversation_items",
    metadata,
    Column(
        "conversation_id",
        Text,
        ForeignKey("conversations.id", ondelete="CASCADE"),
        primary_key=True,
    ),
    Column("seq", Integer, primary_key=True, autoincrement=False),
    Column("kind", Text, nullable=False),
    Column("item_id", Text, nullable=False),
    Column("item", _Json),
    Column("response_id", Text),
    Column("recorded_at", Double, nullable=False),
    Index(None, "conversation_id", "item_id", "kind", unique=True),
    Index(None, "item_id"),  # an item_reference to a conversation item (``find_items``)
    sqlite_with_rowid=False,
)
