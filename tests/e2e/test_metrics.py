"""``GET /metrics`` and the structured logs, against a real server with keys on, driven by the
OpenAI SDK; scraped over HTTP and parsed with prometheus_client's parser."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
from openai import OpenAI

from app.encoding import load_encoding
from app.engines.scripted import ScriptedEngine
from app.keys import create_key
from app.logs import JsonFormatter
from app.settings import Settings
from persistence.sql import open_store
from tests.e2e.conftest import harmony
from tests.support.metrics import samples
from tests.support.server import RunningServer, serve

MODEL = "gpt-oss-test"
ADMIN = "static-admin-key-for-metrics"
PROMPT_MARKER = "PROMPT-MARKER-7f3a"


@dataclass
class Ledger:
    server: RunningServer
    engine: ScriptedEngine
    member_key: str

    @property
    def url(self) -> str:
        return self.server.base_url

    def scrape(self, key: str | None = ADMIN) -> dict[str, float]:
        """Every sample of a scrape, ``name{label="v",...}`` -> value."""
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        r = httpx.get(self.url + "/metrics", headers=headers, timeout=30)
        assert r.status_code == 200, r.text
        assert r.headers["content-type"].startswith("text/plain")
        return samples(r.text)


async def _member_key(url: str) -> str:
    store = await open_store(url)
    try:
        _row, key = await create_key(store, project="alpha", role="member")
        return key
    finally:
        await store.close()


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ledger]:
    db: Path = tmp_path_factory.mktemp("metrics") / "responses.db"
    url = f"sqlite+aiosqlite:///{db}"
    member = asyncio.run(_member_key(url))
    engine = ScriptedEngine(load_encoding(), [MODEL], {"turns": []})
    settings = Settings(
        engine="scripted", database_url=url, served_model_names=(MODEL,), api_key=ADMIN
    )
    with serve(settings, engine=engine) as server:
        yield Ledger(server, engine, member)


@pytest.fixture
def sdk(ledger: Ledger) -> Iterator[Callable[[str], OpenAI]]:
    """OpenAI SDK clients of the server with a given key, closed after the test."""
    made: list[OpenAI] = []

    def make(key: str) -> OpenAI:
        made.append(OpenAI(base_url=ledger.url + "/v1", api_key=key, max_retries=0))
        return made[-1]

    yield make
    for client in made:
        client.close()


@pytest.fixture
def log_lines() -> Iterator[list[str]]:
    """What the process logs meanwhile, as the JSON formatter writes it."""
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(self.format(record))

    handler = Collect(logging.DEBUG)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield lines
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def test_counters_move_as_a_client_streams_and_reads(
    ledger: Ledger, sdk: Callable[[str], OpenAI]
) -> None:
    before = ledger.scrape()
    client = sdk(ledger.member_key)
    ledger.engine.add_turns(
        {"completion": harmony(("analysis", "thinking"), ("final", "one two three four five"))}
    )
    with client.responses.stream(model=MODEL, input="hello") as stream:
        final = stream.get_final_response()
    assert final.status == "completed"
    ledger.engine.add_turns({"completion": harmony(("final", "plain"))})
    assert client.responses.create(model=MODEL, input="again").status == "completed"
    # a resume of the stored stream
    with httpx.stream(
        "GET",
        f"{ledger.url}/v1/responses/{final.id}?stream=true&starting_after=2",
        headers={"Authorization": f"Bearer {ledger.member_key}"},
    ) as r:
        assert r.status_code == 200
        r.read()
    with pytest.raises(openai.AuthenticationError):
        sdk("sk-rl-wrong").models.list()

    after = ledger.scrape()
    key = f'ledger_responses_total{{model="{MODEL}",status="completed"}}'
    assert after[key] - before.get(key, 0) == 2
    assert after["ledger_resumes_total"] - before["ledger_resumes_total"] == 1
    invalid = 'ledger_auth_failures_total{reason="invalid"}'
    assert after[invalid] - before.get(invalid, 0) == 1
    # two streams' first tokens, each durable before it was sent
    ttft = "ledger_time_to_first_token_seconds_count"
    assert after[ttft] - before[ttft] == 2
    assert (
        after["ledger_time_to_first_token_seconds_sum"]
        > before["ledger_time_to_first_token_seconds_sum"]
    )
    assert after['ledger_time_to_first_token_seconds_bucket{le="+Inf"}'] == after[ttft]
    assert (
        after["ledger_commit_latency_seconds_count"] > before["ledger_commit_latency_seconds_count"]
    )
    assert after["ledger_commits_total"] > before["ledger_commits_total"]
    # every event of both logs was appended, and counted once per commit in the batch histogram
    events = after["ledger_events_appended_total"] - before["ledger_events_appended_total"]
    assert events >= 2 * 6
    assert (
        after["ledger_commit_batch_events_sum"] - before["ledger_commit_batch_events_sum"] == events
    )
    assert after["ledger_live_streams"] == 0
    assert after["ledger_store_writable"] == 1
    assert after["ledger_store_errors_total"] == 0
    assert 'ledger_takeovers_total{outcome="continued"}' in after
    assert after["ledger_draining"] == 0
    assert "process_cpu_seconds_total" in after  # prometheus_client's global registry too


def test_inter_event_latency_is_observed_per_batch(
    ledger: Ledger, sdk: Callable[[str], OpenAI]
) -> None:
    before = ledger.scrape()
    words = " ".join(f"w{i}" for i in range(40))
    ledger.engine.add_turns({"completion": harmony(("final", words)), "token_delay_ms": 5})
    client = sdk(ADMIN)
    events = list(client.responses.create(model=MODEL, input="x", stream=True))
    deltas = sum(1 for e in events if e.type.endswith(".delta"))
    after = ledger.scrape()
    gaps = (
        after["ledger_inter_event_latency_seconds_count"]
        - before["ledger_inter_event_latency_seconds_count"]
    )
    # one per commit that carried output (paced: about one a token), never one per event more:
    # the first output batch is the time to first token, created and in_progress are no output
    assert deltas // 4 <= gaps <= len(events) - 3


def test_metrics_need_an_admin_key_when_keys_are_on(ledger: Ledger) -> None:
    assert httpx.get(ledger.url + "/metrics").status_code == 401
    r = httpx.get(ledger.url + "/metrics", headers={"Authorization": f"Bearer {ledger.member_key}"})
    assert r.status_code == 403
    assert r.json()["error"]["code"] == "admin_only"  # as the audit page (app.ui)
    after = ledger.scrape()
    assert after['ledger_auth_failures_total{reason="not_admin"}'] >= 1
    assert after['ledger_auth_failures_total{reason="missing"}'] >= 1


def test_metrics_off_is_a_404_and_open_servers_serve_them(tmp_path: Path) -> None:
    engine = ScriptedEngine(load_encoding(), [MODEL], {"turns": []})
    url = f"sqlite+aiosqlite:///{tmp_path / 'r.db'}"
    off = Settings(engine="scripted", database_url=url, served_model_names=(MODEL,), metrics=False)
    with serve(off, engine=engine) as server:
        r = httpx.get(server.base_url + "/metrics")
        assert r.status_code == 404
        assert r.json()["error"]["message"] == "Invalid URL (GET /metrics)"
        assert server.service.store.commit_observer is None
    assert Settings.from_env({"RESPONSES_LEDGER_METRICS": "false"}).metrics is False
    with serve(
        Settings(engine="scripted", database_url=url, served_model_names=(MODEL,)), engine=engine
    ) as server:
        assert httpx.get(server.base_url + "/metrics").status_code == 200  # run open: no key


def test_one_json_line_per_request_without_keys_or_prompt_text(
    ledger: Ledger, log_lines: list[str], sdk: Callable[[str], OpenAI]
) -> None:
    client = sdk(ledger.member_key)
    ledger.engine.add_turns({"completion": harmony(("final", f"echo {PROMPT_MARKER}"))})
    response = client.responses.create(
        model=MODEL, input=f"say {PROMPT_MARKER}", instructions=PROMPT_MARKER
    )
    with pytest.raises(openai.AuthenticationError) as refusal:
        sdk(ADMIN + "x").responses.retrieve(response.id)
    read_back = client.responses.retrieve(response.id)

    text = "\n".join(log_lines)
    assert ledger.member_key not in text
    assert ADMIN not in text
    assert PROMPT_MARKER not in text
    lines = [json.loads(line) for line in log_lines]
    requests = [line for line in lines if line.get("event") == "request"]
    created = next(line for line in requests if line["method"] == "POST")
    assert created["response_id"] == response.id
    assert created["project"] == "alpha"
    assert created["key_id"].startswith("key_")
    assert created["model"] == MODEL
    assert created["status"] == "completed"
    assert created["http_status"] == 200
    assert created["input_tokens"] == response.usage.input_tokens
    assert created["output_tokens"] == response.usage.output_tokens
    assert created["duration_ms"] > 0 and created["level"] == "info"
    refused = next(line for line in requests if line["http_status"] == 401)
    assert refused["path"] == f"/v1/responses/{response.id}" and "key_id" not in refused
    read = [line for line in requests if line["method"] == "GET" and line["http_status"] == 200]
    assert read and read[-1]["response_id"] == response.id
    # each answer's x-request-id, as the SDK shows it, is its line's request_id
    ids = [response._request_id, refusal.value.request_id, read_back._request_id]
    assert [created["request_id"], refused["request_id"], read[-1]["request_id"]] == ids
    assert len(set(ids)) == 3 and all(re.fullmatch("req_[0-9a-f]{48}", i or "") for i in ids)
