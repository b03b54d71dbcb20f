"""Compaction through the real SDK: ``responses.compact``, ``compaction`` items replayed as
context (a tampered one is a 400), a final ``compaction_trigger`` (one compaction item, streamed),
and ``context_management``'s threshold. The scripted engine writes the summaries; the tests check
the pipeline (the summarisation prompt sent, the item sealed, the summary replayed), not words."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI

from app.encoding import load_encoding
from app.engines.scripted import ScriptedEngine
from domain.compaction import SUMMARY_HEADER, SUMMARY_PROMPT
from tests.e2e.conftest import MODEL, harmony, sse_events
from tests.support.stream_checker import check_stream

HISTORY: list[Any] = [
    {"role": "user", "content": "My cat is called Mirabelle."},
    {"role": "assistant", "content": "A lovely name; the assistant said this long ago."},
    {"role": "user", "content": "She is nine years old."},
]


def _prompt(engine: ScriptedEngine, index: int = -1) -> str:
    return load_encoding().decode(list(engine.prompts[index]))


def _items(output: Any) -> list[dict[str, Any]]:
    # warnings=False: the SDK types a compacted output's user messages as assistant output
    # messages, and its serializer warns about their ``input_text`` parts
    return [item.to_dict(warnings=False) for item in output]


def _compact(client: OpenAI, engine: ScriptedEngine, summary: str, **body: Any) -> Any:
    engine.add_turns({"completion": harmony(("analysis", "Summarise."), ("final", summary))})
    return client.responses.compact(model=MODEL, **body)


def test_compact_keeps_the_user_messages_and_seals_the_models_summary(
    client: OpenAI, engine: ScriptedEngine
) -> None:
    compacted = _compact(
        client, engine, "Cat Mirabelle, nine.", input=HISTORY, instructions="Be kind."
    )
    assert compacted.object == "response.compaction"
    prompt = _prompt(engine)
    # the summarisation prompt follows the whole context, and the instructions are kept
    assert prompt.index("Be kind.") < prompt.index("A lovely name") < prompt.index(SUMMARY_PROMPT)
    assert prompt.endswith("<|start|>assistant")
    assert [item.type for item in compacted.output] == ["message", "message", "compaction"]
    users = _items(compacted.output[:2])
    assert [u["role"] for u in users] == ["user", "user"]
    assert [u["content"][0]["text"] for u in users] == [
        HISTORY[0]["content"],
        HISTORY[2]["content"],
    ]
    item = compacted.output[2]
    assert item.id.startswith("cmp_") and item.encrypted_content.startswith("rlr1.")
    assert "Mirabelle" not in item.encrypted_content  # sealed, not encoded
    assert compacted.usage.input_tokens == len(engine.prompts[-1])
    assert compacted.usage.output_tokens > 0


def test_a_compaction_item_is_replayed_as_the_summary(
    client: OpenAI, engine: ScriptedEngine
) -> None:
    compacted = _compact(client, engine, "SUMMARY-7f3: cat Mirabelle, nine years.", input=HISTORY)
    engine.add_turns({"completion": harmony(("final", "Mirabelle."))})
    answer = client.responses.create(
        model=MODEL, input=[*_items(compacted.output), {"role": "user", "content": "Her name?"}]
    )
    assert answer.output_text == "Mirabelle."
    prompt = _prompt(engine)
    assert SUMMARY_HEADER + "SUMMARY-7f3: cat Mirabelle, nine years." in prompt
    assert "A lovely name" not in prompt  # the assistant's turn is in the summary only
    # the whole history sent again with the item: what came before it is the summary's
    engine.add_turns({"completion": harmony(("final", "Nine."))})
    client.responses.create(
        model=MODEL,
        input=[*HISTORY, _items(compacted.output)[-1], {"role": "user", "content": "Her age?"}],
        store=False,
    )
    again = _prompt(engine)
    assert "A lovely name" not in again and "SUMMARY-7f3" in again and "My cat is called" in again


def test_a_compaction_carries_on_through_previous_response_id(
    client: OpenAI, engine: ScriptedEngine
) -> None:
    compacted = _compact(client, engine, "SUMMARY-c41", input=HISTORY)
    engine.add_turns({"completion": harmony(("final", "Noted."))})
    first = client.responses.create(model=MODEL, input=_items(compacted.output))
    engine.add_turns({"completion": harmony(("final", "Still noted."))})
    client.responses.create(model=MODEL, input="And now?", previous_response_id=first.id)
    prompt = _prompt(engine)
    assert "SUMMARY-c41" in prompt and "Noted." in prompt and "And now?" in prompt


def test_a_tampered_or_foreign_compaction_item_is_a_400(
    client: OpenAI, engine: ScriptedEngine
) -> None:
    compacted = _compact(client, engine, "SUMMARY", input=HISTORY)
    item = _items(compacted.output)[-1]
    blob = item["encrypted_content"]
    tampered = {
        **item,
        "encrypted_content": blob[:-6] + ("AAAAAA" if not blob.endswith("AAAAAA") else "BBBBBB"),
    }
    engine.add_turns({"completion": harmony(("analysis", "thinking"), ("final", "ok"))})
    reasoned = client.responses.create(
        model=MODEL, input="hi", include=["reasoning.encrypted_content"]
    )
    sealed_reasoning = next(o for o in reasoned.output if o.type == "reasoning").encrypted_content
    for bad in (
        tampered,
        {**item, "encrypted_content": sealed_reasoning},
        {**item, "encrypted_content": "x"},
    ):
        prompts = engine.prompt_count
        with pytest.raises(openai.BadRequestError) as caught:
            client.responses.create(model=MODEL, input=[bad, {"role": "user", "content": "go on"}])
        error: Any = caught.value.body
        assert error["param"] == "input[0].encrypted_content", error
        assert error["code"] == "invalid_encrypted_content"
        assert engine.prompt_count == prompts  # refused before anything was generated


@pytest.mark.parametrize("store", [True, False])
def test_a_compaction_trigger_streams_exactly_one_compaction_item(
    client: OpenAI, engine: ScriptedEngine, ledger: Any, store: bool
) -> None:
    engine.add_turns({"completion": harmony(("final", f"SUMMARY-trigger-{store}"))})
    prompts = engine.prompt_count  # (the deque of prompts stops growing at 64)
    stream = client.responses.create(
        model=MODEL, input=[*HISTORY, {"type": "compaction_trigger"}], stream=True, store=store
    )
    events = list(stream)
    assert engine.prompt_count == prompts + 1  # the summary only: no answer is generated
    assert SUMMARY_PROMPT in _prompt(engine)
    added = [e for e in events if e.type == "response.output_item.added"]
    done = [e for e in events if e.type == "response.output_item.done"]
    assert [e.item.type for e in added] == ["compaction"] and [e.item.type for e in done] == [
        "compaction"
    ]
    assert added[0].item.id == done[0].item.id and done[0].item.encrypted_content
    assert [e.type for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.compaction.compacting",
        "response.output_item.done",
        "response.completed",
    ]
    compacting = events[3]
    assert (compacting.item_id, compacting.output_index) == (added[0].item.id, 0)  # type: ignore[union-attr]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1]
    assert final.type == "response.completed"
    assert [o.type for o in final.response.output] == ["compaction"]
    assert final.response.usage.input_tokens == len(engine.prompts[-1])
    item = final.response.output[0]
    engine.add_turns({"completion": harmony(("final", "ok"))})
    client.responses.create(
        model=MODEL, input=[item.to_dict(), {"role": "user", "content": "Go on."}], store=False
    )
    assert f"SUMMARY-trigger-{store}" in _prompt(engine)
    if store:  # in the log: the item, and the engine's work in the audit records
        log = httpx.get(f"{ledger.base_url}/v1/responses/{final.response.id}/events").json()
        kinds = {a["kind"]: a for a in log["audit"]}
        assert kinds["compaction_prompt_token_ids"]["token_ids"] == list(engine.prompts[-2])
        assert kinds["compaction_output_token_ids"]["token_ids"]
        assert (
            client.responses.retrieve(final.response.id).output[0].encrypted_content
            == item.encrypted_content
        )
        engine.add_turns({"completion": harmony(("final", "ok"))})
        client.responses.create(model=MODEL, input="More?", previous_response_id=final.response.id)
        follow = _prompt(engine)
        assert f"SUMMARY-trigger-{store}" in follow and "A lovely name" not in follow


def test_context_management_compacts_past_the_threshold(
    client: OpenAI, engine: ScriptedEngine
) -> None:
    body: dict[str, Any] = {"model": MODEL, "input": HISTORY}
    size = client.responses.input_tokens.count(**body).input_tokens
    engine.add_turns({"completion": harmony(("final", "Below."))})
    below = client.responses.create(
        **body,
        extra_body={"context_management": [{"type": "compaction", "compact_threshold": size}]},
    )
    assert [o.type for o in below.output] == ["message"]  # at the threshold: no compaction
    engine.add_turns(
        {"completion": harmony(("final", "SUMMARY-threshold"))},
        {"completion": harmony(("final", "Nine years."))},
    )
    above = client.responses.create(
        **body,
        extra_body={"context_management": [{"type": "compaction", "compact_threshold": size - 1}]},
    )
    assert [o.type for o in above.output] == ["compaction", "message"]
    assert above.output_text == "Nine years."
    summarised, answered = _prompt(engine, -2), _prompt(engine, -1)
    assert SUMMARY_PROMPT in summarised and "A lovely name" in summarised
    assert "SUMMARY-threshold" in answered and "A lovely name" not in answered
    assert answered.index("She is nine") < answered.index("SUMMARY-threshold")
    assert above.usage is not None
    assert above.usage.input_tokens == len(engine.prompts[-2]) + len(engine.prompts[-1])


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (
            "/responses",
            {"input": [{"type": "compaction_trigger"}, {"role": "user", "content": "x"}]},
            "input[0].type",
        ),
        (
            "/responses",
            {"input": "x", "context_management": [{"type": "truncate"}]},
            "context_management[0].type",
        ),
        (
            "/responses",
            {"input": "x", "context_management": [{"type": "compaction", "compact_threshold": 0}]},
            "context_management[0].compact_threshold",
        ),
        (
            "/responses",
            {"input": "x", "context_management": {"type": "compaction"}},
            "context_management",
        ),
        (
            "/responses",
            {"input": [{"type": "compaction"}, {"role": "user", "content": "x"}]},
            "input[0].encrypted_content",
        ),
        ("/responses/compact", {"input": "x", "store": True}, "store"),
        ("/responses/compact", {"input": []}, "input"),
        ("/responses/compact", {"input": "x", "model": "no-such-model"}, "model"),
    ],
)
def test_what_cannot_be_compacted_is_refused(
    client: OpenAI, path: str, body: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.APIStatusError) as caught:
        client.post(path, body={"model": MODEL, **body}, cast_to=httpx.Response)
    error: Any = caught.value.body
    assert caught.value.status_code in (400, 404), error
    assert error["param"] == param, error


def test_a_trigger_with_a_forced_tool_choice_still_gives_only_the_compaction_item(
    client: OpenAI, engine: ScriptedEngine
) -> None:
    tool = {
        "type": "function",
        "name": "lookup",
        "parameters": {"type": "object", "properties": {}},
    }
    engine.add_turns({"completion": harmony(("final", "SUMMARY-forced"))})
    response = client.responses.create(
        model=MODEL,
        input=[*HISTORY, {"type": "compaction_trigger"}],
        tools=[tool],  # type: ignore[list-item]
        tool_choice={"type": "function", "name": "lookup"},
        store=False,
    )
    assert response.status == "completed"
    assert [o.type for o in response.output] == ["compaction"]
    summarised = _prompt(engine)
    assert summarised.endswith("<|start|>assistant")  # no tool offered, no call pre-filled
    assert "functions.lookup" not in summarised.split(SUMMARY_PROMPT)[-1]


def test_a_triggered_stream_passes_the_stream_checker_and_the_sdk_types(
    ledger: Any, engine: ScriptedEngine
) -> None:
    engine.add_turns({"completion": harmony(("analysis", "hmm"), ("final", "SUMMARY-raw"))})
    body = {"model": MODEL, "input": [*HISTORY, {"type": "compaction_trigger"}], "stream": True}
    with httpx.stream("POST", f"{ledger.base_url}/v1/responses", json=body, timeout=60) as r:
        assert r.status_code == 200
        events = sse_events(r.read())
    final = check_stream(events)  # every event an SDK stream event type, in a valid order
    assert [o["type"] for o in final["output"]] == ["compaction"]


def test_compact_takes_the_codex_clis_body(client: OpenAI, engine: ScriptedEngine) -> None:
    """Codex's ``CompactionInput``: the turn's tools, parallel_tool_calls, reasoning and text too;
    the tools are declared so that the history's calls render, and none is offered."""
    tool = {"type": "function", "name": "shell", "parameters": {"type": "object", "properties": {}}}
    history = [
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "List files."}],
        },
        {"type": "function_call", "call_id": "call_1", "name": "shell", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "README.md"},
    ]
    engine.add_turns({"completion": harmony(("final", "SUMMARY-codex"))})
    compacted = client.responses.compact(
        model=MODEL,
        input=history,  # type: ignore[arg-type]
        instructions="You are Codex.",
        prompt_cache_key="thread-1",
        extra_body={
            "tools": [tool],
            "parallel_tool_calls": False,
            "reasoning": {"effort": "low"},
            "text": {"verbosity": "low"},
        },
    )
    assert [o.type for o in compacted.output] == ["message", "compaction"]
    prompt = _prompt(engine)
    assert "functions.shell" in prompt and "README.md" in prompt and "Reasoning: low" in prompt
    assert "namespace functions" not in prompt  # declared for the history, not offered
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.compact(
            model=MODEL, input="x", extra_body={"tools": [{"type": "web_search"}]}
        )
    assert caught.value.body["param"] == "tools[0].type"  # type: ignore[index]


def test_a_conversation_keeps_its_compaction(client: OpenAI, engine: ScriptedEngine) -> None:
    conversation = client.conversations.create(items=HISTORY)
    engine.add_turns({"completion": harmony(("final", "SUMMARY-conversation"))})
    compacted = client.responses.create(
        model=MODEL, input=[{"type": "compaction_trigger"}], conversation=conversation.id
    )
    assert [o.type for o in compacted.output] == ["compaction"]
    assert "A lovely name" in _prompt(engine)  # the conversation's items were summarised
    engine.add_turns({"completion": harmony(("final", "ok"))})
    client.responses.create(model=MODEL, input="Her age?", conversation=conversation.id)
    prompt = _prompt(engine)
    assert "SUMMARY-conversation" in prompt and "A lovely name" not in prompt
    kinds = [i.type for i in client.conversations.items.list(conversation.id, order="asc")]
    assert kinds[-4:] == ["compaction_trigger", "compaction", "message", "message"]


def test_a_default_threshold_needs_an_engine_that_knows_its_context_window(client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(
            model=MODEL, input="x", extra_body={"context_management": [{"type": "compaction"}]}
        )
    assert caught.value.body["param"] == "context_management[0].compact_threshold"  # type: ignore[index]
