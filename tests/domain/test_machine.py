"""Every forbidden transition is rejected with the rule it breaks."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from domain.builder import Usage
from domain.errors import InvariantViolation
from domain.events import (
    ContentPartAdded,
    Event,
    FunctionCallArgumentsDelta,
    OutputItemAdded,
    OutputItemDone,
    OutputTextDelta,
    OutputTextDone,
    ReasoningTextDelta,
    ResponseCompleted,
    ResponseCreated,
    ResponseInProgress,
)
from domain.machine import INITIAL, LogState, apply, check_log
from tests.domain.factories import make_builder, response_skeleton


def _valid_log() -> list[Event]:
    b = make_builder()
    b.created()
    b.in_progress()
    b.open_reasoning()
    b.append("think")
    b.open_message()
    b.append("Hel")
    b.append("lo")
    b.open_function_call("get_weather")
    b.append('{"city":')
    b.append('"Paris"}')
    b.finish("completed", usage=Usage(10, 0, 5, 1), completed_at=1)
    return b.take()


def _state_before(events: list[Event], index: int) -> LogState:
    return check_log(events[:index])


def _index_of(events: list[Event], cls: type[Any], nth: int = 0) -> int:
    return [i for i, e in enumerate(events) if isinstance(e, cls)][nth]


def _expect(rule: str, state: LogState, event: Event) -> None:
    with pytest.raises(InvariantViolation) as info:
        apply(state, event)
    assert info.value.rule == rule


def test_the_builder_log_is_valid() -> None:
    final = check_log(_valid_log())
    assert final.terminal and final.status == "completed" and final.items_added == 3


def test_sequence_numbers_must_be_contiguous() -> None:
    events = _valid_log()
    _expect("seq_not_contiguous", _state_before(events, 3), replace(events[3], sequence_number=4))


def test_created_must_come_first_and_once() -> None:
    events = _valid_log()
    _expect("created_not_first", INITIAL, replace(events[1], sequence_number=0))
    _expect("created_twice", check_log(events[:1]), replace(events[0], sequence_number=1))


def test_status_cannot_go_back_to_queued() -> None:
    from domain.events import ResponseQueued

    events = _valid_log()
    state = check_log(events[:2])
    _expect("bad_status_transition", state, ResponseQueued(2, response_skeleton(status="queued")))


def test_delta_for_an_item_that_is_not_open() -> None:
    events = _valid_log()
    i = _index_of(events, OutputItemDone)  # the reasoning item just closed
    state = _state_before(events, i + 1)
    reasoning_id = events[i].item["id"]  # type: ignore[union-attr]
    _expect("delta_for_closed_item", state, ReasoningTextDelta(i + 1, reasoning_id, 0, 0, "late"))


def test_delta_after_the_text_was_done() -> None:
    events = _valid_log()
    i = _index_of(events, OutputTextDone)
    state = _state_before(events, i + 1)
    done = events[i]
    assert isinstance(done, OutputTextDone)
    _expect(
        "delta_for_closed_item",
        state,
        OutputTextDelta(i + 1, done.item_id, done.output_index, done.content_index, "x"),
    )


def test_wrong_delta_type_for_the_item() -> None:
    events = _valid_log()
    i = _index_of(events, OutputTextDelta)
    state = _state_before(events, i)
    delta = events[i]
    assert isinstance(delta, OutputTextDelta)
    _expect(
        "wrong_event_for_item",
        state,
        FunctionCallArgumentsDelta(i, delta.item_id, delta.output_index, "{"),
    )


def test_anything_after_the_terminal_and_a_second_terminal() -> None:
    events = _valid_log()
    final = check_log(events)
    n = len(events)
    _expect("second_terminal", final, replace(events[-1], sequence_number=n))
    _expect(
        "event_after_terminal",
        final,
        ResponseInProgress(n, response_skeleton(status="in_progress")),
    )


def test_terminal_while_an_item_is_open() -> None:
    events = _valid_log()
    i = _index_of(events, OutputTextDelta)
    state = _state_before(events, i)
    terminal = ResponseCompleted(i, response_skeleton(status="completed"))
    _expect("terminal_while_item_open", state, terminal)


def test_terminal_status_must_match_the_event() -> None:
    events = _valid_log()
    state = _state_before(events, len(events) - 1)
    bad = ResponseCompleted(len(events) - 1, response_skeleton(status="failed"))
    _expect("terminal_status_mismatch", state, bad)


def test_output_index_must_be_dense() -> None:
    events = _valid_log()
    i = _index_of(events, OutputItemAdded, 1)
    added = events[i]
    assert isinstance(added, OutputItemAdded)
    _expect("output_index_not_dense", _state_before(events, i), replace(added, output_index=2))


def test_one_item_open_at_a_time() -> None:
    events = _valid_log()
    i = _index_of(events, OutputTextDelta)
    state = _state_before(events, i)
    item = {
        "id": "msg_other",
        "type": "message",
        "role": "assistant",
        "status": "in_progress",
        "content": [],
    }
    _expect("item_already_open", state, OutputItemAdded(i, 2, item))


def test_unknown_item_type() -> None:
    state = check_log(_valid_log()[:2])
    _expect(
        "unknown_item_type", state, OutputItemAdded(2, 0, {"id": "x", "type": "web_search_call"})
    )


def test_content_index_restarts_per_item() -> None:
    events = _valid_log()
    i = _index_of(events, ContentPartAdded, 1)  # the message's first part
    part = events[i]
    assert isinstance(part, ContentPartAdded)
    _expect("content_index_not_dense", _state_before(events, i), replace(part, content_index=1))


def test_item_id_and_call_id_cannot_change() -> None:
    events = _valid_log()
    i = _index_of(events, OutputItemDone, 2)  # the function call
    done = events[i]
    assert isinstance(done, OutputItemDone)
    state = _state_before(events, i)
    _expect("item_id_changed", state, replace(done, item={**done.item, "id": "fc_new"}))
    _expect("call_id_changed", state, replace(done, item={**done.item, "call_id": "call_new"}))


@pytest.mark.parametrize("cls_name", ["OutputTextDone", "FunctionCallArgumentsDone"])
def test_done_value_must_equal_the_deltas(cls_name: str) -> None:
    events = _valid_log()
    i = next(j for j, e in enumerate(events) if type(e).__name__ == cls_name)
    done: Any = events[i]
    field = "text" if cls_name == "OutputTextDone" else "arguments"
    _expect("done_differs_from_deltas", _state_before(events, i), replace(done, **{field: "other"}))


def test_item_done_must_carry_the_streamed_text() -> None:
    events = _valid_log()
    i = _index_of(events, OutputItemDone, 1)  # the message
    done = events[i]
    assert isinstance(done, OutputItemDone)
    item = {**done.item, "content": [{"type": "output_text", "text": "Goodbye", "annotations": []}]}
    _expect("done_differs_from_deltas", _state_before(events, i), replace(done, item=item))


def test_part_must_close_before_item() -> None:
    events = _valid_log()
    i = _index_of(events, OutputItemDone, 1)
    state = _state_before(events, i - 1)  # before content_part.done
    _expect("part_still_open", state, replace(events[i], sequence_number=i - 1))


def test_created_with_a_terminal_status_is_rejected() -> None:
    _expect(
        "bad_status_transition", INITIAL, ResponseCreated(0, response_skeleton(status="completed"))
    )


def _outcome(state: LogState, event: Event) -> LogState | str:
    try:
        return apply(state, event)
    except InvariantViolation as error:
        return error.rule


def test_the_per_token_path_agrees_with_the_general_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    """``apply`` checks a text delta in one condition before the general rules: every delta of a
    valid log, and each way of breaking one, must come out the same through both (the rule it
    breaks, or the same next state)."""
    log = _valid_log()
    cases: list[tuple[LogState, Event]] = []
    for index, event in enumerate(log):
        if not isinstance(event, OutputTextDelta | ReasoningTextDelta):
            continue
        state = _state_before(log, index)
        other = ReasoningTextDelta if isinstance(event, OutputTextDelta) else OutputTextDelta
        swapped = other(
            event.sequence_number,
            event.item_id,
            event.output_index,
            event.content_index,
            event.delta,
        )
        cases += [
            (state, event),
            (state, swapped),  # the wrong kind of delta for the open item
            (state, replace(event, sequence_number=event.sequence_number + 1)),
            (state, replace(event, item_id="msg_other")),
            (state, replace(event, output_index=event.output_index + 1)),
            (state, replace(event, content_index=event.content_index + 1)),
            (INITIAL, replace(event, sequence_number=0)),  # before response.created
            (check_log(log), replace(event, sequence_number=len(log))),  # after the terminal event
        ]
    text_done = _index_of(log, OutputTextDone)
    late = next(e for e in log if isinstance(e, OutputTextDelta))
    cases.append((_state_before(log, text_done + 1), replace(late, sequence_number=text_done + 1)))

    fast = [_outcome(state, event) for state, event in cases]
    monkeypatch.setattr("domain.machine._TEXT_DELTAS", {})  # only the general rules now
    general = [_outcome(state, event) for state, event in cases]
    assert fast == general
    assert sum(isinstance(o, str) for o in fast) >= len(cases) // 2  # the broken ones do break
