"""Structured outputs on the real vLLM engine (CPU build, tiny random-weight gpt-oss), through the
OpenAI SDK and the Agents SDK over a real socket.

Random weights write random tokens, so an output that parses and validates 50 times out of 50
cannot be luck: it is the grammar (``domain.constraints``, enforced by vLLM's ``guidance``
backend). Each output is checked by an independent validator (``jsonschema``; the ``lark``
package's own parser for a Lark grammar; ``re.fullmatch`` for a regex), never by llguidance.
The engine's ``--logit-bias`` makes ``<|end|>`` likely, so the random model's reasoning ends after
a few tokens instead of filling the context; reasoning is still free text, which is checked too.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

import httpx
import jsonschema
import lark
import pytest
import pytest_asyncio
from openai import AsyncOpenAI
from pydantic import BaseModel, Field

from app.engines.vllm import VllmEngine
from app.main import create_app
from app.settings import Settings
from tests.support.server import serve_in_loop

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
MODEL = "gpt-oss-tiny"
RUNS = 50
END = 200007  # <|end|>
#: Enough that a random model ends its reasoning after a handful of tokens (measured: 1-15).
END_BIAS = 9.0

FORECAST = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "units": {"enum": ["celsius", "fahrenheit"]},
        "days": {
            "type": "array",
            "maxItems": 3,
            "items": {
                "type": "object",
                "properties": {
                    "day": {"type": "integer", "minimum": 1, "maximum": 7},
                    "rain": {"type": "boolean"},
                    "sky": {"enum": ["clear", "cloudy", "storm"]},
                },
                "required": ["day", "rain", "sky"],
                "additionalProperties": False,
            },
        },
        "source": {
            "type": "object",
            "properties": {
                "name": {"enum": ["met", "noaa"]},
                "confidence": {"type": "integer", "minimum": 0, "maximum": 100},
            },
            "required": ["name", "confidence"],
            "additionalProperties": False,
        },
    },
    "required": ["city", "units", "days", "source"],
    "additionalProperties": False,
}
BOOKING = {
    "type": "object",
    "properties": {
        "guests": {"type": "integer", "minimum": 1, "maximum": 8},
        "room": {"enum": ["single", "double", "suite"]},
        "extras": {"type": "array", "items": {"enum": ["breakfast", "parking"]}, "maxItems": 2},
    },
    "required": ["guests", "room", "extras"],
    "additionalProperties": False,
}
SQL_LARK = r"""
start: "SELECT " columns " FROM " table where?
columns: column (", " column)? (", " column)?
column: "id" | "name" | "email"
table: "users" | "orders"
where: " WHERE " column " = " NUMBER
NUMBER: /[0-9]{1,4}/
"""
SQL_REGEX = r"^SELECT (id|name) FROM (users|orders)( LIMIT [1-9][0-9]?)?$"


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def base_url(
    vllm_engine: VllmEngine, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[str]:
    db: Path = tmp_path_factory.mktemp("structured") / "responses.db"
    settings = Settings(
        engine="vllm", database_url=f"sqlite+aiosqlite:///{db}", served_model_names=(MODEL,)
    )
    assert vllm_engine.constrains, "the tiny model directory has the o200k_harmony tokenizer"
    saved = dict(vllm_engine.logit_bias)
    vllm_engine.logit_bias[END] = END_BIAS
    try:
        async with serve_in_loop(create_app(settings, engine=vllm_engine)) as url:
            yield url
    finally:
        vllm_engine.logit_bias.clear()
        vllm_engine.logit_bias.update(saved)


@pytest_asyncio.fixture(loop_scope="session")
async def client(base_url: str) -> AsyncIterator[AsyncOpenAI]:
    async with AsyncOpenAI(base_url=base_url + "/v1", api_key="x", max_retries=0, timeout=300) as c:
        yield c


async def _many(make: Any, runs: int = RUNS) -> list[Any]:
    """``runs`` requests, 10 at a time (the CPU engine batches them)."""
    results: list[Any] = []
    for start in range(0, runs, 10):
        results.extend(
            await asyncio.gather(*(make(i) for i in range(start, min(start + 10, runs))))
        )
    return results


def _texts(response: Any, kind: str) -> list[str]:
    out = []
    for item in response.output:
        if item.type == kind == "message":
            out.extend(part.text for part in item.content)
        elif item.type == kind == "reasoning":
            out.extend(part.text for part in item.content or [])
    return out


async def test_50_final_outputs_validate_against_a_nested_schema_and_reasoning_stays_free(
    client: AsyncOpenAI,
) -> None:
    fmt = {"type": "json_schema", "name": "forecast", "schema": FORECAST, "strict": True}

    async def one(i: int) -> Any:
        return await client.responses.create(
            model=MODEL,
            input=f"Forecast {i}",
            text={"format": fmt},
            max_output_tokens=400,
            temperature=1.0,
        )

    responses = await _many(one)
    valid, reasoning = 0, []
    for response in responses:
        assert response.status == "completed", (
            response.status,
            response.incomplete_details,
            response.output,
        )
        [text] = _texts(response, "message")
        jsonschema.validate(json.loads(text), FORECAST)
        valid += 1
        reasoning.extend(_texts(response, "reasoning"))
    assert valid == RUNS
    # reasoning came first and is not held to the schema: random text, not JSON
    assert len(reasoning) >= RUNS // 5, len(reasoning)
    assert any(not _is_json(t) for t in reasoning if t)
    assert all("<|" not in t for t in reasoning)


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


async def test_50_strict_function_calls_validate(client: AsyncOpenAI) -> None:
    tools: list[Any] = [
        {
            "type": "function",
            "name": "book_room",
            "description": "Book.",
            "parameters": BOOKING,
            "strict": True,
        },
        {
            "type": "function",
            "name": "get_forecast",
            "description": "Weather.",
            "parameters": FORECAST,
            "strict": True,
        },
    ]
    schemas = {"book_room": BOOKING, "get_forecast": FORECAST}

    async def one(i: int) -> Any:
        return await client.responses.create(
            model=MODEL,
            input=f"Do it {i}",
            tools=tools,
            tool_choice="required",
            max_output_tokens=400,
        )

    names = set()
    for response in await _many(one):
        assert response.status == "completed", (response.status, response.output)
        [call] = [item for item in response.output if item.type == "function_call"]
        jsonschema.validate(json.loads(call.arguments), schemas[call.name])
        names.add(call.name)
    assert names == {"book_room", "get_forecast"}  # the model chose the tool; each validates


@pytest.mark.parametrize("syntax", ["lark", "regex"])
async def test_50_grammar_payloads_parse_with_the_grammar(client: AsyncOpenAI, syntax: str) -> None:
    definition = SQL_LARK if syntax == "lark" else SQL_REGEX
    tool: Any = {
        "type": "custom",
        "name": "run_sql",
        "description": "Runs one read-only query.",
        "format": {"type": "grammar", "syntax": syntax, "definition": definition},
    }
    parser = lark.Lark(definition, start="start") if syntax == "lark" else None

    async def one(i: int) -> Any:
        return await client.responses.create(
            model=MODEL,
            input=f"Query {i}",
            tools=[tool],
            tool_choice={"type": "custom", "name": "run_sql"},
            max_output_tokens=200,
        )

    payloads = []
    for response in await _many(one):
        assert response.status == "completed", (response.status, response.output)
        [call] = [item for item in response.output if item.type == "custom_tool_call"]
        payloads.append(call.input)
        if parser is not None:
            parser.parse(call.input)
        else:
            assert re.fullmatch(SQL_REGEX.strip("^$"), call.input), call.input
    assert len(payloads) == RUNS and len(set(payloads)) > 5  # sampled, not one fixed string


async def test_a_grammar_that_does_not_compile_is_a_400_naming_the_tool(
    client: AsyncOpenAI, base_url: str
) -> None:
    bad: Any = {
        "type": "custom",
        "name": "broken",
        "format": {"type": "grammar", "syntax": "lark", "definition": 'start: "a" ('},
    }
    ok: Any = {
        "type": "function",
        "name": "f",
        "parameters": {"type": "object", "properties": {}},
        "strict": False,
    }
    async with httpx.AsyncClient(timeout=60) as http:
        reply = await http.post(
            f"{base_url}/v1/responses", json={"model": MODEL, "input": "x", "tools": [ok, bad]}
        )
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert (
            error["param"] == "tools[1].format.definition"
            and "cannot be enforced" in error["message"]
        )
        schema = {"type": "object", "properties": {"a": {"type": "no-such-type"}}}
        reply = await http.post(
            f"{base_url}/v1/responses",
            json={
                "model": MODEL,
                "input": "x",
                "text": {"format": {"type": "json_schema", "name": "s", "schema": schema}},
            },
        )
        assert reply.status_code == 400, reply.text
        assert reply.json()["error"]["param"] == "text.format.schema"
        ebnf: Any = {
            "type": "custom",
            "name": "e",
            "format": {"type": "grammar", "syntax": "ebnf", "definition": "a ::= 'x'"},
        }
        reply = await http.post(
            f"{base_url}/v1/responses", json={"model": MODEL, "input": "x", "tools": [ebnf]}
        )
        assert (
            reply.status_code == 400 and reply.json()["error"]["param"] == "tools[0].format.syntax"
        ), reply.text


class Day(BaseModel):
    day: int = Field(ge=1, le=7)
    sky: Literal["clear", "cloudy", "storm"]


class Forecast(BaseModel):
    city: str = Field(max_length=10)
    days: list[Day] = Field(max_length=2)


async def test_responses_parse_returns_the_pydantic_model(client: AsyncOpenAI) -> None:
    for i in range(5):
        parsed = await client.responses.parse(
            model=MODEL, input=f"Forecast {i}", text_format=Forecast, max_output_tokens=400
        )
        assert parsed.status == "completed"
        assert isinstance(parsed.output_parsed, Forecast)


async def test_agents_sdk_output_type(client: AsyncOpenAI) -> None:
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, set_tracing_disabled

    set_tracing_disabled(True)
    agent = Agent(
        name="forecaster",
        instructions="Forecast.",
        model=OpenAIResponsesModel(model=MODEL, openai_client=client),
        model_settings=ModelSettings(max_tokens=400),
        output_type=Forecast,
    )
    for i in range(3):
        result = await Runner.run(agent, f"Forecast {i}")
        assert isinstance(result.final_output, Forecast)
