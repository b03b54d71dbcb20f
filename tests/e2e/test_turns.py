"""The server's turn gate (``app.turns``) pauses a burst of new responses' set-ups while
paced responses are generating, and only then: it is given the setting and the service's
paced generations (``app.feed.Paced``)."""

from __future__ import annotations

import time
from pathlib import Path

from openai import OpenAI

from app.engines.scripted import ScriptedEngine
from app.settings import Settings
from app.turns import SETUP_SHARE
from tests.e2e.conftest import MODEL, harmony
from tests.support.server import RunningServer, serve


def test_the_gate_knows_when_paced_responses_are_generating(
    client: OpenAI, ledger: RunningServer, engine: ScriptedEngine
) -> None:
    """Requests made while a paced response streams each pause the next set-up; made when
    none generates (the echo engine unpaced), none does."""
    gate = ledger.service.turns
    assert gate.share == SETUP_SHARE  # the setting's default (the fixture sets none)
    engine.add_turns(
        {"completion": harmony(("final", "one two three four five six")), "token_delay_ms": 100}
    )
    with client.responses.create(model=MODEL, input="count", stream=True) as stream:
        seen = []
        for event in stream:
            seen.append(event.type)
            if event.type == "response.output_text.delta":
                assert gate.busy()  # its paced generation runs: set-ups would pause for it
                if seen.count(event.type) == 1:  # a few requests while it streams
                    before = gate.pauses
                    for _ in range(3):
                        made = client.responses.create(model=MODEL, input="beside it")
                        assert made.status == "completed"
                    assert gate.pauses >= before + 3
        assert seen[-1] == "response.completed"
    deadline = time.monotonic() + 10  # (another test's response may still be ending)
    while gate.busy() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not gate.busy()
    before = gate.pauses
    for _ in range(3):
        assert client.responses.create(model=MODEL, input="alone").status == "completed"
    assert gate.pauses == before  # nothing paced generates: no pause


def test_the_gate_takes_the_setup_share_setting(tmp_path: Path, engine: ScriptedEngine) -> None:
    settings = Settings(
        engine="scripted",
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'responses.db'}",
        served_model_names=(MODEL,),
        setup_share=0.25,
    )
    with serve(settings, engine=engine) as server:
        assert server.service.turns.share == 0.25
