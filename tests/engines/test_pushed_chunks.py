"""A paced engine's steps push each stream's chunks (``StepStream``, ``PushedChunks``): the same
chunks as reading it, the consumer's backpressure honoured, its failure and its leaving handled."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from app.encoding import load_encoding
from app.engines.echo import StepClock
from app.engines.protocol import EngineChunk, PushedChunks, Sampling
from app.engines.scripted import ScriptedEngine

ENC = load_encoding()
STOPS = (200002, 200012)
COMPLETION = "<|channel|>final<|message|>one two three four five six<|return|>"


def _engine(turns: int = 1, **turn: object) -> ScriptedEngine:
    """An engine that plays ``turns`` such turns (one a generation), then echoes."""
    return ScriptedEngine(
        ENC, ["m"], {"turns": [{"completion": COMPLETION, "token_delay_ms": 1, **turn}] * turns}
    )


async def _read(engine: ScriptedEngine, sampling: Sampling, request_id: str) -> list[EngineChunk]:
    return [chunk async for chunk in engine.generate([200006], sampling, request_id)]


async def _pushed(engine: ScriptedEngine, sampling: Sampling, request_id: str) -> list[EngineChunk]:
    stream = engine.generate([200006], sampling, request_id)
    assert isinstance(stream, PushedChunks)
    got: list[EngineChunk] = []

    def sink(chunk: EngineChunk) -> None:
        got.append(chunk)

    await asyncio.wait_for(stream.push_to(sink), 5)
    return got


@pytest.mark.parametrize(
    ("turn", "sampling"),
    [
        ({}, Sampling(stop_token_ids=STOPS)),  # ends on its stop token
        ({}, Sampling(max_tokens=4, stop_token_ids=STOPS)),  # cut: length
        (
            {"completion": "<|channel|>final<|message|>a b", "error": "boom"},
            Sampling(stop_token_ids=STOPS),
        ),
        ({"completion": "<|channel|>final<|message|>no stop"}, Sampling(stop_token_ids=STOPS)),
        ({}, Sampling(max_tokens=0, stop_token_ids=STOPS)),  # ends before its first step
    ],
)
async def test_pushed_chunks_are_the_chunks_read(
    turn: dict[str, object], sampling: Sampling
) -> None:
    read = await _read(_engine(**turn), sampling, "r1")
    pushed = await _pushed(_engine(**turn), sampling, "r2")
    assert pushed == read and read[-1].finish_reason is not None


async def test_streams_pushed_together_share_the_steps_and_abort_ends_one() -> None:
    engine = _engine(21, token_delay_ms=20)
    clock = engine._clocks.setdefault(0.02, StepClock(0.02))
    ticks = 0
    tick = clock._tick

    def counted() -> None:
        nonlocal ticks
        ticks += 1
        tick()

    clock._tick = counted  # type: ignore[method-assign]
    sampling = Sampling(stop_token_ids=STOPS)
    streams = [asyncio.ensure_future(_pushed(engine, sampling, f"s{i}")) for i in range(20)]
    doomed = asyncio.ensure_future(_pushed(engine, sampling, "doomed"))
    await asyncio.sleep(0.05)
    await engine.abort("doomed")
    done = await asyncio.gather(*streams)
    expected = ENC.encode(COMPLETION, allowed_special="all")
    assert all([t for c in chunks for t in c.token_ids] == expected for chunks in done)
    aborted = await doomed
    assert aborted[-1] == EngineChunk((), "abort") and len(aborted) < len(expected)
    # 21 streams advanced together: a step a token, not a timer a stream
    assert len(expected) <= ticks <= len(expected) + 3, ticks
    assert engine._aborted == {}  # every stream let go of its abort flag


async def test_a_sink_that_returns_a_future_has_its_next_token_only_once_it_is_done() -> None:
    engine = _engine()
    stream = engine.generate([200006], Sampling(stop_token_ids=STOPS), "r1")
    assert isinstance(stream, PushedChunks)
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    got: list[EngineChunk] = []

    def sink(chunk: EngineChunk) -> asyncio.Future[None] | None:
        got.append(chunk)
        return gate if len(got) == 2 else None

    done = stream.push_to(sink)
    while len(got) < 2:
        await asyncio.sleep(0.001)
    await asyncio.sleep(0.05)  # ~50 steps of 1 ms: none of them pushes a token
    assert len(got) == 2 and not done.done()
    gate.set_result(None)
    await asyncio.wait_for(done, 5)
    assert [t for c in got for t in c.token_ids] == ENC.encode(COMPLETION, allowed_special="all")


async def test_a_failing_sink_ends_the_push_with_its_error_and_closing_stops_it() -> None:
    engine = _engine(2)

    def failing(chunk: EngineChunk) -> None:
        raise ValueError("the decoder broke")

    stream = engine.generate([200006], Sampling(stop_token_ids=STOPS), "r1")
    assert isinstance(stream, PushedChunks)
    with pytest.raises(ValueError, match="the decoder broke"):
        await asyncio.wait_for(stream.push_to(failing), 5)
    assert "r1" not in engine._aborted

    got: list[EngineChunk] = []
    stream = engine.generate([200006], Sampling(stop_token_ids=STOPS), "r2")
    assert isinstance(stream, PushedChunks)
    done = stream.push_to(got.append)  # type: ignore[arg-type]
    while not got:
        await asyncio.sleep(0.001)
    stream.close()  # the consumer went away
    seen = len(got)
    await asyncio.sleep(0.02)
    assert 0 < seen == len(got) and not done.done() and "r2" not in engine._aborted


async def test_a_stream_whose_engine_side_fails_fails_alone(tmp_path: Path) -> None:
    """What the engine does for one stream at a step failing (its last chunk writes the
    benchmark's token-times file, here into a folder that is not there) ends that stream's push
    with the error; the step's other streams go on."""
    engine = _engine(2, token_delay_ms=5)
    engine.token_times_dir = tmp_path / "gone"  # (taken when a stream is made)
    doomed = engine.generate([200006], Sampling(max_tokens=3, stop_token_ids=STOPS), "doomed")
    engine.token_times_dir = None
    survivor = engine.generate([200006], Sampling(stop_token_ids=STOPS), "survivor")
    assert isinstance(doomed, PushedChunks) and isinstance(survivor, PushedChunks)
    got: list[EngineChunk] = []
    failed = doomed.push_to(lambda chunk: None)
    finished = survivor.push_to(got.append)  # type: ignore[arg-type]
    with pytest.raises(FileNotFoundError):
        await asyncio.wait_for(failed, 5)
    await asyncio.wait_for(finished, 5)
    assert [t for c in got for t in c.token_ids] == ENC.encode(COMPLETION, allowed_special="all")
