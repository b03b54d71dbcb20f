"""domain.compaction: where a trigger may stand, what the latest compaction item stands for, what
the summary is; compaction items in the prompt and in a log."""

from __future__ import annotations

from typing import Any

import pytest

from app.encoding import load_encoding
from domain.builder import ResponseBuilder
from domain.compaction import (
    SUMMARY_HEADER,
    SUMMARY_PROMPT,
    NoSummary,
    split_trigger,
    summarisation_items,
    summary_of,
    superseded,
)
from domain.errors import InvalidInput, InvariantViolation
from domain.events import CompactionCompacting, OutputItemAdded, ResponseCreated
from domain.machine import apply, check_log
from domain.projections import fold
from domain.prompt import PromptRequest, render_prompt

ENC = load_encoding()
USER = {"type": "message", "role": "user", "content": "hello"}
ASSISTANT = {"type": "message", "role": "assistant", "content": "an old answer"}
COMPACTION = {"type": "compaction", "id": "cmp_1", "encrypted_content": "sealed:the summary"}


def _open(blob: str) -> str:
    if not blob.startswith("sealed:"):
        raise InvalidInput("not sealed here", code="invalid_encrypted_content")
    return blob[len("sealed:") :]


def _text(items: list[Any], history: int = 0) -> str:
    request = PromptRequest(items=items, history_length=history, decrypt_compaction=_open)
    return str(ENC.decode_utf8(render_prompt(ENC, request).token_ids))


def test_a_trigger_is_taken_off_the_end_and_refused_elsewhere() -> None:
    assert split_trigger([USER, {"type": "compaction_trigger"}]) == ([USER], True)
    assert split_trigger([USER]) == ([USER], False)
    with pytest.raises(InvalidInput) as caught:
        split_trigger([{"type": "compaction_trigger"}, USER])
    assert caught.value.param == "input[0].type"


def test_the_latest_compaction_stands_for_all_before_it_but_the_user_messages() -> None:
    items = [USER, ASSISTANT, COMPACTION, ASSISTANT, {**COMPACTION, "id": "cmp_2"}, USER]
    assert superseded(items) == frozenset({1, 2, 3})
    assert superseded([USER, ASSISTANT]) == frozenset()
    text = _text(items)
    assert text.count(SUMMARY_HEADER + "the summary") == 1
    assert "an old answer" not in text and text.count("hello") == 2


def test_a_compaction_renders_as_its_summary_and_a_bad_one_is_refused() -> None:
    assert SUMMARY_HEADER + "the summary" in _text([COMPACTION, USER])
    for bad, code in (
        ({**COMPACTION, "encrypted_content": "forged"}, "invalid_encrypted_content"),
        ({"type": "compaction"}, "missing_required_parameter"),
    ):
        with pytest.raises(InvalidInput) as caught:
            _text([USER, bad])
        assert (caught.value.param, caught.value.code) == ("input[1].encrypted_content", code)


def test_a_trigger_in_the_history_was_acted_on_and_does_not_render() -> None:
    assert "hello" in _text([USER, {"type": "compaction_trigger"}, COMPACTION, USER], history=3)
    with pytest.raises(InvalidInput):
        _text([USER, {"type": "compaction_trigger"}])  # as input it is never rendered


def test_the_summarisation_prompt_follows_the_context() -> None:
    items = summarisation_items([USER, ASSISTANT])
    assert items[-1] == {"type": "message", "role": "user", "content": SUMMARY_PROMPT}
    assert _text(items).index("an old answer") < _text(items).index(SUMMARY_PROMPT)


def test_the_summary_is_the_last_final_message_and_nothing_else_is() -> None:
    final = {
        "type": "message",
        "phase": "final_answer",
        "content": [{"type": "output_text", "text": " S "}],
    }
    preamble = {**final, "phase": "commentary", "content": [{"type": "output_text", "text": "P"}]}
    reasoning = {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "R"}]}
    assert summary_of([reasoning, final, preamble]) == "S"
    for output in (
        [reasoning],
        [preamble],
        [{**final, "content": [{"type": "output_text", "text": "  "}]}],
        [],
    ):
        with pytest.raises(NoSummary):
            summary_of(output)


def test_a_compaction_item_is_a_valid_log_item_without_deltas() -> None:
    ids = iter(range(100))
    builder = ResponseBuilder({"id": "resp_1", "output": []}, new_id=lambda p: f"{p}_{next(ids)}")
    builder.created()
    builder.in_progress()
    item_id = builder.open_compaction()
    builder.compacting()
    builder.close_compaction("blob")
    builder.open_message()
    builder.append("answer")
    final = builder.finish("completed", usage=None)
    events = builder.take()
    check_log(events)
    added = [e for e in events if e.type == "response.output_item.added"]
    assert added[0].item == {"id": item_id, "type": "compaction"}  # type: ignore[attr-defined]
    assert final["output"][0] == {"id": item_id, "type": "compaction", "encrypted_content": "blob"}
    assert fold(events)["output"] == final["output"]
    assert [e.type for e in events][3] == "response.compaction.compacting"


def test_compacting_is_only_for_an_open_compaction_item() -> None:
    state = check_log(
        [
            ResponseCreated(0, {"id": "r", "status": "in_progress", "output": []}),
            OutputItemAdded(1, 0, {"id": "msg_1", "type": "message"}),
        ]
    )
    with pytest.raises(InvariantViolation) as caught:
        apply(state, CompactionCompacting(2, "msg_1", 0))
    assert caught.value.rule == "wrong_event_for_item"
    with pytest.raises(InvariantViolation) as caught:
        apply(state, CompactionCompacting(2, "cmp_other", 0))
    assert caught.value.rule == "delta_for_closed_item"
