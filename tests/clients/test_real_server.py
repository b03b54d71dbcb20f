"""Real clients (openai SDK, openai-agents, Codex CLI) against the REAL ledger.

The server is the real app with the scripted engine (tests/e2e/conftest.py); every stream is
checked with the structural checker, the SDK's event union and the OpenAPI document, and stream,
non-stream and GET must agree item by item.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI, OpenAI

from app.encoding import load_encoding
from app.engines.scripted import ScriptedEngine
from tests.e2e.conftest import MODEL, harmony, sse_events
from tests.support.codex import codex_binary, run_codex
from tests.support.openapi import validate_response, validate_stream_event
from tests.support.server import RunningServer
from tests.support.stream_checker import check_stream, validate_with_sdk


@pytest.fixture(autouse=True)
def _no_leftover_turns(engine: ScriptedEngine) -> Iterator[None]:
    """Each test starts with an empty queue (a failing test may leave turns behind)."""
    with engine._lock:
        engine._next = len(engine._turns)
    yield


# -- helpers -----------------------------------------------------------------------------------


def _stream(ledger: RunningServer, body: dict[str, Any]) -> list[dict[str, Any]]:
    with httpx.stream(
        "POST", ledger.base_url + "/v1/responses", json={**body, "stream": True}, timeout=60
    ) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        return sse_events(r.read())


def _get_stream(
    ledger: RunningServer, response_id: str, after: int | None = None
) -> list[dict[str, Any]]:
    params = {"stream": "true"}
    if after is not None:
        params["starting_after"] = str(after)
    r = httpx.get(f"{ledger.base_url}/v1/responses/{response_id}", params=params, timeout=60)
    assert r.status_code == 200, r.text
    return sse_events(r.content)


def _get(ledger: RunningServer, response_id: str) -> dict[str, Any]:
    r = httpx.get(f"{ledger.base_url}/v1/responses/{response_id}", timeout=60)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    validate_response(body)
    return body


def _validate(events: list[dict[str, Any]]) -> dict[str, Any]:
    final = check_stream(events)
    validate_with_sdk(events)
    for event in events:
        validate_stream_event(event)
    return dict(final)


def _summary(item: dict[str, Any]) -> dict[str, Any]:
    """What must agree between two runs of the same script (not ids, not call ids)."""
    out: dict[str, Any] = {"type": item["type"]}
    for key in ("name", "arguments", "input", "role", "namespace"):
        if key in item:
            out[key] = item[key]
    if "content" in item and item["content"] is not None:
        out["content"] = [(p.get("type"), p.get("text", p.get("refusal"))) for p in item["content"]]
    if "summary" in item:
        out["summary"] = [s.get("text") for s in item["summary"]]
    return out


def _ids(items: list[dict[str, Any]]) -> list[tuple[str, str | None]]:
    return [(i["id"], i.get("call_id")) for i in items]


# -- 1. the openai SDK as oracle ---------------------------------------------------------------

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}
TIME = {
    "type": "function",
    "name": "get_time",
    "description": "Local time in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    # explicit: the ledger echoes tools verbatim, and a function tool without "strict" then
    # fails the OpenAPI FunctionTool schema (strict is required there); see the report
    "strict": False,
}
APPLY_PATCH = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Apply a patch to the workspace.",
    "format": {"type": "text"},
}
PATCH = "*** Begin Patch\n*** Add File: a.txt\n+hello\n*** End Patch"


@dataclass(frozen=True)
class Scenario:
    name: str
    turn: dict[str, Any]
    status: str = "completed"
    body: dict[str, Any] = field(default_factory=dict)
    types: tuple[str, ...] = ()
    sdk_helper: bool = True


SCENARIOS = [
    Scenario("plain", {"completion": harmony(("final", "Hello there!"))}, types=("message",)),
    Scenario(
        "reasoning_then_final",
        {"completion": harmony(("analysis", "The user greets me."), ("final", "Hi!"))},
        types=("reasoning", "message"),
    ),
    Scenario(
        "preamble_then_tool_call",
        {
            "completion": harmony(
                ("commentary", "Let me check the weather."),
                ("commentary to=functions.get_weather <|constrain|>json", '{"city":"Paris"}'),
                end="<|call|>",
            )
        },
        body={"tools": [WEATHER]},
        types=("message", "function_call"),
    ),
    Scenario(
        "parallel_tool_calls",
        {
            "completion": harmony(
                ("commentary to=functions.get_weather <|constrain|>json", '{"city":"Paris"}'),
                ("commentary to=functions.get_time <|constrain|>json", '{"city":"Oslo"}'),
                end="<|call|>",
            )
        },
        body={"tools": [WEATHER, TIME]},
        types=("function_call", "function_call"),
    ),
    Scenario(
        "custom_tool_call",
        {
            "completion": "<|channel|>commentary to=functions.apply_patch <|constrain|>json"
            f"<|message|>{json.dumps({'input': PATCH})}<|call|>"
        },
        body={"tools": [APPLY_PATCH]},
        types=("custom_tool_call",),
    ),
    Scenario(
        "truncated",
        {"completion": harmony(("final", " ".join(f"word{i}" for i in range(200))))},
        status="incomplete",
        body={"max_output_tokens": 16},
        sdk_helper=False,
    ),
    Scenario(
        "failed",
        {"completion": "<|channel|>final<|message|>Partial answer", "error": "scripted failure"},
        status="failed",
        sdk_helper=False,
    ),
]


def _body(s: Scenario) -> dict[str, Any]:
    return {"model": MODEL, "input": f"scenario {s.name}", **s.body}


@pytest.mark.parametrize("s", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_stream_nonstream_and_get_agree(
    s: Scenario, ledger: RunningServer, engine: ScriptedEngine, client: OpenAI
) -> None:
    engine.add_turns(s.turn)
    events = _stream(ledger, _body(s))
    streamed = _validate(events)
    assert streamed["status"] == s.status, streamed
    assert events[-1]["type"] == f"response.{s.status}"
    if s.types:
        assert tuple(o["type"] for o in streamed["output"]) == s.types
    if s.name == "custom_tool_call":
        assert streamed["output"][0]["name"] == "apply_patch"
        assert streamed["output"][0]["input"] == PATCH
    if s.name == "truncated":
        assert streamed["incomplete_details"] == {"reason": "max_output_tokens"}
    if s.name == "failed":
        assert streamed["error"] is not None

    fetched = _get(ledger, streamed["id"])
    validate_response(streamed)
    assert fetched["status"] == s.status
    assert [_summary(o) for o in fetched["output"]] == [_summary(o) for o in streamed["output"]]
    assert _ids(fetched["output"]) == _ids(streamed["output"])
    added = [e["item"]["id"] for e in events if e["type"] == "response.output_item.added"]
    assert added == [o["id"] for o in fetched["output"]]

    engine.add_turns(s.turn)
    r = httpx.post(ledger.base_url + "/v1/responses", json=_body(s), timeout=60)
    assert r.status_code == 200, r.text
    plain = r.json()
    validate_response(plain)
    assert plain["status"] == s.status
    assert [_summary(o) for o in plain["output"]] == [_summary(o) for o in streamed["output"]]
    assert _get(ledger, plain["id"])["output"] == plain["output"]

    if s.sdk_helper:
        engine.add_turns(s.turn)
        with client.responses.stream(**_body(s)) as stream:
            kinds = [event.type for event in stream]
            final = stream.get_final_response()
        assert kinds[-1] == "response.completed"
        assert [_summary(o.model_dump(exclude_none=True)) for o in final.output] == [
            _summary({k: v for k, v in o.items() if v is not None}) for o in streamed["output"]
        ]


def test_background_then_get_stream_until_terminal(
    ledger: RunningServer, engine: ScriptedEngine
) -> None:
    turn = {
        "completion": harmony(("analysis", "Slowly."), ("final", "Background answer.")),
        "token_delay_ms": 20,
    }
    engine.add_turns(turn)
    body = {"model": MODEL, "input": "scenario background", "background": True, "store": True}
    r = httpx.post(ledger.base_url + "/v1/responses", json=body, timeout=60)
    assert r.status_code == 200, r.text
    created = r.json()
    validate_response(created)
    assert created["status"] in ("queued", "in_progress"), created
    events = _get_stream(ledger, created["id"])
    final = _validate(events)
    assert events[0]["response"]["status"] == "queued"
    assert [e["type"] for e in events[:3]] == [
        "response.created", "response.queued", "response.in_progress",
    ]  # fmt: skip
    assert final["status"] == "completed" and final["id"] == created["id"]
    fetched = _get(ledger, created["id"])
    assert fetched["status"] == "completed"
    assert [_summary(o) for o in fetched["output"]] == [_summary(o) for o in final["output"]]
    assert _ids(fetched["output"]) == _ids(final["output"])
    assert [o["type"] for o in fetched["output"]] == ["reasoning", "message"]

    engine.add_turns(turn)
    plain = httpx.post(
        ledger.base_url + "/v1/responses", json={**body, "background": False}, timeout=60
    ).json()
    validate_response(plain)
    assert [_summary(o) for o in plain["output"]] == [_summary(o) for o in final["output"]]


def test_resume_with_starting_after(ledger: RunningServer, engine: ScriptedEngine) -> None:
    engine.add_turns({"completion": harmony(("analysis", "Think."), ("final", "One two three."))})
    events = _stream(ledger, {"model": MODEL, "input": "scenario resume"})
    final = _validate(events)
    response_id = final["id"]
    replay = _get_stream(ledger, response_id)
    assert replay == events
    for n in (0, 3, len(events) // 2, len(events) - 2):
        tail = _get_stream(ledger, response_id, after=n)
        assert tail == events[n + 1 :], n
        assert [e["sequence_number"] for e in tail] == list(range(n + 1, len(events)))
        for event in tail:
            validate_stream_event(event)
        validate_with_sdk(tail)
    assert _get_stream(ledger, response_id, after=len(events) - 1) == []
    fetched = _get(ledger, response_id)
    assert _ids(fetched["output"]) == _ids(final["output"])


# -- 2. openai-agents --------------------------------------------------------------------------

TOOL_RAN: list[str] = []


def _agent(ledger: RunningServer, oai: AsyncOpenAI, tools: list[Any] | None = None) -> Any:
    from agents import Agent, OpenAIResponsesModel, function_tool, set_tracing_disabled

    set_tracing_disabled(True)

    @function_tool
    def get_weather(city: str) -> str:
        """Return the current weather for a city."""
        TOOL_RAN.append(city)
        return f"sunny in {city}"

    return Agent(
        name="weather",
        instructions="You answer questions about the weather.",
        tools=[get_weather] if tools is None else tools,
        model=OpenAIResponsesModel(model=MODEL, openai_client=oai),
    )


def _agents_turns() -> list[dict[str, Any]]:
    return [
        {
            "completion": harmony(
                ("analysis", "I need the weather tool for Paris."),
                ("commentary to=functions.get_weather <|constrain|>json", '{"city":"Paris"}'),
                end="<|call|>",
            )
        },
        {"completion": harmony(("final", "It is sunny in Paris."))},
    ]


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
async def test_agents_tool_loop(
    streamed: bool, ledger: RunningServer, engine: ScriptedEngine
) -> None:
    from agents import Runner

    TOOL_RAN.clear()
    engine.add_turns(*_agents_turns())
    n = engine.prompt_count
    oai = AsyncOpenAI(base_url=ledger.base_url + "/v1", api_key="x", max_retries=0)
    result: Any
    try:
        agent = _agent(ledger, oai)
        if streamed:
            result = Runner.run_streamed(agent, "What is the weather in Paris?")
            kinds = {type(event).__name__ async for event in result.stream_events()}
            assert "RawResponsesStreamEvent" in kinds
        else:
            result = await Runner.run(agent, "What is the weather in Paris?")
    finally:
        await oai.close()
    assert result.final_output == "It is sunny in Paris."
    assert TOOL_RAN == ["Paris"]
    assert engine.prompt_count == n + 2
    second = load_encoding().decode_utf8(engine.prompts[-1])
    assert "sunny in Paris" in second  # the tool output reached the model


async def test_agents_previous_response_id(ledger: RunningServer, engine: ScriptedEngine) -> None:
    from agents import Runner

    engine.add_turns(
        {"completion": harmony(("final", "Noted, your name is Zebulon."))},
        {"completion": harmony(("final", "Your name is Zebulon."))},
    )
    oai = AsyncOpenAI(base_url=ledger.base_url + "/v1", api_key="x", max_retries=0)
    try:
        agent = _agent(ledger, oai, tools=[])
        first = await Runner.run(agent, "My name is Zebulon.")
        assert first.final_output == "Noted, your name is Zebulon."
        assert first.last_response_id is not None
        second = await Runner.run(
            agent, "What is my name?", previous_response_id=first.last_response_id
        )
    finally:
        await oai.close()
    assert second.final_output == "Your name is Zebulon."
    prompt = load_encoding().decode_utf8(engine.prompts[-1])
    assert "My name is Zebulon." in prompt
    assert "Noted, your name is Zebulon." in prompt
    assert prompt.index("My name is Zebulon.") < prompt.index("What is my name?")


# -- 3. Codex CLI ------------------------------------------------------------------------------


@pytest.mark.codex
@pytest.mark.skipif(codex_binary() is None, reason="Codex CLI not installed")
def test_codex_runs_a_command_through_the_ledger(
    ledger: RunningServer, engine: ScriptedEngine, tmp_path: Path
) -> None:
    engine.add_turns(
        {
            "completion": harmony(
                ("analysis", "Run the command."),
                ("commentary", "Running the command."),
                (
                    "commentary to=functions.exec_command <|constrain|>json",
                    '{"cmd":"echo ledger-ok"}',
                ),
                end="<|call|>",
            )
        },
        {
            "completion": harmony(
                ("analysis", "It printed."), ("final", "The command printed ledger-ok.")
            )
        },
    )
    n = engine.prompt_count
    started = time.monotonic()
    run = run_codex(
        "Run `echo ledger-ok` and tell me what it printed.",
        base_url=ledger.base_url + "/v1",
        model=MODEL,
        workdir=tmp_path,
    )
    assert time.monotonic() - started < 120
    assert run.returncode == 0, run.describe()
    kinds = [e["type"] for e in run.events]
    assert kinds[-1] == "turn.completed", run.describe()
    assert "turn.failed" not in kinds, run.describe()
    (command,) = run.items("command_execution")
    assert "ledger-ok" in command["aggregated_output"], run.describe()
    assert [m["text"] for m in run.items("agent_message")][-1] == "The command printed ledger-ok."
    assert engine.prompt_count == n + 2, run.describe()
    second = load_encoding().decode_utf8(engine.prompts[-1])
    assert "ledger-ok" in second.split("echo ledger-ok")[-1]  # the output, not just the call
