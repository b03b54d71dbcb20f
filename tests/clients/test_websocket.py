"""WebSocket mode (``app.websocket``) driven by the openai SDK's ``client.responses.connect()``
against the real ledger (scripted engine, SQLite, uvicorn on a socket).

Each test reads the events the SDK parsed (its ``ResponsesServerEvent`` union) and checks them
against what HTTP says about the same response: the log (``/events``), ``GET``, and a resumed
``GET ?stream=true&starting_after=N``.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import websockets.sync.client
from openai import OpenAI
from websockets.exceptions import InvalidStatus

from app.encoding import load_encoding
from app.engines.scripted import ScriptedEngine
from app.settings import Settings
from tests.e2e.conftest import MODEL, harmony, sse_events
from tests.support.server import RunningServer, serve

TERMINAL = ("response.completed", "response.incomplete", "response.failed")


@pytest.fixture(autouse=True)
def _no_leftover_turns(engine: ScriptedEngine) -> Iterator[None]:
    with engine._lock:
        engine._next = len(engine._turns)
    yield


def _until(connection: Any, stop: Any) -> list[Any]:
    """Events from the connection up to and including the first for which ``stop`` is true."""
    events = []
    for event in connection:
        events.append(event)
        if stop(event):
            return events
    raise AssertionError(f"the socket ended after {[e.type for e in events]}")


def _terminal(event: Any) -> bool:
    return event.type in TERMINAL or event.type == "error"


def _wire(event: Any) -> dict[str, Any]:
    data: dict[str, Any] = event.to_dict()
    data.pop("stream_id", None)
    return data


def _answer(final: str, delay_ms: float = 0) -> dict[str, Any]:
    return {
        "completion": harmony(("analysis", "Thinking."), ("final", final)),
        "token_delay_ms": delay_ms,
    }


def _prompt_text(engine: ScriptedEngine, back: int = 1) -> str:
    return load_encoding().decode_utf8(engine.prompts[-back])


def test_a_response_over_the_socket_is_its_log(
    ledger: RunningServer, client: OpenAI, engine: ScriptedEngine
) -> None:
    engine.add_turns(_answer("Hello over the socket."))
    with client.responses.connect() as connection:
        connection.response.create(model=MODEL, input="Say hello.", stream_id="lane-a")
        events = _until(connection, _terminal)
    assert events[-1].type == "response.completed", [e.type for e in events]
    assert {e.stream_id for e in events} == {"lane-a"}  # every event names its lane
    assert [e.sequence_number for e in events] == list(range(len(events)))
    response_id = events[0].response.id
    assert events[-1].response.output_text == "Hello over the socket."
    # the same log over HTTP: its events, its fold, and a resumed stream from seq 3
    log = httpx.get(f"{ledger.base_url}/v1/responses/{response_id}/events", timeout=30).json()
    assert [(e["seq"], e["type"]) for e in log["data"]] == [
        (e.sequence_number, e.type) for e in events
    ]
    got = client.responses.retrieve(response_id)
    assert got.output_text == "Hello over the socket." and got.status == "completed"
    resumed = httpx.get(
        f"{ledger.base_url}/v1/responses/{response_id}",
        params={"stream": "true", "starting_after": "3"},
        timeout=30,
    )
    assert sse_events(resumed.content) == [_wire(e) for e in events[4:]]


def test_one_connection_runs_responses_in_turn_and_continues_them(
    client: OpenAI, engine: ScriptedEngine
) -> None:
    engine.add_turns(_answer("Noted: Zebulon."), _answer("Your name is Zebulon."))
    with client.responses.connect() as connection:
        connection.response.create(model=MODEL, input="My name is Zebulon.")
        first = _until(connection, _terminal)
        connection.response.create(
            model=MODEL, input="What is my name?", previous_response_id=first[0].response.id
        )
        second = _until(connection, _terminal)
    assert second[-1].type == "response.completed"
    assert second[-1].response.previous_response_id == first[0].response.id
    prompt = _prompt_text(engine)
    assert prompt.index("My name is Zebulon.") < prompt.index("Noted: Zebulon.")
    assert prompt.index("Noted: Zebulon.") < prompt.index("What is my name?")


def test_store_false_and_a_prewarm_continue_on_their_connection_only(
    ledger: RunningServer, client: OpenAI, engine: ScriptedEngine
) -> None:
    """What Codex does: ``generate: false`` first (its prewarm), then turns that send only the
    new items with ``previous_response_id``, all ``store: false``."""
    engine.add_turns(_answer("First answer."), _answer("Second answer."))
    count = engine.prompt_count
    with client.responses.connect() as connection:
        connection.response.create(
            model=MODEL, instructions="Be brief.", input="Prewarmed.", store=False, generate=False
        )
        prewarm = _until(connection, _terminal)
        assert [e.type for e in prewarm] == ["response.created", "response.completed"]
        assert prewarm[-1].response.output == []
        assert engine.prompt_count == count  # nothing was generated
        connection.response.create(
            model=MODEL,
            input="Turn one.",
            store=False,
            previous_response_id=prewarm[0].response.id,
        )
        one = _until(connection, _terminal)
        connection.response.create(
            model=MODEL, input="Turn two.", store=False, previous_response_id=one[0].response.id
        )
        two = _until(connection, _terminal)
    assert two[-1].response.output_text == "Second answer."
    prompt = _prompt_text(engine)
    for earlier, later in [
        ("Prewarmed.", "Turn one."),
        ("Turn one.", "First answer."),
        ("First answer.", "Turn two."),
    ]:
        assert prompt.index(earlier) < prompt.index(later), prompt
    # store=false: nothing to read over HTTP, and another connection cannot continue it
    r = httpx.get(f"{ledger.base_url}/v1/responses/{two[0].response.id}", timeout=30)
    assert r.status_code == 404
    with client.responses.connect() as other:
        other.response.create(
            model=MODEL, input="Again.", store=False, previous_response_id=one[0].response.id
        )
        (error,) = _until(other, _terminal)
    assert error.type == "error" and error.status == 404, error


def test_steering_runs_a_successor_with_the_queued_input(
    ledger: RunningServer, client: OpenAI, engine: ScriptedEngine
) -> None:
    engine.add_turns(
        _answer("A long answer about the sea, word by word.", delay_ms=40),
        _answer("Steered: now about mountains."),
    )
    with client.responses.connect() as connection:
        connection.response.create(model=MODEL, input="Tell me about the sea.", stream_id="s")
        created = connection.recv()
        assert created.type == "response.created"
        target = created.response.id
        connection.response.steer(
            input="Talk about mountains instead.", previous_response_id=target
        )
        events = _until(
            connection,
            lambda e: (e.type in TERMINAL and e.response.id != target) or e.type == "error",
        )
    kinds = [e.type for e in events]
    accepted = next(e for e in events if e.type == "response.steer.accepted")
    assert accepted.steer.previous_response_id == target and accepted.steer.id.startswith("steer_")
    assert accepted.stream_id == "s"
    # the steered response completes, then its successor starts: the commit point
    done = kinds.index("response.completed")
    successor = events[done + 1]
    assert successor.type == "response.created", kinds
    assert successor.response.previous_response_id == target
    assert events[-1].type == "response.completed"
    assert events[-1].response.output_text == "Steered: now about mountains."
    assert successor.stream_id == "s"
    prompt = _prompt_text(engine)
    assert prompt.index("word by word.") < prompt.index("Talk about mountains instead.")
    # the successor is a stored response like any other
    got = client.responses.retrieve(successor.response.id)
    assert got.previous_response_id == target and got.status == "completed"
    items = client.responses.input_items.list(successor.response.id)
    assert [i.content[0].text for i in items.data] == ["Talk about mountains instead."]  # type: ignore[union-attr]


def test_steering_waits_for_tool_output_and_joins_the_next_request(
    client: OpenAI, engine: ScriptedEngine
) -> None:
    engine.add_turns(
        {
            "completion": harmony(
                ("analysis", "I need the weather first, so I will look it up."),
                ("commentary to=functions.weather <|constrain|>json", '{"city":"Oslo"}'),
                end="<|call|>",
            ),
            "token_delay_ms": 40,
        },
        _answer("Oslo is cold; bring a coat."),
    )
    tools = [
        {
            "type": "function",
            "name": "weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        }
    ]
    with client.responses.connect() as connection:
        connection.response.create(model=MODEL, input="Weather in Oslo?", tools=tools)  # type: ignore[arg-type]
        created = connection.recv()
        target = created.response.id
        connection.response.steer(input="And should I bring a coat?", previous_response_id=target)
        events = _until(connection, lambda e: e.type == "response.steer.pending")
        kinds = [e.type for e in events]
        assert "response.steer.accepted" in kinds
        assert kinds.index("response.completed") < kinds.index("response.steer.pending")
        pending = events[-1]
        call = next(
            i
            for i in events[kinds.index("response.completed")].response.output
            if i.type == "function_call"
        )
        assert pending.reason == "waiting_for_required_input"
        assert [r.to_dict() for r in pending.required_input] == [
            {"type": "function_call_output", "call_id": call.call_id, "name": "weather"}
        ]
        connection.response.create(
            model=MODEL,
            previous_response_id=target,
            tools=tools,  # type: ignore[arg-type]
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": "-5 C"}],
        )
        after = _until(connection, _terminal)
    assert after[-1].type == "response.completed", [e.type for e in after]
    prompt = _prompt_text(engine)
    assert "And should I bring a coat?" in prompt and "-5 C" in prompt


def test_steering_that_cannot_be_accepted_is_returned(
    client: OpenAI, engine: ScriptedEngine
) -> None:
    engine.add_turns(_answer("Done."), _answer("Unstored.", delay_ms=40))
    with client.responses.connect() as connection:
        connection.response.steer(input="Hello?", previous_response_id="resp_nowhere")
        (unknown,) = _until(connection, lambda e: True)
        connection.response.create(model=MODEL, input="Quick one.")
        finished = _until(connection, _terminal)[0].response.id
        connection.response.steer(input="Too late.", previous_response_id=finished)
        (late,) = _until(connection, lambda e: True)
        connection.send(
            {
                "type": "response.steer",
                "previous_response_id": finished,
                "input": [{"role": "assistant", "content": "Not a user."}],
            }
        )
        (invalid,) = _until(connection, lambda e: True)
        connection.response.create(model=MODEL, input="Not stored.", store=False)
        unstored = connection.recv().response.id
        connection.response.steer(input="Steer it.", previous_response_id=unstored)
        events = _until(connection, _terminal)
    assert unknown.type == "response.steer.failed" and unknown.error.code == "response_not_found"
    assert unknown.steer.id is None and unknown.steer.input == "Hello?"
    assert late.error.code == "response_already_completed"
    assert invalid.error.code == "invalid_input"
    (refused,) = [e for e in events if e.type == "response.steer.failed"]
    assert refused.error.code == "steering_not_supported", refused


def test_errors_are_error_events_and_the_socket_stays_usable(
    ledger: RunningServer, client: OpenAI, engine: ScriptedEngine
) -> None:
    engine.add_turns(_answer("Still here."))
    url = ledger.base_url.replace("http", "ws") + "/v1/responses"
    with websockets.sync.client.connect(url) as ws:
        sent: list[str | bytes] = [
            "not json",
            json.dumps({"type": "response.frobnicate"}),
            json.dumps({"type": "response.create", "model": MODEL, "input": "x", "temprature": 1}),
            json.dumps(
                {"type": "response.create", "model": MODEL, "input": "x", "background": True}
            ),
            json.dumps({"type": "response.create", "model": "no-such-model", "input": "x"}),
            b"\x00binary",
        ]
        errors = []
        for message in sent:
            ws.send(message)
            errors.append(json.loads(ws.recv(timeout=30)))
        ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": "Are you there?"}))
        events = []
        while not events or events[-1]["type"] not in TERMINAL:
            events.append(json.loads(ws.recv(timeout=30)))
    assert [(e["type"], e["status"], e["error"]["code"]) for e in errors] == [
        ("error", 400, "invalid_json"),
        ("error", 400, "unknown_event_type"),
        ("error", 400, "unknown_parameter"),
        ("error", 400, "invalid_value"),
        ("error", 404, "model_not_found"),
        ("error", 400, "invalid_message"),
    ]
    assert errors[2]["error"]["param"] == "temprature"
    assert events[-1]["response"]["output"][-1]["content"][0]["text"] == "Still here."


def test_the_upgrade_needs_a_key_and_an_allowed_origin(
    tmp_path: Any, engine: ScriptedEngine
) -> None:
    settings = Settings(
        engine="scripted",
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'keys.db'}",
        served_model_names=(MODEL,),
        api_key="sk-right",
    )
    engine.add_turns(_answer("Authorised."))
    with serve(settings, engine=engine) as server:
        url = server.base_url.replace("http", "ws") + "/v1/responses"
        for headers in ({}, {"Authorization": "Bearer sk-wrong"}):
            with pytest.raises(InvalidStatus) as refused:
                websockets.sync.client.connect(url, additional_headers=headers).close()
            assert refused.value.response.status_code == 401
            body = json.loads(refused.value.response.body)
            assert body["error"]["code"] == "invalid_api_key"
        with pytest.raises(InvalidStatus) as foreign:
            websockets.sync.client.connect(
                url,
                additional_headers={"Authorization": "Bearer sk-right"},
                origin="https://evil.example",  # type: ignore[arg-type]
            ).close()
        assert foreign.value.response.status_code == 403
        base = server.base_url + "/v1"
        with (
            OpenAI(base_url=base, api_key="sk-wrong", max_retries=0) as wrong,
            pytest.raises(InvalidStatus),
        ):
            wrong.responses.connect().enter()
        with (
            OpenAI(base_url=base, api_key="sk-right", max_retries=0) as right,
            right.responses.connect() as connection,
        ):
            connection.response.create(model=MODEL, input="Let me in.")
            events = _until(connection, _terminal)
    assert events[-1].type == "response.completed"
    assert events[-1].response.output_text == "Authorised."


def test_an_upgrade_with_a_query_parameter_is_refused_naming_it(
    ledger: RunningServer, client: OpenAI, engine: ScriptedEngine
) -> None:
    """The socket takes no query parameter (``app.query``): one was ignored; now the upgrade is
    refused as its HTTP request would be, 400 ``unknown_parameter``, through the SDK too."""
    url = ledger.base_url.replace("http", "ws") + "/v1/responses?model=" + MODEL
    with pytest.raises(InvalidStatus) as refused:
        websockets.sync.client.connect(url).close()
    assert refused.value.response.status_code == 400
    error = json.loads(refused.value.response.body)["error"]
    assert (error["param"], error["code"]) == ("model", "unknown_parameter")
    # the upgrade's answer, refused or accepted, carries an x-request-id as every HTTP answer
    refused_id = refused.value.response.headers["x-request-id"]
    with websockets.sync.client.connect(url.split("?")[0]) as ws:
        accepted_id = ws.response.headers["x-request-id"]
    assert refused_id != accepted_id
    assert all(re.fullmatch("req_[0-9a-f]{48}", i) for i in (refused_id, accepted_id))
    with pytest.raises(InvalidStatus) as through_sdk:
        client.responses.connect(extra_query={"stream_id": "a"}).enter()
    assert through_sdk.value.response.status_code == 400
    engine.add_turns(_answer("No query."))
    with client.responses.connect() as connection:
        connection.response.create(model=MODEL, input="Plain.")
        assert _until(connection, _terminal)[-1].type == "response.completed"


def test_a_socket_outlives_the_header_timeout_and_frees_its_connection_slot(
    tmp_path: Any, engine: ScriptedEngine
) -> None:
    """An upgraded connection leaves the HTTP limits (``app.transport``): its head timer once
    answered 408 into the open socket, and the connection stayed counted after it closed."""
    settings = Settings(
        engine="scripted",
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'slots.db'}",
        served_model_names=(MODEL,),
        http_header_timeout_s=0.3,
    )
    engine.add_turns(_answer("After the timeout."))
    with serve(settings, engine=engine) as server:
        connections = server.server.connections
        url = server.base_url.replace("http", "ws") + "/v1/responses"
        with websockets.sync.client.connect(url) as ws:
            assert connections.open == 1
            with pytest.raises(TimeoutError):
                ws.recv(timeout=0.8)  # past the header timeout: nothing arrives, nothing closes
            ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": "Still open?"}))
            events = []
            while not events or events[-1]["type"] not in TERMINAL:
                events.append(json.loads(ws.recv(timeout=30)))
        assert events[-1]["type"] == "response.completed"
        assert connections.stats.head_timeouts == 0
        deadline = time.monotonic() + 5
        while connections.open and time.monotonic() < deadline:
            time.sleep(0.02)
        assert connections.open == 0


def test_lanes_run_side_by_side_and_in_order_within_one(
    client: OpenAI, engine: ScriptedEngine
) -> None:
    engine.add_turns(
        _answer("Slow lane answer, one token at a time.", delay_ms=30),
        _answer("Fast lane answer."),
        _answer("Slow lane, second."),
    )
    with client.responses.connect() as connection:
        connection.response.create(model=MODEL, input="Slow one.", stream_id="slow")
        first = connection.recv()
        assert first.type == "response.created" and first.stream_id == "slow"
        connection.response.create(model=MODEL, input="Fast one.", stream_id="fast")
        connection.response.create(model=MODEL, input="Slow two.", stream_id="slow")
        events = []
        done: list[tuple[str, str]] = []
        while len(done) < 3:
            event = connection.recv()
            events.append(event)
            if event.type in TERMINAL:
                done.append((event.stream_id, event.response.output_text))
    # the fast lane finished while the slow one was still streaming; the slow lane kept its order
    assert done == [
        ("fast", "Fast lane answer."),
        ("slow", "Slow lane answer, one token at a time."),
        ("slow", "Slow lane, second."),
    ]
    lanes_of: dict[str, set[str]] = {}
    for event in events:
        response = getattr(event, "response", None)
        if response is not None:
            lanes_of.setdefault(response.id, set()).add(event.stream_id)
    assert sorted(map(sorted, lanes_of.values())) == [["fast"], ["slow"], ["slow"]]
