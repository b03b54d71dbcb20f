"""The recording fake streams what OpenAI would: its canned turns pass every checker we have.

The requests are the real ones recorded from Codex and the Agents SDK (tests/fixtures), so the
tool echo in the Response objects (function, namespace, web_search, custom) is checked as well.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI

from tests.clients.captures import agents_turns, codex_turns
from tests.clients.fake_server import RecordingServer, ResponseScript, Turn
from tests.support import openapi
from tests.support.stream_checker import check_stream, validate_with_sdk

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _fixture(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / name).read_text(encoding="utf-8"))


_CASES = [
    ("codex/turn1.request.json", codex_turns, 0),
    ("codex/turn2.request.json", codex_turns, 1),
    ("codex/catalog-model-gpt-5.5.turn1.request.json", codex_turns, 0),
    ("agents/streamed.turn1.request.json", agents_turns, 0),
    ("agents/streamed.turn2.request.json", agents_turns, 1),
]


@pytest.mark.parametrize(("request_file", "turns", "turn"), _CASES)
def test_canned_streams_pass_every_checker(
    request_file: str, turns: Callable[[], list[Turn]], turn: int
) -> None:
    request = _fixture(request_file)
    script = turns()[turn](request, "resp_check")
    events = script.events()
    final = check_stream(events)
    validate_with_sdk(events)
    for event in events:
        openapi.validate_stream_event(event)
    openapi.validate_response(final)
    openapi.validate_response(script.final())
    assert final == script.final()


def _post(url: str, body: Mapping[str, Any]) -> tuple[int, str, bytes]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"content-type": "application/json"})  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers["content-type"], response.read()
    except urllib.error.HTTPError as e:
        with e:
            return e.code, e.headers["content-type"], e.read()


def _one_message(text: str) -> Turn:
    def turn(request: Mapping[str, Any], response_id: str) -> ResponseScript:
        script = ResponseScript(request, response_id=response_id)
        script.message(text)
        return script

    return turn


def test_the_openai_sdk_parses_the_fake_streamed_and_not() -> None:
    with (
        RecordingServer([_one_message("streamed"), _one_message("whole")]) as server,
        OpenAI(base_url=server.base_url, api_key="sk-dummy", max_retries=0) as client,
    ):
        with client.responses.stream(model="gpt-oss-120b", input="hi") as stream:
            streamed = stream.get_final_response()
        whole = client.responses.create(model="gpt-oss-120b", input="hi")
    assert streamed.output_text == "streamed"
    assert whole.output_text == "whole"
    first, second = server.response_bodies
    assert first["stream"] is True and "stream" not in second
    assert server.requests[0].headers["authorization"] == "Bearer sk-dummy"


def test_the_fake_refuses_what_it_was_not_scripted_for() -> None:
    with RecordingServer([_one_message("only one")]) as server:
        base = server.base_url
        assert _post(f"{base}/responses", {"model": "m", "input": "a"})[0] == 200
        status, content_type, body = _post(f"{base}/responses", {"model": "m", "input": "b"})
        assert (status, content_type) == (500, "application/json")
        assert "unscripted request #2" in json.loads(body)["error"]["message"]
        assert _post(f"{base}/chat/completions", {"model": "m"})[0] == 404
    assert [r.path for r in server.requests] == [
        "/v1/responses",
        "/v1/responses",
        "/v1/chat/completions",
    ]
