"""``include: ["message.output_text.logprobs"]`` with ``top_logprobs``, served by the real vLLM
engine (CPU build, tiny random-weight gpt-oss), through the OpenAI SDK over a real socket.

A random-weight model hardly ever writes a well-formed Harmony message, and text recovered from
malformed output carries no logprobs; so the server here runs the vLLM engine behind
:class:`FinalChannel`, which opens the final channel for it (the header tokens go out first, and
vLLM continues the prompt after them) and rules out special tokens and tokens that are not
valid UTF-8 on their own with ``logit_bias``. vLLM's logprobs are its raw ones (before the bias),
so what the client gets are the model's own numbers for the tokens it sampled.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from openai import AsyncOpenAI
from openai.types.responses import ResponseIncludable

from app.encoding import load_encoding
from app.engines.protocol import EngineChunk, Sampling
from app.engines.vllm import VllmEngine
from app.main import create_app
from app.settings import Settings
from domain.decoder import FIRST_SPECIAL
from tests.e2e.conftest import sse_events
from tests.support.server import serve_in_loop
from tests.support.stream_checker import check_stream

pytestmark = pytest.mark.vllm
MODEL = "gpt-oss-tiny"
ENC = load_encoding()
_DECODE_BYTES = ENC._inner.decode_bytes
INCLUDE: list[ResponseIncludable] = ["message.output_text.logprobs"]


def _not_text_tokens(vocab_size: int) -> dict[int, float]:
    banned = dict.fromkeys(range(FIRST_SPECIAL, vocab_size), -100.0)
    for token in range(FIRST_SPECIAL):
        try:
            bytes(_DECODE_BYTES([token])).decode()
        except UnicodeDecodeError:
            banned[token] = -100.0
    return banned


class FinalChannel:
    """The vLLM engine with every answer on the final channel (see the module docstring)."""

    def __init__(self, engine: VllmEngine) -> None:
        self._engine = engine
        self.model_names = engine.model_names
        self.vocab_size = engine.vocab_size
        self.max_model_len = engine.max_model_len
        self.supports_logprobs = engine.supports_logprobs
        self.constrains = False  # a grammar over the whole turn would not expect the header
        self._header = tuple(ENC.encode("<|channel|>final<|message|>", allowed_special="all"))
        self._bias = _not_text_tokens(engine.vocab_size)

    async def start(self) -> None:  # the session fixture owns the engine
        pass

    async def stop(self) -> None:
        pass

    def healthy(self) -> bool:
        return self._engine.healthy()

    async def abort(self, request_id: str) -> None:
        await self._engine.abort(request_id)

    def generate(
        self, prompt_token_ids: Sequence[int], sampling: Sampling, request_id: str
    ) -> AsyncIterator[EngineChunk]:
        assert sampling.max_tokens is not None and sampling.max_tokens > len(self._header)
        inner = self._engine.generate(
            [*prompt_token_ids, *self._header],
            dataclasses.replace(
                sampling,
                max_tokens=sampling.max_tokens - len(self._header),
                logit_bias={**sampling.logit_bias, **self._bias},
            ),
            request_id,
        )
        return self._stream(inner)

    async def _stream(self, inner: AsyncIterator[EngineChunk]) -> AsyncIterator[EngineChunk]:
        yield EngineChunk(self._header)  # header tokens: not text, so no logprobs
        async for chunk in inner:
            yield chunk


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def base_url(
    vllm_engine: VllmEngine, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[str]:
    db: Path = tmp_path_factory.mktemp("vllm-logprobs") / "responses.db"
    settings = Settings(
        engine="vllm", database_url=f"sqlite+aiosqlite:///{db}", served_model_names=(MODEL,)
    )
    app = create_app(settings, engine=FinalChannel(vllm_engine))  # type: ignore[arg-type]
    async with serve_in_loop(app) as url:
        yield url


@pytest_asyncio.fixture(loop_scope="session")
async def client(base_url: str) -> AsyncIterator[AsyncOpenAI]:
    async with AsyncOpenAI(base_url=base_url + "/v1", api_key="x", max_retries=0, timeout=120) as c:
        yield c


def _check_entries(entries: Sequence[Any], k: int) -> None:
    """OpenAI's shape; probabilities; top-k sorted; the sampled token's logprob where it is one."""
    for entry in entries:
        assert isinstance(entry.token, str) and entry.bytes
        assert bytes(entry.bytes).decode() == entry.token
        assert entry.logprob <= 0 and 0 < math.exp(entry.logprob) <= 1
        assert len(entry.top_logprobs) == k
        values = [top.logprob for top in entry.top_logprobs]
        assert values == sorted(values, reverse=True)
        assert sum(math.exp(v) for v in values) <= 1 + 1e-3
        for top in entry.top_logprobs:  # any token: also special ones, or part of a character
            assert 0 < math.exp(top.logprob) <= 1
            assert bytes(top.bytes).decode("utf-8", errors="replace") == top.token
            if top.bytes == entry.bytes:  # the sampled token is in the top-k
                assert top.logprob == pytest.approx(entry.logprob, abs=1e-6)
        if entry.top_logprobs and entry.bytes not in [top.bytes for top in entry.top_logprobs]:
            assert entry.logprob <= values[-1] + 1e-6  # outside the top-k: no likelier than them


async def test_streamed_logprobs_on_deltas_done_and_parts(
    client: AsyncOpenAI, base_url: str
) -> None:
    k = 5
    stream = await client.responses.create(
        model=MODEL,
        input="Say something.",
        max_output_tokens=24,
        include=INCLUDE,
        top_logprobs=k,
        stream=True,
    )
    events = [event async for event in stream]
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert deltas, [e.type for e in events]
    for delta in deltas:
        assert delta.logprobs  # every delta here is made of whole tokens
        _check_entries(delta.logprobs, k)
        assert b"".join(bytes(e.bytes) for e in delta.logprobs).decode() == delta.delta
    every = [entry for d in deltas for entry in d.logprobs]
    (done,) = [e for e in events if e.type == "response.output_text.done"]
    assert [e.model_dump() for e in done.logprobs] == [e.model_dump() for e in every]
    text = "".join(d.delta for d in deltas)
    assert done.text == text
    assert b"".join(bytes(e.bytes) for e in every) == text.encode()
    (part_done,) = [e for e in events if e.type == "response.content_part.done"]
    assert part_done.part.type == "output_text"
    assert [e.model_dump() for e in part_done.part.logprobs or []] == [
        e.model_dump() for e in every
    ]
    (part_added,) = [e for e in events if e.type == "response.content_part.added"]
    assert part_added.part.logprobs == []  # type: ignore[union-attr]
    final = events[-1]
    assert final.type == "response.incomplete"  # no stop token can be sampled: max_output_tokens
    assert final.response.usage is not None and final.response.usage.output_tokens == 24
    assert final.response.top_logprobs == k
    streamed = final.response.output[0].content[0]  # type: ignore[union-attr]
    assert [e.model_dump() for e in streamed.logprobs] == [e.model_dump() for e in every]  # type: ignore[union-attr]
    # 24 tokens: 3 of header, 21 of text
    assert len(every) == 21

    # stored: GET, and the stream replayed from the log, are the same
    fetched = await client.responses.retrieve(final.response.id)
    assert fetched.model_dump() == final.response.model_dump()
    async with httpx.AsyncClient(timeout=60) as http:
        raw = await http.get(
            f"{base_url}/v1/responses/{final.response.id}", params={"stream": "true"}
        )
    replayed = sse_events(raw.content)
    check_stream(replayed)
    assert [e for e in replayed if e["type"] == "response.output_text.delta"] == [
        d.model_dump(exclude_unset=True) for d in deltas
    ]


async def test_non_streamed_top_logprobs_zero_and_without_include(client: AsyncOpenAI) -> None:
    response = await client.responses.create(
        model=MODEL, input="Hello.", max_output_tokens=10, include=INCLUDE, top_logprobs=0
    )
    part = response.output[0].content[0]  # type: ignore[union-attr]
    assert part.type == "output_text" and part.logprobs
    _check_entries(part.logprobs, 0)
    assert b"".join(bytes(e.bytes) for e in part.logprobs) == part.text.encode()
    assert len(part.logprobs) == 10 - 3

    plain = await client.responses.create(
        model=MODEL, input="Hello.", max_output_tokens=10, top_logprobs=3
    )
    plain_part = plain.output[0].content[0]  # type: ignore[union-attr]
    assert plain_part.text and plain_part.logprobs == []
    assert plain.top_logprobs == 3


async def test_twenty_top_logprobs_with_sampling(client: AsyncOpenAI) -> None:
    response = await client.responses.create(
        model=MODEL,
        input="Go.",
        max_output_tokens=8,
        include=INCLUDE,
        top_logprobs=20,
        temperature=1.0,
        top_p=0.5,
    )
    part = response.output[0].content[0]  # type: ignore[union-attr]
    assert len(part.logprobs) == 5  # type: ignore[union-attr]
    _check_entries(part.logprobs, 20)  # type: ignore[union-attr]
