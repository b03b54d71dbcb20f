"""``truncation: "auto"`` through the OpenAI SDK, on a small context (the scripted engine's
``max_model_len`` set for the test; with no queued turn it echoes the last user message)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI

from app.encoding import load_encoding
from app.engines.scripted import ScriptedEngine
from tests.e2e.conftest import MODEL
from tests.support.server import RunningServer

LIMIT = 800
MAX_OUT = 150
ENCODING = load_encoding()


@pytest.fixture
def small_context(
    engine: ScriptedEngine, monkeypatch: pytest.MonkeyPatch
) -> Iterator[ScriptedEngine]:
    monkeypatch.setattr(engine, "max_model_len", LIMIT, raising=False)
    yield engine


def _turn(k: int) -> str:
    return f"turn{k} " + " ".join(f"t{k}w{i}" for i in range(10))


def _prompt_text(engine: ScriptedEngine) -> str:
    return ENCODING.decode(engine.prompts[-1])


def _audit(ledger: RunningServer, rid: str) -> dict[str, Any]:
    audit = httpx.get(f"{ledger.base_url}/v1/responses/{rid}/events", timeout=30).json()["audit"]
    [prompt] = [a for a in audit if a["kind"] == "prompt_token_ids"]
    return dict(prompt["detail"])


def test_a_previous_response_id_chain_that_outgrows_the_context_keeps_going_with_auto(
    ledger: RunningServer, client: OpenAI, small_context: ScriptedEngine
) -> None:
    engine = small_context
    instructions = "Always answer in the voice of a lighthouse keeper."
    previous: str | None = None
    truncated_turns = 0
    for k in range(14):
        kwargs: dict[str, Any] = {"previous_response_id": previous} if previous else {}
        if k == 0:
            kwargs["input"] = [
                {"role": "developer", "content": "Developer rule: never use the letter zed."},
                {"role": "user", "content": _turn(k)},
            ]
        else:
            kwargs["input"] = _turn(k)
        if previous is not None:
            # the same request with truncation disabled: refused once the chain outgrew the context
            try:
                client.responses.create(
                    model=MODEL, instructions=instructions, max_output_tokens=MAX_OUT, **kwargs
                )
                disabled_fits = True
            except openai.BadRequestError as exc:
                body: Any = exc.body
                assert body["code"] == "context_length_exceeded" and body["param"] == "input"
                disabled_fits = False
        response = client.responses.create(
            model=MODEL,
            instructions=instructions,
            max_output_tokens=MAX_OUT,
            truncation="auto",
            **kwargs,
        )
        assert response.status == "completed" and response.truncation == "auto"
        assert _turn(k) in response.output_text  # the echo of what was asked now
        prompt = engine.prompts[-1]
        assert len(prompt) + MAX_OUT <= LIMIT
        text = _prompt_text(engine)
        assert instructions in text and "Developer rule: never use the letter zed." in text
        assert _turn(k) in text
        detail = _audit(ledger, response.id)
        if "truncation" in detail:
            truncated_turns += 1
            assert previous is not None and not disabled_fits
            dropped = detail["truncation"]["dropped_items"]
            assert dropped >= 1 and len(detail["truncation"]["dropped_ids"]) == dropped
            assert "turn0 " not in text  # the oldest turn went first
        elif previous is not None:
            assert disabled_fits
        assert client.responses.retrieve(response.id).truncation == "auto"
        previous = response.id
    assert truncated_turns >= 5  # the chain outgrew the context about half way


def test_a_tool_call_and_its_output_are_dropped_together(
    ledger: RunningServer, client: OpenAI, small_context: ScriptedEngine
) -> None:
    engine = small_context
    big = " ".join(f"r{i}" for i in range(300))
    items: list[Any] = [
        {"role": "user", "content": "What is the weather in Paris?"},
        {
            "type": "function_call",
            "call_id": "call_w1",
            "name": "weather",
            "arguments": '{"city":"Paris"}',
        },
        {"type": "function_call_output", "call_id": "call_w1", "output": big},
        {"role": "user", "content": "And now just say hello."},
    ]
    tools: Any = [
        {"type": "function", "name": "weather", "parameters": {"type": "object", "properties": {}}}
    ]
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model=MODEL, input=items, tools=tools, max_output_tokens=MAX_OUT)
    response = client.responses.create(
        model=MODEL, input=items, tools=tools, max_output_tokens=MAX_OUT, truncation="auto"
    )
    assert response.status == "completed" and "say hello" in response.output_text
    text = _prompt_text(engine)
    assert "r299" not in text and "Paris" not in text and "And now just say hello." in text
    assert _audit(ledger, response.id)["truncation"]["dropped_items"] == 3


def test_auto_still_refuses_when_the_last_item_alone_does_not_fit(
    client: OpenAI, small_context: ScriptedEngine
) -> None:
    huge = " ".join(f"h{i}" for i in range(800))
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(
            model=MODEL,
            input=[{"role": "user", "content": "old"}, {"role": "user", "content": huge}],
            truncation="auto",
        )
    body: Any = caught.value.body
    assert body["code"] == "context_length_exceeded" and body["param"] == "input"


def test_the_token_count_is_of_what_truncation_auto_keeps(
    client: OpenAI, small_context: ScriptedEngine
) -> None:
    engine = small_context
    items: list[Any] = [{"role": "user", "content": _turn(k)} for k in range(40)]
    with pytest.raises(openai.BadRequestError) as caught:  # disabled: the same 400 as create
        client.responses.input_tokens.count(model=MODEL, input=items)
    assert caught.value.body["code"] == "context_length_exceeded"  # type: ignore[index]
    counted = client.responses.input_tokens.count(model=MODEL, input=items, truncation="auto")
    assert counted.input_tokens < LIMIT
    response = client.responses.create(model=MODEL, input=items, truncation="auto", store=False)
    assert counted.input_tokens == len(engine.prompts[-1]) == response.usage.input_tokens  # type: ignore[union-attr]
    assert "turn0 " not in _prompt_text(engine) and _turn(39) in _prompt_text(engine)
