"""Malformed output with special and reserved tokens, from the scripted engine through the
OpenAI SDK: no special token's text in any event, nor in what GET returns."""

from __future__ import annotations

import json

from openai import OpenAI

from app.engines.scripted import ScriptedEngine
from tests.e2e.conftest import MODEL
from tests.support.server import RunningServer

COMPLETION = (
    "<|channel|>analysis<|message|>Let me<|reserved_200711|> think.<|end|>"
    "<|reserved_200711|>stray <|reserved_201087|>words<|startoftext|> between"
    "<|start|>assistant<|channel|>commentary to=functions.get<|reserved_200100|>_weather "
    '<|constrain|>json<|message|>{"city":<|endoftext|>"Rome"}<|call|>'
)


def test_special_tokens_in_malformed_output_never_reach_the_client(
    ledger: RunningServer, client: OpenAI, engine: ScriptedEngine
) -> None:
    tools: list = [
        {
            "type": "function",
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {}},
        }
    ]
    engine.add_turns({"completion": COMPLETION})
    with client.responses.stream(model=MODEL, input="weather?", tools=tools) as stream:
        events = list(stream)
    streamed = "\n".join(e.model_dump_json(warnings=False) for e in events)
    assert "<|" not in streamed and "reserved" not in streamed
    rid = events[0].response.id  # type: ignore[union-attr]
    got = client.responses.retrieve(rid)
    assert "<|" not in got.model_dump_json()
    kinds = [(item.type, getattr(item, "name", None)) for item in got.output]
    assert kinds == [("reasoning", None), ("message", None), ("function_call", "get_weather")]
    reasoning, message, call = got.output
    assert reasoning.content[0].text == "Let me think."  # type: ignore[union-attr,index]
    assert json.loads(call.arguments) == {"city": "Rome"}  # type: ignore[union-attr]
    assert message.content[0].text == "stray words between"  # type: ignore[union-attr]

    engine.add_turns({"completion": COMPLETION})
    plain = client.responses.create(model=MODEL, input="weather?", tools=tools)
    assert "<|" not in plain.model_dump_json()
    assert [i.type for i in plain.output] == [i.type for i in got.output]
