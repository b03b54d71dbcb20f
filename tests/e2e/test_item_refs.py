"""``item_reference`` to any stored item of the project, through the OpenAI SDK against the real
server: output items (reasoning, messages, function calls) and input items of earlier responses,
with no ``previous_response_id``, as the Vercel AI SDK sends them."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI

from app.encoding import load_encoding
from app.engines.scripted import ScriptedEngine
from app.settings import Settings
from tests.e2e.conftest import MODEL, harmony
from tests.support.server import serve

TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


def _decode(ids: list[int]) -> str:
    return load_encoding().decode_utf8(ids)


def _ref(item_id: str) -> dict[str, Any]:
    return {"type": "item_reference", "id": item_id}


def test_references_to_earlier_output_and_input_items(
    client: OpenAI, engine: ScriptedEngine
) -> None:
    engine.add_turns(
        {"completion": harmony(("analysis", "Think BLUE-42."), ("final", "The sky is blue."))}
    )
    first = client.responses.create(model=MODEL, input="What colour is the SKY-QUESTION?")
    reasoning, message = first.output
    assert (reasoning.type, message.type) == ("reasoning", "message")
    user_item = client.responses.input_items.list(first.id).data[0]

    engine.add_turns({"completion": harmony(("final", "Yes."))})
    second = client.responses.create(
        model=MODEL,
        input=[
            _ref(user_item.id),
            _ref(reasoning.id),
            _ref(message.id),
            {"role": "user", "content": "Sure?"},
        ],
    )
    assert second.output_text == "Yes."
    prompt = _decode(engine.prompts[-1])
    assert "SKY-QUESTION" in prompt and "The sky is blue." in prompt and "Sure?" in prompt
    # the references are stored as sent, and listed as sent
    listed = client.responses.input_items.list(second.id, order="asc").data
    assert [item.type for item in listed] == ["item_reference"] * 3 + ["message"]


def test_a_tool_loop_through_references(client: OpenAI, engine: ScriptedEngine) -> None:
    engine.add_turns(
        {
            "completion": harmony(
                ("analysis", "Need the weather."),
                ("commentary to=functions.get_weather <|constrain|>json", '{"city": "Paris"}'),
                end="<|call|>",
            )
        }
    )
    first = client.responses.create(model=MODEL, input="Weather in Paris?", tools=[TOOL])  # type: ignore[list-item]
    call = first.output[-1]
    assert call.type == "function_call"
    engine.add_turns({"completion": harmony(("final", "Sunny, 21 C."))})
    second = client.responses.create(
        model=MODEL,
        tools=[TOOL],  # type: ignore[list-item]
        input=[
            {"role": "user", "content": "Weather in Paris?"},
            *[_ref(item.id) for item in first.output],  # type: ignore[misc]
            {
                "type": "function_call_output",
                "call_id": call.call_id,
                "output": json.dumps({"celsius": 21}),
            },
        ],
    )
    assert second.output_text == "Sunny, 21 C."
    prompt = _decode(engine.prompts[-1])
    assert "to=functions.get_weather" in prompt and '{"celsius": 21}' in prompt


def test_a_store_false_request_may_reference_stored_items_but_is_not_stored_itself(
    client: OpenAI, engine: ScriptedEngine
) -> None:
    engine.add_turns({"completion": harmony(("final", "STORED-ANSWER"))})
    stored = client.responses.create(model=MODEL, input="one")
    engine.add_turns({"completion": harmony(("final", "UNSTORED-ANSWER"))})
    unstored = client.responses.create(model=MODEL, input=[_ref(stored.output[0].id)], store=False)
    assert "STORED-ANSWER" in _decode(engine.prompts[-1])
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model=MODEL, input=[_ref(unstored.output[0].id)])
    assert caught.value.body["param"] == "input[0].id"  # type: ignore[index]
    assert f"No item found with id '{unstored.output[0].id}'" in caught.value.body["message"]  # type: ignore[index]


def test_a_missing_reference_is_a_400_naming_it(client: OpenAI) -> None:
    for missing in ("msg_" + "0" * 48, "rs_nothing"):
        with pytest.raises(openai.BadRequestError) as caught:
            client.responses.create(
                model=MODEL, input=[{"role": "user", "content": "x"}, _ref(missing)]
            )
        error: Any = caught.value.body
        assert error["param"] == "input[1].id"
        assert error["message"] == f"No item found with id '{missing}'"


def test_a_reference_to_an_item_a_conversation_holds(
    client: OpenAI, engine: ScriptedEngine
) -> None:
    """An item added through the conversation items API (no response holds it) resolves too;
    once deleted from its conversation (or the conversation deleted) it does not."""
    conversation = client.conversations.create(
        items=[{"type": "message", "role": "user", "content": "The code word is TANGERINE-9."}]
    )
    added = client.conversations.items.create(
        conversation.id,
        items=[{"type": "message", "role": "assistant", "content": "Noted: ORCHID-3."}],
    ).data[0]
    first = client.conversations.items.list(conversation.id, order="asc").data[0]

    engine.add_turns({"completion": harmony(("final", "Both noted."))})
    reply = client.responses.create(
        model=MODEL, input=[_ref(first.id), _ref(added.id), {"role": "user", "content": "Which?"}]
    )
    assert reply.output_text == "Both noted."
    prompt = _decode(engine.prompts[-1])
    assert "TANGERINE-9" in prompt and "ORCHID-3" in prompt
    assert "<|start|>assistant<|channel|>final<|message|>Noted: ORCHID-3." in prompt

    client.conversations.items.delete(added.id, conversation_id=conversation.id)
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model=MODEL, input=[_ref(added.id)])
    assert caught.value.body["message"] == f"No item found with id '{added.id}'"  # type: ignore[index]
    client.conversations.delete(conversation.id)
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model=MODEL, input=[_ref(first.id)])


@pytest.mark.postgres
def test_more_references_than_one_statement_can_take_are_a_400_on_postgresql(pg_url: str) -> None:
    # 40,000 references are more arguments than a PostgreSQL statement takes: the look-up was a
    # 503 "the database is unavailable" (and the SDK retries a 503) instead of the answer
    engine = ScriptedEngine(load_encoding(), [MODEL], {"turns": []})
    settings = Settings(engine="scripted", database_url=pg_url, served_model_names=(MODEL,))
    with (
        serve(settings, engine=engine) as server,
        OpenAI(base_url=server.base_url + "/v1", api_key="k", max_retries=0, timeout=60) as client,
    ):
        engine.add_turns({"completion": harmony(("final", "Noted."))})
        first = client.responses.create(model=MODEL, input="REMEMBER-THIS")
        kept = client.responses.input_items.list(first.id).data[0].id
        missing = [_ref(f"msg_none_{n}") for n in range(40_000)]
        with pytest.raises(openai.BadRequestError) as caught:  # (the SDK's own request, without
            # its typed parameters' transform: 20 s of the client's CPU for 40,000 items)
            client.post(
                "/responses",
                cast_to=httpx.Response,
                body={"model": MODEL, "input": [_ref(kept), *missing]},
            )
        error: Any = caught.value.body
        assert (error["param"], error["message"]) == (
            "input[1].id",
            "No item found with id 'msg_none_0'",
        )
        engine.add_turns({"completion": harmony(("final", "Still here."))})
        again = client.responses.create(
            model=MODEL, input=[_ref(kept), {"role": "user", "content": "ok?"}]
        )
        assert again.output_text == "Still here." and "REMEMBER-THIS" in _decode(engine.prompts[-1])
