"""Finding responses by what an operator knows of them (the audit page, ``app.ui``).

A :class:`ResponseQuery` filters the ``responses`` rows by status, model, project, creation time
and text, and pages through them newest first. These are reads only, from the rows the write path
already keeps (``responses``, with its indexes on ``created_at``, ``(project, created_at)`` and
``status``): nothing is added to an append. ``text`` is a case-insensitive substring of the
response id or of the request body as stored (input, instructions, metadata); it scans the rows
the other filters leave, which an audit page can afford and a hot path never pays.

``previous_response_id`` and ``conversation`` find a response's neighbours: the responses that
continue it, and the responses whose turns appended to a conversation.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Text, cast, func, select

from persistence.records import ResponseRow, dump_json
from persistence.schema import conversation_items, responses

__all__ = ["ResponseQuery", "matches", "sql_filters"]


@dataclass(frozen=True, slots=True)
class ResponseQuery:
    status: str | None = None
    model: str | None = None
    project: str | None = None
    #: ``created_at`` (unix seconds) at or after ``since``, and before ``until``.
    since: int | None = None
    until: int | None = None
    text: str | None = None
    previous_response_id: str | None = None
    conversation: str | None = None
    offset: int = 0
    limit: int = 50

    def __post_init__(self) -> None:
        if self.limit < 1:
            raise ValueError(f"limit must be >= 1, got {self.limit}")
        if self.offset < 0:
            raise ValueError(f"offset must be >= 0, got {self.offset}")


def _like(text: str) -> str:
    escaped = text.lower().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def sql_filters(query: ResponseQuery) -> list[Any]:
    """The WHERE clauses of ``query`` over ``responses``."""
    r = responses
    clauses: list[Any] = []
    if query.status is not None:
        clauses.append(r.c.status == query.status)
    if query.model is not None:
        clauses.append(r.c.model == query.model)
    if query.project is not None:
        clauses.append(r.c.project == query.project)
    if query.since is not None:
        clauses.append(r.c.created_at >= query.since)
    if query.until is not None:
        clauses.append(r.c.created_at < query.until)
    if query.previous_response_id is not None:
        clauses.append(r.c.previous_response_id == query.previous_response_id)
    if query.conversation is not None:
        turns = select(conversation_items.c.response_id).where(
            conversation_items.c.conversation_id == query.conversation,
            conversation_items.c.response_id.is_not(None),
        )
        clauses.append(r.c.id.in_(turns))
    if query.text:
        pattern = _like(query.text)
        clauses.append(
            func.lower(r.c.id).like(pattern, escape="\\")
            | func.lower(cast(r.c.request, Text)).like(pattern, escape="\\")
        )
    return clauses


def matches(
    row: ResponseRow, query: ResponseQuery, conversation_turns: Collection[str] = ()
) -> bool:
    """``sql_filters`` for a store that holds its rows in memory (``conversation_turns``: the
    ids of the responses that appended to ``query.conversation``)."""
    if query.status is not None and row.status != query.status:
        return False
    if query.model is not None and row.model != query.model:
        return False
    if query.project is not None and row.project != query.project:
        return False
    if query.since is not None and row.created_at < query.since:
        return False
    if query.until is not None and row.created_at >= query.until:
        return False
    if (
        query.previous_response_id is not None
        and row.previous_response_id != query.previous_response_id
    ):
        return False
    if query.conversation is not None and row.id not in conversation_turns:
        return False
    if query.text:
        needle = query.text.lower()
        return needle in row.id.lower() or needle in dump_json(row.request).lower()
    return True
