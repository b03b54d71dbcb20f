"""Projections of a log: the wire JSON of an event, its SSE frame, and the folded Response.

The SSE frame of an event is a pure function of the stored event: ``sse_frame(type, seq,
payload_json)`` where ``payload_json`` is the JSON object of the event's fields other than
``type`` and ``sequence_number`` -- exactly what the store keeps. Replaying a stored log therefore
re-sends the bytes that were streamed live, without parsing or re-serialising anything.

One stored type is sent under another name: the log's ``response.cancelled`` (the truth: the
response was cancelled, its ``response.status`` is ``"cancelled"``) goes out as
``response.incomplete`` (:func:`wire_type`). OpenAI's stream event union, and so the OpenAI SDK
(3.57), has no cancellation event: the SDK parsed ``response.cancelled`` as an audio delta event
without a ``response``, and its ``responses.stream()`` accumulator never saw the stream end.
``response.incomplete`` is the terminal the SDK types and accumulates for a response that stopped
before it finished (it fills ``output`` from the streamed items); its ``response.status`` stays
``"cancelled"``, as GET returns it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import fields
from typing import Any

from domain.events import (
    ContentPartAdded,
    ContentPartDone,
    CustomToolCallInputDelta,
    Event,
    FunctionCallArgumentsDelta,
    Json,
    OutputItemAdded,
    OutputItemDone,
    OutputTextDelta,
    ReasoningTextDelta,
    ResponseCancelled,
    ResponseCompleted,
    ResponseCreated,
    ResponseFailed,
    ResponseIncomplete,
    ResponseInProgress,
    ResponseQueued,
    copy_json,
    event_class,
)

__all__ = [
    "fold",
    "from_wire",
    "output_as_input",
    "payload",
    "payload_and_json",
    "payload_json",
    "sse_frame",
    "to_sse",
    "to_wire",
    "wire_type",
]

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
_encode_str = json.encoder.encode_basestring  # type: ignore[attr-defined]


_FIELD_NAMES: dict[type[Any], tuple[str, ...]] = {}


def _field_names(cls: type[Any]) -> tuple[str, ...]:
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = tuple(f.name for f in fields(cls) if f.name != "sequence_number")
        _FIELD_NAMES[cls] = names
    return names


def payload(event: Event) -> Json:
    """The event's fields other than ``type`` and ``sequence_number``, as JSON values."""
    cls = type(event)
    if cls is OutputTextDelta and not event.logprobs:  # type: ignore[union-attr]
        e: Any = event
        return {
            "item_id": e.item_id,
            "output_index": e.output_index,
            "content_index": e.content_index,
            "delta": e.delta,
            "logprobs": [],
        }
    out: Json = {}
    for name in _field_names(type(event)):
        value = getattr(event, name)
        out[name] = list(value) if isinstance(value, tuple) else value
    return out


def payload_json(event: Event) -> str:
    """``payload(event)`` as compact JSON text; deltas take a fast path (no dict, no encoder)."""
    return payload_and_json(event)[1]


def payload_and_json(event: Event) -> tuple[Json | None, str]:
    """``payload(event)`` and its JSON text; the object only where it is built on the way to the
    text (every event but the deltas, whose text is written directly), so whoever needs both
    (the store reads a lifecycle event's status) does not parse the text back."""
    cls = type(event)
    if cls is OutputTextDelta or cls is ReasoningTextDelta:
        e: Any = event
        if cls is ReasoningTextDelta:
            tail = "}"
        elif e.logprobs:
            obj = payload(event)
            return obj, _dumps(obj)
        else:
            tail = ',"logprobs":[]}'
        return None, (
            f'{{"item_id":"{e.item_id}","output_index":{e.output_index},'
            f'"content_index":{e.content_index},"delta":{_encode_str(e.delta)}{tail}'
        )
    if cls is FunctionCallArgumentsDelta or cls is CustomToolCallInputDelta:
        e = event
        return None, (
            f'{{"item_id":"{e.item_id}","output_index":{e.output_index},'
            f'"delta":{_encode_str(e.delta)}}}'
        )
    obj = payload(event)
    return obj, _dumps(obj)


#: Stored event types sent under another type on the wire (see the module docstring).
_WIRE_TYPES = {ResponseCancelled.type: ResponseIncomplete.type}


def wire_type(type_: str) -> str:
    """The type a stored event of type ``type_`` is sent as (the same, but for cancellation)."""
    return _WIRE_TYPES.get(type_, type_)


def sse_frame(type_: str, seq: int, payload_json_: str) -> bytes:
    """``event: <type>\\ndata: <one-line JSON>\\n\\n`` for a stored event of type ``type_``."""
    type_ = _WIRE_TYPES.get(type_, type_)
    return (
        f'event: {type_}\ndata: {{"type":"{type_}","sequence_number":{seq},{payload_json_[1:]}\n\n'
    ).encode()


def to_sse(event: Event) -> bytes:
    return sse_frame(event.type, event.sequence_number, payload_json(event))


def to_wire(event: Event) -> Json:
    """The event as the OpenAI SDK sees it: ``{"type", "sequence_number", ...fields}``."""
    return {
        "type": wire_type(event.type),
        "sequence_number": event.sequence_number,
        **payload(event),
    }


def from_wire(type_: str, seq: int, data: Json) -> Event:
    """Rebuild an event from its stored ``type``, ``seq`` and payload."""
    cls = event_class(type_)
    kwargs = {
        name: tuple(data[name]) if name == "logprobs" else data[name]
        for name in _field_names(cls)
        if name in data
    }
    event: Event = cls(sequence_number=seq, **kwargs)
    return event


def fold(events: Iterable[Event]) -> Json:
    """The Response object after ``events`` (any prefix of a valid log).

    After the terminal event the terminal's ``response`` is the answer. Before it, the response
    is the one created, with the status reached so far and every item added so far: finished
    items as their ``output_item.done`` showed them, the open item with its text so far and
    status ``in_progress``.
    """
    response: Json | None = None
    items: list[Json] = []
    for event in events:
        match event:
            case (
                ResponseCompleted() | ResponseIncomplete() | ResponseFailed() | ResponseCancelled()
            ):
                return copy_json(event.response)
            case ResponseCreated() | ResponseQueued() | ResponseInProgress():
                status = event.response.get("status")
                if response is None:
                    response = copy_json(event.response)
                response["status"] = status
            case OutputItemAdded():
                items.append(copy_json(event.item))
            case OutputItemDone():
                items[event.output_index] = copy_json(event.item)
            case ContentPartAdded():
                items[event.output_index].setdefault("content", []).append(copy_json(event.part))
            case ContentPartDone():
                items[event.output_index]["content"][event.content_index] = dict(event.part)
            case OutputTextDelta():
                part = items[event.output_index]["content"][event.content_index]
                part["text"] = part.get("text", "") + event.delta
                if event.logprobs:
                    part.setdefault("logprobs", []).extend(event.logprobs)
            case ReasoningTextDelta():
                part = items[event.output_index]["content"][event.content_index]
                part["text"] = part.get("text", "") + event.delta
            case FunctionCallArgumentsDelta():
                items[event.output_index]["arguments"] += event.delta
            case CustomToolCallInputDelta():
                items[event.output_index]["input"] += event.delta
            case _:
                pass  # the .done text events repeat what the deltas already built
    if response is None:
        raise ValueError("fold() of a log without response.created")
    response["output"] = items
    return response


_INPUT_KEYS = {
    "message": ("type", "id", "role", "content", "status", "phase"),
    "reasoning": ("type", "id", "summary", "content", "encrypted_content"),
    "function_call": ("type", "id", "call_id", "name", "arguments", "status"),
    "custom_tool_call": ("type", "id", "call_id", "name", "input"),
}


def output_as_input(item: Json) -> Json:
    """An output item as the input item a client would replay for the next turn."""
    keys = _INPUT_KEYS.get(item.get("type", ""))
    if keys is None:
        return copy_json(item)
    return {k: copy_json(item[k]) for k in keys if k in item and item[k] is not None}
