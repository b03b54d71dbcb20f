"""The pinned Codex CLI, driven end to end against the recording fake.

These pin down what Codex sends and what it needs back (the server must do the same for Codex to
work), and prove the harness (``tests.support.codex``) drives a real ``codex exec`` turn: a tool
call, the command actually running, its output coming back in the second request.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from app.contract import SUPPORTED_TOOL_TYPES
from tests.clients.captures import CODEX_CALL_ID, CODEX_MARKER, CodexSession, codex_session
from tests.clients.fake_server import ResponseScript, Turn
from tests.support import openapi
from tests.support.codex import codex_binary, codex_version
from tests.support.stream_checker import check_stream, validate_with_sdk

pytestmark = [
    pytest.mark.codex,
    pytest.mark.skipif(
        codex_binary() is None,
        reason="Codex CLI not installed (node_modules/.bin/codex): run scripts/install-codex.sh",
    ),
]

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "codex"


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> CodexSession:
    return codex_session(tmp_path_factory.mktemp("codex-work"))


def test_the_pinned_version_runs() -> None:
    pinned = json.loads((Path(__file__).resolve().parents[2] / "package.json").read_text())
    assert codex_version() == f"codex-cli {pinned['devDependencies']['@openai/codex']}"
    assert (FIXTURES / "VERSION").read_text().strip() == codex_version()


def test_codex_completes_a_tool_turn(session: CodexSession) -> None:
    run = session.run
    assert run.returncode == 0, run.describe()
    kinds = [e["type"] for e in run.events]
    assert kinds[0] == "thread.started" and kinds[-1] == "turn.completed", run.describe()
    assert "turn.failed" not in kinds
    (command,) = run.items("command_execution")
    assert command["exit_code"] == 0 and command["aggregated_output"] == f"{CODEX_MARKER}\n"
    assert [m["text"] for m in run.items("agent_message")] == [
        "Running the command.",
        f"The command printed {CODEX_MARKER}.",
    ]
    # turn.completed sums the usage of both responses
    assert run.of_type("turn.completed")[0]["usage"]["input_tokens"] == 200
    # an unknown model name is an `error` item, not a failure
    assert [e["message"] for e in run.items("error")] == [
        "Model metadata for `gpt-oss-120b` not found. Defaulting to fallback metadata; "
        "this can degrade performance and cause issues."
    ]


def test_the_second_request_carries_the_command_output(session: CodexSession) -> None:
    first, second = session.server.response_bodies
    n = len(first["input"])
    assert second["input"][:n] == first["input"], "Codex replays the whole history (store=false)"
    reasoning, commentary, call, output = second["input"][n:]
    turn1 = session.server.scripts[0].final()["output"]
    # reasoning comes back with its text *and* encrypted_content, without status
    assert reasoning == {k: v for k, v in turn1[0].items() if k != "status"}
    assert commentary == {**turn1[1], "phase": "commentary"}
    assert call == turn1[2]
    assert output["type"] == "function_call_output" and output["call_id"] == CODEX_CALL_ID
    assert output["id"].startswith("fco_")  # minted by Codex, not one of ours
    assert (
        f"Output:\n{CODEX_MARKER}\n" in output["output"]
        and "exited with code 0" in output["output"]
    )
    assert {k: v for k, v in second.items() if k not in ("input", "client_metadata")} == {
        k: v for k, v in first.items() if k not in ("input", "client_metadata")
    }


def test_what_the_first_request_looks_like(session: CodexSession) -> None:
    (request, _), headers = session.server.response_bodies, session.server.requests[0].headers
    assert request["stream"] is True and request["store"] is False
    assert request["include"] == ["reasoning.encrypted_content"]
    assert request["reasoning"] == {"summary": "auto"}
    assert request["tool_choice"] == "auto" and request["parallel_tool_calls"] is True
    assert "instructions" not in request and "previous_response_id" not in request
    assert isinstance(request["prompt_cache_key"], str)
    # the system prompt is a developer message; every input message has an id
    assert [(i["type"], i["role"]) for i in request["input"]] == [
        ("message", "developer"), ("message", "developer"), ("message", "user"), ("message", "user"),
    ]  # fmt: skip
    assert all(i["id"].startswith("msg_") for i in request["input"])
    assert request["input"][-1]["content"] == [
        {"type": "input_text", "text": f"Run `echo {CODEX_MARKER}` and tell me what it printed."}
    ]
    tools = {t.get("name", t["type"]): t for t in request["tools"]}
    shell = tools["exec_command"]
    assert shell["type"] == "function" and shell["strict"] is False
    assert shell["parameters"]["required"] == ["cmd"]
    namespace = tools["multi_agent_v1"]
    assert namespace["type"] == "namespace"
    assert {t["type"] for t in namespace["tools"]} == {"function"}
    # Codex declares its hosted web_search by default (the recorded fixtures hold it); the
    # harness's config disables it, since the server refuses hosted tools (app.contract): what
    # is left is only tool types the server offers
    assert "web_search" not in tools
    assert {t["type"] for t in request["tools"]} <= set(SUPPORTED_TOOL_TYPES)
    assert headers["authorization"] == "Bearer sk-ledger-dummy"
    assert headers["accept"] == "text/event-stream"
    assert headers["content-type"] == "application/json"


def test_the_streams_codex_accepted_pass_our_checkers(session: CodexSession) -> None:
    for script in session.server.scripts:
        events = script.events()
        check_stream(events)
        validate_with_sdk(events)
        for event in events:
            openapi.validate_stream_event(event)


def _request_shape(body: Mapping[str, Any]) -> dict[str, Any]:
    def tool(t: Mapping[str, Any]) -> Any:
        params = sorted((t.get("parameters") or {}).get("properties") or {})
        return [t["type"], t.get("name"), params, [tool(x) for x in t.get("tools", [])]]

    return {
        "keys": sorted(body),
        "settings": {
            k: body.get(k)
            for k in ("stream", "store", "include", "reasoning", "tool_choice", "text")
        },
        "tools": [tool(t) for t in body["tools"]],
        "input": [[i.get("type"), i.get("role"), sorted(i)] for i in body["input"]],
    }


def test_the_fixtures_match_a_live_capture(session: CodexSession) -> None:
    """If this fails after a Codex bump, run `python -m tests.clients.record_fixtures`."""
    for number, live in enumerate(session.server.response_bodies, 1):
        recorded = json.loads((FIXTURES / f"turn{number}.request.json").read_text())
        assert _request_shape(live) == _request_shape(recorded), f"turn {number}"


# -- what the stream must contain ------------------------------------------------------------


def _mutated(mutate: Callable[[list[dict[str, Any]]], list[dict[str, Any]]], text: str) -> Turn:
    class Script(ResponseScript):
        def events(self) -> list[dict[str, Any]]:
            mutated = mutate(copy.deepcopy(super().events()))
            return [{**e, "sequence_number": n} for n, e in enumerate(mutated)]

    def turn(request: Mapping[str, Any], response_id: str) -> ResponseScript:
        script = Script(request, response_id=response_id)
        script.message(text)
        return script

    return turn


def _terminal(kind: str, **fields: Any) -> Callable[[list[dict[str, Any]]], list[dict[str, Any]]]:
    def mutate(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        events[-1]["type"] = f"response.{kind}"
        events[-1]["response"].update(status=kind, **fields)
        return events

    return mutate


def _without_usage(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    del events[-1]["response"]["usage"]
    return events


@pytest.mark.parametrize(
    ("mutate", "outcome", "messages"),
    [
        pytest.param(lambda e: e, "turn.completed", ["hello"], id="full-stream"),
        pytest.param(_without_usage, "turn.completed", ["hello"], id="no-usage-is-fine"),
        pytest.param(
            lambda e: [x for x in e if x["type"] != "response.output_item.done"],
            "turn.completed", [], id="deltas-and-completed-output-are-ignored",
        ),
        pytest.param(lambda e: e[:-1], "turn.failed", ["hello"], id="no-terminal"),
        pytest.param(
            _terminal("incomplete", incomplete_details={"reason": "max_output_tokens"}),
            "turn.failed", ["hello"], id="incomplete",
        ),
        pytest.param(
            _terminal("failed", error={"code": "server_error", "message": "engine died"}),
            "turn.failed", ["hello"], id="failed",
        ),
    ],
)  # fmt: skip
def test_what_codex_needs_from_the_stream(
    tmp_path: Path,
    mutate: Callable[[list[dict[str, Any]]], list[dict[str, Any]]],
    outcome: str,
    messages: list[str],
) -> None:
    """Items come only from output_item.done; response.completed is what ends a turn."""
    run = codex_session(tmp_path, turns=[_mutated(mutate, "hello")]).run
    assert run.events[-1]["type"] == outcome, run.describe()
    assert [m["text"] for m in run.items("agent_message")] == messages
    if outcome == "turn.failed":
        assert run.returncode == 1
        assert run.events[-1]["error"]["message"] in {
            "stream disconnected before completion: stream closed before response.completed",
            "Incomplete response returned, reason: max_output_tokens",
            "stream disconnected before completion: engine died",
        }


def _calls(name: str, namespace: str | None) -> list[Turn]:
    def turn1(request: Mapping[str, Any], response_id: str) -> ResponseScript:
        script = ResponseScript(request, response_id=response_id)
        script.function_call(
            name, json.dumps({"target": "no-such-agent"}), call_id="call_ns", namespace=namespace
        )
        return script

    def turn2(request: Mapping[str, Any], response_id: str) -> ResponseScript:
        script = ResponseScript(request, response_id=response_id)
        script.message("done")
        return script

    return [turn1, turn2]


@pytest.mark.parametrize(
    ("name", "namespace", "routed"),
    [
        ("close_agent", "multi_agent_v1", True),
        ("multi_agent_v1.close_agent", None, False),
        ("close_agent", None, False),
    ],
)
def test_a_namespaced_tool_is_called_with_the_namespace_field(
    tmp_path: Path, name: str, namespace: str | None, routed: bool
) -> None:
    session = codex_session(tmp_path, turns=_calls(name, namespace))
    assert session.run.returncode == 0, session.run.describe()
    call, output = session.server.response_bodies[1]["input"][-2:]
    assert call["name"] == name and call.get("namespace") == namespace  # replayed as sent
    assert output["call_id"] == "call_ns"
    unsupported = output["output"] == f"unsupported call: {name}"
    assert unsupported is not routed, output["output"]
