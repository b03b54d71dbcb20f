"""What the store knows about event types: which end a log, and how lifecycle events move the
``responses`` row.

Lifecycle events (``response.created``, ``response.queued``, ``response.in_progress`` and the
terminals) carry ``payload["response"]``, a full OpenAI Response object. The row is
overwritten from the latest such snapshot in the same transaction as the event, so the row
never disagrees with the log. A terminal event's status is taken from its type, so
``unfinished()`` can trust ``responses.status`` even if a snapshot were malformed.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from persistence.records import StoredEvent

__all__ = [
    "LIFECYCLE_EVENT_TYPES",
    "OUTPUT_ITEM_DONE",
    "TERMINAL_EVENT_TYPES",
    "TERMINAL_STATUSES",
    "UNFINISHED_STATUSES",
    "RowUpdate",
    "initial_status",
    "row_update",
]

OUTPUT_ITEM_DONE = "response.output_item.done"

_TERMINAL_STATUS_BY_TYPE: Mapping[str, str] = {
    "response.completed": "completed",
    "response.incomplete": "incomplete",
    "response.failed": "failed",
    "response.cancelled": "cancelled",
}
TERMINAL_EVENT_TYPES = frozenset(_TERMINAL_STATUS_BY_TYPE)
TERMINAL_STATUSES = frozenset(_TERMINAL_STATUS_BY_TYPE.values())
#: Every status a row has before its terminal event: a row's status is always one of these or
#: of ``TERMINAL_STATUSES``. The periodic queries for unfinished responses (the orphan sweep, a
#: replica's cancel requests) name these, so they read the ``status`` index: ``status NOT IN``
#: the terminal ones scans the whole table (97-149 ms at a million rows, every heartbeat on
#: every replica; ``python -m bench.sweeps``).
UNFINISHED_STATUSES = frozenset({"queued", "in_progress"})
LIFECYCLE_EVENT_TYPES = TERMINAL_EVENT_TYPES | {
    "response.created",
    "response.queued",
    "response.in_progress",
}


@dataclass(frozen=True, slots=True)
class RowUpdate:
    """The ``responses`` columns a lifecycle event sets."""

    status: str
    completed_at: int | None
    input_tokens: int | None
    output_tokens: int | None
    reasoning_tokens: int | None
    error_code: str | None
    incomplete_reason: str | None

    def values(self) -> tuple[Any, ...]:
        """The columns' values in field order (``dataclasses.astuple`` deep-copies each one:
        5.4 µs against 0.15, twice a response)."""
        return _FIELD_VALUES(self)  # type: ignore[no-any-return]


_FIELD_VALUES = operator.attrgetter(*(field.name for field in dataclasses.fields(RowUpdate)))


def initial_status(background: bool) -> str:
    """The row's status before the first lifecycle event is appended (one of
    ``UNFINISHED_STATUSES``)."""
    return "queued" if background else "in_progress"


def row_update(event: StoredEvent) -> RowUpdate | None:
    """The row change a lifecycle event implies, or None for any other event, and for an
    opening event whose snapshot's status is not one of ``UNFINISHED_STATUSES`` (the row keeps
    the unfinished status it has: only a terminal event ends it)."""
    if event.type not in LIFECYCLE_EVENT_TYPES:
        return None
    snapshot = event.payload.get("response")
    response: Mapping[str, Any] = snapshot if isinstance(snapshot, Mapping) else {}
    status = _TERMINAL_STATUS_BY_TYPE.get(event.type)
    if status is None:
        status = response.get("status")
        if status not in UNFINISHED_STATUSES:
            return None
    usage = _mapping(response.get("usage"))
    error = _mapping(response.get("error"))
    incomplete = _mapping(response.get("incomplete_details"))
    return RowUpdate(
        status=status,
        completed_at=_int(response.get("completed_at")),
        input_tokens=_int(usage.get("input_tokens")),
        output_tokens=_int(usage.get("output_tokens")),
        reasoning_tokens=_int(_mapping(usage.get("output_tokens_details")).get("reasoning_tokens")),
        error_code=_str(error.get("code")),
        incomplete_reason=_str(incomplete.get("reason")),
    )


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _int(value: object) -> int | None:
    # bool is an int subclass; a JSON true is not a count.
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None
