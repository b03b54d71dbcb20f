"""Property tests: any program of builder calls yields a log the state machine and SDK accept."""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from domain.builder import ResponseBuilder, Usage
from domain.events import (
    CustomToolCallInputDelta,
    CustomToolCallInputDone,
    Event,
    FunctionCallArgumentsDelta,
    FunctionCallArgumentsDone,
    OutputItemDone,
    OutputTextDelta,
    OutputTextDone,
    ReasoningTextDelta,
    ReasoningTextDone,
)
from domain.machine import check_log
from domain.projections import fold, from_wire, payload, to_wire
from tests.domain.factories import counter_ids, make_builder, response_skeleton

STREAM_EVENT = TypeAdapter(ResponseStreamEvent)

text = st.text(min_size=0, max_size=12)
step = st.one_of(
    st.tuples(st.just("reasoning")),
    st.tuples(st.just("message"), st.sampled_from(["final_answer", "commentary"])),
    st.tuples(st.just("function"), st.from_regex(r"[a-z][a-z_.]{0,10}", fullmatch=True)),
    st.tuples(st.just("custom"), st.from_regex(r"[a-z][a-z_]{0,10}", fullmatch=True)),
    st.tuples(st.just("append"), text),
    st.tuples(st.just("close"), st.sampled_from(["completed", "incomplete"])),
)
ending = st.sampled_from(["completed", "incomplete", "failed", "cancelled"])


def run_program(program: list[tuple[Any, ...]], end: str, queued: bool) -> ResponseBuilder:
    b = make_builder(background=queued)
    b.created(queued=queued)
    b.in_progress()
    for op in program:
        run_program_step(b, op)
    b.finish(end, usage=Usage(3, 1, 4, 2), completed_at=5)  # type: ignore[arg-type]
    return b


def _sdk_dump(event: Event) -> dict[str, Any]:
    wire = to_wire(event)
    model = STREAM_EVENT.validate_python(wire)
    if event.type == "response.cancelled":
        # sent as the SDK's response.incomplete (domain.projections), its Response still cancelled
        assert model.type == "response.incomplete" and model.response.status == "cancelled"
        return {**model.model_dump(mode="json", exclude_unset=True), "type": event.type}
    return model.model_dump(mode="json", exclude_unset=True)


@settings(max_examples=100, deadline=None)
@given(st.lists(step, max_size=30), ending, st.booleans())
def test_builder_programs_make_valid_logs(
    program: list[tuple[Any, ...]], end: str, queued: bool
) -> None:
    events = run_program(program, end, queued).take()
    final = check_log(events)
    assert final.terminal and final.status == end
    assert [e.sequence_number for e in events] == list(range(len(events)))
    # deltas concatenate to their .done value, per item
    deltas: dict[str, str] = {}
    for e in events:
        if isinstance(
            e,
            OutputTextDelta
            | ReasoningTextDelta
            | FunctionCallArgumentsDelta
            | CustomToolCallInputDelta,
        ):
            deltas[e.item_id] = deltas.get(e.item_id, "") + e.delta
        elif isinstance(e, OutputTextDone | ReasoningTextDone):
            assert e.text == deltas.get(e.item_id, "")
        elif isinstance(e, FunctionCallArgumentsDone):
            assert e.arguments == deltas.get(e.item_id, "")
        elif isinstance(e, CustomToolCallInputDone):
            assert e.input == deltas.get(e.item_id, "")
    # every prefix folds; the full fold is the terminal response and validates with the SDK
    for i in range(1, len(events) + 1):
        folded = fold(events[:i])
        assert folded["id"] == "resp_test"
    response = fold(events)
    validated = Response.model_validate(response)
    assert validated.status == end
    # an item cut off by anything but success is incomplete
    if end != "completed":
        for e in events:
            if isinstance(e, OutputItemDone) and e.item["type"] != "custom_tool_call":
                assert e.item["status"] in ("completed", "incomplete")


@settings(max_examples=60, deadline=None)
@given(st.lists(step, max_size=20), ending)
def test_events_validate_against_sdk_models_and_round_trip(
    program: list[tuple[Any, ...]], end: str
) -> None:
    events = run_program(program, end, False).take()
    for e in events:
        # model_validate on the exclude_unset dump: a missing required field fails here
        dumped = _sdk_dump(e)
        STREAM_EVENT.validate_python({**dumped, "type": to_wire(e)["type"]})
        assert dumped["sequence_number"] == e.sequence_number
        assert from_wire(e.type, e.sequence_number, payload(e)) == e


@settings(max_examples=80, deadline=None)
@given(st.lists(step, max_size=20), st.data())
def test_any_unfinished_prefix_can_be_resumed_and_closed(
    program: list[tuple[Any, ...]], data: st.DataObject
) -> None:
    events = run_program(program, "completed", False).take()[:-1]  # drop the terminal
    cut = data.draw(st.integers(min_value=1, max_value=len(events)))
    prefix = events[:cut]
    builder = ResponseBuilder.resume(prefix, new_id=lambda p: f"{p}_resumed")
    builder.finish(
        "failed", usage=None, error={"code": "server_error", "message": "the server restarted"}
    )
    closing = builder.take()
    final = check_log([*prefix, *closing])
    assert final.terminal and final.status == "failed"
    response = fold([*prefix, *closing])
    assert response["error"]["message"] == "the server restarted"
    assert all(
        item.get("status", "incomplete") == "incomplete" or item in fold(prefix)["output"]
        for item in response["output"]
    )


_DELTAS = (
    OutputTextDelta,
    ReasoningTextDelta,
    FunctionCallArgumentsDelta,
    CustomToolCallInputDelta,
)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(step, st.tuples(st.just("take"))), max_size=40), ending)
def test_a_coalescing_builder_makes_one_delta_of_the_text_between_two_takes(
    program: list[tuple[Any, ...]], end: str
) -> None:
    """The same calls to a coalescing builder and a plain one: the same Response, the same
    text in every item's deltas, and, between two takes, one delta for each run of appends
    (what the writer does to the tokens that wait for a commit, ``app.live``)."""
    plain = make_builder()
    coalescing = ResponseBuilder(response_skeleton(), new_id=counter_ids(), coalesce=True)
    batches: list[list[Event]] = []
    plain_events: list[Event] = []
    for b in (plain, coalescing):
        b.created()
        b.in_progress()
    for op in program:
        if op == ("take",):
            plain_events += plain.take()
            batches.append(coalescing.take())
            continue
        for b in (plain, coalescing):
            run_program_step(b, op)
    for b in (plain, coalescing):
        b.finish(end, usage=Usage(3, 1, 4, 2), completed_at=5)  # type: ignore[arg-type]
    plain_events += plain.take()
    batches.append(coalescing.take())
    events = [e for batch in batches for e in batch]
    final = check_log(events)
    assert final.terminal and final.status == end
    assert fold(events) == fold(plain_events)

    def texts(log: list[Event]) -> dict[str, str]:
        out: dict[str, str] = {}
        for e in log:
            if isinstance(e, _DELTAS):
                out[e.item_id] = out.get(e.item_id, "") + e.delta
        return out

    assert texts(events) == texts(plain_events)
    for batch in batches:  # never two deltas in a row within one take
        assert not any(
            isinstance(a, _DELTAS) and isinstance(b, _DELTAS) for a, b in itertools.pairwise(batch)
        )
    assert sum(isinstance(e, _DELTAS) for e in events) <= sum(
        isinstance(e, _DELTAS) for e in plain_events
    )


def run_program_step(b: ResponseBuilder, op: tuple[Any, ...]) -> None:
    match op:
        case ("reasoning",):
            b.open_reasoning()
        case ("message", phase):
            b.open_message(phase)
        case ("function", name):
            b.open_function_call(name)
        case ("custom", name):
            b.open_custom_tool_call(name)
        case ("append", chunk):
            if b.open_item_type is not None:
                b.append(chunk)
        case ("close", status):
            b.close_item(status)
