"""tests.support.stream_checker: each stream rule accepts a good stream and rejects its breach."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest
from openai.types.responses import (
    ResponseCompletedEvent,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseOutputItemDoneEvent,
    ResponseTextDeltaEvent,
)

from tests.clients.fake_server import ResponseScript
from tests.support.stream_checker import check_stream, validate_with_sdk

Events = list[dict[str, Any]]
_REQUEST = {"model": "gpt-oss-120b", "stream": True, "tools": [], "input": "hi"}


def _script() -> ResponseScript:
    return ResponseScript(_REQUEST, response_id="resp_t", chunk_size=3)


def _full_stream() -> Events:
    """reasoning (1 part) + message (1 part) + function_call: every kind of nesting."""
    script = _script()
    script.reasoning("Think it through.")
    script.message("Hello there, world.")
    script.function_call("get_weather", json.dumps({"city": "Paris"}), call_id="call_1")
    return script.events()


def _renumber(events: Events) -> Events:
    return [{**e, "sequence_number": n} for n, e in enumerate(events)]


def _index(events: Events, event_type: str, nth: int = 0) -> int:
    return [i for i, e in enumerate(events) if e["type"] == event_type][nth]


def _rejects(events: Events, *fragments: str) -> None:
    with pytest.raises(AssertionError) as caught:
        check_stream(events)
    for fragment in fragments:
        assert fragment in str(caught.value), str(caught.value)


# -- good streams --------------------------------------------------------------------------------


def test_a_full_stream_passes_and_returns_the_terminal_response() -> None:
    events = _full_stream()
    final = check_stream(events)
    assert final["status"] == "completed"
    assert [item["type"] for item in final["output"]] == ["reasoning", "message", "function_call"]


def test_an_empty_response_passes() -> None:
    check_stream(_script().events())


def test_a_background_stream_with_queued_passes() -> None:
    events = _full_stream()
    events[0]["response"]["status"] = "queued"
    queued = {"type": "response.queued", "response": {**events[0]["response"], "status": "queued"}}
    check_stream(_renumber([events[0], queued, *events[1:]]))


@pytest.mark.parametrize(
    ("terminal", "status", "extra"),
    [
        (
            "response.incomplete",
            "incomplete",
            {"incomplete_details": {"reason": "max_output_tokens"}},
        ),
        (
            "response.failed",
            "failed",
            {"error": {"code": "server_error", "message": "engine died"}},
        ),
        ("response.incomplete", "cancelled", {}),
    ],
)
def test_other_terminal_events_pass(terminal: str, status: str, extra: dict[str, Any]) -> None:
    events = _full_stream()
    events[-1]["type"] = terminal
    events[-1]["response"].update(status=status, **extra)
    assert check_stream(events)["status"] == status


# -- lifecycle rules -----------------------------------------------------------------------------


def test_first_event_must_be_created() -> None:
    events = _full_stream()
    _rejects(_renumber(events[1:]), "event #0", "the first event must be response.created")


def test_second_event_must_be_in_progress() -> None:
    events = _full_stream()
    _rejects(_renumber([events[0], *events[2:]]), "event #1", "expected response.in_progress")


def test_background_stream_must_announce_queued() -> None:
    events = _full_stream()
    events[0]["response"]["status"] = "queued"
    _rejects(events, "expected response.queued at position 1")


def test_in_progress_must_say_in_progress() -> None:
    events = _full_stream()
    events[1]["response"]["status"] = "queued"
    _rejects(events, "response.in_progress has status 'queued'")


def test_sequence_numbers_must_start_at_zero() -> None:
    events = [{**e, "sequence_number": e["sequence_number"] + 1} for e in _full_stream()]
    _rejects(events, "sequence_number 1, expected 0")


def test_sequence_numbers_must_be_contiguous() -> None:
    events = _full_stream()
    for event in events[5:]:
        event["sequence_number"] += 1
    _rejects(events, "event #5", "sequence_number 6, expected 5")


def test_response_id_must_not_change() -> None:
    events = _full_stream()
    events[-1]["response"]["id"] = "resp_other"
    _rejects(events, "response id 'resp_other' != 'resp_t'")


def test_a_stream_needs_a_terminal_event() -> None:
    _rejects(_full_stream()[:-1], "no terminal event")


def test_nothing_may_follow_the_terminal_event() -> None:
    events = _full_stream()
    _rejects(_renumber([*events, copy.deepcopy(events[-1])]), "event after the terminal event")


def test_terminal_status_must_match_its_type() -> None:
    events = _full_stream()
    events[-1]["response"]["status"] = "incomplete"
    _rejects(events, "response.completed has status 'incomplete'")


def test_incomplete_needs_a_reason_and_failed_an_error() -> None:
    events = _full_stream()
    events[-1].update(type="response.incomplete")
    events[-1]["response"]["status"] = "incomplete"
    _rejects(events, "without incomplete_details.reason")
    events[-1].update(type="response.failed")
    events[-1]["response"]["status"] = "failed"
    _rejects(events, "response.failed without error")


def test_terminal_may_not_close_over_an_open_item() -> None:
    events = _full_stream()
    cut = _index(events, "response.output_item.done", 2)
    _rejects(_renumber([*events[:cut], events[-1]]), "while item #2 function_call")


def test_terminal_output_must_equal_the_done_items() -> None:
    events = _full_stream()
    events[-1]["response"]["output"][1]["content"][0]["text"] = "Hello there, world!"
    _rejects(events, "terminal response.output[1] differs from output_item.done #1")
    events = _full_stream()
    del events[-1]["response"]["output"][2]
    _rejects(events, "terminal response.output has 2 items, the stream finished 3")


def test_unknown_body_events_are_rejected() -> None:
    events = _full_stream()
    events.insert(3, {"type": "response.output_text.annotation.added"})
    _rejects(_renumber(events), "unexpected event type 'response.output_text.annotation.added'")


# -- item rules ----------------------------------------------------------------------------------


def test_output_index_must_be_dense() -> None:
    events = _full_stream()
    for event in events:
        if event.get("output_index") == 2:
            event["output_index"] = 3
    _rejects(events, "output_index 3, expected 2")


def test_items_may_not_interleave() -> None:
    events = _full_stream()
    second_added = events.pop(_index(events, "response.output_item.added", 1))
    events.insert(_index(events, "response.output_item.added", 0) + 1, second_added)
    _rejects(_renumber(events), "output_item.added while item #0 reasoning 'rs_t_0' is open")


def test_done_item_id_must_equal_the_added_id() -> None:
    events = _full_stream()
    events[_index(events, "response.output_item.done", 1)]["item"]["id"] = "msg_other"
    _rejects(events, "item id 'msg_other' != open item's 'msg_t_1'")


def test_call_id_may_not_change_between_added_and_done() -> None:
    events = _full_stream()
    done = events[_index(events, "response.output_item.done", 2)]
    done["item"]["call_id"] = "call_2"
    events[-1]["response"]["output"][2]["call_id"] = "call_2"
    _rejects(events, "output_item.done call_id='call_2', added had 'call_1'")


def test_item_ids_are_unique() -> None:
    events = _full_stream()
    for event in events:
        if event.get("item_id") == "msg_t_1":
            event["item_id"] = "rs_t_0"
        if event.get("item", {}).get("id") == "msg_t_1":
            event["item"]["id"] = "rs_t_0"
    _rejects(events, "item id 'rs_t_0' reused")


def test_an_added_item_starts_empty() -> None:
    events = _full_stream()
    events[_index(events, "response.output_item.added", 2)]["item"]["arguments"] = '{"ci'
    _rejects(events, "added function_call item has arguments='{\"ci'")


def test_item_events_must_name_the_open_item() -> None:
    events = _full_stream()
    events[_index(events, "response.output_text.delta")]["item_id"] = "msg_other"
    _rejects(events, "item id 'msg_other' != open item's 'msg_t_1'")
    events = _full_stream()
    events[_index(events, "response.output_text.delta")]["output_index"] = 0
    _rejects(events, "output_index 0 != open item's 1")


def test_delta_outside_any_item_is_rejected() -> None:
    events = _full_stream()
    delta = events.pop(_index(events, "response.function_call_arguments.delta"))
    events.insert(_index(events, "response.output_item.added", 2), delta)
    _rejects(_renumber(events), "response.function_call_arguments.delta with no open item")


# -- part rules ----------------------------------------------------------------------------------


def test_content_index_starts_at_zero_in_every_item() -> None:
    events = _full_stream()
    for event in events:
        if event.get("item_id") == "msg_t_1" and "content_index" in event:
            event["content_index"] = 1
    _rejects(events, "content_index 1, expected 0 (per item, from 0)")


def test_deltas_need_an_open_part() -> None:
    events = _full_stream()
    del events[_index(events, "response.content_part.added", 1)]
    _rejects(_renumber(events), "response.output_text.delta with no open part")


def test_item_cannot_finish_with_an_open_part() -> None:
    events = _full_stream()
    del events[_index(events, "response.content_part.done", 1)]
    _rejects(_renumber(events), "output_item.done while part content[0] output_text is open")


def test_part_done_needs_the_text_done_event_first() -> None:
    events = _full_stream()
    del events[_index(events, "response.output_text.done")]
    _rejects(_renumber(events), "response.content_part.done before the part's text .done event")


def test_delta_type_must_fit_the_part() -> None:
    events = _full_stream()
    events[_index(events, "response.output_text.delta")]["type"] = "response.reasoning_text.delta"
    _rejects(events, "response.reasoning_text.delta in a output_text part")


def test_parts_only_where_the_item_type_has_them() -> None:
    script = _script()
    script.function_call("f", "{}", call_id="call_1")
    events = script.events()
    part = {"type": "response.content_part.added", "item_id": "fc_t_0", "output_index": 0,
            "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}}  # fmt: skip
    events.insert(3, part)
    _rejects(_renumber(events), "response.content_part.added on a function_call item")


# -- delta concatenation -------------------------------------------------------------------------


def test_text_done_must_equal_the_deltas() -> None:
    events = _full_stream()
    events[_index(events, "response.output_text.done")]["text"] = "Hello there world."
    _rejects(events, "response.output_text.done.text 'Hello there world.' != concatenated deltas")


def test_a_lost_delta_is_caught() -> None:
    events = _full_stream()
    del events[_index(events, "response.output_text.delta", 1)]
    _rejects(_renumber(events), "concatenated deltas")


def test_reasoning_done_must_equal_the_deltas() -> None:
    events = _full_stream()
    events[_index(events, "response.reasoning_text.done")]["text"] = "Think."
    _rejects(events, "response.reasoning_text.done.text 'Think.' != concatenated deltas")


def test_finished_part_must_equal_the_deltas() -> None:
    events = _full_stream()
    events[_index(events, "response.content_part.done", 1)]["part"]["text"] = "Hello."
    _rejects(events, "finished part text 'Hello.' != concatenated deltas 'Hello there, world.'")


def test_done_item_content_must_equal_the_deltas() -> None:
    events = _full_stream()
    done = events[_index(events, "response.output_item.done", 1)]
    done["item"]["content"][0]["text"] = "Hello."
    events[-1]["response"]["output"][1]["content"][0]["text"] = "Hello."
    _rejects(events, "done item content[0].text differs from its deltas")


def test_delta_after_done_is_rejected() -> None:
    events = _full_stream()
    delta = copy.deepcopy(events[_index(events, "response.output_text.delta")])
    events.insert(_index(events, "response.output_text.done") + 1, delta)
    _rejects(_renumber(events), "response.output_text.delta after its .done event")


def test_function_arguments_done_must_equal_the_deltas() -> None:
    events = _full_stream()
    events[_index(events, "response.function_call_arguments.done")]["arguments"] = "{}"
    _rejects(events, "response.function_call_arguments.done.arguments '{}' != concatenated deltas")


def test_function_call_needs_its_arguments_done_event() -> None:
    events = _full_stream()
    del events[_index(events, "response.function_call_arguments.done")]
    _rejects(_renumber(events), "output_item.done before response.function_call_arguments.done")


def test_done_function_call_arguments_must_equal_the_deltas() -> None:
    events = _full_stream()
    events[_index(events, "response.output_item.done", 2)]["item"]["arguments"] = "{}"
    events[-1]["response"]["output"][2]["arguments"] = "{}"
    _rejects(events, "done item arguments '{}' != concatenated deltas")


def test_arguments_done_must_name_the_function() -> None:
    events = _full_stream()
    events[_index(events, "response.function_call_arguments.done")]["name"] = "other"
    _rejects(events, "function_call_arguments.done name 'other' != item name")


# -- SDK validation ------------------------------------------------------------------------------


def test_sdk_accepts_a_good_stream_and_picks_each_events_model() -> None:
    models = validate_with_sdk(_full_stream())
    kinds = {type(m).__name__ for m in models}
    assert {"ResponseCreatedEvent", "ResponseTextDeltaEvent", "ResponseCompletedEvent",
            "ResponseFunctionCallArgumentsDeltaEvent", "ResponseReasoningTextDeltaEvent"} <= kinds  # fmt: skip
    assert isinstance(models[-1], ResponseCompletedEvent)
    assert models[-1].response.output[1].content[0].text == "Hello there, world."


def _sdk_rejects(mutate: Callable[[Events], None], *fragments: str) -> None:
    events = _full_stream()
    mutate(events)
    with pytest.raises(AssertionError) as caught:
        validate_with_sdk(events)
    for fragment in fragments:
        assert fragment in str(caught.value), str(caught.value)


def test_sdk_rejects_an_event_type_it_does_not_know() -> None:
    def cancel(events: Events) -> None:
        events[-1]["type"] = "response.cancelled"

    _sdk_rejects(cancel, "the openai SDK has no stream event of this type")


def test_sdk_rejects_a_missing_required_field() -> None:
    def drop(events: Events) -> None:
        del events[_index(events, "response.output_text.delta")]["item_id"]

    _sdk_rejects(drop, ResponseTextDeltaEvent.__name__, "item_id")


def test_sdk_rejects_a_wrong_enum() -> None:
    def wrong(events: Events) -> None:
        events[_index(events, "response.output_item.done", 2)]["item"]["status"] = "done"

    _sdk_rejects(wrong, ResponseOutputItemDoneEvent.__name__, "status")


def test_sdk_rejects_a_wrong_type() -> None:
    def wrong(events: Events) -> None:
        events[_index(events, "response.function_call_arguments.delta")]["delta"] = {
            "city": "Paris"
        }

    _sdk_rejects(wrong, ResponseFunctionCallArgumentsDeltaEvent.__name__, "delta")


def test_sdk_rejects_usage_without_cache_write_tokens() -> None:
    """openai 3.57 requires usage.input_tokens_details.cache_write_tokens (the spec does not)."""

    def old_usage(events: Events) -> None:
        del events[-1]["response"]["usage"]["input_tokens_details"]["cache_write_tokens"]

    _sdk_rejects(old_usage, "cache_write_tokens")
