"""A cancelled background stream, read through the OpenAI SDK (3.57) both ways it offers.

The log ends ``response.cancelled``; the wire sends it as ``response.incomplete`` whose
``response.status`` is ``"cancelled"`` (``domain.projections``), the one terminal event of the
SDK's union for a response that stopped before it finished. Before, the SDK parsed the unknown
type as an audio delta event without a ``response``.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from openai import OpenAI
from openai.types.responses import ResponseIncompleteEvent, ResponseTextDeltaEvent

from app.engines.scripted import ScriptedEngine
from tests.e2e.conftest import harmony, sse_events
from tests.support.openapi import validate_stream_event
from tests.support.server import RunningServer
from tests.support.stream_checker import check_stream, validate_with_sdk

MODEL = "gpt-oss-test"
LONG = " ".join(f"w{i}" for i in range(300))


def _cancel_after_first_delta(client: OpenAI, events: Any) -> list[Any]:
    """Read ``events`` to their end, cancelling the response (POST .../cancel, another
    connection) at its first text delta."""
    seen: list[Any] = []
    for event in events:
        seen.append(event)
        if (
            isinstance(event, ResponseTextDeltaEvent)
            and len([e for e in seen if isinstance(e, ResponseTextDeltaEvent)]) == 1
        ):
            assert client.responses.cancel(seen[0].response.id).status == "cancelled"
    return seen


def _check_end(client: OpenAI, ledger: RunningServer, seen: list[Any]) -> None:
    rid = seen[0].response.id
    last = seen[-1]
    assert isinstance(last, ResponseIncompleteEvent), type(last).__name__
    assert last.response.status == "cancelled" and last.response.id == rid
    [item] = last.response.output
    assert item.type == "message" and item.status == "incomplete"
    text = item.content[0].text  # type: ignore[union-attr]
    assert text and LONG.startswith(text) and text != LONG
    assert [e.sequence_number for e in seen] == list(range(len(seen)))
    got = client.responses.retrieve(rid)
    assert got.status == "cancelled" and got.model_dump() == last.response.model_dump()
    # the log keeps what happened; a replay of the stream ends the same way the live one did
    log = httpx.get(f"{ledger.base_url}/v1/responses/{rid}/events", timeout=30).json()["data"]
    assert log[-1]["type"] == "response.cancelled"
    with httpx.stream("GET", f"{ledger.base_url}/v1/responses/{rid}?stream=true", timeout=30) as r:
        replay = sse_events(r.read())
    assert (
        replay[-1]["type"] == "response.incomplete"
        and replay[-1]["response"]["status"] == "cancelled"
    )
    check_stream(replay)
    validate_with_sdk(replay)
    validate_stream_event(replay[-1])  # OpenAI's OpenAPI document takes it too


@pytest.mark.parametrize("way", ["create_stream_true", "responses_stream"])
def test_a_cancelled_background_stream_ends_in_a_terminal_the_sdk_types(
    ledger: RunningServer, client: OpenAI, engine: ScriptedEngine, way: str
) -> None:
    engine.add_turns({"completion": harmony(("final", LONG)), "token_delay_ms": 10})
    if way == "create_stream_true":
        with client.responses.create(
            model=MODEL, input="long", background=True, stream=True
        ) as events:
            seen = _cancel_after_first_delta(client, events)
    else:
        with client.responses.stream(model=MODEL, input="long", background=True) as stream:
            seen = _cancel_after_first_delta(client, stream)
            # the accumulator took the terminal event; like any response that did not complete,
            # get_final_response (which wants response.completed) says so rather than guessing
            with pytest.raises(RuntimeError, match=r"response\.completed"):
                stream.get_final_response()
    _check_end(client, ledger, seen)
