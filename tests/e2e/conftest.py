"""A real server with the scripted engine and a SQLite file, shared by the end-to-end tests.

Tests queue the completions they need with ``engine.add_turns(...)`` just before their requests;
with no queued turn the engine echoes the last user message.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI

from app.encoding import load_encoding
from app.engines.scripted import ScriptedEngine
from app.settings import Settings
from tests.support.postgres import create_database, drop_database, unavailable
from tests.support.process import ServerProcess
from tests.support.server import RunningServer, serve

MODEL = "gpt-oss-test"


@pytest.fixture(scope="session")
def engine() -> ScriptedEngine:
    return ScriptedEngine(load_encoding(), [MODEL], {"turns": []})


@pytest.fixture(scope="session")
def ledger(
    tmp_path_factory: pytest.TempPathFactory, engine: ScriptedEngine
) -> Iterator[RunningServer]:
    db: Path = tmp_path_factory.mktemp("ledger") / "responses.db"
    settings = Settings(
        engine="scripted",
        database_url=f"sqlite+aiosqlite:///{db}",
        served_model_names=(MODEL,),
        model_aliases={"gpt-oss-alias": MODEL},
        max_body_bytes=1_000_000,
    )
    with serve(settings, engine=engine) as server:
        yield server


@pytest.fixture
def processes() -> Iterator[list[ServerProcess]]:
    """Server processes a test starts (``tests/support/process.py``), stopped after it."""
    started: list[ServerProcess] = []
    yield started
    for process in started:
        process.stop()


@pytest.fixture
def pg_url() -> Iterator[str]:
    """An empty PostgreSQL database of the test's own on the shared server (skipped, with the
    reason, when PostgreSQL is down), dropped afterwards: for replicas in server processes."""
    reason = asyncio.run(unavailable())
    if reason is not None:
        pytest.skip(reason)
    url = asyncio.run(create_database("ledger_e2e"))
    try:
        yield url
    finally:
        asyncio.run(drop_database(url))


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database of each kind in turn, for this test alone: a new SQLite file, or ``pg_url``."""
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"
    url: str = request.getfixturevalue("pg_url")
    return url


@pytest.fixture
def client(ledger: RunningServer) -> Iterator[OpenAI]:
    with OpenAI(
        base_url=ledger.base_url + "/v1", api_key="test-key", max_retries=0, timeout=60
    ) as c:
        yield c


def harmony(*messages: tuple[str, str], end: str = "<|return|>") -> str:
    """A raw completion: ``("analysis", "text")``, ``("final", "text")``,
    ``("commentary to=functions.f <|constrain|>json", '{...}')``; messages after the first start
    with ``<|start|>assistant``."""
    parts = []
    for i, (header, text) in enumerate(messages):
        last = i == len(messages) - 1
        prefix = "" if i == 0 else "<|start|>assistant"
        parts.append(f"{prefix}<|channel|>{header}<|message|>{text}{end if last else '<|end|>'}")
    return "".join(parts)


def sse_events(raw: bytes) -> list[dict[str, Any]]:
    import json

    out = []
    for frame in raw.split(b"\n\n"):
        for line in frame.split(b"\n"):
            if line.startswith(b"data: "):
                out.append(json.loads(line[6:]))
    return out
