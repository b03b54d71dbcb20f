"""``/metrics`` on the vLLM engine: vLLM's own ``vllm:*`` metrics from the in-process AsyncLLM
(its PrometheusStatLogger) in the same scrape as the ledger's, moving as a client streams."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
from openai import AsyncOpenAI
from prometheus_client.parser import text_string_to_metric_families

from app.engines.vllm import VllmEngine
from app.main import create_app
from app.settings import Settings
from tests.support.server import serve_in_loop

pytestmark = pytest.mark.vllm
MODEL = "gpt-oss-tiny"

#: What every vLLM deployment's dashboards read (issue 19).
VLLM_FAMILIES = (
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:prompt_tokens",
    "vllm:generation_tokens",
    "vllm:prefix_cache_queries",
)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def base_url(
    vllm_engine: VllmEngine, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[str]:
    db: Path = tmp_path_factory.mktemp("vllm-metrics") / "responses.db"
    settings = Settings(
        engine="vllm", database_url=f"sqlite+aiosqlite:///{db}", served_model_names=(MODEL,)
    )
    async with serve_in_loop(create_app(settings, engine=vllm_engine)) as url:
        yield url


async def _scrape(base_url: str) -> dict[str, dict[str, float]]:
    async with httpx.AsyncClient() as http:
        r = await http.get(base_url + "/metrics")
    assert r.status_code == 200
    families: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(r.text):
        families[family.name] = {
            s.name + str(sorted(s.labels.items())): s.value for s in family.samples
        }
    return families


def _total(families: dict[str, dict[str, float]], family: str, suffix: str) -> float:
    return sum(v for k, v in families[family].items() if k.startswith(family + suffix + "["))


async def test_vllm_metrics_are_scraped_with_the_ledgers(base_url: str) -> None:
    before = await _scrape(base_url)
    for name in VLLM_FAMILIES:
        assert name in before, f"{name} missing from /metrics"
    async with AsyncOpenAI(
        base_url=base_url + "/v1", api_key="x", max_retries=0, timeout=120
    ) as client:
        stream = await client.responses.create(
            model=MODEL, input="hi", max_output_tokens=12, stream=True
        )
        async for _event in stream:
            pass
    after = await _scrape(base_url)
    generated = _total(after, "vllm:generation_tokens", "_total") - _total(
        before, "vllm:generation_tokens", "_total"
    )
    assert generated >= 1
    ttft = "vllm:time_to_first_token_seconds"
    assert _total(after, ttft, "_count") - _total(before, ttft, "_count") == 1
    assert _total(after, "vllm:prompt_tokens", "_total") > _total(
        before, "vllm:prompt_tokens", "_total"
    )
    ledger = "ledger_time_to_first_token_seconds"
    assert _total(after, ledger, "_count") - _total(before, ledger, "_count") == 1
    labels = next(iter(after["vllm:num_requests_running"]))
    assert MODEL in labels  # vLLM labels its metrics with the served model name
