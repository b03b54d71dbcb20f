"""Check the structure of one Responses API event stream, and type-check it with the SDK.

:func:`check_stream` holds the rules the OpenAPI document cannot express, because they relate
events to each other (ARCHITECTURE.md, "State machine invariants"):

* ``response.created`` is first and ``response.in_progress`` second, or, for a background
  response, ``response.created`` (status queued), ``response.queued``, ``response.in_progress``;
  every event that carries a response carries the same response id;
* ``sequence_number`` is 0, 1, 2, ... in stream order;
* items are strictly sequential and nest: ``output_item.added`` -> (``content_part.added`` ->
  deltas -> ``*.done`` -> ``content_part.done``)* -> ``output_item.done``, with one item and one
  part open at a time (OpenAI streams that way and a Harmony decoder produces one message at a
  time; interleaving is reported, not tolerated);
* ``output_index`` counts ``output_item.added`` events from 0; ``content_index`` (and a reasoning
  item's ``summary_index``) counts that item's parts from 0; every event of an item names its
  ``item_id`` and ``output_index``, and ``output_item.done`` repeats the added item's id (and
  ``call_id``, ``name``, ``type``);
* an item starts empty (message ``content: []``, ``arguments: ""``, ...), so the concatenation of
  its deltas equals the ``.done`` value, the finished part, and the field of the done item;
* exactly one terminal event (``response.completed`` / ``incomplete`` / ``failed``), last, after
  every item closed, with the matching ``status`` (a cancelled response ends
  ``response.incomplete`` with ``status: "cancelled"``, as ``domain.projections`` sends it); its
  ``response.output`` equals the ``output_item.done`` items, in order.

:func:`validate_with_sdk` validates every event with the ``openai`` SDK's ``ResponseStreamEvent``
union (the models the Python client and the Agents SDK parse with) and insists that the model
chosen is the one whose ``type`` literal is the event's type.
"""

from __future__ import annotations

import functools
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pydantic
from openai.types.responses import ResponseStreamEvent

__all__ = ["TERMINAL_STATUS", "check_stream", "validate_with_sdk"]

TERMINAL_STATUS: Mapping[str, str] = {
    "response.completed": "completed",
    "response.incomplete": "incomplete",
    "response.failed": "failed",
}
#: The statuses a terminal event may carry besides its own: the server's cancellation.
_ALSO = {"response.incomplete": "cancelled"}

# delta type -> (done type, field of the done event, part type it belongs to or None for item-level)
_TEXT_STREAMS: Mapping[str, tuple[str, str, str | None]] = {
    "response.output_text.delta": ("response.output_text.done", "text", "output_text"),
    "response.refusal.delta": ("response.refusal.done", "refusal", "refusal"),
    "response.reasoning_text.delta": ("response.reasoning_text.done", "text", "reasoning_text"),
    "response.reasoning_summary_text.delta": (
        "response.reasoning_summary_text.done",
        "text",
        "summary_text",
    ),
    "response.function_call_arguments.delta": (
        "response.function_call_arguments.done",
        "arguments",
        None,
    ),
    "response.custom_tool_call_input.delta": (
        "response.custom_tool_call_input.done",
        "input",
        None,
    ),
}
_DONE_TO_DELTA = {done: delta for delta, (done, _, _) in _TEXT_STREAMS.items()}

# item type -> (item field holding its streamed value, delta type) for item-level streams
_ITEM_STREAMS: Mapping[str, tuple[str, str]] = {
    "function_call": ("arguments", "response.function_call_arguments.delta"),
    "custom_tool_call": ("input", "response.custom_tool_call_input.delta"),
}
# part type -> field holding its text
_PART_TEXT = {
    "output_text": "text",
    "refusal": "refusal",
    "reasoning_text": "text",
    "summary_text": "text",
}
# item type -> which part kinds it may hold: kind -> (item field listing the parts, part types)
_ITEM_PARTS: Mapping[str, Mapping[str, tuple[str, frozenset[str]]]] = {
    "message": {"content": ("content", frozenset({"output_text", "refusal"}))},
    "reasoning": {
        "content": ("content", frozenset({"reasoning_text"})),
        "summary": ("summary", frozenset({"summary_text"})),
    },
}
_PART_EVENTS = {
    "response.content_part.added": ("content", "content_index", True),
    "response.content_part.done": ("content", "content_index", False),
    "response.reasoning_summary_part.added": ("summary", "summary_index", True),
    "response.reasoning_summary_part.done": ("summary", "summary_index", False),
}


class _StreamError(AssertionError):
    pass


@dataclass
class _Part:
    kind: str  # "content" | "summary"
    index: int
    type: str
    added: Mapping[str, Any]
    text: str = ""
    done_value: str | None = None  # set by the *.done event


@dataclass
class _Item:
    output_index: int
    added: Mapping[str, Any]
    parts: dict[str, list[_Part]] = field(default_factory=lambda: {"content": [], "summary": []})
    open_part: _Part | None = None
    text: str = ""  # item-level stream (arguments / input)
    done_value: str | None = None

    @property
    def id(self) -> str:
        return str(self.added["id"])

    @property
    def type(self) -> str:
        return str(self.added["type"])


def check_stream(events: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    """Assert the stream rules above; return the terminal event's ``response``."""
    if not events:
        raise AssertionError("empty stream")
    checker = _Checker()
    for position, event in enumerate(events):
        try:
            checker.feed(position, event)
        except _StreamError as e:
            raise AssertionError(
                f"event #{position} ({event.get('type')!r}, seq {event.get('sequence_number')!r}): {e}"
            ) from None
    return checker.finish()


class _Checker:
    def __init__(self) -> None:
        self.position = 0
        self.response_id: str | None = None
        self.background = False
        self.items: list[_Item] = []
        self.open_item: _Item | None = None
        self.done_items: list[Mapping[str, Any]] = []
        self.terminal: Mapping[str, Any] | None = None

    # -- lifecycle ------------------------------------------------------------------------------

    def feed(self, position: int, event: Mapping[str, Any]) -> None:
        self.position = position
        if not isinstance(event, Mapping):
            raise _StreamError(f"not a JSON object: {event!r}")
        _expect(
            event.get("sequence_number") == position,
            f"sequence_number {event.get('sequence_number')!r}, expected {position} "
            "(contiguous from 0 in stream order)",
        )
        _expect(self.terminal is None, "event after the terminal event")
        kind = event.get("type")
        if "response" in event:
            self._check_response_header(event)
        if position == 0:
            _expect(kind == "response.created", "the first event must be response.created")
            self.background = event["response"].get("status") == "queued"
            _expect(
                event["response"].get("status") in ("in_progress", "queued"),
                f"response.created has status {event['response'].get('status')!r}",
            )
            _expect(event["response"].get("output") == [], "response.created with output")
            return
        expected_prefix = (
            ["response.created", "response.queued", "response.in_progress"]
            if self.background
            else ["response.created", "response.in_progress"]
        )
        if position < len(expected_prefix):
            _expect(
                kind == expected_prefix[position],
                f"expected {expected_prefix[position]} at position {position} "
                f"({'background' if self.background else 'foreground'} stream)",
            )
            status = "queued" if kind == "response.queued" else "in_progress"
            _expect(
                event["response"].get("status") == status,
                f"{kind} has status {event['response'].get('status')!r}, expected {status!r}",
            )
            _expect(event["response"].get("output") == [], f"{kind} with output")
            return
        if kind in TERMINAL_STATUS:
            self._terminal(event)
        elif kind == "response.output_item.added":
            self._item_added(event)
        elif kind == "response.output_item.done":
            self._item_done(event)
        elif kind in _PART_EVENTS:
            self._part_event(event)
        elif kind in _TEXT_STREAMS:
            self._delta(event)
        elif kind in _DONE_TO_DELTA:
            self._text_done(event)
        elif kind == "response.compaction.compacting":
            item = self._open_item_for(event)
            _expect(
                item.added.get("type") == "compaction",
                f"{kind} for a {item.added.get('type')} item",
            )
        else:
            raise _StreamError(f"unexpected event type {kind!r} in the body of the stream")

    def finish(self) -> Mapping[str, Any]:
        if self.terminal is None:
            raise AssertionError(
                f"no terminal event (one of {sorted(TERMINAL_STATUS)}) after {self.position + 1} events"
            )
        return self.terminal["response"]

    def _check_response_header(self, event: Mapping[str, Any]) -> None:
        response = event["response"]
        _expect(isinstance(response, Mapping), "response is not an object")
        rid = response.get("id")
        _expect(isinstance(rid, str) and rid != "", f"response id {rid!r}")
        if self.response_id is None:
            self.response_id = rid
        _expect(
            rid == self.response_id,
            f"response id {rid!r} != {self.response_id!r} of response.created",
        )

    def _terminal(self, event: Mapping[str, Any]) -> None:
        kind = event["type"]
        response = event["response"]
        _expect(self.open_item is None, f"{kind} while item {self._open_desc()} is still open")
        status = TERMINAL_STATUS[kind]
        _expect(
            response.get("status") in (status, _ALSO.get(kind)),
            f"{kind} has status {response.get('status')!r}, expected {status!r}",
        )
        if kind == "response.incomplete" and response.get("status") != "cancelled":
            details = response.get("incomplete_details") or {}
            _expect(
                bool(details.get("reason")), "response.incomplete without incomplete_details.reason"
            )
        if kind == "response.failed":
            _expect(bool(response.get("error")), "response.failed without error")
        output = response.get("output")
        _expect(isinstance(output, list), "terminal response.output is not a list")
        _expect(
            len(output) == len(self.done_items),
            f"terminal response.output has {len(output)} items, the stream finished {len(self.done_items)}",
        )
        for index, (final, done) in enumerate(zip(output, self.done_items, strict=True)):
            _expect(
                final == done,
                f"terminal response.output[{index}] differs from output_item.done #{index}:\n"
                f"  terminal: {final}\n  done:     {done}",
            )
        self.terminal = event

    # -- items ----------------------------------------------------------------------------------

    def _item_added(self, event: Mapping[str, Any]) -> None:
        _expect(self.open_item is None, f"output_item.added while item {self._open_desc()} is open")
        index = len(self.items)
        _expect(
            event.get("output_index") == index,
            f"output_index {event.get('output_index')!r}, expected {index} (dense, in added order)",
        )
        item = event.get("item")
        _expect(isinstance(item, Mapping), "output_item.added without an item object")
        _expect(isinstance(item.get("id"), str) and item["id"] != "", f"item without id: {item}")
        _expect(
            item["id"] not in {known.id for known in self.items},
            f"item id {item['id']!r} reused",
        )
        if "status" in item:
            _expect(item["status"] == "in_progress", f"added item has status {item['status']!r}")
        for kind, (item_field, _) in _ITEM_PARTS.get(str(item.get("type")), {}).items():
            _expect(
                item.get(item_field, []) == [],
                f"added {item['type']} item already has {kind} parts",
            )
        if item.get("type") in _ITEM_STREAMS:
            item_field, _ = _ITEM_STREAMS[item["type"]]
            _expect(
                item.get(item_field) == "",
                f"added {item['type']} item has {item_field}={item.get(item_field)!r}",
            )
        new = _Item(output_index=index, added=item)
        self.items.append(new)
        self.open_item = new

    def _item_done(self, event: Mapping[str, Any]) -> None:
        item = self._open_item_for(event, id_from_item=True)
        done = event["item"]
        _expect(
            item.open_part is None,
            f"output_item.done while part {self._part_desc(item.open_part)} is open",
        )
        for key in ("type", "call_id", "name", "namespace", "role"):
            if key in item.added:
                _expect(
                    done.get(key) == item.added[key],
                    f"output_item.done {key}={done.get(key)!r}, added had {item.added[key]!r}",
                )
        _expect(
            done.get("status", "completed") != "in_progress",
            "output_item.done with status in_progress",
        )
        for kind, (item_field, _) in _ITEM_PARTS.get(item.type, {}).items():
            streamed = item.parts[kind]
            parts = done.get(item_field, None if streamed else [])
            _expect(isinstance(parts, list), f"done {item.type} item has no {item_field} list")
            _expect(
                len(parts) == len(streamed),
                f"done item has {len(parts)} {item_field} parts, the stream opened {len(streamed)}",
            )
            for part, seen in zip(parts, streamed, strict=True):
                _expect(
                    part.get("type") == seen.type,
                    f"done item part type {part.get('type')!r} != {seen.type!r}",
                )
                text_field = _PART_TEXT[seen.type]
                _expect(
                    part.get(text_field) == seen.text,
                    f"done item {item_field}[{seen.index}].{text_field} differs from its deltas: "
                    f"{part.get(text_field)!r} != {seen.text!r}",
                )
        if item.type in _ITEM_STREAMS:
            item_field, delta_type = _ITEM_STREAMS[item.type]
            done_type = _TEXT_STREAMS[delta_type][0]
            _expect(item.done_value is not None, f"output_item.done before {done_type}")
            _expect(
                done.get(item_field) == item.text,
                f"done item {item_field} {done.get(item_field)!r} != concatenated deltas {item.text!r}",
            )
        self.done_items.append(done)
        self.open_item = None

    # -- parts ----------------------------------------------------------------------------------

    def _part_event(self, event: Mapping[str, Any]) -> None:
        kind, index_key, is_added = _PART_EVENTS[event["type"]]
        item = self._open_item_for(event)
        allowed = _ITEM_PARTS.get(item.type, {})
        _expect(kind in allowed, f"{event['type']} on a {item.type} item")
        part = event.get("part")
        _expect(isinstance(part, Mapping), f"{event['type']} without a part object")
        index = event.get(index_key)
        if is_added:
            _expect(
                item.open_part is None,
                f"part added while part {self._part_desc(item.open_part)} is open",
            )
            expected = len(item.parts[kind])
            _expect(
                index == expected, f"{index_key} {index!r}, expected {expected} (per item, from 0)"
            )
            _expect(
                part.get("type") in allowed[kind][1],
                f"part type {part.get('type')!r} in a {item.type} item",
            )
            _expect(part.get(_PART_TEXT[part["type"]]) == "", f"added part is not empty: {part}")
            new = _Part(kind=kind, index=index, type=part["type"], added=part)
            item.parts[kind].append(new)
            item.open_part = new
            return
        open_part = item.open_part
        _expect(
            open_part is not None and open_part.kind == kind and open_part.index == index,
            f"{event['type']} {index_key}={index!r} but the open part is {self._part_desc(open_part)}",
        )
        assert open_part is not None
        _expect(
            part.get("type") == open_part.type,
            f"part type {part.get('type')!r} != added {open_part.type!r}",
        )
        _expect(
            open_part.done_value is not None, f"{event['type']} before the part's text .done event"
        )
        text_field = _PART_TEXT[open_part.type]
        _expect(
            part.get(text_field) == open_part.text,
            f"finished part {text_field} {part.get(text_field)!r} != concatenated deltas {open_part.text!r}",
        )
        item.open_part = None

    # -- text streams ---------------------------------------------------------------------------

    def _delta(self, event: Mapping[str, Any]) -> None:
        _, _, part_type = _TEXT_STREAMS[event["type"]]
        delta = event.get("delta")
        _expect(isinstance(delta, str), f"delta is {type(delta).__name__}, not a string")
        target = self._stream_target(event, event["type"], part_type)
        _expect(target.done_value is None, f"{event['type']} after its .done event")
        target.text += delta

    def _text_done(self, event: Mapping[str, Any]) -> None:
        delta_type = _DONE_TO_DELTA[event["type"]]
        _, value_field, part_type = _TEXT_STREAMS[delta_type]
        target = self._stream_target(event, delta_type, part_type)
        _expect(target.done_value is None, f"second {event['type']}")
        value = event.get(value_field)
        _expect(
            value == target.text,
            f"{event['type']}.{value_field} {value!r} != concatenated deltas {target.text!r}",
        )
        target.done_value = value
        if isinstance(target, _Item) and "name" in event:  # function_call_arguments.done
            _expect(
                event["name"] == target.added.get("name"),
                f"function_call_arguments.done name {event['name']!r} != item name",
            )

    def _stream_target(
        self, event: Mapping[str, Any], delta_type: str, part_type: str | None
    ) -> _Part | _Item:
        item = self._open_item_for(event)
        if part_type is None:  # an item-level stream: arguments / input
            _expect(
                _ITEM_STREAMS.get(item.type, ("", ""))[1] == delta_type,
                f"{event['type']} on a {item.type} item",
            )
            return item
        part = item.open_part
        _expect(part is not None, f"{event['type']} with no open part")
        assert part is not None
        index_key = "summary_index" if part.kind == "summary" else "content_index"
        _expect(
            event.get(index_key) == part.index,
            f"{index_key} {event.get(index_key)!r} != open part {part.index}",
        )
        _expect(part.type == part_type, f"{event['type']} in a {part.type} part")
        return part

    def _open_item_for(self, event: Mapping[str, Any], *, id_from_item: bool = False) -> _Item:
        item = self.open_item
        _expect(item is not None, f"{event['type']} with no open item")
        assert item is not None
        _expect(
            event.get("output_index") == item.output_index,
            f"output_index {event.get('output_index')!r} != open item's {item.output_index}",
        )
        event_item_id = (
            (event.get("item") or {}).get("id") if id_from_item else event.get("item_id")
        )
        _expect(event_item_id == item.id, f"item id {event_item_id!r} != open item's {item.id!r}")
        return item

    def _open_desc(self) -> str:
        item = self.open_item
        return "none" if item is None else f"#{item.output_index} {item.type} {item.id!r}"

    @staticmethod
    def _part_desc(part: _Part | None) -> str:
        return "none" if part is None else f"{part.kind}[{part.index}] {part.type}"


def _expect(condition: bool, message: str) -> None:
    if not condition:
        raise _StreamError(message)


# -- SDK validation ----------------------------------------------------------------------------


@functools.cache
def _sdk_models() -> tuple[pydantic.TypeAdapter[Any], Mapping[str, type[pydantic.BaseModel]]]:
    (union, *_) = typing.get_args(ResponseStreamEvent)  # Annotated[Union[...], PropertyInfo]
    by_type: dict[str, type[pydantic.BaseModel]] = {}
    for model in typing.get_args(union):
        literal = model.model_fields["type"].annotation
        (event_type,) = typing.get_args(literal)
        assert typing.get_origin(literal) is typing.Literal and event_type not in by_type, model
        by_type[event_type] = model
    return pydantic.TypeAdapter(ResponseStreamEvent), by_type


def validate_with_sdk(events: Sequence[Mapping[str, Any]]) -> list[pydantic.BaseModel]:
    """Validate each event with ``openai.types.responses.ResponseStreamEvent``; return the models.

    The union is validated as a whole (what ``TypeAdapter`` does for any client that validates),
    and the model it picks must be the one declared for the event's ``type``; an event type the
    SDK does not know is a failure, not a fallback.
    """
    adapter, by_type = _sdk_models()
    parsed = []
    for position, event in enumerate(events):
        where = f"event #{position} ({event.get('type')!r})"
        expected = by_type.get(str(event.get("type")))
        if expected is None:
            raise AssertionError(f"{where}: the openai SDK has no stream event of this type")
        try:
            model = adapter.validate_python(event)
        except pydantic.ValidationError as union_error:
            try:  # say why the event's own model refused it, not why all 59 did
                expected.model_validate(event)
            except pydantic.ValidationError as e:
                raise AssertionError(
                    f"{where}: openai.types.responses.{expected.__name__}: {e}"
                ) from None
            raise AssertionError(f"{where}: ResponseStreamEvent: {union_error}") from None
        if type(model) is not expected:
            raise AssertionError(
                f"{where}: parsed as {type(model).__name__}, expected {expected.__name__}"
            )
        parsed.append(model)
    return parsed
