"""The honest contract through the OpenAI SDK against the real server (issue 17): what the server
cannot honour is a 400 in OpenAI's shape naming the parameter; what it takes is echoed; every
Response it returns, from the first streamed snapshot on, carries every field of the SDK's
``Response`` model."""

from __future__ import annotations

import json
import typing
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI
from openai.types.responses import Response, ResponseIncludable
from openai.types.responses.service_tier import ServiceTier
from openai.types.shared.reasoning_effort import ReasoningEffort

from app.contract import EFFORTS, HOSTED_TOOL_TYPES, SUPPORTED_TOOL_TYPES
from app.encoding import load_encoding
from app.engines.scripted import ScriptedEngine
from tests.e2e.conftest import MODEL, harmony, sse_events
from tests.support.server import RunningServer

FUNCTION = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def _literal_values(alias: Any) -> list[str]:
    return [
        v
        for arg in typing.get_args(alias)
        for v in (typing.get_args(arg) or [arg])
        if isinstance(v, str)
    ]


def _refused(client: OpenAI, **kwargs: Any) -> dict[str, Any]:
    """The error body of a create that must be a 400."""
    kwargs.setdefault("input", "hi")
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model=MODEL, **kwargs)
    body = caught.value.body
    assert isinstance(body, dict) and set(body) == {"message", "type", "param", "code"}, body
    assert body["type"] == "invalid_request_error"
    return body


def _answered(engine: ScriptedEngine, client: OpenAI, **kwargs: Any) -> Response:
    engine.add_turns({"completion": harmony(("final", "ok"))})
    kwargs.setdefault("input", "hi")
    response: Response = client.responses.create(model=MODEL, **kwargs)
    assert response.status == "completed", response
    return response


# -- unknown and refused parameters ---------------------------------------------------------------


@pytest.mark.parametrize("name", ["no_such_parameter", "messages", "n"])
def test_an_unknown_top_level_parameter_is_openais_unknown_parameter(
    client: OpenAI, name: str
) -> None:
    error = _refused(client, extra_body={name: 1})
    assert error == {
        "message": f"Unrecognized request argument supplied: {name}",
        "type": "invalid_request_error",
        "param": name,
        "code": "unknown_parameter",
    }


@pytest.mark.parametrize(
    ("name", "value", "why"),
    [
        ("prompt", {"id": "pmpt_123", "version": "2"}, "Prompt templates"),
        ("moderation", {"model": "omni-moderation-latest"}, "moderation"),
        ("access_programs", {"cyber": "standard"}, "access programs"),
    ],
)
def test_a_refused_parameter_is_a_400_naming_it_and_saying_why(
    client: OpenAI, engine: ScriptedEngine, name: str, value: Any, why: str
) -> None:
    error = _refused(client, extra_body={name: value})
    assert error["param"] == name and error["code"] == "unsupported_parameter"
    assert why in error["message"]
    _answered(engine, client, extra_body={name: None})  # null is the same as absent


# -- tools ----------------------------------------------------------------------------------------

HOSTED = [
    {"type": "web_search"},
    {"type": "web_search_preview"},
    {"type": "file_search", "vector_store_ids": ["vs_1"]},
    {"type": "code_interpreter", "container": {"type": "auto"}},
    {"type": "mcp", "server_label": "deepwiki", "server_url": "https://mcp.deepwiki.com/mcp"},
    {"type": "image_generation"},
    {
        "type": "computer_use_preview",
        "display_width": 1024,
        "display_height": 768,
        "environment": "linux",
    },
    {"type": "local_shell"},
    {"type": "shell"},
    {"type": "apply_patch"},
]


@pytest.mark.parametrize("tool", HOSTED, ids=lambda tool: str(tool["type"]))
def test_a_hosted_tool_is_a_400_naming_it_and_the_supported_types(
    client: OpenAI, tool: dict[str, Any]
) -> None:
    error = _refused(client, tools=[FUNCTION, tool])
    assert error["param"] == "tools[1].type"
    assert f"'{tool['type']}'" in error["message"] and "hosted tool" in error["message"]
    assert "supported tool types: function, custom, namespace" in error["message"]


def test_an_unknown_tool_type_and_one_inside_a_namespace_are_400s(client: OpenAI) -> None:
    error = _refused(client, tools=[{"type": "teleport"}])
    assert error["param"] == "tools[0].type" and "Unknown tool type 'teleport'" in error["message"]
    namespace = {
        "type": "namespace",
        "name": "crm",
        "description": "CRM.",
        "tools": [FUNCTION, {"type": "mcp"}],
    }
    error = _refused(client, tools=[namespace])
    assert error["param"] == "tools[0].tools[1].type"


def test_a_grammar_in_a_syntax_no_backend_reads_is_a_400_on_every_engine(client: OpenAI) -> None:
    """The scripted engine enforces no grammar, and still an ``ebnf`` one is refused, in a
    namespace too; a grammar without its definition as well."""
    ebnf: Any = {
        "type": "custom",
        "name": "e",
        "format": {"type": "grammar", "syntax": "ebnf", "definition": "a ::= 'x'"},
    }
    error = _refused(client, tools=[ebnf])
    assert error["param"] == "tools[0].format.syntax" and "'lark' or 'regex'" in error["message"]
    namespace: Any = {
        "type": "namespace",
        "name": "db",
        "description": "DB.",
        "tools": [FUNCTION, ebnf],
    }
    assert _refused(client, tools=[namespace])["param"] == "tools[0].tools[1].format.syntax"
    empty: Any = {
        "type": "custom",
        "name": "e",
        "format": {"type": "grammar", "syntax": "lark", "definition": " "},
    }
    assert _refused(client, tools=[empty])["param"] == "tools[0].format.definition"


def test_every_sdk_tool_type_is_offered_or_refused_as_hosted() -> None:
    from openai.types.responses.tool_param import ToolParam

    sdk = {
        v
        for member in typing.get_args(ToolParam)
        for v in _literal_values(member.__annotations__["type"])
    }
    assert sdk <= {*SUPPORTED_TOOL_TYPES, *HOSTED_TOOL_TYPES}, sdk - {
        *SUPPORTED_TOOL_TYPES,
        *HOSTED_TOOL_TYPES,
    }


def test_offered_tool_types_still_work(client: OpenAI, engine: ScriptedEngine) -> None:
    namespace = {"type": "namespace", "name": "crm", "description": "CRM.", "tools": [FUNCTION]}
    custom = {"type": "custom", "name": "apply_patch", "description": "Edit files."}
    _answered(engine, client, tools=[FUNCTION, namespace, custom])


# -- include --------------------------------------------------------------------------------------


def test_an_unknown_include_value_is_a_400(client: OpenAI) -> None:
    error = _refused(client, include=["reasoning.encrypted_content", "bogus.value"])
    assert error["param"] == "include[1]" and "'bogus.value'" in error["message"]


@pytest.mark.parametrize(
    "value",
    [
        "file_search_call.results",
        "web_search_call.results",
        "web_search_call.action.sources",
        "code_interpreter_call.outputs",
        "computer_call_output.output.image_url",
    ],
)
def test_an_include_of_a_hosted_tool_is_a_400_saying_why(client: OpenAI, value: str) -> None:
    error = _refused(client, include=[value])
    assert error["param"] == "include[0]" and error["code"] == "unsupported_value"
    assert "hosted tool this server does not run" in error["message"]


def test_the_includes_the_server_delivers_are_accepted(
    client: OpenAI, engine: ScriptedEngine
) -> None:
    sdk = set(_literal_values(ResponseIncludable))
    kept = [
        "reasoning.encrypted_content",
        "message.input_image.image_url",
    ]
    # message.output_text.logprobs too, on an engine that has them (tests/engines/
    # test_vllm_logprobs.py); the scripted one answers 400 (tests/e2e/test_logprobs_refused.py)
    assert {*kept, "message.output_text.logprobs"} <= sdk
    _answered(engine, client, include=kept, top_logprobs=2)


# -- text -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "param"),
    [
        ({"format": {"type": "yaml"}}, "text.format.type"),
        ({"format": {}}, "text.format.type"),
        ({"format": "json"}, "text.format"),
        ({"format": {"type": "json_schema", "schema": {"type": "object"}}}, "text.format.name"),
        (
            {"format": {"type": "json_schema", "name": "has space", "schema": {}}},
            "text.format.name",
        ),
        ({"format": {"type": "json_schema", "name": "x" * 65, "schema": {}}}, "text.format.name"),
        ({"format": {"type": "json_schema", "name": "answer"}}, "text.format.schema"),
        ({"format": {"type": "json_schema", "name": "answer", "schema": []}}, "text.format.schema"),
        (
            {"format": {"type": "json_schema", "name": "a", "schema": {}, "strict": "yes"}},
            "text.format.strict",
        ),
        ({"verbosity": "chatty"}, "text.verbosity"),
    ],
)
def test_a_text_config_of_the_wrong_shape_is_a_400_naming_the_field(
    client: OpenAI, text: dict[str, Any], param: str
) -> None:
    assert _refused(client, text=text)["param"] == param


@pytest.mark.parametrize(
    "text",
    [
        {"format": {"type": "text"}},
        {"format": {"type": "json_object"}},
        {
            "format": {
                "type": "json_schema",
                "name": "weather-report_2",
                "description": "A report.",
                "schema": {
                    "type": "object",
                    "properties": {"t": {"type": "number"}},
                    "required": ["t"],
                },
                "strict": True,
            },
            "verbosity": "low",
        },
        {"verbosity": "high"},
    ],
)
def test_text_configs_openai_takes_are_accepted_and_echoed(
    client: OpenAI, engine: ScriptedEngine, text: dict[str, Any]
) -> None:
    response = _answered(engine, client, text=text)
    assert response.text is not None
    echoed = response.text.model_dump(by_alias=True, exclude_none=True)
    assert echoed == text or echoed == {**text, "format": {"type": "text"}}


# -- service_tier, reasoning ----------------------------------------------------------------------


def test_a_service_tier_openai_does_not_know_is_a_400(client: OpenAI) -> None:
    error = _refused(client, extra_body={"service_tier": "bogus"})
    assert error["param"] == "service_tier" and "'priority'" in error["message"]


@pytest.mark.parametrize("tier", _literal_values(ServiceTier))
def test_every_service_tier_of_the_sdk_is_accepted_and_echoed(
    client: OpenAI, engine: ScriptedEngine, tier: str
) -> None:
    assert _answered(engine, client, service_tier=tier).service_tier == tier


@pytest.mark.parametrize("effort", _literal_values(ReasoningEffort))
def test_every_reasoning_effort_of_the_sdk_renders_as_its_documented_harmony_level(
    client: OpenAI, engine: ScriptedEngine, effort: str
) -> None:
    response = _answered(engine, client, reasoning={"effort": effort})  # type: ignore[typeddict-item]
    assert response.reasoning is not None and response.reasoning.effort == effort
    prompt = load_encoding().decode_utf8(engine.prompts[-1])
    assert f"Reasoning: {EFFORTS[effort]}" in prompt


def test_an_unknown_reasoning_effort_is_a_400(client: OpenAI) -> None:
    assert _refused(client, reasoning={"effort": "extreme"})["param"] == "reasoning.effort"  # type: ignore[typeddict-item]


# -- penalties ------------------------------------------------------------------------------------


def _raw(response: Response) -> dict[str, Any]:
    return response.model_dump()  # extras (the penalties are not in the SDK's model) included


def test_penalties_are_echoed_zero_by_default(client: OpenAI, engine: ScriptedEngine) -> None:
    raw = _raw(_answered(engine, client))
    assert raw["presence_penalty"] == 0 and raw["frequency_penalty"] == 0
    raw = _raw(
        _answered(engine, client, extra_body={"presence_penalty": 1.5, "frequency_penalty": -0.5})
    )
    assert raw["presence_penalty"] == 1.5 and raw["frequency_penalty"] == -0.5


@pytest.mark.parametrize("name", ["presence_penalty", "frequency_penalty"])
@pytest.mark.parametrize("value", [2.5, -2.01, "high"])
def test_a_penalty_outside_minus_two_to_two_is_a_400(client: OpenAI, name: str, value: Any) -> None:
    assert _refused(client, extra_body={name: value})["param"] == name


# -- every Response field, from the first snapshot on ---------------------------------------------

SDK_FIELDS = set(Response.model_fields)


def test_streamed_snapshots_and_a_get_carry_every_field_of_the_sdk_response(
    ledger: RunningServer, client: OpenAI, engine: ScriptedEngine
) -> None:
    engine.add_turns({"completion": harmony(("analysis", "Think."), ("final", "Done."))})
    body = {"model": MODEL, "input": "hi", "stream": True}
    with httpx.stream("POST", ledger.base_url + "/v1/responses", json=body, timeout=60) as resp:
        assert resp.status_code == 200
        events = sse_events(resp.read())
    snapshots = {e["type"]: e["response"] for e in events if "response" in e}
    assert {"response.created", "response.in_progress", "response.completed"} <= set(snapshots)
    for kind, snapshot in snapshots.items():
        assert set(snapshot) >= SDK_FIELDS, (kind, sorted(SDK_FIELDS - set(snapshot)))
        assert snapshot["presence_penalty"] == 0 and snapshot["frequency_penalty"] == 0
        Response.model_validate(snapshot)
    assert snapshots["response.created"]["completed_at"] is None
    assert snapshots["response.in_progress"]["completed_at"] is None
    assert isinstance(snapshots["response.completed"]["completed_at"], int)

    response_id = snapshots["response.created"]["id"]
    got = httpx.get(f"{ledger.base_url}/v1/responses/{response_id}", timeout=60).json()
    assert set(got) >= SDK_FIELDS, sorted(SDK_FIELDS - set(got))
    assert got == snapshots["response.completed"]
    assert client.responses.retrieve(response_id).completed_at == got["completed_at"]


def test_a_background_post_answers_with_every_field(
    ledger: RunningServer, engine: ScriptedEngine
) -> None:
    engine.add_turns({"completion": harmony(("final", "Later."))})
    body = {"model": MODEL, "input": "hi", "background": True}
    queued = httpx.post(ledger.base_url + "/v1/responses", json=body, timeout=60).json()
    assert set(queued) >= SDK_FIELDS, sorted(SDK_FIELDS - set(queued))
    assert queued["completed_at"] is None and queued["status"] in ("queued", "in_progress")
    json.dumps(queued)


# -- hints ----------------------------------------------------------------------------------------


def test_hints_are_accepted_and_the_echoed_ones_echoed(
    client: OpenAI, engine: ScriptedEngine
) -> None:
    response = _answered(
        engine,
        client,
        prompt_cache_key="k1",
        prompt_cache_retention="24h",
        safety_identifier="s1",
        user="u1",
        max_tool_calls=3,
        parallel_tool_calls=False,
        extra_body={
            "image": {"context_compression": "auto"},
            "prompt_cache_options": {"mode": "implicit"},
            "background_options": {"completion_window": "soonest"},
            "client_metadata": {"session_id": "x"},
        },
    )
    assert (response.prompt_cache_key, response.prompt_cache_retention) == ("k1", "24h")
    assert (response.safety_identifier, response.user) == ("s1", "u1")
    assert (response.max_tool_calls, response.parallel_tool_calls) == (3, False)


@pytest.mark.parametrize(
    ("window", "code"), [("2h", "unsupported_value"), ("tomorrow", "invalid_value")]
)
def test_a_deferred_completion_window_is_a_400(client: OpenAI, window: str, code: str) -> None:
    error = _refused(
        client, background=True, extra_body={"background_options": {"completion_window": window}}
    )
    assert error["param"] == "background_options.completion_window" and error["code"] == code
