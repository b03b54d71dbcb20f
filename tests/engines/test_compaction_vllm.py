"""Compaction on the real vLLM engine (CPU build, tiny random-weight gpt-oss): the summary is
what the engine generated for the summarisation prompt, under the summary grammar, and it is what
the next turn's prompt holds.

Random weights write random tokens; a bias on ``<|end|>`` and ``<|return|>`` makes its messages
short (as in ``test_structured_outputs``), and the grammar makes the turn an optional analysis then
a non-empty final message, so a summary comes out whatever the weights.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from openai import AsyncOpenAI
from openai_harmony import Role

from app.encoding import load_encoding
from app.engines.vllm import VllmEngine
from app.main import create_app
from app.settings import Settings
from domain.compaction import SUMMARY_HEADER, SUMMARY_PROMPT
from tests.support.server import serve_in_loop

pytestmark = pytest.mark.vllm
MODEL = "gpt-oss-tiny"
END, RETURN = 200007, 200002  # <|end|>, <|return|>
BIAS = 9.0


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def base_url(
    vllm_engine: VllmEngine, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[str]:
    db: Path = tmp_path_factory.mktemp("compaction") / "responses.db"
    settings = Settings(
        engine="vllm", database_url=f"sqlite+aiosqlite:///{db}", served_model_names=(MODEL,)
    )
    assert vllm_engine.constrains, "the tiny model directory has the o200k_harmony tokenizer"
    saved = dict(vllm_engine.logit_bias)
    vllm_engine.logit_bias.update({END: BIAS, RETURN: BIAS})
    try:
        async with serve_in_loop(create_app(settings, engine=vllm_engine)) as url:
            yield url
    finally:
        vllm_engine.logit_bias.clear()
        vllm_engine.logit_bias.update(saved)


async def _audit(http: httpx.AsyncClient, base_url: str, response_id: str) -> dict[str, Any]:
    log = (await http.get(f"{base_url}/v1/responses/{response_id}/events")).json()
    return {a["kind"]: a for a in log["audit"]}


async def test_the_summary_is_the_engines_and_the_next_turn_holds_it(base_url: str) -> None:
    encoding = load_encoding()
    history: list[Any] = [
        {"role": "user", "content": "The build fails on module alpha."},
        {"role": "assistant", "content": "I will look at alpha's imports."},
    ]
    async with (
        AsyncOpenAI(base_url=base_url + "/v1", api_key="x", max_retries=0, timeout=300) as client,
        httpx.AsyncClient(timeout=300) as http,
    ):
        compacted = await client.responses.compact(model=MODEL, input=history)
        assert [o.type for o in compacted.output] == ["message", "compaction"]
        assert compacted.usage.output_tokens >= 1

        triggered = await client.responses.create(
            model=MODEL, input=[*history, {"type": "compaction_trigger"}], temperature=1.0
        )
        assert triggered.status == "completed", triggered.error
        assert [o.type for o in triggered.output] == ["compaction"]
        audit = await _audit(http, base_url, triggered.id)
        sent = encoding.decode(audit["compaction_prompt_token_ids"]["token_ids"])
        assert SUMMARY_PROMPT in sent and "alpha's imports" in sent
        generated = audit["compaction_output_token_ids"]["token_ids"]
        messages = encoding.parse_messages_from_completion_tokens(generated, Role.ASSISTANT)
        final = [m for m in messages if m.channel == "final"]
        assert len(final) == 1  # the grammar: an optional analysis, then one final message
        summary = "".join(c.text for c in final[0].content).strip()
        assert summary

        follow = await client.responses.create(
            model=MODEL,
            input=[triggered.output[0].to_dict(), {"role": "user", "content": "Go on."}],
            max_output_tokens=4,
        )
        prompt = encoding.decode(
            (await _audit(http, base_url, follow.id))["prompt_token_ids"]["token_ids"]
        )
        assert SUMMARY_HEADER + summary in prompt  # what the engine wrote, decrypted and rendered
        assert "alpha's imports" not in prompt
