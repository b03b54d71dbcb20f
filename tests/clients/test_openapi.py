"""tests.support.openapi: the OpenAPI validator catches what it should and nothing else."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import Any

import pytest
from openai.types.responses import (
    FileSearchTool,
    Response,
    ResponseCompletedEvent,
    ResponseCreatedEvent,
    ResponseFunctionToolCall,
    ResponseOutputItemAddedEvent,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseReasoningItem,
    ResponseTextDeltaEvent,
    ResponseUsage,
)
from openai.types.responses.response_reasoning_item import Content as ReasoningContent
from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails

from tests.support import openapi


def _dump(model: Any) -> dict[str, Any]:
    # exclude_unset: only what a server would put on the wire, not the SDK's None defaults
    return model.model_dump(mode="json", exclude_unset=True)


def _usage() -> ResponseUsage:
    return ResponseUsage(
        input_tokens=12,
        input_tokens_details=InputTokensDetails(cached_tokens=0, cache_write_tokens=0),
        output_tokens=7,
        output_tokens_details=OutputTokensDetails(reasoning_tokens=3),
        total_tokens=19,
    )


def _output() -> list[Any]:
    return [
        ResponseReasoningItem(
            id="rs_1", type="reasoning", summary=[], status="completed",
            content=[ReasoningContent(type="reasoning_text", text="Look up the weather.")],
        ),
        ResponseFunctionToolCall(
            id="fc_1", type="function_call", call_id="call_1", name="get_weather",
            arguments='{"city":"Paris"}', status="completed",
        ),
        ResponseOutputMessage(
            id="msg_1", type="message", role="assistant", status="completed",
            content=[ResponseOutputText(type="output_text", text="Sunny.", annotations=[], logprobs=[])],
        ),
    ]  # fmt: skip


def _response(**overrides: Any) -> Response:
    fields: dict[str, Any] = dict(
        id="resp_1", object="response", created_at=1_767_225_600, status="completed",
        model="gpt-oss-120b", output=_output(), usage=_usage(), error=None, incomplete_details=None,
        instructions=None, metadata={}, parallel_tool_calls=True, temperature=1.0, top_p=1.0,
        tool_choice="auto", tools=[], text={"format": {"type": "text"}}, user=None,
        safety_identifier=None, prompt_cache_key=None,
    )  # fmt: skip
    fields.update(overrides)
    return Response(**fields)


def _response_dict(**overrides: Any) -> dict[str, Any]:
    return _dump(_response(**overrides))


def _rejected(
    obj: dict[str, Any], validate: Callable[[Any], None] = openapi.validate_response
) -> str:
    with pytest.raises(AssertionError) as caught:
        validate(obj)
    return str(caught.value)


def test_the_document_is_openapi_3_1_loaded_once() -> None:
    loaded = openapi.spec()
    assert loaded.openapi_version.startswith("3.1.")
    assert loaded.path.name == "openapi.yml"
    assert 0 < loaded.load_seconds < 60
    started = time.perf_counter()
    assert openapi.spec() is loaded
    assert time.perf_counter() - started < 0.01


def test_a_response_built_with_the_sdk_is_valid() -> None:
    openapi.validate_response(_response_dict())


def test_a_missing_required_field_is_reported_with_its_path() -> None:
    obj = _response_dict()
    del obj["output"][1]["call_id"]
    message = _rejected(obj)
    assert "$.output[1]" in message and "'call_id' is a required property" in message
    assert "#/components/schemas/FunctionToolCall/required" in message


def test_a_missing_top_level_field_is_reported() -> None:
    obj = _response_dict()
    del obj["tool_choice"]
    assert "'tool_choice' is a required property" in _rejected(obj)


def test_a_wrong_enum_is_reported() -> None:
    obj = _response_dict()
    obj["output"][2]["status"] = "done"
    message = _rejected(obj)
    assert "$.output[2].status" in message and "'done' is not one of" in message


def test_a_wrong_response_status_is_reported() -> None:
    obj = _response_dict()
    obj["status"] = "finished"
    assert "$.status" in _rejected(obj)


def test_an_unknown_item_type_is_reported_at_the_item() -> None:
    obj = _response_dict()
    obj["output"][2]["type"] = "mesage"
    message = _rejected(obj)
    assert "$.output[2]" in message and "not valid under any of the given schemas" in message


def test_null_where_the_sdk_says_optional_but_openai_never_sends_null() -> None:
    obj = _response_dict()
    obj["output"][2]["content"][0]["logprobs"] = None  # OpenAI sends []
    assert "$.output[2].content[0].logprobs" in _rejected(obj)
    obj = _response_dict()
    obj["text"] = None  # OpenAI always echoes the text config
    assert "$.text" in _rejected(obj)


def test_finished_response_must_not_have_null_usage() -> None:
    obj = _response_dict()
    obj["usage"] = None
    assert "$.usage" in _rejected(obj)


def test_usage_may_be_null_while_running() -> None:
    obj = _response_dict(status="in_progress", output=[])
    obj["usage"] = None
    openapi.validate_response(obj)


# Each allow-list entry: an object OpenAI really returns that the snapshot as published rejects.
_ALLOW_LIST_PROBES: dict[str, Callable[[dict[str, Any]], None]] = {
    "Response.usage": lambda o: o.update(status="in_progress", output=[], usage=None),
    "ModelResponseProperties.user": lambda o: o.update(user=None),
    "ModelResponseProperties.safety_identifier": lambda o: o.update(safety_identifier=None),
    "ModelResponseProperties.prompt_cache_key": lambda o: o.update(prompt_cache_key=None),
}


def test_every_allow_list_entry_has_a_probe_and_a_reason() -> None:
    assert {entry.where for entry in openapi.ALLOW_LIST} == set(_ALLOW_LIST_PROBES)
    assert all(entry.reason.strip() for entry in openapi.ALLOW_LIST)


@pytest.mark.parametrize("where", sorted(_ALLOW_LIST_PROBES))
def test_every_allow_list_entry_is_still_needed(where: str) -> None:
    obj = _dump(_response(user="u", safety_identifier="s", prompt_cache_key="k"))
    _ALLOW_LIST_PROBES[where](obj)
    strict = openapi.spec().validator("Response", relaxed=False)
    assert not strict.is_valid(obj), (
        f"{where}: the published snapshot accepts it now; drop the entry"
    )
    openapi.validate_response(obj)


def test_without_nulls_the_strict_snapshot_accepts_the_same_response() -> None:
    obj = _dump(_response(user="u", safety_identifier="s", prompt_cache_key="k"))
    assert openapi.spec().validator("Response", relaxed=False).is_valid(obj)


def test_nested_compound_filters_are_validated() -> None:
    """$recursiveRef (2019-09) was rewritten to a $ref; nested filters are checked, not skipped."""
    tool = FileSearchTool(
        type="file_search",
        vector_store_ids=["vs_1"],
        filters={
            "type": "and",
            "filters": [
                {"type": "or", "filters": [{"type": "eq", "key": "lang", "value": "en"}]},
            ],
        },
    )
    good = _response_dict(tools=[tool])
    openapi.validate_response(good)
    bad = copy.deepcopy(good)
    bad["tools"][0]["filters"]["filters"][0]["filters"][0]["key"] = 42
    assert "$.tools[0].filters" in _rejected(bad)


# -- stream events -------------------------------------------------------------------------------


def test_stream_events_built_with_the_sdk_are_valid() -> None:
    running = _response(status="in_progress", output=[])
    message = ResponseOutputMessage(
        id="msg_1", type="message", role="assistant", status="in_progress", content=[]
    )
    events = [
        ResponseCreatedEvent(type="response.created", sequence_number=0, response=running),
        ResponseOutputItemAddedEvent(type="response.output_item.added", sequence_number=1, output_index=0, item=message),
        ResponseTextDeltaEvent(
            type="response.output_text.delta", sequence_number=2, item_id="msg_1",
            output_index=0, content_index=0, delta="Sun", logprobs=[],
        ),
        ResponseCompletedEvent(type="response.completed", sequence_number=3, response=_response()),
    ]  # fmt: skip
    for event in events:
        obj = _dump(event)
        if obj["type"] == "response.created":
            obj["response"]["usage"] = None  # what OpenAI sends before the end
        openapi.validate_stream_event(obj)


def test_a_stream_event_missing_a_required_field_is_reported() -> None:
    event = _dump(
        ResponseTextDeltaEvent(
            type="response.output_text.delta", sequence_number=2, item_id="msg_1",
            output_index=0, content_index=0, delta="Sun", logprobs=[],
        )
    )  # fmt: skip
    del event["logprobs"]
    message = _rejected(event, openapi.validate_stream_event)
    assert "response.output_text.delta event (seq 2)" in message
    assert "'logprobs' is a required property" in message


def test_a_stream_event_with_a_wrong_enum_inside_is_reported() -> None:
    message = ResponseOutputMessage(
        id="msg_1", type="message", role="assistant", status="in_progress", content=[]
    )
    event = _dump(
        ResponseOutputItemAddedEvent(
            type="response.output_item.added", sequence_number=1, output_index=0, item=message
        )
    )
    event["item"]["role"] = "user"
    assert "$.item.role" in _rejected(event, openapi.validate_stream_event)


def test_the_terminal_response_is_checked_inside_the_event() -> None:
    event = _dump(
        ResponseCompletedEvent(type="response.completed", sequence_number=3, response=_response())
    )
    event["response"]["usage"] = None
    assert "$.response.usage" in _rejected(event, openapi.validate_stream_event)


@pytest.mark.parametrize("event_type", ["response.cancelled", "response.output_text.deltas", None])
def test_an_event_type_outside_the_union_is_rejected(event_type: str | None) -> None:
    message = _rejected({"type": event_type, "sequence_number": 0}, openapi.validate_stream_event)
    assert "not in the OpenAPI ResponseStreamEvent union" in message


def test_the_union_knows_the_events_the_server_emits() -> None:
    assert {
        "response.created", "response.in_progress", "response.queued", "response.completed",
        "response.incomplete", "response.failed", "response.output_item.added",
        "response.output_item.done", "response.content_part.added", "response.content_part.done",
        "response.output_text.delta", "response.output_text.done", "response.reasoning_text.delta",
        "response.reasoning_text.done", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.custom_tool_call_input.delta",
        "response.custom_tool_call_input.done",
    } <= openapi.stream_event_types()  # fmt: skip
