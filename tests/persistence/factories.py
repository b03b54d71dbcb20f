"""Plain functions that build store inputs shaped like the real wire events."""

from __future__ import annotations

import itertools
import secrets
from dataclasses import dataclass
from typing import Any

from persistence.records import AuditRecord, NewResponse, StoredEvent
from persistence.store import EventStore

#: The newest migration: what a store migrates a new database to.
HEAD = "0011"

_clock = itertools.count(1_700_000_000)


def response_id() -> str:
    return f"resp_{secrets.token_hex(12)}"


def new_response(
    rid: str | None = None,
    *,
    previous: str | None = None,
    background: bool = False,
    input_items: list[dict[str, Any]] | None = None,
    created_at: int | None = None,
    model: str = "gpt-oss-20b",
    project: str = "default",
    api_key_id: str | None = None,
) -> NewResponse:
    rid = rid or response_id()
    items = (
        input_items
        if input_items is not None
        else [user_message("hello", item_id=f"msg_in_{secrets.token_hex(4)}")]
    )
    return NewResponse(
        id=rid,
        model=model,
        created_at=created_at if created_at is not None else next(_clock),
        previous_response_id=previous,
        background=background,
        request={"model": model, "input": items, "stream": True, "previous_response_id": previous},
        input_items=items,
        project=project,
        api_key_id=api_key_id,
    )


def user_message(text: str, *, item_id: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": text}],
    }


def function_call_output(call_id: str, output: str, *, item_id: str) -> dict[str, Any]:
    return {"id": item_id, "type": "function_call_output", "call_id": call_id, "output": output}


def snapshot(rid: str, status: str, **extra: Any) -> dict[str, Any]:
    """A (trimmed) OpenAI Response object as lifecycle events carry it."""
    return {
        "id": rid,
        "object": "response",
        "created_at": 1_700_000_000,
        "status": status,
        "completed_at": None,
        "error": None,
        "incomplete_details": None,
        "output": [],
        "usage": None,
        **extra,
    }


def created(rid: str, seq: int = 0, status: str = "in_progress") -> StoredEvent:
    return StoredEvent(seq, "response.created", {"response": snapshot(rid, status)})


def completed(
    rid: str, seq: int, *, input_tokens: int = 10, output_tokens: int = 5, reasoning: int = 2
) -> StoredEvent:
    usage = {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": input_tokens + output_tokens,
    }
    response = snapshot(rid, "completed", completed_at=1_700_000_100, usage=usage)
    return StoredEvent(seq, "response.completed", {"response": response})


def failed(rid: str, seq: int, code: str = "server_error") -> StoredEvent:
    response = snapshot(rid, "failed", error={"code": code, "message": "boom"})
    return StoredEvent(seq, "response.failed", {"response": response})


def incomplete(rid: str, seq: int, reason: str = "max_output_tokens") -> StoredEvent:
    response = snapshot(rid, "incomplete", incomplete_details={"reason": reason})
    return StoredEvent(seq, "response.incomplete", {"response": response})


def delta(seq: int, text: str = "tok", *, item_id: str = "msg_1") -> StoredEvent:
    return StoredEvent(
        seq,
        "response.output_text.delta",
        {
            "item_id": item_id,
            "output_index": 0,
            "content_index": 0,
            "delta": text,
            "logprobs": [],
        },
    )


def text_done(seq: int, text: str, *, item_id: str, output_index: int = 0) -> StoredEvent:
    return StoredEvent(
        seq,
        "response.output_text.done",
        {
            "item_id": item_id,
            "output_index": output_index,
            "content_index": 0,
            "text": text,
            "logprobs": [],
        },
    )


def message_done(seq: int, text: str, *, item_id: str, output_index: int = 0) -> StoredEvent:
    item = {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    }
    return item_done(seq, item, output_index=output_index)


def function_call_done(
    seq: int, *, item_id: str, call_id: str, name: str, arguments: str, output_index: int = 0
) -> StoredEvent:
    item = {
        "id": item_id,
        "type": "function_call",
        "status": "completed",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }
    return item_done(seq, item, output_index=output_index)


def item_done(seq: int, item: dict[str, Any], *, output_index: int = 0) -> StoredEvent:
    return StoredEvent(
        seq, "response.output_item.done", {"output_index": output_index, "item": item}
    )


@dataclass(frozen=True)
class Conversation:
    r1: str
    r2: str
    r3: str
    r4: str


async def _log(store: EventStore, rid: str, events: list[StoredEvent]) -> None:
    await store.append(rid, events, 0)


async def fabricate_conversation(store: EventStore) -> Conversation:
    """r1 calls a function, r2 carries its output and answers, r3 follows up (a 3-link
    chain); r4 stands alone, calls a function that gets no output, and is still streaming."""
    n1 = new_response(
        input_items=[user_message("Weather in Paris?", item_id="in_1")], created_at=100
    )
    await store.create_response(n1)
    r1 = n1.id
    await _log(
        store,
        r1,
        [
            created(r1),
            text_done(1, "Let me check. ", item_id="msg_1"),
            message_done(2, "Let me check. ", item_id="msg_1"),
            function_call_done(
                3,
                item_id="fc_1",
                call_id="call_1",
                name="get_weather",
                arguments='{"city":"Paris"}',
                output_index=1,
            ),
            completed(r1, 4),
        ],
    )
    n2 = new_response(
        previous=r1,
        input_items=[function_call_output("call_1", '{"temp_c": 21}', item_id="fco_1")],
        created_at=200,
    )
    await store.create_response(n2)
    r2 = n2.id
    answer = "It is 21 °C in Paris."
    await _log(
        store,
        r2,
        [
            created(r2),
            text_done(1, answer, item_id="msg_2"),
            message_done(2, answer, item_id="msg_2"),
            completed(r2, 3),
        ],
    )
    await store.append_audit(
        r2,
        [
            AuditRecord("prompt_token_ids", (200006, 17360, 200008)),
            AuditRecord("finish", detail={"finish_reason": "stop"}),
        ],
    )
    n3 = new_response(
        previous=r2, input_items=[user_message("Thanks!", item_id="in_3")], created_at=300
    )
    await store.create_response(n3)
    r3 = n3.id
    await _log(
        store,
        r3,
        [
            created(r3),
            text_done(1, "You're ", item_id="msg_3"),
            StoredEvent(
                2,
                "response.output_text.done",
                {"item_id": "msg_3", "output_index": 0, "content_index": 1, "text": "welcome."},
            ),
            message_done(3, "You're welcome.", item_id="msg_3"),
            completed(r3, 4),
        ],
    )
    n4 = new_response(created_at=400)
    await store.create_response(n4)
    r4 = n4.id
    await _log(
        store,
        r4,
        [
            created(r4),
            function_call_done(1, item_id="fc_9", call_id="call_9", name="lookup", arguments="{}"),
            delta(2, "Hmm", item_id="msg_4"),
        ],
    )
    return Conversation(r1, r2, r3, r4)
