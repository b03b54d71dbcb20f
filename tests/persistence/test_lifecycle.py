from __future__ import annotations

import dataclasses

from persistence.lifecycle import (
    TERMINAL_STATUSES,
    UNFINISHED_STATUSES,
    RowUpdate,
    initial_status,
    row_update,
)
from persistence.records import StoredEvent
from tests.persistence.factories import completed, created, delta, failed, incomplete


def test_non_lifecycle_events_leave_the_row_alone() -> None:
    assert row_update(delta(3)) is None
    assert row_update(StoredEvent(4, "response.output_item.done", {"response": {}})) is None


def test_created_sets_the_snapshot_status() -> None:
    assert row_update(created("r", status="queued")) == RowUpdate(
        "queued", None, None, None, None, None, None
    )


def test_completed_carries_usage_and_time() -> None:
    update = row_update(completed("r", 9, input_tokens=12, output_tokens=8, reasoning=5))
    assert update == RowUpdate("completed", 1_700_000_100, 12, 8, 5, None, None)


def test_failed_and_incomplete_carry_their_reason() -> None:
    failed_update = row_update(failed("r", 2, code="server_error"))
    incomplete_update = row_update(incomplete("r", 2, reason="content_filter"))
    assert failed_update is not None and failed_update.error_code == "server_error"
    assert incomplete_update is not None
    assert incomplete_update.incomplete_reason == "content_filter"


def test_a_terminal_event_status_comes_from_its_type() -> None:
    event = StoredEvent(5, "response.completed", {"response": {"status": "in_progress"}})
    update = row_update(event)
    assert update is not None and update.status == "completed"
    bare = row_update(StoredEvent(5, "response.cancelled", {}))
    assert bare is not None and bare.status == "cancelled"


def test_malformed_snapshots_do_not_raise() -> None:
    odd = {
        "response": {
            "status": "in_progress",
            "usage": {"input_tokens": True, "output_tokens": "7", "output_tokens_details": None},
            "error": "not an object",
            "incomplete_details": [],
        }
    }
    assert row_update(StoredEvent(1, "response.in_progress", odd)) == RowUpdate(
        "in_progress", None, None, None, None, None, None
    )
    assert row_update(StoredEvent(1, "response.in_progress", {"response": None})) is None


def test_values_are_the_columns_in_the_update_statements_order() -> None:
    update = RowUpdate("failed", 7, 1, 2, 3, "server_error", None)
    assert update.values() == dataclasses.astuple(update)
    assert len(update.values()) == len(dataclasses.fields(RowUpdate))


def test_an_opening_event_never_gives_the_row_a_status_outside_the_unfinished_ones() -> None:
    # The sweeps find unfinished responses by these statuses (the ``status`` index): a row
    # marked ended, or with a status nobody looks for, before its terminal event would never be
    # repaired.
    for status in ("completed", "failed", "requires_action", 7):
        event = StoredEvent(1, "response.in_progress", {"response": {"status": status}})
        assert row_update(event) is None
    for status in sorted(UNFINISHED_STATUSES):
        update = row_update(StoredEvent(0, "response.created", {"response": {"status": status}}))
        assert update is not None and update.status == status
    assert (
        initial_status(True) in UNFINISHED_STATUSES and initial_status(False) in UNFINISHED_STATUSES
    )
    assert not UNFINISHED_STATUSES & TERMINAL_STATUSES
