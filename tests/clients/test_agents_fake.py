"""openai-agents (``OpenAIResponsesModel``), driven against the recording fake.

What the Agents SDK sends for a one-tool agent, streamed and not, and what it needs back. Its
bodies are deterministic, so they must equal the recorded fixtures exactly.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from agents.exceptions import ModelBehaviorError

from tests.clients.captures import AGENTS_CALL_ID, agents_session
from tests.clients.fake_server import ResponseScript, Turn
from tests.support import openapi
from tests.support.stream_checker import check_stream, validate_with_sdk

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "agents"


def _fixture(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text(encoding="utf-8"))


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
async def test_a_tool_turn_and_its_follow_up(streamed: bool) -> None:
    session = await agents_session(streamed=streamed)
    assert session.final_output == "It is sunny in Paris."
    first, second = session.server.response_bodies
    prefix = "streamed." if streamed else "run."
    assert first == _fixture(f"{prefix}turn1.request.json")
    assert second == _fixture(f"{prefix}turn2.request.json")

    if streamed:
        assert first["stream"] is True and second["stream"] is True
        assert "RawResponsesStreamEvent" in session.stream_event_kinds
    else:
        assert "stream" not in first  # a plain JSON Response comes back
    # no store / previous_response_id: the SDK replays the whole history itself
    assert not {"store", "previous_response_id", "reasoning"} & set(first)
    assert (
        first["include"] == []
        and first["instructions"] == "You answer questions about the weather."
    )
    assert first["input"] == [{"content": "What is the weather in Paris?", "role": "user"}]
    (tool,) = first["tools"]
    assert tool["type"] == "function" and tool["strict"] is True
    assert tool["parameters"]["additionalProperties"] is False

    turn1 = session.server.scripts[0].final()["output"]
    assert second["input"][0] == first["input"][0]
    reasoning, call, output = second["input"][1:]
    assert reasoning == turn1[0]  # replayed verbatim, status included, no encrypted_content
    assert call == turn1[1]
    assert output == {
        "call_id": AGENTS_CALL_ID,
        "output": "sunny in Paris",
        "type": "function_call_output",
    }

    for script in session.server.scripts:
        events = script.events()
        check_stream(events)
        validate_with_sdk(events)
        for event in events:
            openapi.validate_stream_event(event)
        openapi.validate_response(script.final())


def test_headers_recorded() -> None:
    for prefix in ("run.", "streamed."):
        headers = _fixture(f"{prefix}headers.json")
        assert headers["authorization"] == "Bearer sk-ledger-dummy"
        assert headers["user-agent"] == "Agents/Python 0.24.0"
        assert headers["accept"] == "application/json"  # even for stream=true
    assert _fixture("streamed.headers.json")["x-stainless-raw-response"] == "stream"


# -- what the streamed run needs -------------------------------------------------------------


def _mutated_turns(mutate: Callable[[list[dict[str, Any]]], list[dict[str, Any]]]) -> list[Turn]:
    class Script(ResponseScript):
        def events(self) -> list[dict[str, Any]]:
            mutated = mutate(copy.deepcopy(super().events()))
            return [{**e, "sequence_number": n} for n, e in enumerate(mutated)]

    def turn1(request: Mapping[str, Any], response_id: str) -> ResponseScript:
        script = Script(request, response_id=response_id)
        script.function_call("get_weather", json.dumps({"city": "Paris"}), call_id=AGENTS_CALL_ID)
        return script

    def turn2(request: Mapping[str, Any], response_id: str) -> ResponseScript:
        script = Script(request, response_id=response_id)
        script.message("It is sunny in Paris.")
        return script

    return [turn1, turn2]


def _empty_terminal_output(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    events[-1]["response"]["output"] = []
    return events


def _terminal(kind: str, **fields: Any) -> Callable[[list[dict[str, Any]]], list[dict[str, Any]]]:
    def mutate(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        events[-1]["type"] = f"response.{kind}"
        events[-1]["response"].update(status=kind, **fields)
        return events

    return mutate


@pytest.mark.parametrize(
    "mutate",
    [
        pytest.param(_empty_terminal_output, id="items-from-output_item.done"),
        pytest.param(lambda e: [e[0], e[-1]], id="items-from-response.completed"),
    ],
)
async def test_either_item_source_is_enough(
    mutate: Callable[[list[dict[str, Any]]], list[dict[str, Any]]],
) -> None:
    session = await agents_session(streamed=True, turns=_mutated_turns(mutate))
    assert session.final_output == "It is sunny in Paris."


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        pytest.param(lambda e: e[:-1], "Model did not produce a final response", id="no-terminal"),
        pytest.param(
            _terminal("failed", error={"code": "server_error", "message": "engine died"}),
            "terminal event `response.failed`", id="failed",
        ),
        pytest.param(
            _terminal("incomplete", incomplete_details={"reason": "max_output_tokens"}),
            "terminal event `response.incomplete`", id="incomplete",
        ),
    ],
)  # fmt: skip
async def test_a_streamed_run_fails_without_response_completed(
    mutate: Callable[[list[dict[str, Any]]], list[dict[str, Any]]], message: str
) -> None:
    with pytest.raises(ModelBehaviorError, match=message):
        await agents_session(streamed=True, turns=_mutated_turns(mutate))
