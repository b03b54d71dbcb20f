"""VllmEngine's pushed requests (``app.engines.protocol.PushedChunks``): vLLM's output handler
hands each output to the consumer's sink, as the service takes them. The same chunks as reading
the request, vLLM's abort, the consumer leaving or failing, and a consumer that asks to wait."""

from __future__ import annotations

import asyncio

import pytest

from app.engines.protocol import EngineChunk, PushedChunks, Sampling
from app.engines.vllm import VllmEngine
from tests.engines.test_vllm_engine import (
    LONG,
    NO_STOP,
    check_one_final,
    collect,
    prompt,
    request_id,
    tokens,
    wait_until_idle,
)

pytestmark = pytest.mark.vllm


def pushed(engine: VllmEngine, ids: list[int], sampling: Sampling, name: str) -> PushedChunks:
    stream = engine.generate(ids, sampling, request_id(name))
    assert isinstance(stream, PushedChunks)
    return stream


async def test_pushed_chunks_are_the_chunks_read(vllm_engine: VllmEngine) -> None:
    greedy = Sampling(max_tokens=6, temperature=0.0, logit_bias=NO_STOP, logprobs=2)
    read = await collect(vllm_engine.generate(prompt(12, 5), greedy, request_id("read")))
    stream, got = pushed(vllm_engine, prompt(12, 5), greedy, "pushed"), []
    await asyncio.wait_for(stream.push_to(got.append), 30)  # type: ignore[arg-type]
    assert check_one_final(got).finish_reason == "length"
    assert [c.token_ids for c in got] == [c.token_ids for c in read] and len(tokens(got)) == 6
    assert all(
        c.logprobs is not None and len(c.logprobs) == len(c.token_ids) for c in got if c.token_ids
    )
    assert [[top for _, top in c.logprobs or ()] for c in got] == [
        [top for _, top in c.logprobs or ()] for c in read
    ]
    # a forced stop token ends it with stop
    stream, got = (
        pushed(
            vllm_engine, prompt(10), Sampling(max_tokens=20, logit_bias={200002: 100.0}), "stop"
        ),
        [],
    )
    await asyncio.wait_for(stream.push_to(got.append), 30)  # type: ignore[arg-type]
    assert check_one_final(got).finish_reason == "stop" and tokens(got) == [200002]


async def test_abort_ends_a_pushed_request(vllm_engine: VllmEngine) -> None:
    got: list[EngineChunk] = []
    rid = request_id("abort")
    stream = vllm_engine.generate(prompt(8), LONG, rid)
    assert isinstance(stream, PushedChunks)
    done = stream.push_to(got.append)  # type: ignore[arg-type]
    while not got:
        await asyncio.sleep(0.01)
    await vllm_engine.abort(rid)
    await asyncio.wait_for(done, 10)
    assert check_one_final(got).finish_reason == "abort" and len(tokens(got)) < 3000
    await wait_until_idle(vllm_engine)


async def test_a_consumer_that_leaves_or_fails_aborts_the_request(vllm_engine: VllmEngine) -> None:
    stream, got = pushed(vllm_engine, prompt(8), LONG, "gone"), []
    done = stream.push_to(got.append)  # type: ignore[arg-type]
    while not got:
        await asyncio.sleep(0.01)
    stream.close()  # the response's task was cancelled, or its client is gone
    seen = len(got)
    await wait_until_idle(vllm_engine)
    assert len(got) == seen and not done.done()

    def failing(chunk: EngineChunk) -> None:
        raise RuntimeError("the decoder broke")

    stream = pushed(vllm_engine, prompt(8), LONG, "failing")
    with pytest.raises(RuntimeError, match="the decoder broke"):
        await asyncio.wait_for(stream.push_to(failing), 30)
    await wait_until_idle(vllm_engine)
    # vLLM's output handler was not hurt: the next request streams
    chunks = await collect(
        vllm_engine.generate(
            prompt(8), Sampling(max_tokens=2, logit_bias=NO_STOP), request_id("after")
        )
    )
    assert check_one_final(chunks).finish_reason == "length"


async def test_outputs_made_while_the_consumer_waits_come_after_the_wait_merged(
    vllm_engine: VllmEngine,
) -> None:
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    got: list[EngineChunk] = []

    def sink(chunk: EngineChunk) -> asyncio.Future[None] | None:
        got.append(chunk)
        return gate if len(got) == 1 else None

    stream = pushed(vllm_engine, prompt(8), Sampling(max_tokens=40, logit_bias=NO_STOP), "wait")
    done = stream.push_to(sink)
    while not got:
        await asyncio.sleep(0.01)
    await wait_until_idle(vllm_engine, timeout=30)  # vLLM made all 40 while the sink waited
    assert len(got) == 1 and not done.done()
    gate.set_result(None)
    await asyncio.wait_for(done, 10)
    assert check_one_final(got).finish_reason == "length" and len(tokens(got)) == 40
    assert len(got) == 2  # the 39 held by vLLM's collector, merged into one chunk
