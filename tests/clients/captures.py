"""The scripted client sessions, shared by the tests and ``record_fixtures``.

Each function points one real client at a :class:`RecordingServer` with a fixed two-turn script
(turn 1: reasoning and a tool call, turn 2: the final answer) and returns what happened: the
server (with every recorded request and the scripts it streamed) and the client's own result.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
from openai import AsyncOpenAI

from tests.clients.fake_server import RecordingServer, ResponseScript, Turn
from tests.support.codex import CodexRun, run_codex

__all__ = [
    "AGENTS_CALL_ID",
    "CODEX_CALL_ID",
    "CODEX_MARKER",
    "AgentsSession",
    "CodexSession",
    "agents_session",
    "agents_turns",
    "codex_session",
    "codex_turns",
]

MODEL = "gpt-oss-120b"
CODEX_MARKER = "ledger-marker-7f3a"
CODEX_CALL_ID = "call_codex_1"
AGENTS_CALL_ID = "call_weather_1"


def codex_turns() -> list[Turn]:
    """Turn 1 runs ``echo <marker>`` through Codex's shell tool; turn 2 answers."""

    def turn1(request: Mapping[str, Any], response_id: str) -> ResponseScript:
        script = ResponseScript(request, response_id=response_id)
        script.reasoning(
            "The user wants the marker echoed; run it.", encrypted_content="opaque-blob-1"
        )
        script.message("Running the command.", phase="commentary")
        script.function_call(
            "exec_command", json.dumps({"cmd": f"echo {CODEX_MARKER}"}), call_id=CODEX_CALL_ID
        )
        return script

    def turn2(request: Mapping[str, Any], response_id: str) -> ResponseScript:
        script = ResponseScript(request, response_id=response_id)
        script.reasoning("The command printed the marker.", encrypted_content="opaque-blob-2")
        script.message(f"The command printed {CODEX_MARKER}.", phase="final_answer")
        return script

    return [turn1, turn2]


@dataclass(frozen=True)
class CodexSession:
    server: RecordingServer
    run: CodexRun


def codex_session(
    workdir: Path, *, model: str = MODEL, turns: list[Turn] | None = None
) -> CodexSession:
    with RecordingServer(codex_turns() if turns is None else turns) as server:
        run = run_codex(
            f"Run `echo {CODEX_MARKER}` and tell me what it printed.",
            base_url=server.base_url,
            model=model,
            workdir=workdir,
        )
    return CodexSession(server=server, run=run)


@function_tool
def get_weather(city: str) -> str:
    """Return the current weather for a city."""
    return f"sunny in {city}"


def agents_turns() -> list[Turn]:
    """Turn 1 calls ``get_weather``; turn 2 answers with its result."""

    def turn1(request: Mapping[str, Any], response_id: str) -> ResponseScript:
        script = ResponseScript(request, response_id=response_id)
        script.reasoning("I need the weather tool for Paris.")
        script.function_call("get_weather", json.dumps({"city": "Paris"}), call_id=AGENTS_CALL_ID)
        return script

    def turn2(request: Mapping[str, Any], response_id: str) -> ResponseScript:
        script = ResponseScript(request, response_id=response_id)
        script.message("It is sunny in Paris.")
        return script

    return [turn1, turn2]


@dataclass(frozen=True)
class AgentsSession:
    server: RecordingServer
    final_output: Any
    stream_event_kinds: frozenset[str]  # class names of what RunResultStreaming yielded


async def agents_session(*, streamed: bool, turns: list[Turn] | None = None) -> AgentsSession:
    """``Runner.run`` (or ``run_streamed``) of a one-tool agent against the fake."""
    set_tracing_disabled(True)
    kinds: set[str] = set()
    with RecordingServer(agents_turns() if turns is None else turns) as server:
        client = AsyncOpenAI(base_url=server.base_url, api_key="sk-ledger-dummy", max_retries=0)
        try:
            agent = Agent(
                name="weather",
                instructions="You answer questions about the weather.",
                tools=[get_weather],
                model=OpenAIResponsesModel(model=MODEL, openai_client=client),
            )
            if streamed:
                result = Runner.run_streamed(agent, "What is the weather in Paris?")
                async for event in result.stream_events():
                    kinds.add(type(event).__name__)
            else:
                result = await Runner.run(agent, "What is the weather in Paris?")
        finally:
            await client.close()
    return AgentsSession(
        server=server, final_output=result.final_output, stream_event_kinds=frozenset(kinds)
    )
