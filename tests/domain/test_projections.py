from __future__ import annotations

import json

from openai.types.responses import Response, ResponseIncompleteEvent, ResponseStreamEvent
from pydantic import TypeAdapter

from domain.builder import Usage
from domain.events import OutputItemAdded, OutputTextDelta
from domain.projections import (
    fold,
    output_as_input,
    payload,
    payload_json,
    sse_frame,
    to_sse,
    to_wire,
    wire_type,
)
from tests.domain.factories import make_builder


def _events() -> list:
    b = make_builder()
    b.created()
    b.in_progress()
    b.open_message()
    b.append('say "hi"\n\u2028é')
    b.append(" there")
    b.finish("incomplete", usage=Usage(7, 2, 3, 0), incomplete_reason="max_output_tokens")
    return b.take()


def test_sse_frame_is_one_line_json_with_type_and_sequence_number() -> None:
    for event in _events():
        frame = to_sse(event)
        head, data, end = frame.split(b"\n", 2)
        assert head == b"event: " + event.type.encode()
        assert data.startswith(b"data: ") and end == b"\n"
        assert json.loads(data[6:]) == to_wire(event)


def test_sse_frame_is_a_pure_function_of_the_stored_event() -> None:
    for event in _events():
        stored = payload_json(event)
        assert json.loads(stored) == payload(event)
        assert sse_frame(event.type, event.sequence_number, stored) == to_sse(event)


def test_fold_of_a_truncated_response_marks_the_cut_item_incomplete() -> None:
    response = fold(_events())
    model = Response.model_validate(response)
    assert model.status == "incomplete"
    assert (
        model.incomplete_details is not None
        and model.incomplete_details.reason == "max_output_tokens"
    )
    assert model.output[0].status == "incomplete"  # type: ignore[union-attr]
    assert model.output_text == 'say "hi"\n\u2028é there'
    usage = response["usage"]
    assert usage["input_tokens_details"] == {"cached_tokens": 2, "cache_write_tokens": 0}
    assert usage["output_tokens_details"] == {"reasoning_tokens": 0}
    assert usage["total_tokens"] == 10


def test_fold_of_a_prefix_shows_the_open_item_with_its_text_so_far() -> None:
    events = _events()
    i = max(n for n, e in enumerate(events) if isinstance(e, OutputTextDelta))
    response = fold(events[: i + 1])
    assert response["status"] == "in_progress"
    assert response["output"][0]["status"] == "in_progress"
    assert response["output"][0]["content"][0]["text"] == 'say "hi"\n\u2028é there'
    assert isinstance(events[2], OutputItemAdded)


def test_every_response_field_is_present() -> None:
    response = fold(_events())
    for name in Response.model_fields:
        if name in (
            "access_programs",
            "conversation",
            "image",
            "input_transformations",
            "moderation",
            "prompt",
            "prompt_cache_diagnostics",
            "prompt_cache_options",
            "prompt_cache_retention",
            "tool_usage",
            "top_logprobs",
            "max_tool_calls",
            "completed_at",
        ):
            continue
        assert name in response, name


def test_output_items_replay_as_input_items() -> None:
    b = make_builder()
    b.created()
    b.open_reasoning()
    b.append("why")
    b.open_function_call("f")
    b.append("{}")
    b.finish("completed", usage=None, completed_at=1)
    output = fold(b.take())["output"]
    replay = [output_as_input(item) for item in output]
    assert replay[0] == {
        "type": "reasoning",
        "id": output[0]["id"],
        "summary": [],
        "content": [{"type": "reasoning_text", "text": "why"}],
    }
    assert replay[1]["call_id"] == output[1]["call_id"] and replay[1]["arguments"] == "{}"


def test_a_cancelled_log_ends_on_the_wire_as_the_sdks_incomplete_event_with_status_cancelled() -> (
    None
):
    b = make_builder(background=True)
    b.created(queued=True)
    b.in_progress()
    b.open_message()
    b.append("half an ans")
    b.finish("cancelled", usage=Usage(7, 0, 3, 0))
    events = b.take()
    terminal = events[-1]
    assert terminal.type == "response.cancelled"  # the log says what happened
    head, data, _ = to_sse(terminal).split(b"\n", 2)
    assert head == b"event: response.incomplete"
    wire = json.loads(data[6:])
    assert wire == to_wire(terminal) and wire["type"] == "response.incomplete"
    parsed = TypeAdapter(ResponseStreamEvent).validate_python(wire)
    assert isinstance(parsed, ResponseIncompleteEvent) and parsed.response.status == "cancelled"
    assert fold(events)["status"] == "cancelled"
    assert wire_type("response.completed") == "response.completed"
