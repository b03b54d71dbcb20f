"""Issue 6, point 7 and issue 15: restart recovery.

A real ``responses-ledger serve`` process (scripted engine, SQLite file) is killed with SIGKILL
while a background response is streaming. The next process on that database either continues
it from its log (``RESPONSES_LEDGER_TAKEOVER=continue``, the default: the same completion, every
event once, a ``takeover`` audit record), or, set to ``fail``, closes it at start-up with
``response.failed`` (``server_error``, "the server restarted"), its open item closed
``incomplete``; either way the stream stays resumable up to its terminal event.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import httpx
from openai import OpenAI

from app.encoding import load_encoding
from app.engines.scripted import ScriptedEngine
from app.settings import Settings
from tests.e2e.conftest import harmony, sse_events
from tests.support.process import ServerProcess
from tests.support.server import serve
from tests.support.stream_checker import check_stream

MODEL = "gpt-oss-recovery"
REASONING = "Let me think this through."
TERMINALS = ("response.completed", "response.incomplete", "response.failed", "response.cancelled")
WORDS = " ".join(f"word{i}" for i in range(300))  # ~600 tokens at 40 ms: far longer than the test


def _events(base_url: str, response_id: str) -> list[dict[str, Any]]:
    resp = httpx.get(f"{base_url}/v1/responses/{response_id}/events", timeout=30)
    assert resp.status_code == 200, resp.text
    return list(resp.json()["data"])


def _replay(base_url: str, response_id: str, after: int | None = None) -> list[dict[str, Any]]:
    params: dict[str, Any] = {"stream": "true"}
    if after is not None:
        params["starting_after"] = after
    with httpx.stream(
        "GET", f"{base_url}/v1/responses/{response_id}", params=params, timeout=30
    ) as r:
        assert r.status_code == 200, r.read()
        return sse_events(r.read())


def _kill_mid_stream(
    tmp_path: Path, processes: list[ServerProcess], turn: dict[str, Any]
) -> tuple[str, list[dict[str, Any]]]:
    """Start a server, stream a background response until 3 deltas are stored, SIGKILL it:
    the response's id and its log as it was before the kill."""
    first = ServerProcess(
        tmp_path,
        "first",
        f"sqlite+aiosqlite:///{tmp_path / 'responses.db'}",
        {"turns": [turn]},
        model=MODEL,
    )
    processes.append(first)
    resp = httpx.post(
        first.base_url + "/v1/responses",
        json={"model": MODEL, "input": "go", "background": True},
        timeout=30,
    )
    assert resp.status_code == 200, resp.text
    assert resp.json()["status"] == "queued"
    response_id = str(resp.json()["id"])
    deadline = time.monotonic() + 30
    while True:
        before = _events(first.base_url, response_id)
        if sum(e["type"] == "response.output_text.delta" for e in before) >= 3:
            break
        assert time.monotonic() < deadline, "no deltas were stored"
        time.sleep(0.02)
    first.kill()
    assert first.proc.returncode == -signal.SIGKILL
    return response_id, before


def test_a_restarted_server_continues_the_killed_servers_response(
    tmp_path: Path, processes: list[ServerProcess]
) -> None:
    turn = {
        "completion": harmony(("analysis", REASONING), ("final", WORDS[:600])),
        "token_delay_ms": 5,
    }
    response_id, before = _kill_mid_stream(tmp_path, processes, turn)
    url = f"sqlite+aiosqlite:///{tmp_path / 'responses.db'}"
    settings = Settings(engine="scripted", database_url=url, served_model_names=(MODEL,))
    engine = ScriptedEngine(load_encoding(), [MODEL], {"turns": [turn]})
    # the client closed with the server: a pooled socket left to the GC warns in a later test
    with (
        serve(settings, engine=engine) as second,
        OpenAI(base_url=second.base_url + "/v1", api_key="k", max_retries=0, timeout=30) as client,
    ):
        # a follower from the middle of the log gets the continuation, each event once
        middle = before[-1]["seq"]
        tail = list(client.responses.retrieve(response_id, stream=True, starting_after=middle))
        assert [e.sequence_number for e in tail] == list(range(middle + 1, middle + 1 + len(tail)))
        assert tail[-1].type == "response.completed"
        response = client.responses.retrieve(response_id)
        assert response.status == "completed" and response.error is None
        reasoning, message = response.output
        assert reasoning.content is not None and reasoning.content[0].text == REASONING
        assert message.type == "message" and message.status == "completed"
        assert (
            response.output_text == WORDS[:600]
        )  # the same completion, resumed at the right token
        log = _events(second.base_url, response_id)
        assert log[: len(before)] == before
        assert [e["seq"] for e in log] == list(range(len(log)))
        full = _replay(second.base_url, response_id)
        assert check_stream(full)["status"] == "completed"
        audit = httpx.get(
            f"{second.base_url}/v1/responses/{response_id}/events", timeout=30
        ).json()["audit"]
        takeover = [a["detail"] for a in audit if a["kind"] == "takeover"]
        assert len(takeover) == 1 and takeover[0]["at_seq"] >= len(before)
        assert takeover[0]["reason"] == "the server restarted"
        assert response.usage is not None
        output_ids = next(a["token_ids"] for a in audit if a["kind"] == "output_token_ids")
        assert len(output_ids) == response.usage.output_tokens
        assert engine.prompt_count == 1  # one continuation, no new turn taken


def test_killed_server_closes_the_response_at_restart(
    tmp_path: Path, processes: list[ServerProcess]
) -> None:
    slow = {"completion": harmony(("analysis", REASONING), ("final", WORDS)), "token_delay_ms": 40}
    response_id, before = _kill_mid_stream(tmp_path, processes, slow)
    db = tmp_path / "responses.db"

    # Start again on the same database: here in-thread (``serve``), the way the e2e fixture runs.
    url = f"sqlite+aiosqlite:///{db}"
    settings = Settings(
        engine="scripted", database_url=url, served_model_names=(MODEL,), takeover="fail"
    )
    engine = ScriptedEngine(
        load_encoding(), [MODEL], {"turns": [{"completion": harmony(("final", "Back again."))}]}
    )
    # the client closed with the server: a pooled socket left to the GC warns in a later test
    with (
        serve(settings, engine=engine) as second,
        OpenAI(base_url=second.base_url + "/v1", api_key="k", max_retries=0, timeout=30) as client,
    ):
        response = client.responses.retrieve(response_id)
        assert response.status == "failed"
        assert response.error is not None
        assert (response.error.code, response.error.message) == (
            "server_error",
            "the server restarted",
        )
        reasoning, message = response.output
        assert reasoning.type == "reasoning" and reasoning.status == "completed"
        assert reasoning.content is not None and reasoning.content[0].text == REASONING
        assert message.type == "message" and message.status == "incomplete"
        text = message.content[0].text
        assert text and WORDS.startswith(text) and text != WORDS

        log = _events(second.base_url, response_id)
        assert log[: len(before)] == before  # append-only: what was stored before the kill is kept
        assert [e["seq"] for e in log] == list(range(len(log)))
        terminals = [e["type"] for e in log if e["type"] in TERMINALS]
        assert terminals == ["response.failed"] and log[-1]["type"] == "response.failed"
        deltas = "".join(
            e["payload"]["delta"] for e in log if e["type"] == "response.output_text.delta"
        )
        assert deltas == text  # the item was closed with exactly what had been stored

        # The stream replays to the terminal event, and resumes from any point of the log.
        full = _replay(second.base_url, response_id)
        assert check_stream(full)["status"] == "failed"
        assert [e["sequence_number"] for e in full] == [e["seq"] for e in log]
        fetched = httpx.get(f"{second.base_url}/v1/responses/{response_id}", timeout=30).json()
        assert fetched == full[-1]["response"]
        middle = next(e["seq"] for e in log if e["type"] == "response.output_text.delta")
        assert _replay(second.base_url, response_id, after=middle) == full[middle + 1 :]
        sdk_tail = list(client.responses.retrieve(response_id, stream=True, starting_after=middle))
        assert [e.sequence_number for e in sdk_tail] == list(range(middle + 1, len(full)))
        assert sdk_tail[-1].type == "response.failed"
        assert _replay(second.base_url, response_id, after=len(full) - 1) == []

        # The restarted server serves new requests.
        assert client.responses.create(model=MODEL, input="hi").output_text == "Back again."

    # Recovery is not repeated on a log that is already closed.
    with serve(settings, engine=ScriptedEngine(load_encoding(), [MODEL], {"turns": []})) as third:
        assert _events(third.base_url, response_id) == log
        assert (
            httpx.get(f"{third.base_url}/v1/responses/{response_id}", timeout=30).json() == fetched
        )
