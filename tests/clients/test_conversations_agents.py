"""The Agents SDK (openai-agents) keeping its history in the ledger's conversations: with
``OpenAIConversationsSession`` (the SDK reads and writes the items itself) and with
``Runner.run(..., conversation_id=...)`` (the server appends each turn), a tool loop included;
the history is checked in the prompts the scripted engine was given."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from openai import AsyncOpenAI

from app.encoding import load_encoding
from app.engines.scripted import ScriptedEngine
from tests.e2e.conftest import MODEL, harmony
from tests.support.server import RunningServer

RAN: list[str] = []


@pytest.fixture(autouse=True)
def _no_leftover_turns(engine: ScriptedEngine) -> Iterator[None]:
    with engine._lock:
        engine._next = len(engine._turns)
    yield


def _agent(oai: AsyncOpenAI, *, tools: bool = False) -> Any:
    from agents import Agent, OpenAIResponsesModel, function_tool, set_tracing_disabled

    set_tracing_disabled(True)

    @function_tool
    def get_weather(city: str) -> str:
        """Return the current weather for a city."""
        RAN.append(city)
        return f"sunny in {city}"

    return Agent(
        name="weather",
        instructions="You answer questions about the weather.",
        tools=[get_weather] if tools else [],
        model=OpenAIResponsesModel(model=MODEL, openai_client=oai),
    )


def _prompt(engine: ScriptedEngine) -> str:
    return load_encoding().decode_utf8(engine.prompts[-1])


async def _messages(oai: AsyncOpenAI, conversation_id: str) -> list[tuple[str, str]]:
    return [
        (item.role, item.content[0].text)  # type: ignore[union-attr]
        async for item in oai.conversations.items.list(conversation_id, order="asc")
        if item.type == "message"
    ]


async def test_openai_conversations_session(ledger: RunningServer, engine: ScriptedEngine) -> None:
    from agents import OpenAIConversationsSession, Runner

    engine.add_turns(
        {"completion": harmony(("analysis", "A name."), ("final", "Noted, Zebulon."))},
        {"completion": harmony(("final", "Your name is Zebulon."))},
    )
    oai = AsyncOpenAI(base_url=ledger.base_url + "/v1", api_key="x", max_retries=0)
    try:
        session = OpenAIConversationsSession(openai_client=oai)
        agent = _agent(oai)
        first = await Runner.run(agent, "My name is Zebulon.", session=session)
        assert first.final_output == "Noted, Zebulon."
        second = await Runner.run(agent, "What is my name?", session=session)
        assert second.final_output == "Your name is Zebulon."
        prompt = _prompt(engine)
        assert prompt.index("My name is Zebulon.") < prompt.index("Noted, Zebulon.")
        assert prompt.index("Noted, Zebulon.") < prompt.index("What is my name?")
        conversation_id = await session._get_session_id()
        assert await _messages(oai, conversation_id) == [
            ("user", "My name is Zebulon."),
            ("assistant", "Noted, Zebulon."),
            ("user", "What is my name?"),
            ("assistant", "Your name is Zebulon."),
        ]
        popped = await session.pop_item()  # items.list(limit) + items.delete
        assert popped is not None and popped["role"] == "assistant"  # type: ignore[typeddict-item]
        assert len(await session.get_items()) == 4  # user, reasoning, assistant, user
        await session.clear_session()  # conversations.delete
        assert session._session_id is None
    finally:
        await oai.close()


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
async def test_runner_with_conversation_id(
    streamed: bool, ledger: RunningServer, engine: ScriptedEngine
) -> None:
    """The server appends each turn, the tool call and its output too: the SDK sends only the
    new items of each request."""
    from agents import Runner

    RAN.clear()
    engine.add_turns(
        {
            "completion": harmony(
                ("analysis", "I need the weather tool."),
                ("commentary to=functions.get_weather <|constrain|>json", '{"city":"Paris"}'),
                end="<|call|>",
            )
        },
        {"completion": harmony(("final", "It is sunny in Paris."))},
        {"completion": harmony(("final", "You asked about Paris."))},
    )
    oai = AsyncOpenAI(base_url=ledger.base_url + "/v1", api_key="x", max_retries=0)
    try:
        conversation = await oai.conversations.create()
        agent = _agent(oai, tools=True)

        async def run(text: str) -> Any:
            if not streamed:
                return await Runner.run(agent, text, conversation_id=conversation.id)
            result = Runner.run_streamed(agent, text, conversation_id=conversation.id)
            async for _ in result.stream_events():
                pass
            return result

        first = await run("What is the weather in Paris?")
        assert first.final_output == "It is sunny in Paris." and RAN == ["Paris"]
        assert "sunny in Paris" in _prompt(engine)  # the tool output reached the model
        second = await run("Which city did I ask about?")
        assert second.final_output == "You asked about Paris."
        prompt = _prompt(engine)
        for earlier in ("What is the weather in Paris?", "sunny in Paris", "It is sunny in Paris."):
            assert prompt.index(earlier) < prompt.index("Which city did I ask about?")
        kinds = [i.type async for i in oai.conversations.items.list(conversation.id, order="asc")]
        assert kinds == [
            "message",
            "reasoning",
            "function_call",
            "function_call_output",
            "message",
            "message",
            "message",
        ]
    finally:
        await oai.close()
