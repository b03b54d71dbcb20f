"""An engine without log probabilities (the scripted one) refuses a request for them with a
400 naming ``include``, before anything is generated or stored; without the include value
``top_logprobs`` is echoed and output_text parts keep ``logprobs: []``."""

from __future__ import annotations

import openai
import pytest
from openai import OpenAI

from app.engines.scripted import ScriptedEngine
from tests.e2e.conftest import MODEL, harmony


def test_asking_the_scripted_engine_for_logprobs_is_a_400(client: OpenAI) -> None:
    before = client.responses.create(model=MODEL, input="count me").id
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(
            model=MODEL, input="hi", include=["message.output_text.logprobs"], top_logprobs=3
        )
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["param"] == "include"
    assert "log probabilities" in error["message"]
    assert error["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError):  # streamed: refused before the stream starts
        client.responses.create(
            model=MODEL, input="hi", include=["message.output_text.logprobs"], stream=True
        )
    assert client.responses.retrieve(before).id == before
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(
            model=MODEL, input="hi", include=["message.output_text.logprobs"], top_logprobs=21
        )
    assert isinstance(caught.value.body, dict) and caught.value.body["param"] == "top_logprobs"


def test_top_logprobs_alone_is_echoed_and_parts_keep_empty_logprobs(
    client: OpenAI, engine: ScriptedEngine
) -> None:
    engine.add_turns({"completion": harmony(("final", "plain answer"))})
    response = client.responses.create(model=MODEL, input="hi", top_logprobs=4)
    assert response.top_logprobs == 4
    part = response.output[0].content[0]  # type: ignore[union-attr]
    assert part.type == "output_text" and part.text == "plain answer"
    assert part.logprobs == []
