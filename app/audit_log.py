"""A response's log as JSON lines: its stream events in ``seq`` order, then its audit records.

One format for the ``responses-ledger events`` command and the audit page's download
(``/ui/responses/{id}/log.jsonl``), so a file saved from either reads the same.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence

from persistence.records import AuditRecord, StoredEvent

__all__ = ["log_lines"]


def log_lines(events: Sequence[StoredEvent], audit: Sequence[AuditRecord]) -> Iterator[bytes]:
    """One line (with its newline) per event, ``{"seq", "type", "payload"}``, then one per
    audit record, ``{"audit", "token_ids", "detail"}``."""
    for e in events:
        line = {"seq": e.seq, "type": e.type, "payload": e.payload}
        yield json.dumps(line, ensure_ascii=False).encode() + b"\n"
    for record in audit:
        line = {"audit": record.kind, "token_ids": list(record.token_ids), "detail": record.detail}
        yield json.dumps(line).encode() + b"\n"
