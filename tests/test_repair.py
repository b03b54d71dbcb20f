"""The repair loop (app.repair): stranded responses are closed once the store takes writes,
never before; an empty log is given its response.created first; start-up recovery that could
not run at start runs from the loop."""

from __future__ import annotations

from typing import Any

from app.repair import Repairs, store_unavailable_error
from persistence.memory import MemoryStore
from tests.persistence.factories import created, new_response


def _skeleton(rid: str) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "response",
        "created_at": 1_700_000_000,
        "model": "gpt-oss-20b",
        "status": "in_progress",
        "error": None,
        "incomplete_details": None,
        "output": [],
        "usage": None,
    }


class _Flaky(MemoryStore):
    """A store whose writes fail until ``heal()``: its probe reports what the database would."""

    def __init__(self) -> None:
        super().__init__()
        self.healed = False
        self.health.failed(OSError("connection refused"))

    def heal(self) -> None:
        self.healed = True

    async def probe(self) -> None:
        if self.healed:
            self.health.succeeded()
        else:
            self.health.failed(OSError("connection refused"))


def _repairs(store: MemoryStore, live: set[str] | None = None) -> Repairs:
    ids = iter(range(1_000_000))
    return Repairs(
        store,
        interval_s=0.01,
        new_id=lambda prefix: f"{prefix}_{next(ids)}",
        is_live=(live or set()).__contains__,
    )


async def test_a_stranded_log_is_closed_only_once_the_store_takes_writes() -> None:
    store = _Flaky()
    new = new_response()
    await store.create_response(new)
    await store.append(new.id, [created(new.id)], 0)
    repairs = _repairs(store)
    repairs.strand(new.id, _skeleton(new.id), store_unavailable_error(20))
    await repairs.run_once()
    assert [e.type for e in await store.load(new.id)] == ["response.created"]
    assert repairs.stranded(new.id) and repairs.pending == 1
    store.heal()
    await repairs.run_once()
    log = await store.load(new.id)
    assert [e.type for e in log] == ["response.created", "response.failed"]
    assert log[-1].payload["response"]["error"]["code"] == "store_unavailable"
    assert not repairs.stranded(new.id) and repairs.pending == 0
    row = await store.get(new.id)
    assert row is not None and row.status == "failed" and row.error_code == "store_unavailable"


async def test_an_empty_log_gets_its_created_event_from_the_skeleton() -> None:
    """The response row committed but its first events did not: the log is made whole."""
    store = MemoryStore()
    new = new_response()
    await store.create_response(new)
    repairs = _repairs(store)
    repairs.strand(new.id, _skeleton(new.id), store_unavailable_error(20))
    await repairs.run_once()
    log = await store.load(new.id)
    assert [(e.seq, e.type) for e in log] == [(0, "response.created"), (1, "response.failed")]


async def test_a_response_whose_row_never_landed_is_dropped() -> None:
    store = MemoryStore()
    repairs = _repairs(store)
    repairs.strand("resp_never", _skeleton("resp_never"), store_unavailable_error(20))
    await repairs.run_once()
    assert await store.get("resp_never") is None and repairs.pending == 0


async def test_recovery_scheduled_at_a_degraded_start_runs_when_the_store_heals() -> None:
    store = _Flaky()
    left, live = new_response(), new_response()
    for new in (left, live):
        await store.create_response(new)
        await store.append(new.id, [created(new.id)], 0)
    repairs = _repairs(store, live={live.id})
    repairs.schedule_recovery()
    await repairs.run_once()
    assert await store.unfinished() == [left.id, live.id]
    store.heal()
    await repairs.run_once()
    assert await store.unfinished() == [live.id]  # a live response is never closed by recovery
    log = await store.load(left.id)
    assert log[-1].payload["response"]["error"]["message"] == "the server restarted"
