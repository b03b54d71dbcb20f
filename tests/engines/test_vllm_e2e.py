"""``/v1/responses`` served by the real vLLM engine (CPU build, tiny random-weight gpt-oss),
through the OpenAI SDK over a real socket.

Random weights write random tokens, so these tests check the pipeline, not the words: prompt ids
reach vLLM, generated ids come back and are decoded (malformed output recovered, never a 500),
``max_output_tokens`` ends ``incomplete``, usage matches the audit records, and cancelling a
background response aborts the vLLM request. The server runs in the test session's event loop
(where the shared engine lives), on a loopback port.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from openai import AsyncOpenAI

from app.engines.vllm import VllmEngine
from app.main import create_app
from app.settings import Settings
from tests.e2e.conftest import sse_events
from tests.support.server import serve_in_loop
from tests.support.stream_checker import check_stream

pytestmark = pytest.mark.vllm
MODEL = "gpt-oss-tiny"


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def base_url(
    vllm_engine: VllmEngine, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[str]:
    db: Path = tmp_path_factory.mktemp("vllm-ledger") / "responses.db"
    settings = Settings(
        engine="vllm", database_url=f"sqlite+aiosqlite:///{db}", served_model_names=(MODEL,)
    )
    async with serve_in_loop(create_app(settings, engine=vllm_engine)) as url:
        yield url


@pytest_asyncio.fixture(loop_scope="session")
async def client(base_url: str) -> AsyncIterator[AsyncOpenAI]:
    async with AsyncOpenAI(base_url=base_url + "/v1", api_key="x", max_retries=0, timeout=120) as c:
        yield c


def _no_markup(response: Any) -> None:
    for item in response.output:
        for part in getattr(item, "content", None) or []:
            assert "<|" not in getattr(part, "text", "")


async def _audit(base_url: str, response_id: str) -> dict[str, Any]:
    async with httpx.AsyncClient() as http:
        log = (await http.get(f"{base_url}/v1/responses/{response_id}/events")).json()
    return {a["kind"]: a for a in log["audit"]}


async def test_non_streamed_response_from_vllm(client: AsyncOpenAI, base_url: str) -> None:
    response = await client.responses.create(model=MODEL, input="Say hi.", max_output_tokens=8)
    assert response.status in ("incomplete", "completed")
    if response.status == "incomplete":
        assert response.incomplete_details is not None
        assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage is not None and 1 <= response.usage.output_tokens <= 8
    _no_markup(response)
    audit = await _audit(base_url, response.id)
    assert len(audit["output_token_ids"]["token_ids"]) == response.usage.output_tokens
    assert len(audit["prompt_token_ids"]["token_ids"]) == response.usage.input_tokens
    assert audit["finish"]["detail"]["finish_reason"] in ("length", "stop")
    fetched = await client.responses.retrieve(response.id)
    assert fetched.model_dump() == response.model_dump()


async def test_penalties_are_taken_and_echoed_by_the_vllm_server(client: AsyncOpenAI) -> None:
    plain = await client.responses.create(model=MODEL, input="Say hi.", max_output_tokens=4)
    assert (plain.model_dump()["presence_penalty"], plain.model_dump()["frequency_penalty"]) == (
        0,
        0,
    )
    response = await client.responses.create(
        model=MODEL,
        input="Say hi.",
        max_output_tokens=4,
        extra_body={"presence_penalty": 1.0, "frequency_penalty": 0.5},
    )
    assert response.status in ("incomplete", "completed")
    echoed = (await client.responses.retrieve(response.id)).model_dump()
    assert (echoed["presence_penalty"], echoed["frequency_penalty"]) == (1.0, 0.5)


async def test_streamed_response_from_vllm(client: AsyncOpenAI, base_url: str) -> None:
    body = {"model": MODEL, "input": "Count to three.", "max_output_tokens": 12, "stream": True}
    async with (
        httpx.AsyncClient(timeout=120) as http,
        http.stream("POST", base_url + "/v1/responses", json=body) as r,
    ):
        assert r.status_code == 200
        events = sse_events(await r.aread())
    final = check_stream(events)
    fetched = await client.responses.retrieve(events[0]["response"]["id"])
    assert fetched.status == final["status"] == events[-1]["response"]["status"]
    assert events[-1]["type"] == f"response.{fetched.status}"
    assert fetched.usage is not None and fetched.usage.output_tokens <= 12


async def test_cancel_a_background_response_aborts_the_vllm_request(
    client: AsyncOpenAI, vllm_engine: VllmEngine
) -> None:
    started = await client.responses.create(
        model=MODEL, input="Write a long story.", max_output_tokens=3000, background=True
    )
    assert started.status in ("queued", "in_progress")
    await asyncio.sleep(0.5)
    cancelled = await client.responses.cancel(started.id)
    assert cancelled.status == "cancelled"
    for _ in range(100):
        if vllm_engine.num_unfinished_requests == 0:
            break
        await asyncio.sleep(0.05)
    assert vllm_engine.num_unfinished_requests == 0
    assert (await client.responses.retrieve(started.id)).status == "cancelled"


async def test_a_prompt_longer_than_the_context_is_a_400(base_url: str) -> None:
    async with httpx.AsyncClient(timeout=60) as http:
        r = await http.post(
            base_url + "/v1/responses",
            json={"model": MODEL, "input": "word " * 5000, "max_output_tokens": 16},
        )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "context_length_exceeded"
