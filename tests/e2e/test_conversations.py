"""The Conversations API through the OpenAI SDK against the real server (scripted engine,
SQLite): CRUD, items and their pagination, and ``responses.create(conversation=...)`` over
several turns, the history checked in the prompt the engine was given."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI

from app.encoding import load_encoding
from app.engines.scripted import ScriptedEngine
from tests.e2e.conftest import MODEL, harmony, sse_events
from tests.support.server import RunningServer


@pytest.fixture(autouse=True)
def _no_leftover_turns(engine: ScriptedEngine) -> Iterator[None]:
    with engine._lock:
        engine._next = len(engine._turns)
    yield


def _prompt(engine: ScriptedEngine) -> str:
    return load_encoding().decode_utf8(engine.prompts[-1])


def _user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": text}


def test_create_retrieve_update_delete(client: OpenAI) -> None:
    conversation = client.conversations.create(
        metadata={"topic": "weather"}, items=[_user("Hello"), _user("Are you there?")]
    )
    assert conversation.id.startswith("conv_") and conversation.object == "conversation"
    assert conversation.metadata == {"topic": "weather"}
    assert client.conversations.retrieve(conversation.id) == conversation
    updated = client.conversations.update(conversation.id, metadata={"topic": "rain"})
    assert updated.metadata == {"topic": "rain"} and updated.created_at == conversation.created_at
    assert client.conversations.retrieve(conversation.id).metadata == {"topic": "rain"}
    deleted = client.conversations.delete(conversation.id)
    assert (
        deleted.deleted
        and deleted.id == conversation.id
        and deleted.object == "conversation.deleted"
    )
    for call in (
        lambda: client.conversations.retrieve(conversation.id),
        lambda: client.conversations.delete(conversation.id),
        lambda: client.conversations.items.list(conversation.id),
        lambda: client.conversations.update(conversation.id, metadata={}),
    ):
        with pytest.raises(openai.NotFoundError):
            call()


def test_items_create_list_pages_retrieve_delete(client: OpenAI) -> None:
    conversation = client.conversations.create(items=[_user(f"message {n}") for n in range(20)])
    added = client.conversations.items.create(
        conversation.id, items=[_user(f"message {n}") for n in range(20, 25)]
    )
    assert [item.content[0].text for item in added.data] == [f"message {n}" for n in range(20, 25)]  # type: ignore[union-attr]
    assert added.first_id == added.data[0].id and added.last_id == added.data[-1].id

    # the SDK's pager follows last_id through pages of 7, oldest first and newest first
    asc = list(client.conversations.items.list(conversation.id, order="asc", limit=7))
    texts = [item.content[0].text for item in asc]  # type: ignore[union-attr]
    assert texts == [f"message {n}" for n in range(25)]
    desc = list(client.conversations.items.list(conversation.id, limit=7))  # desc by default
    assert [i.id for i in desc] == [i.id for i in reversed(asc)]
    first = client.conversations.items.list(conversation.id, order="asc", limit=3)
    assert first.has_more and [i.id for i in first.data] == [i.id for i in asc[:3]]
    after = client.conversations.items.list(conversation.id, order="asc", after=asc[22].id)
    assert [i.id for i in after.data] == [asc[23].id, asc[24].id] and not after.has_more

    item = client.conversations.items.retrieve(asc[4].id, conversation_id=conversation.id)
    assert item.id == asc[4].id and item.type == "message" and item.role == "user"  # type: ignore[union-attr]
    back = client.conversations.items.delete(asc[4].id, conversation_id=conversation.id)
    assert back.id == conversation.id and back.object == "conversation"
    with pytest.raises(openai.NotFoundError):
        client.conversations.items.retrieve(asc[4].id, conversation_id=conversation.id)
    with pytest.raises(openai.NotFoundError):
        client.conversations.items.delete(asc[4].id, conversation_id=conversation.id)
    remaining = [
        i.id for i in client.conversations.items.list(conversation.id, order="asc", limit=100)
    ]
    assert remaining == [i.id for i in asc if i.id != asc[4].id]


@pytest.mark.parametrize(
    ("call", "param"),
    [
        (lambda c, conv: c.conversations.create(items=[_user("x")] * 21), "items"),
        (lambda c, conv: c.conversations.items.create(conv, items=[_user("x")] * 21), "items"),
        (lambda c, conv: c.conversations.items.create(conv, items=[]), "items"),
        (lambda c, conv: c.conversations.create(metadata={"k" * 65: "v"}), "metadata"),
        (lambda c, conv: c.conversations.create(extra_body={"surprise": 1}), "surprise"),
        (lambda c, conv: c.conversations.items.list(conv, limit=101), "limit"),
        (lambda c, conv: c.conversations.items.list(conv, limit=0), "limit"),
        (lambda c, conv: c.conversations.items.list(conv, order="sideways"), "order"),  # type: ignore[arg-type]
        (
            lambda c, conv: c.conversations.items.list(conv, include=["file_search_call.results"]),
            "include[0]",
        ),
        (
            lambda c, conv: c.conversations.items.create(
                conv, items=[{"type": "function_call_output", "call_id": "call_x", "output": "1"}]
            ),
            "items[0].call_id",
        ),
        (
            lambda c, conv: c.conversations.items.create(
                conv, items=[{"type": "item_reference", "id": "msg_1"}]
            ),
            "items[0].type",
        ),
        (
            lambda c, conv: c.conversations.items.create(conv, items=[{"type": "teleport"}]),
            "items[0].type",
        ),
    ],
)
def test_bad_input_is_a_400_naming_the_param(client: OpenAI, call: Any, param: str) -> None:
    conversation = client.conversations.create()
    with pytest.raises(openai.BadRequestError) as caught:
        call(client, conversation.id)
    assert caught.value.body["param"] == param, caught.value.body  # type: ignore[index]
    assert list(client.conversations.items.list(conversation.id)) == []  # nothing was added


def test_an_item_id_is_held_once(client: OpenAI) -> None:
    conversation = client.conversations.create(items=[{**_user("first"), "id": "msg_mine"}])
    with pytest.raises(openai.BadRequestError) as caught:
        client.conversations.items.create(
            conversation.id, items=[{**_user("again"), "id": "msg_mine"}]
        )
    assert caught.value.body["param"] == "items[0].id"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError) as missing:
        client.conversations.items.list(conversation.id, after="msg_nothing")
    assert missing.value.body["param"] == "after"  # type: ignore[index]


def test_responses_over_several_turns_carry_the_history(
    client: OpenAI, engine: ScriptedEngine
) -> None:
    conversation = client.conversations.create(items=[_user("My name is Zebulon.")])
    engine.add_turns(
        {"completion": harmony(("analysis", "Greet them."), ("final", "Hello Zebulon!"))},
        {"completion": harmony(("final", "Your name is Zebulon."))},
        {"completion": harmony(("final", "You live in Paris."))},
    )
    first = client.responses.create(
        model=MODEL, input="I live in Paris.", conversation=conversation.id
    )
    assert first.conversation is not None and first.conversation.id == conversation.id
    assert first.output_text == "Hello Zebulon!"
    prompt = _prompt(engine)
    assert prompt.index("My name is Zebulon.") < prompt.index("I live in Paris.")

    second = client.responses.create(
        model=MODEL, input="What is my name?", conversation={"id": conversation.id}
    )
    assert second.output_text == "Your name is Zebulon."
    prompt = _prompt(engine)
    for earlier in ("My name is Zebulon.", "I live in Paris.", "Hello Zebulon!"):
        assert prompt.index(earlier) < prompt.index("What is my name?")

    # streamed: the turn is in the conversation once the stream has said completed
    with client.responses.stream(
        model=MODEL, input="Where do I live?", conversation=conversation.id
    ) as stream:
        final = stream.get_final_response()
    assert final.output_text == "You live in Paris." and final.conversation is not None
    items = list(client.conversations.items.list(conversation.id, order="asc"))
    texts = [(i.role, i.content[0].text) for i in items if i.type == "message"]  # type: ignore[union-attr]
    assert texts == [
        ("user", "My name is Zebulon."),
        ("user", "I live in Paris."),
        ("assistant", "Hello Zebulon!"),
        ("user", "What is my name?"),
        ("assistant", "Your name is Zebulon."),
        ("user", "Where do I live?"),
        ("assistant", "You live in Paris."),
    ]
    assert [i.type for i in items].count("reasoning") == 1  # the first turn's reasoning item
    assert items[2].id == first.output[0].id  # the output items keep their ids
    # a deleted item is gone from the next prompt
    client.conversations.items.delete(items[1].id, conversation_id=conversation.id)
    engine.add_turns({"completion": harmony(("final", "I do not know."))})
    client.responses.create(model=MODEL, input="Where do I live?", conversation=conversation.id)
    assert "I live in Paris." not in _prompt(engine)
    assert "My name is Zebulon." in _prompt(engine)


def test_a_tool_loop_in_a_conversation(client: OpenAI, engine: ScriptedEngine) -> None:
    tools: Any = [
        {
            "type": "function",
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        }
    ]
    conversation = client.conversations.create()
    engine.add_turns(
        {
            "completion": harmony(
                ("commentary to=functions.get_weather <|constrain|>json", '{"city":"Oslo"}'),
                end="<|call|>",
            )
        },
        {"completion": harmony(("final", "It snows in Oslo."))},
    )
    call = client.responses.create(
        model=MODEL, input="Weather in Oslo?", tools=tools, conversation=conversation.id
    )
    call_id = call.output[0].call_id  # type: ignore[union-attr]
    answer = client.responses.create(
        model=MODEL,
        tools=tools,
        conversation=conversation.id,
        input=[{"type": "function_call_output", "call_id": call_id, "output": "snow, -3 C"}],
    )
    assert answer.output_text == "It snows in Oslo."
    assert "snow, -3 C" in _prompt(engine) and "Weather in Oslo?" in _prompt(engine)
    kinds = [i.type for i in client.conversations.items.list(conversation.id, order="asc")]
    assert kinds == ["message", "function_call", "function_call_output", "message"]


def test_what_a_response_with_a_conversation_refuses(
    client: OpenAI, engine: ScriptedEngine
) -> None:
    conversation = client.conversations.create()
    engine.add_turns({"completion": harmony(("final", "Hi."))})
    first = client.responses.create(model=MODEL, input="Hi", conversation=conversation.id)
    cases: list[tuple[dict[str, Any], str, type[Exception]]] = [
        (
            {"conversation": conversation.id, "previous_response_id": first.id},
            "conversation",
            openai.BadRequestError,
        ),
        ({"conversation": {"id": 5}}, "conversation", openai.BadRequestError),
        ({"conversation": {"id": conversation.id, "x": 1}}, "conversation", openai.BadRequestError),
        ({"conversation": "conv_missing"}, "conversation", openai.NotFoundError),
    ]
    count = engine.prompt_count
    for extra, param, error in cases:
        with pytest.raises(error) as caught:
            client.responses.create(model=MODEL, input="again", extra_body=extra)
        assert caught.value.body["param"] == param, caught.value.body  # type: ignore[attr-defined]
    assert engine.prompt_count == count  # nothing was generated
    assert len(list(client.conversations.items.list(conversation.id))) == 2


def test_a_failed_response_appends_nothing(
    ledger: RunningServer, client: OpenAI, engine: ScriptedEngine
) -> None:
    """A forced tool call that calls nothing ends failed: the conversation is as it was."""
    conversation = client.conversations.create(items=[_user("before")])
    engine.add_turns({"completion": harmony(("final", "No tool for you."))})
    response = client.responses.create(
        model=MODEL,
        input="call it",
        conversation=conversation.id,
        tool_choice="required",
        tools=[
            {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}
        ],
    )
    assert response.status == "failed"
    items = list(client.conversations.items.list(conversation.id))
    assert [i.content[0].text for i in items] == ["before"]  # type: ignore[union-attr]
    # a raw stream's terminal event comes after the append, and echoes the conversation
    engine.add_turns({"completion": harmony(("final", "Streamed."))})
    with httpx.stream(
        "POST",
        ledger.base_url + "/v1/responses",
        json={"model": MODEL, "input": "s", "stream": True, "conversation": conversation.id},
        timeout=60,
    ) as r:
        events = sse_events(r.read())
    assert events[-1]["type"] == "response.completed"
    assert events[-1]["response"]["conversation"] == {"id": conversation.id}
    assert events[0]["response"]["conversation"] == {"id": conversation.id}


def test_store_false_and_encrypted_reasoning(client: OpenAI, engine: ScriptedEngine) -> None:
    """A ``store=false`` response still appends its turn (the conversation is stored);
    ``include=reasoning.encrypted_content`` seals reasoning items, and the sealed item is
    accepted back (a tampered one is a 400 naming it)."""
    conversation = client.conversations.create()
    engine.add_turns({"completion": harmony(("analysis", "Think of 7."), ("final", "Seven."))})
    response = client.responses.create(
        model=MODEL, input="A number?", conversation=conversation.id, store=False
    )
    assert response.output_text == "Seven."
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)
    listed = client.conversations.items.list(
        conversation.id, order="asc", include=["reasoning.encrypted_content"]
    )
    reasoning = next(i for i in listed.data if i.type == "reasoning")
    sealed = reasoning.encrypted_content  # type: ignore[union-attr]
    assert sealed and "Think of 7." not in sealed
    plain = client.conversations.items.retrieve(reasoning.id, conversation_id=conversation.id)
    assert plain.encrypted_content is None  # type: ignore[union-attr]
    other = client.conversations.create()
    item = {"type": "reasoning", "summary": [], "encrypted_content": sealed}
    client.conversations.items.create(other.id, items=[item])  # type: ignore[list-item]
    engine.add_turns({"completion": harmony(("final", "Ok."))})
    client.responses.create(model=MODEL, input="And?", conversation=other.id)
    assert "Think of 7." in _prompt(engine)  # decrypted: the sealed reasoning reached the model
    tampered = {**item, "encrypted_content": sealed[:-4] + "AAAA"}
    with pytest.raises(openai.BadRequestError) as caught:
        client.conversations.items.create(other.id, items=[tampered])  # type: ignore[list-item]
    assert caught.value.body["param"] == "items[0].encrypted_content"  # type: ignore[index]
