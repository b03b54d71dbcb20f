"""Deltas follow the commits (``RESPONSES_LEDGER_COALESCE_DELTAS``): through the OpenAI SDK, a
fast engine's tokens that waited for a commit arrive as fewer, longer deltas whose text, the
``.done`` event and GET agree; with it off, a delta a token. (A takeover's replay of such a log:
``tests/domain/test_continuation.py``.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from openai import OpenAI

from app.encoding import load_encoding
from app.engines.scripted import ScriptedEngine
from app.settings import Settings
from tests.e2e.conftest import harmony
from tests.support.server import RunningServer, serve

MODEL = "gpt-oss-coalescing"
WORDS = " ".join(f"w{i}" for i in range(3000))


@pytest.fixture(params=[True, False], ids=["coalesce", "a-delta-a-token"])
def server(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[RunningServer, ScriptedEngine, bool]]:
    engine = ScriptedEngine(load_encoding(), [MODEL], {"turns": []})
    settings = Settings(
        engine="scripted",
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'responses.db'}",
        served_model_names=(MODEL,),
        coalesce_deltas=request.param,
    )
    with serve(settings, engine=engine) as running:
        yield running, engine, request.param


def test_a_fast_engines_waiting_tokens_are_one_delta_and_everything_agrees(
    server: tuple[RunningServer, ScriptedEngine, bool],
) -> None:
    running, engine, coalesce = server
    engine.add_turns({"completion": harmony(("final", WORDS))})
    with OpenAI(
        base_url=running.base_url + "/v1", api_key="none"
    ) as client:  # (closed: its socket too)
        with client.responses.stream(model=MODEL, input="go") as stream:
            events = list(stream)
            final = stream.get_final_response()
        deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
        [done] = [e.text for e in events if e.type == "response.output_text.done"]
        assert "".join(deltas) == done == final.output_text == WORDS
        assert [e.sequence_number for e in events] == list(range(len(events)))
        tokens = final.usage.output_tokens
        if coalesce:  # the engine outruns the commits: tokens waited, and rode together
            assert len(deltas) < tokens / 4, (len(deltas), tokens)
        else:
            assert len(deltas) >= len(load_encoding().encode(WORDS)) - 1
        stored = client.responses.retrieve(final.id)
        assert stored.output_text == WORDS and stored.status == final.status == "completed"
        assert [o.id for o in stored.output] == [o.id for o in final.output]


def test_deltas_follow_the_commits_by_default(tmp_path: Path) -> None:
    """The default since the thirtieth session (bench/RESULTS.md): a server made from the
    environment alone coalesces; ``RESPONSES_LEDGER_COALESCE_DELTAS=false`` turns it off."""
    assert Settings.from_env({}).coalesce_deltas is True
    assert Settings.from_env({"RESPONSES_LEDGER_COALESCE_DELTAS": "false"}).coalesce_deltas is False
    engine = ScriptedEngine(load_encoding(), [MODEL], {"turns": []})
    settings = Settings.from_env(
        {},
        engine="scripted",
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'default.db'}",
        served_model_names=(MODEL,),
    )
    with serve(settings, engine=engine) as running:
        engine.add_turns({"completion": harmony(("final", WORDS))})
        client = OpenAI(base_url=running.base_url + "/v1", api_key="none")
        with client, client.responses.stream(model=MODEL, input="go") as stream:
            deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
            final = stream.get_final_response()
    assert "".join(deltas) == final.output_text == WORDS
    assert len(deltas) < final.usage.output_tokens / 4, (len(deltas), final.usage.output_tokens)
