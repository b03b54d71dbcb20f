"""The ids the server gives a response, its output items and its input items (``app.ids``),
seen through the OpenAI SDK."""

from __future__ import annotations

from openai import OpenAI

from app.engines.scripted import ScriptedEngine
from tests.e2e.conftest import MODEL, harmony
from tests.test_ids import SHAPE


def test_responses_and_their_items_get_ids_in_the_order_they_were_made(
    client: OpenAI, engine: ScriptedEngine
) -> None:
    engine.add_turns(
        {"completion": harmony(("analysis", "Think."), ("final", "One."))},
        {"completion": harmony(("final", "Two."))},
    )
    first = client.responses.create(model=MODEL, input="one")
    second = client.responses.create(model=MODEL, input=[{"role": "user", "content": "two"}])
    assert first.id.startswith("resp_") and SHAPE.fullmatch(first.id), first.id
    assert second.id > first.id  # made later, sorts later
    outputs = [item.id for r in (first, second) for item in r.output]
    assert len(outputs) == 3 and all(i and SHAPE.fullmatch(i) for i in outputs), outputs
    made = [i.split("_", 1)[1] for i in outputs]  # (the prefixes differ: rs_, msg_)
    assert made == sorted(made)  # made one after another
    inputs = [i.id for i in client.responses.input_items.list(second.id).data]
    assert len(inputs) == 1 and inputs[0].startswith("msg_") and SHAPE.fullmatch(inputs[0])
