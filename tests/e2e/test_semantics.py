"""Issue 6: the Responses API semantics, end to end through the OpenAI SDK and raw HTTP.

One group per numbered point of the issue: (1) ``previous_response_id`` by replay, (2) model
validation, (3) ``tool_choice``, (4) custom tools, (5) encrypted reasoning, (6) terminal events,
(7) background and cancel. Restart recovery is in ``test_recovery.py``.

Prompts are compared through what the scripted engine received (``engine.prompts``), decoded with
the real ``o200k_harmony`` encoding.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI

from app.encoding import load_encoding
from app.engines.scripted import ScriptedEngine
from tests.e2e.conftest import MODEL, harmony, sse_events
from tests.support.server import RunningServer
from tests.support.stream_checker import check_stream

ALIAS = "gpt-oss-alias"

WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather for a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
TIME_TOOL: dict[str, Any] = {
    "type": "function",
    "name": "get_time",
    "description": "Local time in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
SQL_TOOL: dict[str, Any] = {
    "type": "custom",
    "name": "run_sql",
    "description": "Run one read-only SQL query.",
    "format": {"type": "grammar", "syntax": "lark", "definition": 'start: "SELECT" /[^;]+/'},
}

CALL_WEATHER = harmony(
    ("analysis", "I need the weather for Paris."),
    ("commentary to=functions.get_weather <|constrain|>json", '{"city": "Paris"}'),
    end="<|call|>",
)
INCLUDE_ENCRYPTED = ["reasoning.encrypted_content"]


# -- helpers -------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _fresh_script(engine: ScriptedEngine) -> Iterator[None]:
    """Each test starts with no queued turn, whatever an earlier (failed) test left behind."""
    with engine._lock:
        engine._next = len(engine._turns)
    yield


def decode(ids: list[int]) -> str:
    return load_encoding().decode_utf8(ids)


def final(text: str) -> dict[str, Any]:
    return {"completion": harmony(("final", text))}


def post(
    ledger: RunningServer, body: dict[str, Any], path: str = "/v1/responses"
) -> httpx.Response:
    return httpx.post(ledger.base_url + path, json=body, timeout=30)


def error_of(
    resp: httpx.Response, status: int, *, code: str | None, param: str | None
) -> dict[str, Any]:
    """The OpenAI error shape, exactly: ``{"error": {"message", "type", "param", "code"}}``."""
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    body = resp.json()
    assert set(body) == {"error"}
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    assert err["type"] == "invalid_request_error"
    assert err["code"] == code
    assert err["param"] == param
    return dict(err)


def create(client: OpenAI, stream: bool, **kwargs: Any) -> Any:
    """``responses.create``, or ``responses.stream`` + ``get_final_response`` (checking the stream
    ends with ``response.completed``)."""
    if not stream:
        return client.responses.create(**kwargs)
    with client.responses.stream(**kwargs) as events:
        seen = [e.type for e in events]
        response = events.get_final_response()
    assert seen[0] == "response.created" and seen[-1] == "response.completed"
    return response


def raw_stream(ledger: RunningServer, body: dict[str, Any]) -> list[dict[str, Any]]:
    with httpx.stream(
        "POST", ledger.base_url + "/v1/responses", json={**body, "stream": True}, timeout=60
    ) as r:
        assert r.status_code == 200, r.read()
        return sse_events(r.read())


def replayed(
    ledger: RunningServer, response_id: str, after: int | None = None
) -> list[dict[str, Any]]:
    params: dict[str, Any] = {"stream": "true"}
    if after is not None:
        params["starting_after"] = after
    with httpx.stream(
        "GET", f"{ledger.base_url}/v1/responses/{response_id}", params=params, timeout=60
    ) as r:
        assert r.status_code == 200, r.read()
        return sse_events(r.read())


def stored_events(ledger: RunningServer, response_id: str) -> list[dict[str, Any]]:
    resp = httpx.get(f"{ledger.base_url}/v1/responses/{response_id}/events", timeout=30)
    assert resp.status_code == 200, resp.text
    return list(resp.json()["data"])


def as_input(item: Any) -> dict[str, Any]:
    """An SDK output item as the client replays it in ``input``."""
    return dict(item.model_dump(exclude_none=True))


def wait_for(predicate: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


# == 1. previous_response_id by replay ===========================================================


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_chain_with_tool_call_replays_like_explicit_history(
    client: OpenAI, engine: ScriptedEngine, stream: bool
) -> None:
    # Turn 1: the model reasons and calls a tool.
    engine.add_turns({"completion": CALL_WEATHER})
    r1 = create(
        client,
        stream,
        model=MODEL,
        instructions="OLD-INSTRUCTIONS: answer in French.",
        input="What is the weather in Paris?",
        tools=[WEATHER_TOOL],
    )
    assert [o.type for o in r1.output] == ["reasoning", "function_call"]
    call = r1.output[1]
    assert (call.name, call.arguments) == ("get_weather", '{"city": "Paris"}')
    assert "OLD-INSTRUCTIONS" in decode(engine.prompts[-1])

    # Turn 2: the tool output, through previous_response_id.
    output = {
        "type": "function_call_output",
        "call_id": call.call_id,
        "output": '{"sky": "sunny", "celsius": 21}',
    }
    engine.add_turns(
        {
            "completion": harmony(
                ("analysis", "The tool says sunny."), ("final", "It is sunny in Paris.")
            )
        }
    )
    r2 = create(
        client,
        stream,
        model=MODEL,
        previous_response_id=r1.id,
        instructions="NEW-INSTRUCTIONS-2",
        input=[output],
        tools=[WEATHER_TOOL],
    )
    assert r2.status == "completed" and r2.output_text == "It is sunny in Paris."
    assert r2.previous_response_id == r1.id and r2.instructions == "NEW-INSTRUCTIONS-2"
    prompt2 = engine.prompts[-1]
    text2 = decode(prompt2)
    assert "<|start|>user<|message|>What is the weather in Paris?<|end|>" in text2
    # the reasoning of a turn still working through tool calls survives the replay
    assert "<|channel|>analysis<|message|>I need the weather for Paris.<|end|>" in text2
    assert 'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>' in text2
    assert "<|start|>functions.get_weather" in text2
    assert '<|message|>{"sky": "sunny", "celsius": 21}<|end|>' in text2
    assert "NEW-INSTRUCTIONS-2" in text2 and "OLD-INSTRUCTIONS" not in text2
    # input_items lists this request's own input, not the chain
    items = client.responses.input_items.list(r2.id).data
    assert [(i.type, getattr(i, "call_id", None)) for i in items] == [
        ("function_call_output", call.call_id)
    ]

    # Turn 3: a new user message on top.
    engine.add_turns(final("Rain tomorrow."))
    r3 = create(
        client,
        stream,
        model=MODEL,
        previous_response_id=r2.id,
        instructions="NEW-INSTRUCTIONS-3",
        input="And tomorrow?",
        tools=[WEATHER_TOOL],
    )
    assert r3.output_text == "Rain tomorrow."
    prompt3 = engine.prompts[-1]
    text3 = decode(prompt3)
    for kept in (
        "What is the weather in Paris?",
        'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>',
        '<|message|>{"sky": "sunny", "celsius": 21}<|end|>',
        "<|channel|>final<|message|>It is sunny in Paris.<|end|>",
        "<|start|>user<|message|>And tomorrow?<|end|><|start|>assistant",
        "NEW-INSTRUCTIONS-3",
    ):
        assert kept in text3, kept
    for gone in ("OLD-INSTRUCTIONS", "NEW-INSTRUCTIONS-2"):
        assert gone not in text3, gone  # instructions are never inherited
    # gpt-oss convention: the analysis of turns that ended in a final answer is dropped
    assert "I need the weather for Paris." not in text3 and "The tool says sunny." not in text3

    # The same history sent explicitly, store=false: identical prompt token ids.
    history = [
        {"role": "user", "content": "What is the weather in Paris?"},
        *map(as_input, r1.output),
    ]
    engine.add_turns(final("explicit 2"), final("explicit 3"))
    client.responses.create(
        model=MODEL,
        store=False,
        instructions="NEW-INSTRUCTIONS-2",
        input=[*history, output],
        tools=[WEATHER_TOOL],
    )
    assert engine.prompts[-1] == prompt2
    client.responses.create(
        model=MODEL,
        store=False,
        instructions="NEW-INSTRUCTIONS-3",
        input=[
            *history,
            output,
            *map(as_input, r2.output),
            {"role": "user", "content": "And tomorrow?"},
        ],
        tools=[WEATHER_TOOL],
    )
    assert engine.prompts[-1] == prompt3


def test_instructions_are_not_inherited(client: OpenAI, engine: ScriptedEngine) -> None:
    engine.add_turns(final("First."), final("Second."))
    r1 = client.responses.create(model=MODEL, instructions="ALPHA-RULES apply.", input="one")
    assert "ALPHA-RULES apply." in decode(engine.prompts[-1])
    r2 = client.responses.create(model=MODEL, previous_response_id=r1.id, input="two")
    text = decode(engine.prompts[-1])
    assert "ALPHA-RULES" not in text and "<|start|>developer" not in text
    assert (
        "<|start|>user<|message|>one<|end|>" in text
        and "<|channel|>final<|message|>First.<|end|>" in text
    )
    assert r2.instructions is None
    assert client.responses.retrieve(r2.id).instructions is None


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_unknown_previous_response_is_404_before_generation(
    ledger: RunningServer, client: OpenAI, engine: ScriptedEngine, stream: bool
) -> None:
    prompts = engine.prompt_count
    resp = post(
        ledger,
        {"model": MODEL, "input": "hi", "previous_response_id": "resp_nope", "stream": stream},
    )
    err = error_of(resp, 404, code="previous_response_not_found", param="previous_response_id")
    assert "resp_nope" in err["message"]
    with pytest.raises(openai.NotFoundError):
        client.responses.create(
            model=MODEL, input="hi", previous_response_id="resp_nope", stream=stream
        )
    assert engine.prompt_count == prompts


def test_deleted_previous_response_is_404_before_generation(
    ledger: RunningServer, client: OpenAI, engine: ScriptedEngine
) -> None:
    engine.add_turns(final("soon gone"), final("child"))
    gone = client.responses.create(model=MODEL, input="hi")
    child = client.responses.create(model=MODEL, input="more", previous_response_id=gone.id)
    client.responses.delete(gone.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(gone.id)
    prompts = engine.prompt_count
    resp = post(ledger, {"model": MODEL, "input": "again", "previous_response_id": gone.id})
    error_of(resp, 404, code="previous_response_not_found", param="previous_response_id")
    # a chain with a deleted ancestor cannot be replayed either
    resp = post(ledger, {"model": MODEL, "input": "again", "previous_response_id": child.id})
    error_of(resp, 404, code="previous_response_not_found", param="previous_response_id")
    assert engine.prompt_count == prompts


def test_branching_from_one_parent(client: OpenAI, engine: ScriptedEngine) -> None:
    engine.add_turns(
        final("Root answer."), final("Answer A."), final("Answer B."), final("Leaf answer.")
    )
    root = client.responses.create(model=MODEL, input="ROOT-QUESTION")
    a = client.responses.create(model=MODEL, previous_response_id=root.id, input="BRANCH-A")
    text_a = decode(engine.prompts[-1])
    b = create(client, True, model=MODEL, previous_response_id=root.id, input="BRANCH-B")
    text_b = decode(engine.prompts[-1])
    leaf = client.responses.create(model=MODEL, previous_response_id=a.id, input="LEAF")
    text_leaf = decode(engine.prompts[-1])
    assert (a.output_text, b.output_text, leaf.output_text) == (
        "Answer A.",
        "Answer B.",
        "Leaf answer.",
    )
    for text in (text_a, text_b, text_leaf):
        assert "ROOT-QUESTION" in text and "Root answer." in text
    assert "BRANCH-A" in text_a and "BRANCH-B" not in text_a
    assert "BRANCH-B" in text_b and "BRANCH-A" not in text_b
    assert "BRANCH-A" in text_leaf and "Answer A." in text_leaf
    assert "BRANCH-B" not in text_leaf and "Answer B." not in text_leaf
    # both children are intact afterwards
    assert client.responses.retrieve(b.id).output_text == "Answer B."
    assert client.responses.retrieve(a.id).previous_response_id == root.id


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_function_call_output_without_its_call_is_400(
    ledger: RunningServer, client: OpenAI, engine: ScriptedEngine, stream: bool
) -> None:
    engine.add_turns({"completion": CALL_WEATHER}, {"completion": CALL_WEATHER})
    r1 = client.responses.create(model=MODEL, input="Weather?", tools=[WEATHER_TOOL])
    other = client.responses.create(model=MODEL, input="Weather elsewhere?", tools=[WEATHER_TOOL])
    foreign_call_id = other.output[-1].call_id  # a real call, but of another chain
    prompts = engine.prompt_count
    for call_id in ("call_matches_nothing", foreign_call_id):
        body = {
            "model": MODEL,
            "previous_response_id": r1.id,
            "input": [{"type": "function_call_output", "call_id": call_id, "output": "sunny"}],
            "tools": [WEATHER_TOOL],
            "stream": stream,
        }
        err = error_of(post(ledger, body), 400, code="invalid_value", param="input[0].call_id")
        assert call_id in err["message"]
    assert engine.prompt_count == prompts


# == 2. Model validation =========================================================================


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_unknown_model_is_404_before_generation(
    ledger: RunningServer, client: OpenAI, engine: ScriptedEngine, stream: bool
) -> None:
    prompts = engine.prompt_count
    err = error_of(
        post(ledger, {"model": "gpt-5-unknown", "input": "hi", "stream": stream}),
        404,
        code="model_not_found",
        param="model",
    )
    assert "gpt-5-unknown" in err["message"]
    with pytest.raises(openai.NotFoundError) as raised:
        client.responses.create(model="gpt-5-unknown", input="hi", stream=stream)
    assert raised.value.code == "model_not_found"
    assert engine.prompt_count == prompts


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_alias_is_accepted(client: OpenAI, engine: ScriptedEngine, stream: bool) -> None:
    engine.add_turns(final("Via the alias."))
    response = create(client, stream, model=ALIAS, input="hi")
    assert response.status == "completed" and response.output_text == "Via the alias."
    assert response.model == MODEL  # the alias resolves to the served model


def test_models_lists_exactly_what_is_accepted(
    ledger: RunningServer, client: OpenAI, engine: ScriptedEngine
) -> None:
    listed = [m.id for m in client.models.list()]
    assert sorted(listed) == sorted([MODEL, ALIAS])
    for name in listed:
        engine.add_turns(final(f"served by {name}"))
        assert client.responses.create(model=name, input="hi").output_text == f"served by {name}"
    prompts = engine.prompt_count
    for name in (MODEL.upper(), MODEL + "-x", "gpt-oss", " " + MODEL):
        assert name not in listed
        error_of(
            post(ledger, {"model": name, "input": "hi"}), 404, code="model_not_found", param="model"
        )
    assert engine.prompt_count == prompts


# == 3. tool_choice ==============================================================================

PREFILL_WEATHER = (
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_named_function_choice_forces_that_call(
    ledger: RunningServer, client: OpenAI, engine: ScriptedEngine, stream: bool
) -> None:
    engine.add_turns({"completion": '{"city": "Paris"}<|call|>'})
    body = {
        "model": MODEL,
        "input": "Weather or time in Paris?",
        "tools": [TIME_TOOL, WEATHER_TOOL],
        "tool_choice": {"type": "function", "name": "get_weather"},
    }
    if stream:
        events = raw_stream(ledger, body)
        response = check_stream(events)
        deltas = [
            e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"
        ]
        assert "".join(deltas) == '{"city": "Paris"}'
        assert events[-1]["type"] == "response.completed"
        output = response["output"]
    else:
        response = client.responses.create(**body).model_dump(exclude_none=True)
        output = response["output"]
    assert decode(engine.prompts[-1]).endswith(PREFILL_WEATHER)
    assert len(output) == 1
    assert output[0]["type"] == "function_call" and output[0]["name"] == "get_weather"
    assert output[0]["arguments"] == '{"city": "Paris"}' and output[0]["status"] == "completed"
    assert response["status"] == "completed"
    assert response["tool_choice"] == {"type": "function", "name": "get_weather"}
    assert httpx.get(f"{ledger.base_url}/v1/responses/{response['id']}").json()["output"] == output


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_named_custom_choice_forces_that_call(
    ledger: RunningServer, client: OpenAI, engine: ScriptedEngine, stream: bool
) -> None:
    engine.add_turns({"completion": '{"input": "SELECT 1"}<|call|>'})
    body = {
        "model": MODEL,
        "input": "Count.",
        "tools": [WEATHER_TOOL, SQL_TOOL],
        "tool_choice": {"type": "custom", "name": "run_sql"},
    }
    if stream:
        events = raw_stream(ledger, body)
        response = check_stream(events)
        deltas = [
            e["delta"] for e in events if e["type"] == "response.custom_tool_call_input.delta"
        ]
        assert "".join(deltas) == "SELECT 1"
    else:
        response = client.responses.create(**body).model_dump()
    assert decode(engine.prompts[-1]).endswith(
        "<|start|>assistant<|channel|>commentary to=functions.run_sql <|constrain|>json<|message|>"
    )
    [item] = response["output"]
    assert (item["type"], item["name"], item["input"]) == (
        "custom_tool_call",
        "run_sql",
        "SELECT 1",
    )
    assert response["status"] == "completed"


def test_auto_offers_tools_and_returns_the_call(client: OpenAI, engine: ScriptedEngine) -> None:
    engine.add_turns({"completion": CALL_WEATHER}, final("No tool needed."))
    called = client.responses.create(
        model=MODEL, input="Weather?", tools=[WEATHER_TOOL], tool_choice="auto"
    )
    text = decode(engine.prompts[-1])
    assert "type get_weather = " in text and text.endswith("<|start|>assistant")
    assert [o.type for o in called.output] == ["reasoning", "function_call"]
    answered = client.responses.create(
        model=MODEL, input="Hi", tools=[WEATHER_TOOL]
    )  # auto by default
    assert answered.output_text == "No tool needed." and answered.tool_choice == "auto"


def test_none_hides_the_tools(client: OpenAI, engine: ScriptedEngine) -> None:
    engine.add_turns(final("Without tools."))
    response = client.responses.create(
        model=MODEL, input="Weather?", tools=[WEATHER_TOOL], tool_choice="none"
    )
    text = decode(engine.prompts[-1])
    assert "get_weather" not in text and "namespace functions" not in text
    assert text.endswith("<|start|>assistant")
    assert response.output_text == "Without tools." and response.tool_choice == "none"


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_required_with_a_tool_returns_the_call(
    client: OpenAI, engine: ScriptedEngine, stream: bool
) -> None:
    # the prompt ends with "<|channel|>commentary to=functions.": the model names the tool
    engine.add_turns(
        {"completion": 'get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>'}
    )
    response = create(
        client, stream, model=MODEL, input="Weather?", tools=[WEATHER_TOOL], tool_choice="required"
    )
    assert [o.type for o in response.output] == ["function_call"]
    assert response.output[0].name == "get_weather" and response.tool_choice == "required"
    assert response.output[0].arguments == '{"city": "Paris"}'
    assert "type get_weather = " in decode(engine.prompts[-1])


def test_required_constrains_the_model_to_a_call(client: OpenAI, engine: ScriptedEngine) -> None:
    engine.add_turns(
        {"completion": 'get_weather <|constrain|>json<|message|>{"city": "Oslo"}<|call|>'}
    )
    response = client.responses.create(
        model=MODEL, input="Weather?", tools=[WEATHER_TOOL], tool_choice="required"
    )
    tail = decode(engine.prompts[-1]).rsplit("<|start|>", 1)[-1]
    assert tail == "assistant<|channel|>commentary to=functions."
    assert [o.type for o in response.output] == ["function_call"]


def test_required_does_not_accept_an_answer_without_a_call(
    client: OpenAI, engine: ScriptedEngine
) -> None:
    # a model that ignores the forced header: its words are kept, the response does not succeed
    engine.add_turns(
        {"completion": "<|channel|>final<|message|>I answer without calling anything.<|return|>"}
    )
    response = client.responses.create(
        model=MODEL, input="Weather?", tools=[WEATHER_TOOL], tool_choice="required"
    )
    assert response.status == "failed"
    assert response.error is not None and "tool call" in response.error.message
    assert "I answer without calling anything." in response.output_text


@pytest.mark.parametrize(
    ("tools", "choice", "needle"),
    [
        ([], "required", "required"),
        ([WEATHER_TOOL], {"type": "function", "name": "get_stock"}, "get_stock"),
        ([], {"type": "function", "name": "get_weather"}, "get_weather"),
        ([WEATHER_TOOL], {"type": "custom", "name": "get_weather"}, "get_weather"),
        ([SQL_TOOL], {"type": "function", "name": "run_sql"}, "run_sql"),
    ],
    ids=[
        "required-no-tools",
        "undeclared",
        "no-tools",
        "custom-vs-function",
        "function-vs-custom",
    ],
)
def test_impossible_tool_choice_is_400_before_generation(
    ledger: RunningServer,
    engine: ScriptedEngine,
    tools: list[dict[str, Any]],
    choice: Any,
    needle: str,
) -> None:
    prompts = engine.prompt_count
    for stream in (False, True):
        resp = post(
            ledger,
            {
                "model": MODEL,
                "input": "hi",
                "tools": tools,
                "tool_choice": choice,
                "stream": stream,
            },
        )
        err = error_of(resp, 400, code="invalid_value", param="tool_choice")
        assert needle in err["message"]
    assert engine.prompt_count == prompts


# == 4. Custom tools =============================================================================


def test_custom_tool_call_comes_back_decoded(client: OpenAI, engine: ScriptedEngine) -> None:
    engine.add_turns(
        {
            "completion": harmony(
                ("analysis", "Query the table."),
                (
                    "commentary to=functions.run_sql <|constrain|>json",
                    '{"input": "SELECT name FROM users WHERE id = 7"}',
                ),
                end="<|call|>",
            )
        }
    )
    response = client.responses.create(model=MODEL, input="Who is user 7?", tools=[SQL_TOOL])
    text = decode(engine.prompts[-1])
    assert "type run_sql = " in text and 'start: "SELECT" /[^;]+/' in text
    assert [o.type for o in response.output] == ["reasoning", "custom_tool_call"]
    call = response.output[1]
    assert (call.name, call.input) == ("run_sql", "SELECT name FROM users WHERE id = 7")
    assert call.call_id and client.responses.retrieve(response.id).output[1].input == call.input


def test_custom_tool_input_deltas_stream_the_decoded_string_and_output_replays(
    client: OpenAI, engine: ScriptedEngine
) -> None:
    arguments = r'{"input": "SELECT \"a\\b\" AS q,\n\t\u00e9t\u00e9 -- \ud83d\ude00 \u2603 done"}'
    expected = json.loads(arguments)["input"]
    assert "😀" in expected and "\n\t" in expected and '"a\\b"' in expected
    engine.add_turns(
        {
            "completion": harmony(
                ("commentary to=functions.run_sql <|constrain|>json", arguments), end="<|call|>"
            ),
            "token_delay_ms": 10,  # paced: its tokens do not all wait for one commit (one delta)
        }
    )
    with client.responses.stream(model=MODEL, input="Go.", tools=[SQL_TOOL]) as events:
        seen = list(events)
        response = events.get_final_response()
    deltas = [e.delta for e in seen if e.type == "response.custom_tool_call_input.delta"]
    assert len(deltas) > 3  # really streamed, piece by piece
    for delta in deltas:
        delta.encode("utf-8")  # no lone surrogate: a pair is never split across deltas
    [done] = [e for e in seen if e.type == "response.custom_tool_call_input.done"]
    [call] = response.output
    assert call.type == "custom_tool_call"
    assert "".join(deltas) == done.input == call.input == expected
    assert client.responses.retrieve(response.id).output[0].input == expected

    # The tool's output, replayed in the next turn, is rendered (with the call: SQL_TOOL has a
    # grammar, so its payload is replayed raw, as the model is told to write it).
    engine.add_turns(final("Query ran."))
    out = {"type": "custom_tool_call_output", "call_id": call.call_id, "output": "1 row: ADA"}
    nxt = client.responses.create(
        model=MODEL, previous_response_id=response.id, input=[out], tools=[SQL_TOOL]
    )
    assert nxt.output_text == "Query ran."
    prompt = engine.prompts[-1]
    text = decode(prompt)
    assert "to=functions.run_sql<|message|>" + expected + "<|call|>" in text
    assert "<|start|>functions.run_sql" in text and "<|message|>1 row: ADA<|end|>" in text
    # ... exactly as if the client had sent the history itself
    engine.add_turns(final("explicit"))
    client.responses.create(
        model=MODEL,
        store=False,
        input=[{"role": "user", "content": "Go."}, as_input(call), out],
        tools=[SQL_TOOL],
    )
    assert engine.prompts[-1] == prompt


# == 5. Encrypted reasoning ======================================================================

SECRET_CALL = harmony(
    ("analysis", "SECRET-REASONING: Paris needs a lookup."),
    ("commentary to=functions.get_weather <|constrain|>json", '{"city": "Paris"}'),
    end="<|call|>",
)


def _encrypted_turn(client: OpenAI, engine: ScriptedEngine, stream: bool) -> tuple[Any, Any]:
    engine.add_turns({"completion": SECRET_CALL})
    response = create(
        client,
        stream,
        model=MODEL,
        store=False,
        include=INCLUDE_ENCRYPTED,
        input="Weather in Paris?",
        tools=[WEATHER_TOOL],
    )
    reasoning, call = response.output
    assert reasoning.type == "reasoning" and call.type == "function_call"
    return reasoning, call


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_encrypted_reasoning_replays_without_its_content(
    client: OpenAI, engine: ScriptedEngine, stream: bool
) -> None:
    reasoning, call = _encrypted_turn(client, engine, stream)
    blob = reasoning.encrypted_content
    assert isinstance(blob, str) and blob and "SECRET" not in blob
    assert reasoning.content[0].text == "SECRET-REASONING: Paris needs a lookup."

    def replay(item: dict[str, Any]) -> list[int]:
        engine.add_turns(final("Sunny."))
        r = client.responses.create(
            model=MODEL,
            store=False,
            include=INCLUDE_ENCRYPTED,
            input=[
                {"role": "user", "content": "Weather in Paris?"},
                item,
                as_input(call),
                {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"},
            ],
            tools=[WEATHER_TOOL],
        )
        assert r.output_text == "Sunny."
        return list(engine.prompts[-1])

    only_blob = replay(
        {"type": "reasoning", "id": reasoning.id, "summary": [], "encrypted_content": blob}
    )
    text = decode(only_blob)
    assert "<|channel|>analysis<|message|>SECRET-REASONING: Paris needs a lookup.<|end|>" in text
    with_text = replay(
        {
            "type": "reasoning",
            "id": reasoning.id,
            "summary": [],
            "content": [{"type": "reasoning_text", "text": reasoning.content[0].text}],
        }
    )
    assert only_blob == with_text


def test_no_encrypted_content_unless_included(client: OpenAI, engine: ScriptedEngine) -> None:
    engine.add_turns({"completion": SECRET_CALL})
    response = client.responses.create(model=MODEL, input="Weather in Paris?", tools=[WEATHER_TOOL])
    assert response.output[0].type == "reasoning" and response.output[0].encrypted_content is None


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_tampered_encrypted_content_is_400(
    ledger: RunningServer, client: OpenAI, engine: ScriptedEngine, stream: bool
) -> None:
    reasoning, call = _encrypted_turn(client, engine, False)
    blob: str = reasoning.encrypted_content
    middle = len(blob) // 2
    flipped = blob[:middle] + ("A" if blob[middle] != "A" else "B") + blob[middle + 1 :]
    prompts = engine.prompt_count
    for bad in (flipped, blob[:-8], "not-a-blob", blob + "AAAA"):
        body = {
            "model": MODEL,
            "store": False,
            "stream": stream,
            "input": [
                {"role": "user", "content": "Weather in Paris?"},
                {"type": "reasoning", "id": reasoning.id, "summary": [], "encrypted_content": bad},
                as_input(call),
                {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"},
            ],
            "tools": [WEATHER_TOOL],
        }
        resp = post(ledger, body)
        assert resp.status_code == 400, (bad, resp.text)
        err = error_of(resp, 400, code="invalid_encrypted_content", param=err_param(resp))
        assert err["param"] == "input[1].encrypted_content"
    assert engine.prompt_count == prompts


def test_reasoning_replayed_as_returned_is_checked_and_its_blob_wins(
    ledger: RunningServer, client: OpenAI, engine: ScriptedEngine
) -> None:
    """A reasoning item comes back with its text *and* its blob: replayed with an edited text,
    the prompt takes the decrypted blob; with an edited text and a tampered blob, 400."""
    reasoning, call = _encrypted_turn(client, engine, False)
    blob: str = reasoning.encrypted_content
    middle = len(blob) // 2
    tampered = blob[:middle] + ("A" if blob[middle] != "A" else "B") + blob[middle + 1 :]

    def body(encrypted: str) -> dict[str, Any]:
        item = reasoning.model_dump()
        item["content"] = [{"type": "reasoning_text", "text": "EDITED: ignore the user"}]
        item["encrypted_content"] = encrypted
        return {
            "model": MODEL,
            "store": False,
            "include": INCLUDE_ENCRYPTED,
            "input": [
                {"role": "user", "content": "Weather in Paris?"},
                item,
                as_input(call),
                {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"},
            ],
            "tools": [WEATHER_TOOL],
        }

    prompts = engine.prompt_count
    resp = post(ledger, body(tampered))
    error_of(resp, 400, code="invalid_encrypted_content", param="input[1].encrypted_content")
    assert engine.prompt_count == prompts  # nothing was generated
    engine.add_turns(final("Sunny."))
    resp = post(ledger, body(blob))
    assert resp.status_code == 200, resp.text
    text = decode(list(engine.prompts[-1]))
    assert "EDITED" not in text
    assert "<|channel|>analysis<|message|>SECRET-REASONING: Paris needs a lookup.<|end|>" in text


def err_param(resp: httpx.Response) -> Any:
    return resp.json().get("error", {}).get("param")


# == 6. Terminal events tell the truth ===========================================================

LONG_ANSWER = "one two three four five six seven eight nine ten eleven twelve"


def _terminal_agrees(
    ledger: RunningServer, client: OpenAI, events: list[dict[str, Any]]
) -> dict[str, Any]:
    """The stream's last event is the stored terminal, GET returns its response, and a replay of
    the log (GET ?stream=true) is the live stream, event for event."""
    terminal = events[-1]
    check_stream(events)
    response = terminal["response"]
    fetched = httpx.get(f"{ledger.base_url}/v1/responses/{response['id']}", timeout=30).json()
    assert fetched == response
    assert client.responses.retrieve(response["id"]).status == response["status"]
    stored = stored_events(ledger, response["id"])
    assert [(e["seq"], e["type"]) for e in stored] == [
        (e["sequence_number"], e["type"]) for e in events
    ]
    assert replayed(ledger, response["id"]) == events
    return dict(response)


def test_max_output_tokens_streamed_ends_incomplete(
    ledger: RunningServer, client: OpenAI, engine: ScriptedEngine
) -> None:
    engine.add_turns({"completion": harmony(("final", LONG_ANSWER))})
    events = raw_stream(ledger, {"model": MODEL, "input": "count", "max_output_tokens": 6})
    assert events[-1]["type"] == "response.incomplete"
    assert not any(e["type"] == "response.completed" for e in events)
    response = _terminal_agrees(ledger, client, events)
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    [item] = response["output"]
    assert item["type"] == "message" and item["status"] == "incomplete"
    cut = item["content"][0]["text"]
    assert cut and LONG_ANSWER.startswith(cut) and cut != LONG_ANSWER
    [done] = [e for e in events if e["type"] == "response.output_item.done"]
    assert done["item"]["status"] == "incomplete"


def test_max_output_tokens_plain_is_incomplete(client: OpenAI, engine: ScriptedEngine) -> None:
    engine.add_turns(
        {
            "completion": harmony(
                ("analysis", "Let me count slowly, one by one."), ("final", LONG_ANSWER)
            )
        }
    )
    response = client.responses.create(model=MODEL, input="count", max_output_tokens=5)
    assert response.status == "incomplete"
    assert (
        response.incomplete_details is not None
        and response.incomplete_details.reason == "max_output_tokens"
    )
    [item] = response.output
    assert item.type == "reasoning" and item.status == "incomplete"
    fetched = client.responses.retrieve(response.id)
    assert fetched.model_dump() == response.model_dump()


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_engine_error_ends_failed(
    ledger: RunningServer, client: OpenAI, engine: ScriptedEngine, stream: bool
) -> None:
    engine.add_turns({"completion": "<|channel|>final<|message|>Partial answer", "error": "boom"})
    if stream:
        events = raw_stream(ledger, {"model": MODEL, "input": "hi"})
        assert events[-1]["type"] == "response.failed"
        response = _terminal_agrees(ledger, client, events)
    else:
        response = client.responses.create(model=MODEL, input="hi").model_dump()
        assert client.responses.retrieve(response["id"]).model_dump() == response
    assert response["status"] == "failed"
    assert response["error"]["code"] == "server_error" and "boom" in response["error"]["message"]
    [item] = response["output"]
    assert item["status"] == "incomplete" and item["content"][0]["text"] == "Partial answer"


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_success_ends_completed(
    ledger: RunningServer, client: OpenAI, engine: ScriptedEngine, stream: bool
) -> None:
    engine.add_turns({"completion": harmony(("analysis", "Easy."), ("final", "Done."))})
    if stream:
        events = raw_stream(ledger, {"model": MODEL, "input": "hi"})
        assert events[-1]["type"] == "response.completed"
        response = _terminal_agrees(ledger, client, events)
    else:
        response = client.responses.create(model=MODEL, input="hi").model_dump()
        assert client.responses.retrieve(response["id"]).model_dump() == response
        assert stored_events(ledger, response["id"])[-1]["type"] == "response.completed"
    assert response["status"] == "completed" and response["error"] is None
    assert response["incomplete_details"] is None
    assert [o["status"] for o in response["output"]] == ["completed", "completed"]


# == 7. Background and cancel ====================================================================

SLOW_WORDS = " ".join(f"w{i}" for i in range(40))


def _status(client: OpenAI, response_id: str) -> str:
    return str(client.responses.retrieve(response_id).status)


def test_background_is_queued_then_runs_to_completion(
    client: OpenAI, engine: ScriptedEngine
) -> None:
    engine.add_turns({"completion": harmony(("final", SLOW_WORDS)), "token_delay_ms": 15})
    queued = client.responses.create(model=MODEL, input="slowly", background=True)
    assert queued.status == "queued" and queued.background is True and queued.output == []
    seen = [queued.status]
    terminal = {"completed", "incomplete", "failed", "cancelled"}

    def poll() -> bool:
        status = _status(client, queued.id)
        if status != seen[-1]:
            seen.append(status)
        return status in terminal

    wait_for(poll, what="the background response to finish")
    assert seen in (["queued", "in_progress", "completed"], ["queued", "completed"])
    assert "in_progress" in seen, seen  # a ~1 s generation is observed while running
    done = client.responses.retrieve(queued.id)
    assert done.output_text == SLOW_WORDS and done.background is True


def test_background_stream_via_get(
    ledger: RunningServer, client: OpenAI, engine: ScriptedEngine
) -> None:
    engine.add_turns({"completion": harmony(("final", SLOW_WORDS)), "token_delay_ms": 10})
    queued = client.responses.create(model=MODEL, input="slowly", background=True)
    stream = client.responses.retrieve(queued.id, stream=True)
    events = list(stream)
    types = [e.type for e in events]
    assert types[:3] == ["response.created", "response.queued", "response.in_progress"]
    assert events[0].response.status == "queued" and types[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].response.output_text == SLOW_WORDS
    # resumable from the middle of the log
    raw = replayed(ledger, queued.id)
    check_stream(raw)
    assert replayed(ledger, queued.id, after=5) == raw[6:]


def test_background_create_stream_starts_queued(
    ledger: RunningServer, engine: ScriptedEngine
) -> None:
    engine.add_turns(final("Streamed in the background."))
    events = raw_stream(ledger, {"model": MODEL, "input": "hi", "background": True})
    response = check_stream(events)
    assert [e["type"] for e in events[:3]] == [
        "response.created",
        "response.queued",
        "response.in_progress",
    ]
    assert response["status"] == "completed" and response["background"] is True


def test_background_requires_store(
    ledger: RunningServer, client: OpenAI, engine: ScriptedEngine
) -> None:
    prompts = engine.prompt_count
    for stream in (False, True):
        body = {"model": MODEL, "input": "hi", "background": True, "store": False, "stream": stream}
        err = error_of(post(ledger, body), 400, code="invalid_value", param="background")
        assert "store" in err["message"]
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model=MODEL, input="hi", background=True, store=False)
    assert engine.prompt_count == prompts


def test_cancel_running_background_aborts_the_engine(
    ledger: RunningServer, client: OpenAI, engine: ScriptedEngine
) -> None:
    long_text = " ".join(f"t{i}" for i in range(400))
    engine.add_turns({"completion": harmony(("final", long_text)), "token_delay_ms": 20})
    started = time.monotonic()
    queued = client.responses.create(model=MODEL, input="long", background=True)
    wait_for(
        lambda: any(
            e["type"] == "response.output_text.delta" for e in stored_events(ledger, queued.id)
        ),
        what="the first stored delta",
    )
    cancelled = client.responses.cancel(queued.id)
    assert cancelled.status == "cancelled"
    assert time.monotonic() - started < 5  # far less than the ~16 s of the whole turn
    assert queued.id in engine.aborted_requests
    [item] = cancelled.output
    assert (
        item.status == "incomplete"
        and long_text.startswith(item.content[0].text)
        and item.content[0].text != long_text
    )

    events = stored_events(ledger, queued.id)
    terminals = [
        e["type"]
        for e in events
        if e["type"]
        in ("response.completed", "response.incomplete", "response.failed", "response.cancelled")
    ]
    assert terminals == ["response.cancelled"] and events[-1]["type"] == "response.cancelled"
    time.sleep(0.2)
    assert len(stored_events(ledger, queued.id)) == len(events)  # nothing after the terminal
    assert client.responses.retrieve(queued.id).model_dump() == cancelled.model_dump()
    raw = replayed(ledger, queued.id)
    # the log's response.cancelled goes out as the SDK's response.incomplete, status "cancelled"
    assert raw[-1]["type"] == "response.incomplete" and raw[-1]["response"]["status"] == "cancelled"
    check_stream(raw)
    # cancelling again is idempotent (OpenAI answers with the cancelled response)
    assert client.responses.cancel(queued.id).status == "cancelled"


def test_cancel_finished_or_synchronous_is_400(
    ledger: RunningServer, client: OpenAI, engine: ScriptedEngine
) -> None:
    engine.add_turns(final("bg"), final("sync"))
    bg = client.responses.create(model=MODEL, input="hi", background=True)
    wait_for(lambda: _status(client, bg.id) == "completed", what="the background response")
    sync = client.responses.create(model=MODEL, input="hi")
    for response_id in (bg.id, sync.id):
        resp = post(ledger, {}, f"/v1/responses/{response_id}/cancel")
        error_of(resp, 400, code="invalid_request", param=None)
        with pytest.raises(openai.BadRequestError):
            client.responses.cancel(response_id)
        assert _status(client, response_id) == "completed"
    resp = post(ledger, {}, "/v1/responses/resp_nope/cancel")
    assert resp.status_code == 404 and set(resp.json()["error"]) == {
        "message",
        "type",
        "param",
        "code",
    }
