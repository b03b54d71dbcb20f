"""The contract every event store keeps, as one suite.

Subclass ``EventStoreContract`` and give it a ``store`` fixture (an empty store, closed
afterwards); ``test_stores.py`` does so for memory, SQLite and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
from collections.abc import Callable

import pytest

from persistence.errors import ConcurrencyError, NotFound, StoreError
from persistence.lifecycle import OUTPUT_ITEM_DONE
from persistence.records import ApiKeyRow, AuditRecord, StoredEvent
from persistence.store import EventStore
from tests.persistence.factories import (
    completed,
    created,
    delta,
    failed,
    function_call_done,
    function_call_output,
    incomplete,
    message_done,
    new_response,
    text_done,
    user_message,
)


async def _started(store: EventStore, **kwargs: object) -> str:
    """A response with its ``response.created`` event (seq 0)."""
    new = new_response(**kwargs)  # type: ignore[arg-type]
    await store.create_response(new)
    await store.append(new.id, [created(new.id)], 0)
    return new.id


class EventStoreContract:
    # -- create / get ---------------------------------------------------------------------

    async def test_create_then_get(self, store: EventStore) -> None:
        new = new_response(background=True)
        await store.create_response(new)
        row = await store.get(new.id)
        assert row is not None
        assert (row.id, row.model, row.created_at) == (new.id, new.model, new.created_at)
        assert row.status == "queued"
        assert row.background is True
        assert row.previous_response_id is None
        assert row.request == new.request
        assert row.last_seq == -1
        assert (row.input_tokens, row.output_tokens, row.reasoning_tokens) == (None, None, None)
        assert (row.completed_at, row.error_code, row.incomplete_reason) == (None, None, None)

    async def test_create_events_and_audit_submitted_back_to_back(self, store: EventStore) -> None:
        new = new_response()
        writes = [
            store.submit_create(new),
            store.submit(new.id, [created(new.id)], 0),
            store.submit_audit(new.id, [AuditRecord("prompt_token_ids", (1, 2, 3))]),
        ]
        await asyncio.gather(*writes)
        assert [e.type for e in await store.load(new.id)] == ["response.created"]
        assert [r.token_ids for r in await store.load_audit(new.id)] == [(1, 2, 3)]

    async def test_events_behind_a_failed_create_fail_too(self, store: EventStore) -> None:
        new = new_response()
        await store.create_response(new)
        again = store.submit_create(new)  # the id is taken
        with pytest.raises(ConcurrencyError):
            await again
        other = new_response()
        orphan = store.submit(other.id, [created(other.id)], 0)  # never created
        with pytest.raises(NotFound):
            await orphan
        assert await store.get(other.id) is None

    async def test_submit_then_calls_back_later_with_the_outcome(self, store: EventStore) -> None:
        """...and a callback that raises does not keep the others in its commit from settling."""
        rid = await _started(store)
        other = await _started(store)
        outcomes: list[tuple[str, BaseException | None]] = []
        settled = asyncio.Event()

        def done(name: str) -> Callable[[BaseException | None], None]:
            def record(error: BaseException | None) -> None:
                outcomes.append((name, error))
                if len(outcomes) == 3:
                    settled.set()
                if name == "raises":
                    raise RuntimeError("a writer's bug")

            return record

        store.submit_then(rid, [delta(1, "a")], 1, done("raises"))
        store.submit_then(rid, [delta(1, "again")], 1, done("conflict"))  # seq 1 is taken
        store.submit_then(other, [delta(1, "b")], 1, done("fine"))
        assert outcomes == []  # never from inside submit_then
        await asyncio.wait_for(settled.wait(), 10)
        by_name = dict(outcomes)
        assert by_name["raises"] is None and by_name["fine"] is None
        assert isinstance(by_name["conflict"], ConcurrencyError)
        assert [e.payload.get("delta") for e in await store.load(rid)] == [None, "a"]
        assert [e.payload.get("delta") for e in await store.load(other)] == [None, "b"]

    async def test_foreground_response_starts_in_progress(self, store: EventStore) -> None:
        new = new_response(background=False)
        await store.create_response(new)
        row = await store.get(new.id)
        assert row is not None and row.status == "in_progress" and row.background is False

    async def test_get_unknown_is_none(self, store: EventStore) -> None:
        assert await store.get("resp_nope") is None

    async def test_input_items_need_ids(self, store: EventStore) -> None:
        new = new_response(input_items=[{"type": "message", "role": "user", "content": "hi"}])
        with pytest.raises(ValueError):
            await store.create_response(new)
        assert await store.get(new.id) is None

    async def test_create_twice_is_a_conflict(self, store: EventStore) -> None:
        new = new_response()
        await store.create_response(new)
        with pytest.raises(ConcurrencyError):
            await store.create_response(new)

    # -- append / load ----------------------------------------------------------------------

    async def test_append_then_load_in_order(self, store: EventStore) -> None:
        rid = await _started(store)
        await store.append(rid, [delta(1, "Hel"), delta(2, "lo")], 1)
        await store.append(rid, [delta(3, " world")], 3)
        events = await store.load(rid)
        assert [e.seq for e in events] == [0, 1, 2, 3]
        assert [e.type for e in events] == ["response.created"] + ["response.output_text.delta"] * 3
        assert events[1:] == [
            StoredEvent(e.seq, e.type, e.payload, events[i + 1].payload_json)
            for i, e in enumerate([delta(1, "Hel"), delta(2, "lo"), delta(3, " world")])
        ]
        for event in events:
            assert event.payload_json is not None
            assert json.loads(event.payload_json) == event.payload

    async def test_load_after_seq(self, store: EventStore) -> None:
        rid = await _started(store)
        await store.append(rid, [delta(i) for i in range(1, 6)], 1)
        assert [e.seq for e in await store.load(rid, after_seq=3)] == [4, 5]
        assert [e.seq for e in await store.load(rid, after_seq=-1)] == [0, 1, 2, 3, 4, 5]
        assert await store.load(rid, after_seq=5) == []
        assert await store.load(rid, after_seq=99) == []

    async def test_load_pages_with_a_limit(self, store: EventStore) -> None:
        rid = await _started(store)
        await store.append(rid, [delta(i) for i in range(1, 6)], 1)
        assert [e.seq for e in await store.load(rid, after_seq=1, limit=2)] == [2, 3]
        assert [e.seq for e in await store.load(rid, limit=3)] == [0, 1, 2]
        assert [e.seq for e in await store.load(rid, after_seq=4, limit=10)] == [5]

    async def test_load_unknown_is_empty(self, store: EventStore) -> None:
        assert await store.load("resp_nope") == []

    async def test_payload_json_is_used_as_given(self, store: EventStore) -> None:
        rid = await _started(store)
        text = '{"delta": "caf\\u00e9",   "item_id": "msg_1", "n": [1, 2.5, null]}'
        await store.append(
            rid, [StoredEvent(1, "response.output_text.delta", json.loads(text), text)], 1
        )
        (event,) = await store.load(rid, after_seq=0)
        assert event.payload == {"delta": "café", "item_id": "msg_1", "n": [1, 2.5, None]}

    async def test_unicode_and_nesting_round_trip(self, store: EventStore) -> None:
        rid = await _started(store)
        payload = {"delta": '日本語 🚀 \\u0000 "quoted" \\', "deep": {"a": [{"b": True}]}}
        await store.append(rid, [StoredEvent(1, "response.output_text.delta", payload)], 1)
        (event,) = await store.load(rid, after_seq=0)
        assert event.payload == payload

    async def test_loaded_events_are_copies(self, store: EventStore) -> None:
        rid = await _started(store)
        await store.append(rid, [delta(1, "a")], 1)
        (event,) = await store.load(rid, after_seq=0)
        event.payload["delta"] = "mutated"
        (again,) = await store.load(rid, after_seq=0)
        assert again.payload["delta"] == "a"

    async def test_submitted_events_are_not_aliased(self, store: EventStore) -> None:
        rid = await _started(store)
        event = delta(1, "a")
        await store.append(rid, [event], 1)
        event.payload["delta"] = "mutated after the append"
        (stored,) = await store.load(rid, after_seq=0)
        assert stored.payload["delta"] == "a"

    async def test_submit_many_without_waiting_keeps_order(self, store: EventStore) -> None:
        rid = await _started(store)
        futures = [store.submit(rid, [delta(seq, str(seq))], seq) for seq in range(1, 101)]
        await asyncio.gather(*futures)
        events = await store.load(rid)
        assert [e.seq for e in events] == list(range(101))
        assert [e.payload["delta"] for e in events[1:]] == [str(s) for s in range(1, 101)]

    async def test_submit_returns_a_future_that_resolves_once_durable(
        self, store: EventStore
    ) -> None:
        rid = await _started(store)
        future = store.submit(rid, [delta(1)], 1)
        assert isinstance(future, asyncio.Future)
        await future
        assert future.done() and future.exception() is None
        assert [e.seq for e in await store.load(rid)] == [0, 1]

    async def test_many_responses_interleaved(self, store: EventStore) -> None:
        rids = [await _started(store) for _ in range(8)]

        async def write(rid: str) -> None:
            for seq in range(1, 21):
                await store.append(rid, [delta(seq, f"{rid}:{seq}")], seq)

        await asyncio.gather(*(write(rid) for rid in rids))
        for rid in rids:
            events = await store.load(rid)
            assert [e.seq for e in events] == list(range(21))
            assert all(e.payload["delta"] == f"{rid}:{e.seq}" for e in events[1:])

    # -- refusals ---------------------------------------------------------------------------

    @pytest.mark.parametrize("expected_seq", [0, 2, 7])
    async def test_wrong_expected_seq_is_a_conflict(
        self, store: EventStore, expected_seq: int
    ) -> None:
        rid = await _started(store)
        with pytest.raises(ConcurrencyError):
            await store.append(rid, [delta(expected_seq)], expected_seq)
        assert [e.seq for e in await store.load(rid)] == [0]
        row = await store.get(rid)
        assert row is not None and row.last_seq == 0

    async def test_two_writers_same_seq_exactly_one_wins(self, store: EventStore) -> None:
        rid = await _started(store)
        results = await asyncio.gather(
            store.append(rid, [delta(1, "first")], 1),
            store.append(rid, [delta(1, "second")], 1),
            return_exceptions=True,
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        assert len(errors) == 1 and isinstance(errors[0], ConcurrencyError)
        events = await store.load(rid)
        assert [e.seq for e in events] == [0, 1]
        winner = "first" if results[0] is None else "second"
        assert events[1].payload["delta"] == winner

    async def test_many_racers_leave_a_contiguous_log(self, store: EventStore) -> None:
        rid = await _started(store)

        async def racer(name: str) -> int:
            wins = 0
            for _ in range(30):
                seq = len(await store.load(rid))
                try:
                    await store.append(rid, [delta(seq, name)], seq)
                    wins += 1
                except ConcurrencyError:
                    pass
            return wins

        wins = await asyncio.gather(*(racer(f"w{i}") for i in range(4)))
        events = await store.load(rid)
        assert [e.seq for e in events] == list(range(len(events)))
        assert sum(wins) == len(events) - 1

    async def test_a_refused_submission_fails_the_later_ones_of_its_response(
        self, store: EventStore
    ) -> None:
        rid = await _started(store)
        other = await _started(store)
        bad = store.submit(rid, [delta(5)], 5)  # not next
        after = store.submit(rid, [delta(6)], 6)
        fine = store.submit(other, [delta(1)], 1)
        results = await asyncio.gather(bad, after, fine, return_exceptions=True)
        assert isinstance(results[0], ConcurrencyError)
        assert isinstance(results[1], ConcurrencyError)
        assert results[2] is None
        assert [e.seq for e in await store.load(rid)] == [0]
        assert [e.seq for e in await store.load(other)] == [0, 1]

    async def test_append_to_unknown_response_is_not_found(self, store: EventStore) -> None:
        with pytest.raises(NotFound):
            await store.append("resp_nope", [created("resp_nope")], 0)
        with pytest.raises(NotFound):
            await store.append_audit("resp_nope", [AuditRecord("finish", detail={})])

    async def test_nothing_after_the_terminal_event(self, store: EventStore) -> None:
        rid = await _started(store)
        await store.append(rid, [delta(1), completed(rid, 2)], 1)
        with pytest.raises(ConcurrencyError):
            await store.append(rid, [delta(3)], 3)
        assert [e.seq for e in await store.load(rid)] == [0, 1, 2]
        # Audit records are not part of the stream and may follow the terminal event.
        await store.append_audit(rid, [AuditRecord("finish", detail={"finish_reason": "stop"})])

    @pytest.mark.parametrize(
        ("events", "expected_seq"),
        [
            ([], 0),
            ([delta(1)], -1),
            ([delta(1), delta(3)], 1),
            ([delta(2)], 1),
            ([delta(1), completed("r", 2), delta(3)], 1),
        ],
        ids=["empty", "negative", "gap", "not-at-expected", "event-after-terminal"],
    )
    async def test_malformed_submissions_raise_at_once(
        self, store: EventStore, events: list[StoredEvent], expected_seq: int
    ) -> None:
        with pytest.raises(ValueError):
            store.submit("resp_any", events, expected_seq)

    async def test_payload_that_is_not_json_raises_at_once(self, store: EventStore) -> None:
        rid = await _started(store)
        with pytest.raises(ValueError):
            store.submit(rid, [StoredEvent(1, "x.delta", {"v": math.nan})], 1)
        with pytest.raises(TypeError):
            store.submit(rid, [StoredEvent(1, "x.delta", {"v": {1, 2}})], 1)
        # U+0000 is refused everywhere, because PostgreSQL's JSONB cannot hold it.
        with pytest.raises(ValueError):
            store.submit(rid, [StoredEvent(1, "x.delta", {"v": "a\x00b"})], 1)
        with pytest.raises(ValueError):
            store.submit(rid, [StoredEvent(1, "x.delta", {"v": "a"}, '{"v":"a\\u0000"}')], 1)
        with pytest.raises(ValueError):
            await store.create_response(new_response(input_items=[{"id": "x", "t": "\x00"}]))
        await store.append(rid, [delta(1)], 1)  # the refusals took nothing

    # -- the responses row follows the lifecycle ------------------------------------------

    async def test_row_follows_lifecycle_events(self, store: EventStore) -> None:
        new = new_response(background=True)
        rid = new.id
        await store.create_response(new)
        await store.append(rid, [created(rid, 0, status="queued")], 0)
        row = await store.get(rid)
        assert row is not None and (row.status, row.last_seq) == ("queued", 0)
        in_progress = StoredEvent(
            1, "response.in_progress", {"response": {"id": rid, "status": "in_progress"}}
        )
        await store.append(rid, [in_progress, delta(2), delta(3)], 1)
        row = await store.get(rid)
        assert row is not None and (row.status, row.last_seq) == ("in_progress", 3)
        await store.append(
            rid, [completed(rid, 4, input_tokens=11, output_tokens=7, reasoning=3)], 4
        )
        row = await store.get(rid)
        assert row is not None
        assert (row.status, row.completed_at, row.last_seq) == ("completed", 1_700_000_100, 4)
        assert (row.input_tokens, row.output_tokens, row.reasoning_tokens) == (11, 7, 3)
        assert (row.error_code, row.incomplete_reason) == (None, None)

    async def test_failed_and_incomplete_rows(self, store: EventStore) -> None:
        a = await _started(store)
        b = await _started(store)
        c = await _started(store)
        await store.append(a, [failed(a, 1, code="rate_limit_exceeded")], 1)
        await store.append(b, [incomplete(b, 1, reason="max_output_tokens")], 1)
        cancelled = StoredEvent(1, "response.cancelled", {"response": {"status": "cancelled"}})
        await store.append(c, [cancelled], 1)
        row_a, row_b, row_c = [await store.get(rid) for rid in (a, b, c)]
        assert row_a is not None and (row_a.status, row_a.error_code) == (
            "failed",
            "rate_limit_exceeded",
        )
        assert row_b is not None and (row_b.status, row_b.incomplete_reason) == (
            "incomplete",
            "max_output_tokens",
        )
        assert row_c is not None and row_c.status == "cancelled"

    # -- audit ------------------------------------------------------------------------------

    async def test_audit_round_trip(self, store: EventStore) -> None:
        rid = await _started(store)
        prompt = tuple(range(200_000, 200_500))
        records = [
            AuditRecord("prompt_token_ids", prompt),
            AuditRecord("output_token_ids", (0, 1, 2**32 - 1)),
            AuditRecord("finish", detail={"finish_reason": "length", "recovered": True}),
        ]
        await store.append_audit(rid, records[:2])
        await store.append_audit(rid, records[2:])
        assert await store.load_audit(rid) == records
        assert [e.seq for e in await store.load(rid)] == [0]

    async def test_audit_refuses_ids_outside_uint32(self, store: EventStore) -> None:
        rid = await _started(store)
        for bad in ((-1,), (2**32,)):
            with pytest.raises(OverflowError):
                await store.append_audit(rid, [AuditRecord("output_token_ids", bad)])
        assert await store.load_audit(rid) == []

    async def test_audit_of_unknown_response_is_empty(self, store: EventStore) -> None:
        assert await store.load_audit("resp_nope") == []

    # -- chains -----------------------------------------------------------------------------

    async def test_load_chain_oldest_first_with_replay_events_only(self, store: EventStore) -> None:
        first = await _started(store)
        await store.append(
            first,
            [
                delta(1, "Hi"),
                text_done(2, "Hi", item_id="msg_1"),
                message_done(3, "Hi", item_id="msg_1"),
                function_call_done(
                    4, item_id="fc_1", call_id="call_1", name="f", arguments="{}", output_index=1
                ),
                completed(first, 5),
            ],
            1,
        )
        second_new = new_response(
            previous=first,
            input_items=[function_call_output("call_1", "42", item_id="fco_1")],
        )
        await store.create_response(second_new)
        second = second_new.id
        await store.append(second, [created(second), message_done(1, "ok", item_id="msg_2")], 0)
        await store.append(second, [completed(second, 2)], 2)
        third_new = new_response(previous=second)
        await store.create_response(third_new)
        third = third_new.id
        await store.append(third, [created(third)], 0)

        chain = await store.load_chain(third)
        assert [link.row.id for link in chain] == [first, second, third]
        # an ended response: its terminal event alone (its snapshot holds the output)
        assert [(e.seq, e.type) for e in chain[0].events] == [(5, "response.completed")]
        assert [(e.seq, e.type) for e in chain[1].events] == [(2, "response.completed")]
        assert chain[2].events == []  # generating, nothing finished yet
        await store.append(
            third,
            [
                delta(1, "x"),
                message_done(2, "x", item_id="msg_3"),
                function_call_done(
                    3, item_id="fc_3", call_id="call_3", name="f", arguments="{}", output_index=1
                ),
            ],
            1,
        )
        generating = (await store.load_chain(third))[2].events
        assert [(e.seq, e.type) for e in generating] == [
            (2, OUTPUT_ITEM_DONE),
            (3, OUTPUT_ITEM_DONE),
        ]
        assert generating[1].payload["item"]["call_id"] == "call_3"
        assert chain[1].input_items == second_new.input_items
        assert chain[2].input_items == third_new.input_items
        assert chain[0].row.status == "completed" and chain[2].row.last_seq == 0
        assert [link.row.id for link in await store.load_chain(first)] == [first]

    # -- the item index (item_reference to any stored item) -------------------------------

    async def test_find_items_input_and_output_of_any_response(self, store: EventStore) -> None:
        first = new_response(
            input_items=[
                user_message("question", item_id="msg_q"),
                {"type": "item_reference", "id": "msg_elsewhere"},
            ]
        )
        await store.create_response(first)
        await store.append(first.id, [created(first.id)], 0)
        assert (await store.find_items(["msg_q"], project="default"))["msg_q"].source == "input"
        assert await store.find_items(["msg_a", "fc_1"], project="default") == {}  # not done yet
        await store.append(
            first.id,
            [
                delta(1, "Hi"),
                text_done(2, "Hi", item_id="msg_a"),
                message_done(3, "Hi", item_id="msg_a"),
                function_call_done(
                    4, item_id="fc_1", call_id="call_1", name="f", arguments="{}", output_index=1
                ),
            ],
            1,
        )
        # durable with its output_item.done event, before the response ends
        found = await store.find_items(
            ["msg_q", "msg_a", "fc_1", "msg_elsewhere", "nope"], project="default"
        )
        assert set(found) == {"msg_q", "msg_a", "fc_1"}  # a reference is not an item
        assert found["msg_q"] == (first.id, "input", 0, first.input_items[0])
        assert found["msg_a"].source == "output" and found["msg_a"].position == 0
        assert found["msg_a"].item["content"][0]["text"] == "Hi"
        assert found["fc_1"][:3] == (first.id, "output", 1)
        assert found["fc_1"].item["call_id"] == "call_1"
        await store.append(first.id, [completed(first.id, 5)], 5)
        # a later, unrelated response replays msg_a as input: the output item still wins
        echo = dict(found["msg_a"].item, content=[{"type": "output_text", "text": "edited"}])
        other = new_response(input_items=[echo])
        await store.create_response(other)
        again = await store.find_items(["msg_a"], project="default")
        assert again["msg_a"].response_id == first.id and again["msg_a"].source == "output"

    async def test_find_items_takes_more_ids_than_one_statement_can(
        self, store: EventStore
    ) -> None:
        # a request may reference that many items (the drivers refuse a statement of over 32,767
        # arguments: it was a 503, "the database is unavailable", on PostgreSQL)
        first = new_response(input_items=[user_message("question", item_id="msg_q")])
        await store.create_response(first)
        await store.append(first.id, [created(first.id)], 0)
        ids = [f"msg_none_{n}" for n in range(40_000)] + ["msg_q"]
        found = await store.find_items(ids, project="default")
        assert list(found) == ["msg_q"] and found["msg_q"].response_id == first.id

    async def test_find_items_is_scoped_to_a_project_and_gone_with_its_response(
        self, store: EventStore
    ) -> None:
        mine = new_response(input_items=[user_message("mine", item_id="msg_mine")], project="p1")
        await store.create_response(mine)
        await store.append(mine.id, [created(mine.id), message_done(1, "ok", item_id="msg_out")], 0)
        assert await store.find_items(["msg_mine", "msg_out"], project="p2") == {}
        assert set(await store.find_items(["msg_mine", "msg_out"], project="p1")) == {
            "msg_mine",
            "msg_out",
        }
        # the same id in two projects: each sees its own
        theirs = new_response(
            input_items=[user_message("theirs", item_id="msg_mine")], project="p2"
        )
        await store.create_response(theirs)
        assert (await store.find_items(["msg_mine"], project="p2"))[
            "msg_mine"
        ].response_id == theirs.id
        assert (await store.find_items(["msg_mine"], project="p1"))[
            "msg_mine"
        ].response_id == mine.id
        assert await store.delete(mine.id) is True
        assert await store.find_items(["msg_mine", "msg_out"], project="p1") == {}
        assert set(await store.find_items(["msg_mine"], project="p2")) == {"msg_mine"}
        assert await store.find_items(["bad\x00id", ""], project="p1") == {}

    async def test_load_chain_with_a_missing_link_is_not_found(self, store: EventStore) -> None:
        first = await _started(store)
        second = await _started(store, previous=first)
        third = await _started(store, previous=second)
        assert await store.delete(second)
        with pytest.raises(NotFound):
            await store.load_chain(third)
        with pytest.raises(NotFound):
            await store.load_chain("resp_nope")
        orphan = await _started(store, previous="resp_never_stored")
        with pytest.raises(NotFound):
            await store.load_chain(orphan)

    async def test_load_chain_scoped_to_a_project(self, store: EventStore) -> None:
        first = await _started(store, project="alpha")
        second = await _started(store, previous=first, project="alpha")
        assert [link.row.id for link in await store.load_chain(second, project="alpha")] == [
            first,
            second,
        ]
        with pytest.raises(NotFound):
            await store.load_chain(second, project="beta")
        # a chain that reaches into another project (a hand-made database) is not found either
        third = await _started(store, previous=second, project="beta")
        with pytest.raises(NotFound):
            await store.load_chain(third, project="beta")
        assert len(await store.load_chain(third)) == 3  # unscoped: the operator's view

    # -- projects and keys ------------------------------------------------------------------

    async def test_a_response_row_has_its_project_and_key(self, store: EventStore) -> None:
        new = new_response(project="alpha", api_key_id="key_1")
        await store.create_response(new)
        row = await store.get(new.id)
        assert row is not None and (row.project, row.api_key_id) == ("alpha", "key_1")
        plain = new_response()
        await store.create_response(plain)
        row = await store.get(plain.id)
        assert row is not None and (row.project, row.api_key_id) == ("default", None)

    async def test_api_keys_create_find_list_revoke(self, store: EventStore) -> None:
        first = ApiKeyRow("key_a", "alpha", "member", "ci", "ab" * 32, 1.0, max_streams=2)
        second = ApiKeyRow("key_b", "beta", "admin", None, "cd" * 32, 2.0, requests_per_minute=60)
        await store.create_api_key(second)
        await store.create_api_key(first)
        assert await store.find_api_key("ab" * 32) == first
        assert await store.find_api_key("ef" * 32) is None
        assert await store.list_api_keys() == [first, second]
        with pytest.raises(ConcurrencyError):
            await store.create_api_key(ApiKeyRow("key_c", "alpha", "member", None, "ab" * 32, 3.0))
        assert await store.revoke_api_key("key_a") is True
        assert await store.revoke_api_key("key_a") is False  # already
        assert await store.revoke_api_key("key_nope") is False
        revoked = await store.find_api_key("ab" * 32)
        assert revoked is not None and revoked.revoked_at is not None
        assert (await store.find_api_key("cd" * 32)) == second

    # -- delete -----------------------------------------------------------------------------

    async def test_delete_removes_everything(self, store: EventStore) -> None:
        rid = await _started(store)
        await store.append(rid, [delta(1), completed(rid, 2)], 1)
        await store.append_audit(rid, [AuditRecord("prompt_token_ids", (1, 2, 3))])
        keep = await _started(store)
        assert await store.delete(rid) is True
        assert await store.get(rid) is None
        assert await store.load(rid) == []
        assert await store.load_audit(rid) == []
        with pytest.raises(NotFound):
            await store.list_input_items(rid, after=None, limit=10, order="asc")
        assert await store.delete(rid) is False
        assert [e.seq for e in await store.load(keep)] == [0]
        with pytest.raises(NotFound):
            await store.append(rid, [delta(3)], 3)

    async def test_id_can_be_reused_after_delete(self, store: EventStore) -> None:
        new = new_response()
        await store.create_response(new)
        await store.append(new.id, [created(new.id), completed(new.id, 1)], 0)
        await store.delete(new.id)
        await store.create_response(new)
        await store.append(new.id, [created(new.id)], 0)
        assert [e.type for e in await store.load(new.id)] == ["response.created"]

    # -- input items ------------------------------------------------------------------------

    async def test_list_input_items_pages_both_ways(self, store: EventStore) -> None:
        items = [user_message(f"m{i}", item_id=f"in_{i}") for i in range(5)]
        new = new_response(input_items=items)
        await store.create_response(new)
        rid = new.id

        async def ids(after: str | None, limit: int, order: str) -> tuple[list[str], bool]:
            page, more = await store.list_input_items(
                rid,
                after=after,
                limit=limit,
                order=order,  # type: ignore[arg-type]
            )
            return [i["id"] for i in page], more

        assert await ids(None, 10, "asc") == ([f"in_{i}" for i in range(5)], False)
        assert await ids(None, 10, "desc") == ([f"in_{i}" for i in reversed(range(5))], False)
        assert await ids(None, 2, "asc") == (["in_0", "in_1"], True)
        assert await ids("in_1", 2, "asc") == (["in_2", "in_3"], True)
        assert await ids("in_3", 2, "asc") == (["in_4"], False)
        assert await ids(None, 2, "desc") == (["in_4", "in_3"], True)
        assert await ids("in_3", 2, "desc") == (["in_2", "in_1"], True)
        assert await ids("in_1", 5, "desc") == (["in_0"], False)
        assert await ids("in_0", 5, "desc") == ([], False)
        assert await ids(None, 5, "asc") == ([f"in_{i}" for i in range(5)], False)
        page, _ = await store.list_input_items(rid, after=None, limit=1, order="asc")
        assert page == [items[0]]

    async def test_list_input_items_refusals(self, store: EventStore) -> None:
        new = new_response(input_items=[])
        await store.create_response(new)
        assert await store.list_input_items(new.id, after=None, limit=20, order="desc") == (
            [],
            False,
        )
        with pytest.raises(NotFound):
            await store.list_input_items(new.id, after="in_missing", limit=20, order="asc")
        with pytest.raises(NotFound):
            await store.list_input_items("resp_nope", after=None, limit=20, order="asc")
        with pytest.raises(ValueError):
            await store.list_input_items(new.id, after=None, limit=0, order="asc")

    # -- recovery ---------------------------------------------------------------------------

    async def test_unfinished_lists_logs_without_a_terminal_event(self, store: EventStore) -> None:
        never_started = new_response(created_at=1)
        await store.create_response(never_started)
        streaming = await _started(store, created_at=2)
        await store.append(streaming, [delta(1)], 1)
        done = await _started(store, created_at=3)
        await store.append(done, [completed(done, 1)], 1)
        gone = await _started(store, created_at=4)
        await store.append(gone, [failed(gone, 1)], 1)
        queued = await _started(store, created_at=5, background=True)
        assert await store.unfinished() == [never_started.id, streaming, queued]
        await store.append(streaming, [incomplete(streaming, 2)], 2)
        assert await store.unfinished() == [never_started.id, queued]

    # -- takeover ---------------------------------------------------------------------------

    async def test_output_token_ids_are_kept_with_the_events_they_produced(
        self, store: EventStore
    ) -> None:
        rid = await _started(store)
        await store.submit(rid, [delta(1, "a"), delta(2, "b")], 1, (7, 8, 9))
        await store.submit(rid, [delta(3, "c")], 3)  # a write without tokens
        await store.submit(rid, [delta(4, "d")], 4, (2**32 - 1,))
        assert await store.output_tokens(rid) == [7, 8, 9, 2**32 - 1]
        assert await store.output_tokens("resp_nope") == []
        assert [e.seq for e in await store.load(rid)] == [0, 1, 2, 3, 4]

    async def test_load_after_reads_several_logs_each_after_its_own_seq(
        self, store: EventStore
    ) -> None:
        one, two, three = await _started(store), await _started(store), await _started(store)
        await store.append(one, [delta(1, "a"), delta(2, "b")], 1)
        await store.append(two, [delta(1, "c")], 1)
        found = await store.load_after({one: 0, two: 1, three: -1, "resp_nope": 0})
        assert [e.seq for e in found[one]] == [1, 2] and found[one][1].payload["delta"] == "b"
        assert found[two] == [] and [e.type for e in found[three]] == ["response.created"]
        assert found.get("resp_nope", []) == []

    async def test_load_after_reads_a_thousand_logs_at_once(self, store: EventStore) -> None:
        # followers of this many logs can be woken together (SQLite refused such a batch whole,
        # "Expression tree is too large", when it was one statement of as many ORs)
        ids = list(await asyncio.gather(*(_started(store) for _ in range(1_200))))
        await store.append(ids[-1], [delta(1, "z")], 1)
        found = await store.load_after({rid: -1 for rid in ids[:-1]} | {ids[-1]: 0})
        assert len(found) == 1_200
        assert all([e.type for e in found[rid]] == ["response.created"] for rid in ids[:-1])
        assert [e.seq for e in found[ids[-1]]] == [1]

    async def test_exactly_one_claim_wins_and_the_epoch_goes_up(self, store: EventStore) -> None:
        new = dataclasses.replace(new_response(), owner="rep_a")
        await store.create_response(new)
        await store.append(new.id, [created(new.id)], 0)
        assert await store.claim(new.id, "rep_other", "rep_b") is None  # not its owner
        results = await asyncio.gather(
            store.claim(new.id, "rep_a", "rep_b"), store.claim(new.id, "rep_a", "rep_c")
        )
        assert sorted(results, key=lambda r: r is None) == [1, None]
        row = await store.get(new.id)
        assert row is not None and row.epoch == 1 and row.owner in ("rep_b", "rep_c")
        await store.append(new.id, [completed(new.id, 1)], 1)  # the winner writes on
        assert await store.claim(new.id, row.owner, "rep_d") is None  # ended: nothing to claim

    async def test_cancel_requests_are_recorded_for_the_owner(self, store: EventStore) -> None:
        new = dataclasses.replace(new_response(background=True), owner="rep_a")
        await store.create_response(new)
        await store.append(new.id, [created(new.id)], 0)
        assert await store.cancel_requests("rep_a") == []
        assert await store.request_cancel(new.id)
        assert await store.cancel_requests("rep_a") == [new.id]
        assert await store.cancel_requests("rep_b") == []
        row = await store.get(new.id)
        assert row is not None and row.cancel_requested_at is not None
        await store.append(new.id, [failed(new.id, 1)], 1)
        assert await store.cancel_requests("rep_a") == []
        assert not await store.request_cancel(new.id)  # ended
        assert not await store.request_cancel("resp_nope")

    # -- secrets ----------------------------------------------------------------------------

    async def test_secret_first_writer_wins(self, store: EventStore) -> None:
        calls: list[int] = []

        def factory(value: bytes) -> bytes:
            calls.append(1)
            return value

        first = await store.get_or_create_secret("reasoning_key", lambda: factory(b"k1" * 16))
        second = await store.get_or_create_secret("reasoning_key", lambda: factory(b"k2" * 16))
        other = await store.get_or_create_secret("other", lambda: factory(b"\x00\xff"))
        assert first == second == b"k1" * 16
        assert other == b"\x00\xff"
        assert len(calls) == 2

    # -- close ------------------------------------------------------------------------------

    async def test_closed_store_refuses_work(self, store: EventStore) -> None:
        rid = await _started(store)
        await store.close()
        with pytest.raises(StoreError):
            store.submit(rid, [delta(1)], 1)
        with pytest.raises(StoreError):
            await store.create_response(new_response())
        with pytest.raises(StoreError):
            await store.load(rid)
        await store.close()  # idempotent
