"""``POST /v1/responses/input_tokens`` through the SDK's ``responses.input_tokens.count``: the
count is exactly the prompt create sends to the engine, nothing is generated or stored, and what
create refuses it refuses."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI

from app.engines.scripted import ScriptedEngine
from tests.e2e.conftest import MODEL, harmony

TOOL = {
    "type": "function",
    "name": "lookup",
    "description": "Look a word up.",
    "parameters": {
        "type": "object",
        "properties": {"word": {"type": "string"}},
        "required": ["word"],
    },
}


def test_the_count_is_the_prompt_create_sends(client: OpenAI, engine: ScriptedEngine) -> None:
    engine.add_turns({"completion": harmony(("analysis", "hmm"), ("final", "First answer."))})
    first = client.responses.create(
        model=MODEL, input="Tell me something.", instructions="Be brief."
    )
    bodies: list[dict[str, Any]] = [
        {"input": "Hello"},
        {"model": MODEL, "input": "Hello", "instructions": "Speak like a pirate.", "tools": [TOOL]},
        {
            "model": MODEL,
            "input": "And more?",
            "previous_response_id": first.id,
            "reasoning": {"effort": "high"},
        },
        {
            "model": MODEL,
            "input": [
                {"type": "item_reference", "id": first.output[-1].id},
                {"role": "user", "content": "Again"},
            ],
            "tool_choice": {"type": "function", "name": "lookup"},
            "tools": [TOOL],
            "text": {"format": {"type": "text"}},
        },
    ]
    for body in bodies:
        prompts = engine.prompt_count
        counted = client.responses.input_tokens.count(**body)
        assert counted.object == "response.input_tokens"
        assert engine.prompt_count == prompts  # nothing generated
        if body.get("tool_choice"):
            call = ("commentary to=functions.lookup <|constrain|>json", '{"word": "x"}')
            engine.add_turns({"completion": harmony(call, end="<|call|>")})
        else:
            engine.add_turns({"completion": harmony(("final", "ok"))})
        created = client.responses.create(**{"model": MODEL, **body}, store=False)
        assert counted.input_tokens == len(engine.prompts[-1]) == created.usage.input_tokens  # type: ignore[union-attr]


def test_a_conversation_is_counted_with_its_history(client: OpenAI, engine: ScriptedEngine) -> None:
    conversation = client.conversations.create(
        items=[{"role": "user", "content": "Earlier words " * 20}]
    )
    alone = client.responses.input_tokens.count(model=MODEL, input="Now?")
    counted = client.responses.input_tokens.count(
        model=MODEL, input="Now?", conversation=conversation.id
    )
    engine.add_turns({"completion": harmony(("final", "ok"))})
    created = client.responses.create(model=MODEL, input="Now?", conversation=conversation.id)
    assert counted.input_tokens == len(engine.prompts[-1]) == created.usage.input_tokens  # type: ignore[union-attr]
    assert counted.input_tokens > alone.input_tokens + 20  # the history is in the count


def test_nothing_is_stored(client: OpenAI) -> None:
    item = {"id": "msg_counted_only", "type": "message", "role": "user", "content": "count me"}
    counted = client.responses.input_tokens.count(model=MODEL, input=[item])  # type: ignore[list-item]
    assert counted.input_tokens > 0
    # no response holds its input: the item it named is nowhere to be referenced
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(
            model=MODEL, input=[{"type": "item_reference", "id": "msg_counted_only"}]
        )
    assert "No item found" in caught.value.body["message"]  # type: ignore[index]
    stored = client.responses.create(model=MODEL, input=[item], store=True)  # type: ignore[list-item]
    assert stored.status == "completed"  # and once created, it is
    client.responses.create(
        model=MODEL, input=[{"type": "item_reference", "id": "msg_counted_only"}]
    )


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"input": [{"type": "item_reference", "id": "msg_missing"}]}, "input[0].id", None),
        ({"input": "x", "personality": "friendly"}, "personality", "unsupported_parameter"),
        ({"input": "x", "max_output_tokens": 5}, "max_output_tokens", "unknown_parameter"),
        ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type", None),
        ({"input": [{"type": "bogus"}]}, "input[0].type", None),
        ({"input": "x", "model": "no-such-model"}, "model", "model_not_found"),
        # only a missing (or null) model means the first served one: these were counted (schemathesis)
        ({"input": "x", "model": {}}, "model", None),
        ({"input": "x", "model": ""}, "model", None),
        ({"input": "x", "model": 0}, "model", None),
        ({"input": "x", "model": False}, "model", None),
    ],
)
def test_what_create_refuses_it_refuses(
    client: OpenAI, body: dict[str, Any], param: str, code: str | None
) -> None:
    with pytest.raises(openai.APIStatusError) as caught:
        client.post("/responses/input_tokens", body=body, cast_to=httpx.Response)
    error: Any = caught.value.body
    assert caught.value.status_code in (400, 404), error
    assert error["param"] == param, error
    if code is not None:
        assert error["code"] == code


def test_an_unknown_previous_response_is_404_as_on_create(client: OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client.responses.input_tokens.count(
            model=MODEL, input="x", previous_response_id="resp_missing"
        )
    assert caught.value.body["param"] == "previous_response_id"  # type: ignore[index]
